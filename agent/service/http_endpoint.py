"""A small read-only HTTP endpoint that holds up on the open network: the /metrics server.

Not prometheus_client's ``start_http_server``: that one keeps every connection as long as
the client likes, a thread and a file descriptor each, with no read timeout, so idle or
half-open connections (a port scanner, a TLS hello, an HTTP/0.9 line) could use up the
process's descriptors and starve scrapes, the result stream and reloads. This one is one
thread over non-blocking sockets with a cap on connections (the oldest idle one makes
room for a new one), a deadline for the whole request head (not per read: a client
trickling a byte at a time is cut off all the same), a size limit on it, a deadline for
taking each response or part, and ``Connection: close`` on every answer. It serves ``GET``
and ``HEAD``: of one path (``render``), or of whatever ``handle`` answers (the live view:
pages, JSON, answers that wait for a frame, MJPEG streams), and has no authentication of
its own. With ``allowed_hosts`` it answers only requests whose ``Host`` names one of them
(DNS rebinding: a web page whose name now points at this machine cannot read it). The
request head is read by ``parse_head``, a pure function of the bytes received so far.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import re
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol, TypeVar
from urllib.parse import parse_qs, unquote_to_bytes

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 1.0  # a close waits this long for the server thread

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
#: A whole request line (``\r`` stripped): method, target, HTTP major and minor.
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb"{1,32}) ([\x21-\x7e]+) HTTP/(\d)\.(\d)")
#: What a request line may look like before its end has arrived; anything else (a TLS
#: hello, binary, a space first) is answered 400 at once instead of waiting for more.
_REQUEST_LINE_START = re.compile(
    _TOKEN + rb"{1,32}(?: (?:[\x21-\x7e]+(?: (?:H(?:T(?:T(?:P(?:/(?:\d(?:\.\d?)?)?)?)?)?)?)?)?)?)?"
)
#: A header line (its final CR taken off): a token, a colon, then visible characters, spaces
#: and tabs: no whitespace before the colon, no NUL or bare CR (RFC 9112 §5.1, RFC 9110 §5.5).
_FIELD = re.compile(rb"(" + _TOKEN + rb"+):([\t\x20-\x7e\x80-\xff]*)")
#: A Host value: an address in brackets or a registered name (RFC 3986's characters), and
#: an optional port of digits; nothing after it.
_HOST = re.compile(rb"(\[[0-9A-Za-z:.%_~-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]{0,5})?")
_READING, _WAITING, _WRITING = "reading", "waiting", "writing"
_STREAMING, _LINGERING = "streaming", "lingering"
_LINGER_S = 2.0  # after a response: read and discard what the client still sends, then close
_LINGER_BYTES = 64 * 1024
_T = TypeVar("_T")


@dataclass(frozen=True)
class Request:
    """A request's head as ``handle`` sees it: the path percent-decoded (UTF-8)."""

    method: str  # GET or HEAD
    path: str
    query: dict[str, list[str]]


class RequestRefused(ValueError):
    """A request head answered at once with ``status`` (4xx or 505), ``body`` saying why and
    ``headers``, then closed; ``head_only`` for a HEAD request (no body sent)."""

    def __init__(
        self, status: int, body: bytes = b"", headers: tuple[str, ...] = (), *, head_only: bool = False
    ) -> None:
        why = body.decode("latin-1").strip()
        super().__init__(f"{status} {HTTPStatus(status).phrase}{f': {why}' if why else ''}")
        self.status, self.body, self.headers, self.head_only = status, body, headers, head_only


def parse_head(
    data: bytes,
    max_bytes: int = 8192,
    allowed_hosts: frozenset[str] | None = None,
    setting: str = "http",
) -> Request | None:
    """The request whose head ``data`` (what a connection has sent so far) begins with, or
    None while that head is not whole yet. Pure: no I/O, no state.

    A head is at most ``max_bytes`` (empty lines before it included); its request line is
    ``METHOD TARGET HTTP/1.x``; each header line ``name: value`` (a token; then visible
    characters, spaces and tabs: no NUL, bare CR or folded line); at most one ``Host``, a
    ``host[:port]`` one of ``allowed_hosts`` (lower case, as ``_host_name`` gives them;
    None: any) when present; every ``Content-Length`` one same number. Only GET and HEAD;
    the path percent-decoded as UTF-8 without control characters. Anything else raises
    RequestRefused (400, 405, 421 naming ``setting``.allowed_hosts, 431 or 505); what is not
    HTTP (a TLS hello) is refused as soon as its first bytes show it, not at the deadline.
    """
    buf = data.lstrip(b"\r\n")
    end_of_line = buf.find(b"\n")
    if end_of_line < 0:
        line = _chomp(buf)
        if line and not _REQUEST_LINE_START.fullmatch(line):
            raise RequestRefused(400, b"not an HTTP/1.x request\n")
        if len(data) > max_bytes:
            raise RequestRefused(431)
        return None
    request_line = _REQUEST_LINE.fullmatch(_chomp(buf[:end_of_line]))
    if request_line is None:  # HTTP/0.9 (no version), garbage with a newline
        raise RequestRefused(400, b"not an HTTP/1.x request\n")
    ends = [i for i in (buf.find(b"\n\r\n", end_of_line), buf.find(b"\n\n", end_of_line)) if i >= 0]
    if not ends:
        if len(data) > max_bytes:
            raise RequestRefused(431)
        return None
    if len(data) - len(buf) + min(ends) + 3 > max_bytes:
        raise RequestRefused(431)
    method, target, major = request_line.group(1), request_line.group(2), request_line.group(3)
    head_only = method == b"HEAD"
    hosts, lengths = _fields(buf[end_of_line + 1 : min(ends)], head_only)
    if major != b"1":
        raise RequestRefused(505)
    if method not in (b"GET", b"HEAD"):
        raise RequestRefused(405, headers=("Allow: GET, HEAD",))
    if len(hosts) > 1:
        raise RequestRefused(400, b"more than one Host header\n", head_only=head_only)
    # No Host at all is let through: browsers always send one, so its absence is no rebinding.
    if hosts and not _HOST.fullmatch(hosts[0]):
        raise RequestRefused(400, b"malformed Host header\n", head_only=head_only)
    if hosts and allowed_hosts is not None and _host_name(hosts[0].decode("ascii")) not in allowed_hosts:
        why = f"this server does not answer to that host name (see {setting}.allowed_hosts)\n"
        raise RequestRefused(421, why.encode(), head_only=head_only)
    if len(lengths) > 1 or not all(n.isdigit() for n in lengths):
        raise RequestRefused(400, b"malformed Content-Length\n", head_only=head_only)
    raw_path, _, raw_query = target.partition(b"?")
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRefused(
            400, b"the path is not UTF-8 once percent-decoded\n", head_only=head_only
        ) from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise RequestRefused(400, b"control characters in the path\n", head_only=head_only)
    # The target is visible ASCII (the request line's pattern), so is its query.
    query = parse_qs(raw_query.decode("ascii"), keep_blank_values=True)
    return Request(method.decode(), path, query)


def _chomp(line: bytes) -> bytes:
    """``line`` without the CR of its CRLF (one: a second is a bare CR)."""
    return line[:-1] if line.endswith(b"\r") else line


def _fields(block: bytes, head_only: bool) -> tuple[list[bytes], set[bytes]]:
    """The Host values and the Content-Length values of a head's header lines; raises
    RequestRefused (400) at a line outside the grammar (a folded line included)."""
    hosts: list[bytes] = []
    lengths: set[bytes] = set()
    for raw in block.split(b"\n") if block else ():
        field = _FIELD.fullmatch(_chomp(raw))
        if field is None:
            raise RequestRefused(400, b"malformed header\n", head_only=head_only)
        name, value = field.group(1).lower(), field.group(2).strip(b" \t")
        if name == b"host":
            hosts.append(value)
        elif name == b"content-length":
            lengths.update(n.strip(b" \t") for n in value.split(b","))
    return hosts, lengths


class Stream(Protocol):
    """A body sent in parts as they come (MJPEG), after a head without a length. Polled by
    the server's thread whenever it wakes (``HttpEndpoint.wake``, or twice a second) and
    the previous part has been taken: it must never block."""

    def next_part(self) -> bytes | None:
        """The next part to send, or None when there is nothing new yet."""

    def done(self) -> bool:
        """Whether the body is complete (the connection is then closed)."""

    def close(self) -> None:
        """The connection ended, whatever the reason; called once."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[str, ...] = ()
    stream: Stream | None = None  # the body instead of ``body``
    send_buffer: int = 0  # SO_SNDBUF for this connection (0: the system's)


#: An answer not ready yet (a snapshot waiting for a frame): polled like a stream until it
#: returns the response; it must give one (a 503, say) in its own time.
Deferred = Callable[[], Response | None]


def _response(
    status: int,
    body: bytes = b"",
    content_type: str = "text/plain; charset=utf-8",
    *,
    head_only: bool = False,
    extra: tuple[str, ...] = (),
    length: bool = True,
) -> bytes:
    if not body and status != 200:
        body = f"{status} {HTTPStatus(status).phrase}\n".encode()
    head = "\r\n".join(
        (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Content-Type: {content_type}",
            *((f"Content-Length: {len(body)}",) if length else ()),
            "Connection: close",
            *extra,
        )
    )
    data = head.encode("latin-1") + b"\r\n\r\n"
    return data if head_only else data + body


class _Conn:
    """One client connection: its request head so far, then its response."""

    __slots__ = (
        "buf",
        "deadline",
        "drained",
        "eof",
        "head_only",
        "out",
        "pending",
        "sock",
        "state",
        "stream",
    )

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.state = _READING
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.deadline = deadline
        self.drained = 0
        self.eof = False  # the client has half-closed: nothing more to read
        self.head_only = False
        self.pending: Deferred | None = None
        self.stream: Stream | None = None


def _host_name(value: str) -> str:
    """A Host header's or an address's name: lower case, without port, brackets or final dot
    (a Host is checked against ``_HOST`` first: nothing follows its port)."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:].split("]", 1)[0]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


class HttpEndpoint:
    """Read-only HTTP resources (``GET``/``HEAD``); failure to bind is logged, never fatal.

    One thread (named ``name``) runs a selector loop over non-blocking sockets. At most
    ``max_connections`` are held: one more closes the oldest that has not sent a whole
    request yet, else the oldest waiting for its answer (told 503), else the new one (all
    are being answered or streamed). A client that half-closes after its request still
    gets its answer. A request head must
    arrive within ``request_timeout_s`` of the connection (however it trickles in) and be
    at most ``max_request_bytes``; a response, or a part of a stream, not taken by the
    client within ``write_timeout_s`` is abandoned; a stream with nothing to send for
    ``stream_idle_s`` is ended. Every response closes its connection.
    """

    def __init__(
        self,
        host: str,
        port: int,
        path: str = "",
        render: Callable[[], tuple[bytes, str]] | None = None,
        *,
        handle: Callable[[Request], Response | Deferred] | None = None,
        name: str = "http",
        setting: str = "",
        allowed_hosts: frozenset[str] | None = None,
        headers: tuple[str, ...] = (),
        max_connections: int = 16,
        request_timeout_s: float = 5.0,
        write_timeout_s: float = 10.0,
        stream_idle_s: float = 30.0,
        max_request_bytes: int = 8192,
        backlog: int = 64,
    ) -> None:
        """``render``: the body and content type of ``path``, made at each request; or
        ``handle``: the answer to any request (it runs in the server's thread: it must not
        block; a ``Deferred`` for an answer that is not ready). An exception answers 500.
        ``setting``: the config section named in messages (``view``: ``view.port``).
        ``allowed_hosts``: the names a ``Host`` header may carry (None: any); ``headers``:
        added to every response."""
        self.host, self.port = host, port
        self.path = path
        if handle is None:
            assert render is not None, "render or handle"
            handle = self._one_resource(path, render)
        self.handle = handle
        self.name = name
        self.setting = setting or name
        self.allowed_hosts = None if allowed_hosts is None else frozenset(map(_host_name, allowed_hosts))
        self.headers = headers
        self.url = ""
        self.bind_error = ""  # why it does not listen, when it does not
        self.max_connections = max(1, max_connections)
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
        self.stream_idle_s = stream_idle_s
        self.max_request_bytes = max_request_bytes
        self.backlog = backlog
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._conns: dict[_Conn, None] = {}  # in accept order: the first is the oldest
        self._stopping = False
        self._paused_until = 0.0  # accepting paused (out of fds) until then
        self._warned: set[str] = set()
        self._last_error = ""

    @staticmethod
    def _one_resource(path: str, render: Callable[[], tuple[bytes, str]]) -> Callable[[Request], Response]:
        def handle(request: Request) -> Response:
            if request.path != path:
                return Response(404, f"the resource is at {path}\n".encode())
            body, content_type = render()
            return Response(200, body, content_type)

        return handle

    def start(self) -> None:
        try:
            self._sock = self._listen()
        except OSError as e:
            self.bind_error = (
                f"{self.name}: cannot listen on {self.host or '(all interfaces)'} port {self.port} "
                f"({self.setting}.host, {self.setting}.port): {e.strerror or e}; running without it"
            )
            log.warning("%s", self.bind_error)
            return
        self.port = self._sock.getsockname()[1]  # the real one when 0 asked for any
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}{self.path}"
        self._sel = selectors.DefaultSelector()
        self._wake = socket.socketpair()
        for s in self._wake:
            s.setblocking(False)
        self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake[0], selectors.EVENT_READ, "wake")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        return self._thread is not None

    def wake(self) -> None:
        """Have the server's thread poll its streams and waiting answers now (any thread)."""
        if self._wake is not None:
            with contextlib.suppress(OSError):  # full: a wake-up is pending anyway
                self._wake[1].send(b"\0")

    def close(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Stop serving; True if the server thread ended within ``timeout_s``."""
        thread = self._thread
        if thread is None:
            return True
        self._stopping = True
        self.wake()
        thread.join(timeout_s)
        self._thread = None
        if thread.is_alive():  # stuck in a handler: free the port now, the rest when it returns
            log.warning("%s: the server thread did not stop within %.1f s", self.name, timeout_s)
            if self._sock is not None:
                self._sock.close()
            return False
        return True

    def _listen(self) -> socket.socket:
        family, _, _, _, addr = socket.getaddrinfo(
            self.host or None, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.set_inheritable(False)  # close-on-exec (Python's default; said here on purpose)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
            sock.listen(self.backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    # The loop, all in the server's thread.

    def _serve(self) -> None:
        sel = self._sel
        assert sel is not None
        try:
            while not self._stopping:
                now = time.monotonic()
                timeout = min([0.5, *(c.deadline - now for c in self._conns)])
                if self._paused_until:
                    timeout = min(timeout, self._paused_until - now)
                for key, events in sel.select(max(timeout, 0.0)):
                    if self._stopping:
                        break
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            key.fileobj.recv(4096)  # type: ignore[union-attr]
                    elif key.data in self._conns:
                        self._ready(key.data, events)
                self._poll()
                self._expire(time.monotonic())
        except Exception:
            log.exception("%s: the server loop failed; it is off until a restart", self.name)
        finally:
            for conn in list(self._conns):
                self._drop(conn)
            for s in (self._sock, *(self._wake or ())):
                if s is not None:
                    s.close()
            sel.close()

    def _ready(self, conn: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._send(conn)
            elif events & selectors.EVENT_READ:
                self._receive(conn)
        except Exception as e:  # a bug here must cost one connection, not the server
            self._log_once(f"conn:{type(e).__name__}", "%s: dropping a connection after an error", self.name)
            self._drop(conn)

    def _poll(self) -> None:
        """Answers that were waiting, and streams' next parts, when they have them."""
        for conn in [c for c in self._conns if c.state in (_WAITING, _STREAMING)]:
            try:
                if conn.state == _WAITING:
                    self._poll_one(conn)
                else:
                    self._next_part(conn)
            except Exception as e:
                self._log_once(
                    f"conn:{type(e).__name__}", "%s: dropping a connection after an error", self.name
                )
                self._drop(conn)

    def _next_part(self, conn: _Conn) -> None:
        assert conn.stream is not None
        part = conn.stream.next_part()
        if part:
            self._write(conn, part)
        elif conn.stream.done():
            self._finish(conn)

    def _accept(self) -> None:
        assert self._sock is not None and self._sel is not None
        for _ in range(self.max_connections + self.backlog):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    victim = self._evictable()
                    if victim is not None:  # give an idle connection's fd to the new one
                        self._evict(victim)
                        continue
                    self._log_once(
                        "accept", "%s: cannot accept a connection (%s); pausing 0.5 s", self.name, e.strerror
                    )
                    self._sel.unregister(self._sock)
                    self._paused_until = time.monotonic() + 0.5
                return  # ECONNABORTED and the like: the client is gone
            sock.setblocking(False)
            if len(self._conns) >= self.max_connections:
                victim = self._evictable()
                if victim is None:  # every connection is being answered: refuse the new one
                    sock.close()
                    continue
                self._log_once(
                    "full",
                    "%s: %d connections open (max_connections); closing the oldest idle one for each new one",
                    self.name,
                    len(self._conns),
                )
                self._evict(victim)
            conn = _Conn(sock, time.monotonic() + self.request_timeout_s)
            self._conns[conn] = None
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evictable(self) -> _Conn | None:
        """The oldest connection done with (lingering), else the oldest without a request,
        else the oldest waiting for its answer: requests that wait (a snapshot with no fresh
        frame) must not be able to fill every slot and lock new clients out."""
        for state in (_LINGERING, _READING, _WAITING):
            for conn in self._conns:
                if conn.state == state:
                    return conn
        return None

    def _evict(self, conn: _Conn) -> None:
        """Close ``conn`` to make room; one waiting for its answer is told 503, best effort
        (a short answer into an empty send buffer: it never blocks)."""
        if conn.state == _WAITING:
            with contextlib.suppress(OSError):
                busy = self._plain(503, b"too many connections; try again\n", head_only=conn.head_only)
                conn.sock.send(busy)
        self._drop(conn)

    def _expire(self, now: float) -> None:
        if self._paused_until and now >= self._paused_until and self._sock is not None:
            self._paused_until = 0.0
            assert self._sel is not None
            self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        for conn in [c for c in self._conns if c.deadline <= now]:
            if conn.state == _READING and conn.buf:  # a partial request: say why, best effort
                with contextlib.suppress(OSError):
                    conn.sock.send(self._plain(408))
            self._drop(conn, abort=conn.state == _WRITING)

    def _drop(self, conn: _Conn, abort: bool = False) -> None:
        self._conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            assert self._sel is not None
            self._sel.unregister(conn.sock)
        if abort:  # a client that does not read: discard what it did not take (RST)
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.sock.close()
        self._end_stream(conn)

    def _end_stream(self, conn: _Conn) -> None:
        stream, conn.stream, conn.pending = conn.stream, None, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                self._log_once("stream-close", "%s: closing a stream failed", self.name)

    def _receive(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data and conn.state in (_WAITING, _STREAMING):
            # A half-close after the request (``nc -N``): still owed its answer; stop reading.
            conn.eof = True
            self._watch(conn, selectors.EVENT_READ)
        elif not data:
            self._drop(conn)
        elif conn.state != _READING:  # after the request: read and discard, up to a bound
            conn.drained += len(data)
            if conn.drained > _LINGER_BYTES:
                self._drop(conn)
        else:
            conn.buf += data
            self._parse(conn)

    def _parse(self, conn: _Conn) -> None:
        try:
            request = parse_head(bytes(conn.buf), self.max_request_bytes, self.allowed_hosts, self.setting)
        except RequestRefused as e:
            self._respond(conn, self._plain(e.status, e.body, head_only=e.head_only, extra=e.headers))
            return
        if request is None:  # not whole yet
            return
        conn.head_only = request.method == "HEAD"
        answer = self._handle(request)
        if isinstance(answer, Response):
            self._start_response(conn, answer)
        else:  # not ready: polled from now on
            conn.state, conn.pending, conn.buf = _WAITING, answer, bytearray()
            conn.deadline = time.monotonic() + self.stream_idle_s
            self._watch(conn, selectors.EVENT_READ)
            self._poll_one(conn)

    def _poll_one(self, conn: _Conn) -> None:
        pending = conn.pending
        assert pending is not None
        response = self._guarded("a waiting answer", pending)
        if response is not None:
            self._start_response(conn, response)

    def _handle(self, request: Request) -> Response | Deferred:
        return self._guarded(request.path, lambda: self.handle(request))

    def _guarded(self, what: str, answer: Callable[[], _T]) -> _T | Response:
        """``answer()``, or a 500 when it raises (each new failure logged once, with its traceback)."""
        try:
            result = answer()
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
            if message != self._last_error:
                log.exception("%s: answering %s failed; the request gets 500", self.name, what)
            else:
                log.debug("%s: answering failed again: %s", self.name, message)
            self._last_error = message
            return Response(500)
        if result is not None:  # a waiting answer's "not yet" says nothing about failures
            self._last_error = ""
        return result

    def _start_response(self, conn: _Conn, response: Response) -> None:
        conn.pending = None
        stream = response.stream
        if stream is not None and conn.head_only:
            with contextlib.suppress(Exception):
                stream.close()
            stream = None
        if response.send_buffer:
            # Small: a slow reader holds a part or so in the kernel, then gets the newest one.
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, response.send_buffer)
        conn.stream = stream
        data = _response(
            response.status,
            response.body,
            response.content_type,
            head_only=conn.head_only,
            extra=(*response.headers, *self.headers),
            length=response.stream is None,
        )
        self._respond(conn, data)

    def _plain(
        self, status: int, body: bytes = b"", *, head_only: bool = False, extra: tuple[str, ...] = ()
    ) -> bytes:
        return _response(status, body, head_only=head_only, extra=(*extra, *self.headers))

    def _respond(self, conn: _Conn, data: bytes) -> None:
        conn.buf = bytearray()
        self._write(conn, data)

    def _write(self, conn: _Conn, data: bytes) -> None:
        conn.state, conn.out = _WRITING, memoryview(data)
        conn.deadline = time.monotonic() + self.write_timeout_s
        self._send(conn)
        if conn.state == _WRITING and conn in self._conns:
            self._watch(conn, selectors.EVENT_WRITE)

    def _send(self, conn: _Conn) -> None:
        while conn.out:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # reset by the client
                self._drop(conn)
                return
            conn.out = conn.out[sent:]
        if conn.stream is not None and not conn.stream.done():  # wait for the next part
            conn.state, conn.deadline = _STREAMING, time.monotonic() + self.stream_idle_s
            self._watch(conn, selectors.EVENT_READ)
            return
        self._finish(conn)

    def _finish(self, conn: _Conn) -> None:
        """All sent: half-close, and read what the client still sends until it closes, so
        that closing with unread input (a reset) cannot destroy the response in flight."""
        self._end_stream(conn)
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        if conn.eof:  # the client sends nothing more: nothing to linger for
            self._drop(conn)
            return
        conn.state, conn.deadline = _LINGERING, time.monotonic() + _LINGER_S
        self._watch(conn, selectors.EVENT_READ)

    def _watch(self, conn: _Conn, events: int) -> None:
        """Select ``conn`` for ``events``; never for reading once the client has half-closed
        (its end of stream would wake the loop at once, for ever)."""
        assert self._sel is not None
        if events == selectors.EVENT_READ and conn.eof:
            with contextlib.suppress(KeyError, ValueError):
                self._sel.unregister(conn.sock)
            return
        try:
            self._sel.modify(conn.sock, events, conn)
        except KeyError:  # unregistered after a half-close
            self._sel.register(conn.sock, events, conn)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._warned:
            log.debug(message, *args)
        else:
            self._warned.add(key)
            log.warning(message, *args, exc_info=key.startswith("conn:"))
