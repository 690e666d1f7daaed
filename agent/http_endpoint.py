"""A small read-only HTTP endpoint that holds up on the open network: the /metrics server.

Not prometheus_client's ``start_http_server``: that one keeps every connection as long as
the client likes, a thread and a file descriptor each, with no read timeout, so idle or
half-open connections (a port scanner, a TLS hello, an HTTP/0.9 line) could use up the
process's descriptors and starve scrapes, the result stream and reloads. This one is one
thread over non-blocking sockets with a cap on connections (the oldest idle one makes
room for a new one), a deadline for the request head, a size limit on it, a deadline for
taking the response, and ``Connection: close`` on every answer. It serves ``GET`` and
``HEAD`` of one path and has no authentication.
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
from http import HTTPStatus
from typing import Any

log = logging.getLogger(__name__)

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
#: A whole request line (``\r`` stripped): method, target, HTTP major and minor.
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb"{1,32}) ([\x21-\x7e]+) HTTP/(\d)\.(\d)")
#: What a request line may look like before its end has arrived; anything else (a TLS
#: hello, binary, a space first) is answered 400 at once instead of waiting for more.
_REQUEST_LINE_START = re.compile(
    _TOKEN + rb"{1,32}(?: (?:[\x21-\x7e]+(?: (?:H(?:T(?:T(?:P(?:/(?:\d(?:\.\d?)?)?)?)?)?)?)?)?)?)?"
)
_READING, _WRITING, _LINGERING = "reading", "writing", "lingering"
_LINGER_S = 2.0  # after a response: read and discard what the client still sends, then close
_LINGER_BYTES = 64 * 1024


def _response(
    status: int,
    body: bytes = b"",
    content_type: str = "text/plain; charset=utf-8",
    *,
    head_only: bool = False,
    extra: tuple[str, ...] = (),
) -> bytes:
    if not body and status != 200:
        body = f"{status} {HTTPStatus(status).phrase}\n".encode()
    head = "\r\n".join(
        (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Connection: close",
            *extra,
        )
    )
    data = head.encode("latin-1") + b"\r\n\r\n"
    return data if head_only else data + body


class _Conn:
    """One client connection: its request head so far, then its response."""

    __slots__ = ("buf", "deadline", "drained", "out", "sock", "state")

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.state = _READING
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.deadline = deadline
        self.drained = 0


class HttpEndpoint:
    """One read-only HTTP resource (``GET``/``HEAD path``); failure to bind is logged,
    never fatal.

    One thread (named ``name``) runs a selector loop over non-blocking sockets. At most
    ``max_connections`` are held: one more closes the oldest that has not sent a whole
    request yet (or the new one when all are being answered). A request head must
    arrive within ``request_timeout_s`` and be at most ``max_request_bytes``; a response
    not taken by the client within ``write_timeout_s`` is abandoned. Every response
    closes its connection.
    """

    def __init__(
        self,
        host: str,
        port: int,
        path: str,
        render: Callable[[], tuple[bytes, str]],
        *,
        name: str = "http",
        max_connections: int = 16,
        request_timeout_s: float = 5.0,
        write_timeout_s: float = 10.0,
        max_request_bytes: int = 8192,
        backlog: int = 64,
    ) -> None:
        """``render``: the resource's body and content type, made at each request (an
        exception answers 500)."""
        self.host, self.port = host, port
        self.path = path.encode()
        self.render = render
        self.name = name
        self.url = ""
        self.max_connections = max(1, max_connections)
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
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

    def start(self) -> None:
        try:
            self._sock = self._listen()
        except OSError as e:
            log.warning(
                "%s: cannot listen on %s:%d (%s); running without it", self.name, self.host, self.port, e
            )
            return
        self.port = self._sock.getsockname()[1]  # the real one when 0 asked for any
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.url = f"http://{host}:{self.port}{self.path.decode()}"
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

    def close(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        if self._wake is not None:
            with contextlib.suppress(OSError):
                self._wake[1].send(b"\0")
        thread.join(1.0)
        if thread.is_alive():  # stuck in a collector: free the port now, the rest when it returns
            log.warning("%s: the server thread did not stop within 1 s", self.name)
            if self._sock is not None:
                self._sock.close()
        self._thread = None

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
                            key.fileobj.recv(64)  # type: ignore[union-attr]
                    elif key.data in self._conns:
                        self._ready(key.data, events)
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
                        self._drop(victim)
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
                self._drop(victim)
            conn = _Conn(sock, time.monotonic() + self.request_timeout_s)
            self._conns[conn] = None
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evictable(self) -> _Conn | None:
        """The oldest connection done with (lingering), else the oldest without a request."""
        for state in (_LINGERING, _READING):
            for conn in self._conns:
                if conn.state == state:
                    return conn
        return None

    def _expire(self, now: float) -> None:
        if self._paused_until and now >= self._paused_until and self._sock is not None:
            self._paused_until = 0.0
            assert self._sel is not None
            self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        for conn in [c for c in self._conns if c.deadline <= now]:
            if conn.state == _READING and conn.buf:  # a partial request: say why, best effort
                with contextlib.suppress(OSError):
                    conn.sock.send(_response(408))
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

    def _receive(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
        elif conn.state == _LINGERING:
            conn.drained += len(data)
            if conn.drained > _LINGER_BYTES:
                self._drop(conn)
        else:
            conn.buf += data
            self._parse(conn)

    def _parse(self, conn: _Conn) -> None:
        buf = bytes(conn.buf).lstrip(b"\r\n")
        end_of_line = buf.find(b"\n")
        if end_of_line < 0:
            line = buf.rstrip(b"\r")
            if line and not _REQUEST_LINE_START.fullmatch(line):
                self._respond(conn, _response(400, b"not an HTTP/1.x request\n"))
            elif len(conn.buf) > self.max_request_bytes:
                self._respond(conn, _response(431))
            return
        request = _REQUEST_LINE.fullmatch(buf[:end_of_line].rstrip(b"\r"))
        if request is None:  # HTTP/0.9 (no version), garbage with a newline
            self._respond(conn, _response(400, b"not an HTTP/1.x request\n"))
            return
        ends = [i for i in (buf.find(b"\n\r\n", end_of_line), buf.find(b"\n\n", end_of_line)) if i >= 0]
        if not ends:
            if len(conn.buf) > self.max_request_bytes:
                self._respond(conn, _response(431))
            return
        if min(ends) + 3 > self.max_request_bytes:
            self._respond(conn, _response(431))
            return
        headers = buf[end_of_line + 1 : min(ends)].split(b"\n")
        if any(b":" not in h or h[:1] in (b" ", b"\t") for h in headers if h.strip(b"\r")):
            self._respond(conn, _response(400, b"malformed header\n"))
            return
        method, target, major = request.group(1), request.group(2), request.group(3)
        if major != b"1":
            self._respond(conn, _response(505))
        elif method not in (b"GET", b"HEAD"):
            self._respond(conn, _response(405, extra=("Allow: GET, HEAD",)))
        elif target.split(b"?", 1)[0] != self.path:
            self._respond(conn, _response(404, b"the resource is at " + self.path + b"\n"))
        else:
            self._respond(conn, self._render(head_only=method == b"HEAD"))

    def _render(self, head_only: bool) -> bytes:
        try:
            body, content_type = self.render()
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
            if message != self._last_error:  # each new failure once, with its traceback
                log.exception("%s: rendering %s failed; the request gets 500", self.name, self.path.decode())
            else:
                log.debug("%s: rendering failed again: %s", self.name, message)
            self._last_error = message
            return _response(500, head_only=head_only)
        self._last_error = ""
        return _response(200, body, content_type, head_only=head_only)

    def _respond(self, conn: _Conn, data: bytes) -> None:
        conn.state, conn.out, conn.buf = _WRITING, memoryview(data), bytearray()
        conn.deadline = time.monotonic() + self.write_timeout_s
        self._send(conn)
        if conn.state == _WRITING and conn in self._conns:
            assert self._sel is not None
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)

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
        # All sent: half-close, and read what the client still sends until it closes, so
        # that closing with unread input (a reset) cannot destroy the response in flight.
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._drop(conn)
            return
        conn.state, conn.deadline = _LINGERING, time.monotonic() + _LINGER_S
        assert self._sel is not None
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _log_once(self, key: str, message: str, *args: Any) -> None:
        if key in self._warned:
            log.debug(message, *args)
        else:
            self._warned.add(key)
            log.warning(message, *args, exc_info=key.startswith("conn:"))
