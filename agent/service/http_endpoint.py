"""A small read-only HTTP endpoint that holds up on the open network: the /metrics server,
and the live view's.

Not prometheus_client's ``start_http_server``: that one keeps every connection as long as
the client likes, a thread and a file descriptor each, with no read timeout, so idle or
half-open connections (a port scanner, a TLS hello, an HTTP/0.9 line) could use up the
process's descriptors and starve scrapes, the result stream and reloads. This one is one
thread over non-blocking sockets with a cap on connections (the oldest idle one makes
room for a new one: ``http_connections``), a deadline for the whole request head (not per
read: a client trickling a byte at a time is cut off all the same), a size limit on it, a
deadline for taking each response or part, and ``Connection: close`` on every answer. It
serves ``GET`` and ``HEAD``: of one path (``render``), or of whatever ``handle`` answers
(the live view: pages, JSON, answers that wait for a frame, MJPEG streams; called through
``http_handler``), and has no authentication of its own. With ``allowed_hosts`` it answers
only requests whose ``Host`` names one of them (DNS rebinding: a web page whose name now
points at this machine cannot read it). The request head is read by
``http_request.parse_head``, a pure function of the bytes received so far; what a handler
answers is an ``http_response.Response``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from edge_agent.service.http_connections import (
    LINGERING,
    READING,
    STREAMING,
    WAITING,
    WRITING,
    Connection,
    Connections,
)
from edge_agent.service.http_handler import GuardedHandler, Handle, one_resource
from edge_agent.service.http_request import RequestRefused, host_name, parse_head
from edge_agent.service.http_response import Response, encode_response

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 1.0  # a close waits this long for the server thread

_LINGER_S = 2.0  # after a response: read and discard what the client still sends, then close
_LINGER_BYTES = 64 * 1024


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
        handle: Handle | None = None,
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
            handle = one_resource(path, render)
        self.handle = handle
        self.name = name
        self._answers = GuardedHandler(handle, name)
        self.setting = setting or name
        self.allowed_hosts = None if allowed_hosts is None else frozenset(map(host_name, allowed_hosts))
        self.headers = headers
        self.url = ""
        self.bind_error = ""  # why it does not listen, when it does not
        self.request_timeout_s = request_timeout_s
        self.write_timeout_s = write_timeout_s
        self.stream_idle_s = stream_idle_s
        self.max_request_bytes = max_request_bytes
        self.backlog = backlog
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._sel: selectors.BaseSelector | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        self._conns = Connections(max_connections)
        self._stopping = False
        self._paused_until = 0.0  # accepting paused (out of fds) until then
        self._warned: set[str] = set()

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

    def _ready(self, conn: Connection, events: int) -> None:
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
        for conn in self._conns.in_state(WAITING, STREAMING):
            try:
                if conn.state == WAITING:
                    self._poll_one(conn)
                else:
                    self._next_part(conn)
            except Exception as e:
                self._log_once(
                    f"conn:{type(e).__name__}", "%s: dropping a connection after an error", self.name
                )
                self._drop(conn)

    def _next_part(self, conn: Connection) -> None:
        assert conn.stream is not None
        part = conn.stream.next_part()
        if part:
            self._write(conn, part)
        elif conn.stream.done():
            self._finish(conn)

    def _accept(self) -> None:
        assert self._sock is not None and self._sel is not None
        for _ in range(self._conns.limit + self.backlog):
            try:
                sock, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    victim = self._conns.evictable()
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
            if self._conns.full:
                victim = self._conns.evictable()
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
            conn = Connection(sock, time.monotonic() + self.request_timeout_s)
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _evict(self, conn: Connection) -> None:
        """Close ``conn`` to make room; one waiting for its answer is told 503, best effort
        (a short answer into an empty send buffer: it never blocks)."""
        if conn.state == WAITING:
            with contextlib.suppress(OSError):
                busy = self._plain(503, b"too many connections; try again\n", head_only=conn.head_only)
                conn.sock.send(busy)
        self._drop(conn)

    def _expire(self, now: float) -> None:
        if self._paused_until and now >= self._paused_until and self._sock is not None:
            self._paused_until = 0.0
            assert self._sel is not None
            self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        for conn in self._conns.expired(now):
            if conn.state == READING and conn.buf:  # a partial request: say why, best effort
                with contextlib.suppress(OSError):
                    conn.sock.send(self._plain(408))
            self._drop(conn, abort=conn.state == WRITING)

    def _drop(self, conn: Connection, abort: bool = False) -> None:
        self._conns.remove(conn)
        with contextlib.suppress(KeyError, ValueError):
            assert self._sel is not None
            self._sel.unregister(conn.sock)
        if abort:  # a client that does not read: discard what it did not take (RST)
            with contextlib.suppress(OSError):
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.sock.close()
        self._end_stream(conn)

    def _end_stream(self, conn: Connection) -> None:
        stream, conn.stream, conn.pending = conn.stream, None, None
        if stream is not None:
            try:
                stream.close()
            except Exception:
                self._log_once("stream-close", "%s: closing a stream failed", self.name)

    def _receive(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data and conn.state in (WAITING, STREAMING):
            # A half-close after the request (``nc -N``): still owed its answer; stop reading.
            conn.eof = True
            self._watch(conn, selectors.EVENT_READ)
        elif not data:
            self._drop(conn)
        elif conn.state != READING:  # after the request: read and discard, up to a bound
            conn.drained += len(data)
            if conn.drained > _LINGER_BYTES:
                self._drop(conn)
        else:
            conn.buf += data
            self._parse(conn)

    def _parse(self, conn: Connection) -> None:
        try:
            request = parse_head(bytes(conn.buf), self.max_request_bytes, self.allowed_hosts, self.setting)
        except RequestRefused as e:
            self._respond(conn, self._plain(e.status, e.body, head_only=e.head_only, extra=e.headers))
            return
        if request is None:  # not whole yet
            return
        conn.head_only = request.method == "HEAD"
        answer = self._answers.answer(request)
        if isinstance(answer, Response):
            self._start_response(conn, answer)
        else:  # not ready: polled from now on
            conn.state, conn.pending, conn.buf = WAITING, answer, bytearray()
            conn.deadline = time.monotonic() + self.stream_idle_s
            self._watch(conn, selectors.EVENT_READ)
            self._poll_one(conn)

    def _poll_one(self, conn: Connection) -> None:
        pending = conn.pending
        assert pending is not None
        response = self._answers.poll(pending)
        if response is not None:
            self._start_response(conn, response)

    def _start_response(self, conn: Connection, response: Response) -> None:
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
        data = encode_response(
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
        return encode_response(status, body, head_only=head_only, extra=(*extra, *self.headers))

    def _respond(self, conn: Connection, data: bytes) -> None:
        conn.buf = bytearray()
        self._write(conn, data)

    def _write(self, conn: Connection, data: bytes) -> None:
        conn.state, conn.out = WRITING, memoryview(data)
        conn.deadline = time.monotonic() + self.write_timeout_s
        self._send(conn)
        if conn.state == WRITING and conn in self._conns:
            self._watch(conn, selectors.EVENT_WRITE)

    def _send(self, conn: Connection) -> None:
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
            conn.state, conn.deadline = STREAMING, time.monotonic() + self.stream_idle_s
            self._watch(conn, selectors.EVENT_READ)
            return
        self._finish(conn)

    def _finish(self, conn: Connection) -> None:
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
        conn.state, conn.deadline = LINGERING, time.monotonic() + _LINGER_S
        self._watch(conn, selectors.EVENT_READ)

    def _watch(self, conn: Connection, events: int) -> None:
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
