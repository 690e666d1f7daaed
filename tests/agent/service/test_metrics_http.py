"""The /metrics HTTP server under abuse: real sockets, real HTTP, the server in this process.

Its limits (connections held, request and write deadlines, head size) are what keep a
port scanner, a TLS client or a stuck scraper from using up the agent's file descriptors.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import wait_until
from prometheus_client.core import GaugeMetricFamily

from edge_agent.service.http_endpoint import HttpEndpoint
from edge_agent.service.http_request import Request
from edge_agent.service.http_response import Deferred, Response
from edge_agent.service.metrics import AgentCollector, MetricsServer

#: File descriptors the server may hold beyond its connections at a moment we look.
SLACK = 4


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def serving(host: str = "127.0.0.1", port: int = 0, **limits) -> Iterator[MetricsServer]:
    """A started server for an agent with no pipeline (only the process metrics)."""
    server = MetricsServer(AgentCollector(SimpleNamespace(pipeline=None)), host, port, **limits)
    server.start()
    try:
        yield server
    finally:
        server.close()


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        return r.status, r.read().decode()


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """What the server sends before it closes (end of stream or a reset); AssertionError
    when it keeps the connection open for ``timeout_s``."""
    sock.settimeout(timeout_s)
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open for {timeout_s} s") from None
        if not chunk:
            return data
        data += chunk


def exchange(port: int, payload: bytes, timeout_s: float = 30) -> bytes:
    """Send ``payload`` on a fresh connection, say nothing more, and return what comes back
    before the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(payload)
        return read_until_closed(sock, timeout_s)


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1."), response[:80]
    return int(response.split(b" ", 2)[1])


def test_hundreds_of_idle_connections_neither_pile_up_nor_delay_a_scrape(many_fds):
    n, cap = 500, 16
    with serving(max_connections=cap, request_timeout_s=120) as server:
        baseline = fd_count()
        clients: list[socket.socket] = []
        try:
            for i in range(n):
                clients.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
                if i % 20 == 19:
                    held = fd_count() - len(clients) - baseline
                    assert held <= cap + SLACK, f"server holds {held} fds after {i + 1} idle connections"
            status, text = scrape(server.port)  # queued behind all of them, answered at once
            assert status == 200 and "process_cpu_seconds_total" in text
            held = fd_count() - len(clients) - baseline
            assert held <= cap + SLACK, f"server holds {held} fds with {n} idle connections open"
            assert read_until_closed(clients[0], 30) == b"", "the oldest idle connection made room"
        finally:
            for c in clients:
                c.close()


def test_a_running_agent_is_scraped_while_idle_connections_flood_its_port(const_model, endpoint):
    from helpers import free_port, running_agent

    port = free_port()
    with running_agent(const_model, endpoint, port) as agent:
        wait_until(lambda: agent.pipeline.published() >= 1, 30, message="a result before the scrape")
        clients = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(100)]
        try:
            status, text = scrape(port)
            assert read_until_closed(clients[0], 30) == b"", "the oldest idle connection made room"
        finally:
            for c in clients:
                c.close()
    assert status == 200 and "edge_agent_frames_captured_total" in text


@pytest.mark.parametrize(
    "payload",
    [b"", b"GET /metr", b"hello"],
    ids=["silent", "half a request line", "letters without a newline"],
)
def test_a_connection_without_a_whole_request_is_closed_after_the_request_timeout(payload):
    with serving(request_timeout_s=0.5) as server:
        response = exchange(server.port, payload)
    if response:  # a started request is told why
        assert status_of(response) == 408


@pytest.mark.parametrize(
    "payload",
    [
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32),  # a TLS ClientHello's start
        b"GET /metrics\r\n",  # HTTP/0.9: no version, then silence
        b"\x00\xff\x13\x37 not http at all",
    ],
    ids=["tls hello", "http/0.9", "binary garbage"],
)
def test_what_is_not_http_is_answered_400_and_closed_at_once(payload):
    # The request timeout is far longer than the wait for the close.
    with serving(request_timeout_s=300) as server:
        assert status_of(exchange(server.port, payload, timeout_s=60)) == 400


def test_an_oversized_request_head_is_refused_and_closed():
    with serving(max_request_bytes=8192, request_timeout_s=300) as server:
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Padding: " + b"a" * 20000 + b"\r\n\r\n"
        assert status_of(exchange(server.port, head, timeout_s=60)) in (400, 431)
        endless = b"GET /metrics HTTP/1.1\r\n" + b"X-Padding: aaaaaaaaaaaaaaaa\r\n" * 1000
        assert status_of(exchange(server.port, endless, timeout_s=60)) in (400, 431)
        assert scrape(server.port)[0] == 200


def test_only_get_of_metrics_is_served():
    with serving() as server:
        with pytest.raises(urllib.error.HTTPError) as e:
            scrape(server.port, "/nope")
        assert e.value.code == 404
        request = urllib.request.Request(f"http://127.0.0.1:{server.port}/metrics", data=b"x=1")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(request, timeout=30)
        assert e.value.code == 405
        response = exchange(server.port, b"GET /metrics?name[]=x HTTP/1.0\r\n\r\n")
        assert status_of(response) == 200 and b"\r\nConnection: close\r\n" in response
        assert b"text/plain; version=" in response


class HugeCollector:
    """One gauge with a help text of ``size`` bytes, for a response that cannot fit in
    the socket buffers."""

    def __init__(self, size: int) -> None:
        self.size = size

    def collect(self):
        yield GaugeMetricFamily("test_huge", "x" * self.size, value=1)


def server_side_open(client: socket.socket, server_port: int) -> bool:
    """Whether this process still holds the server's end of ``client``'s connection (its
    socket inode, found in /proc/net/tcp by the two ports, among our descriptors). Unlike
    a count of descriptors, no other descriptor closing meanwhile can change the answer."""
    client_port = client.getsockname()[1]
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if int(f[1].rsplit(":", 1)[1], 16) == server_port and int(f[2].rsplit(":", 1)[1], 16) == client_port:
            inodes.add(f"socket:[{f[9]}]")
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") in inodes:
                return True
        except OSError:  # closed meanwhile
            pass
    return False


def test_a_client_that_does_not_read_its_response_is_dropped_after_the_write_timeout():
    wmem_max = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    size = 2 * wmem_max + (1 << 20)  # beyond what the kernel buffers on both sides take
    with serving(write_timeout_s=1.0, request_timeout_s=300) as server:
        server.registry.register(HugeCollector(size))
        stuck = socket.socket()
        try:
            stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting
            stuck.settimeout(30)
            stuck.connect(("127.0.0.1", server.port))
            stuck.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            # Another scrape is answered while that one waits on a client that does not read.
            status, text = scrape(server.port)
            assert status == 200 and len(text) > size
            wait_until(
                lambda: not server_side_open(stuck, server.port),
                30,
                message="the server closes the connection of a client that does not read",
            )
            assert len(read_until_closed(stuck, 30)) < size, "the response was abandoned"
            assert scrape(server.port)[0] == 200
        finally:
            stuck.close()


@pytest.mark.parametrize(("host", "warned"), [("0.0.0.0", True), ("127.0.0.1", False)])
def test_metrics_on_a_non_loopback_address_warn_that_anyone_can_read_them(caplog, host, warned):
    with caplog.at_level(logging.WARNING, logger="edge_agent.service.metrics"), serving(host) as server:
        assert server.port != 0
        assert scrape(server.port)[0] == 200
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("anyone who can reach the port" in w and "127.0.0.1" in w for w in warnings) == warned, (
        warnings
    )


def metrics_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "metrics"]


def test_close_ends_the_thread_closes_every_socket_and_frees_the_port():
    assert not metrics_threads()
    gc.collect()  # sockets earlier tests dropped are closed now, not in the middle of this one
    baseline = fd_count()
    server = MetricsServer(
        AgentCollector(SimpleNamespace(pipeline=None)), "127.0.0.1", 0, request_timeout_s=300
    )
    server.start()
    port = server.port
    idle = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        assert len(metrics_threads()) == 1
        assert scrape(port)[0] == 200
        server.close()
        assert not metrics_threads(), "close() waits for the server thread"
        assert read_until_closed(idle, 30) == b"", "open connections are closed"
        assert fd_count() == baseline + 1, "only the client's own socket is left"
        with serving(port=port) as again:  # the same port, at once
            assert again.port == port and scrape(port)[0] == 200
    finally:
        idle.close()
        server.close()


def test_a_taken_port_is_logged_with_the_settings_named_and_is_not_fatal(caplog):
    """Consistent with the live view: neither the metrics nor the view is needed for the
    results, so a port another program holds costs that endpoint only, said loudly."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING, logger="edge_agent"), serving(port=port) as server:
            assert not server.http.listening
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("metrics.host" in w and "metrics.port" in w and str(port) in w for w in warnings), warnings


# Answers that wait (a snapshot waiting for a frame) and streams, on the endpoint the view uses.


@contextlib.contextmanager
def endpoint_for(handle, **limits) -> Iterator[HttpEndpoint]:
    server = HttpEndpoint("127.0.0.1", 0, handle=handle, name="test-http", **limits)
    server.start()
    try:
        yield server
    finally:
        server.close()


class Parts:
    """A stream of ``parts``, each sent once ``go`` is set."""

    def __init__(self, parts: list[bytes], go: threading.Event) -> None:
        self.parts, self.go = list(parts), go

    def next_part(self) -> bytes | None:
        return self.parts.pop(0) if self.go.is_set() and self.parts else None

    def done(self) -> bool:
        return not self.parts

    def close(self) -> None:
        pass


def half_closed_exchange(port: int, path: str, go: threading.Event, server: HttpEndpoint) -> bytes:
    """Send a request, half-close (``nc -N``), let the answer come, return all of it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        sock.shutdown(socket.SHUT_WR)
        threading.Timer(0.5, lambda: (go.set(), server.wake())).start()  # after the EOF was seen
        return read_until_closed(sock, 30)


def test_a_client_that_half_closes_after_its_request_still_gets_a_waiting_answer_and_a_stream():
    go = threading.Event()

    def handle(request: Request) -> Response | Deferred:
        if request.path == "/stream":
            return Response(200, stream=Parts([b"one;", b"two;", b"three;"], go))
        return lambda: Response(200, b"ready\n") if go.is_set() else None

    with endpoint_for(handle) as server:
        waited = half_closed_exchange(server.port, "/wait", go, server)
        assert status_of(waited) == 200 and waited.endswith(b"ready\n"), waited
        go.clear()
        streamed = half_closed_exchange(server.port, "/stream", go, server)
        assert status_of(streamed) == 200 and streamed.endswith(b"one;two;three;"), streamed


def test_a_waiting_answer_that_raises_is_answered_500():
    def handle(request: Request) -> Deferred:
        def broken() -> Response | None:
            raise RuntimeError("a bug in a waiting answer")

        return broken

    with endpoint_for(handle) as server:
        for _ in range(2):  # and the server goes on answering
            assert status_of(exchange(server.port, b"GET /x HTTP/1.1\r\nHost: a\r\n\r\n")) == 500


def test_answers_that_wait_cannot_fill_every_slot():
    """Connections waiting for an answer that will not come soon are closed (503), oldest
    first, to make room: a new client is answered, not reset."""
    cap = 4

    def handle(request: Request) -> Response | Deferred:
        if request.path == "/wait":
            return lambda: None  # answered by the deadline (stream_idle_s) at the latest
        return Response(200, b"ok\n")

    with endpoint_for(handle, max_connections=cap, stream_idle_s=120) as server:
        waiting = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(cap)]
        try:
            for sock in waiting:
                sock.sendall(b"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n")
            wait_until(
                lambda: sum(c.state == "waiting" for c in list(server._conns)) == cap,
                30,
                message="every slot holds a waiting answer",
            )
            assert status_of(exchange(server.port, b"GET /now HTTP/1.1\r\nHost: a\r\n\r\n")) == 200
            assert status_of(read_until_closed(waiting[0], 30)) == 503, "the oldest waiting one made room"
        finally:
            for sock in waiting:
                sock.close()


# Heads that break HTTP/1.1's grammar where it says a server MUST refuse (RFC 9112 §5.1,
# RFC 9110 §5.5, §8.6; issue 43): the old server answered them 200. Whatever a proxy in
# front or the server make of them must not differ.
MALFORMED_HEADS = {
    "space before the colon": b"GET /metrics HTTP/1.1\r\nHost : localhost\r\n\r\n",
    "NUL in a value": b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-A: a\x00b\r\n\r\n",
    "bare CR in a value": b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-A: a\rb\r\n\r\n",
    "a name that is not a token": b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nX(y): 1\r\n\r\n",
    "two Content-Lengths that differ": (
        b"GET /metrics HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 99\r\n\r\nx"
    ),
    "a Content-Length that is no number": b"GET /metrics HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    "a Host that is no host": b"GET /metrics HTTP/1.1\r\nHost: a b\r\n\r\n",
    "a Host with junk after its address": b"GET /metrics HTTP/1.1\r\nHost: [::1]evil.example\r\n\r\n",
    "a port that is no number": b"GET /metrics HTTP/1.1\r\nHost: localhost:notaport\r\n\r\n",
}


@pytest.mark.parametrize("head", MALFORMED_HEADS.values(), ids=list(MALFORMED_HEADS))
def test_a_head_outside_http_grammar_is_answered_400(head):
    with serving(request_timeout_s=300) as server:
        response = exchange(server.port, head, timeout_s=60)
        assert status_of(response) == 400, response[:200]
        assert scrape(server.port)[0] == 200
