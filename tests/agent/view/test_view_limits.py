"""The live view against a hostile local process (issue 30, items 2, 3, 9 and 10): a flood of
connections and slow-trickle clients, a foreign Host header, non-ASCII source names, a taken
port and an IPv6 loopback host. A real agent on the synthetic camera, real sockets, real HTTP."""

from __future__ import annotations

import contextlib
import gc
import http.client
import logging
import os
import select
import socket
import threading
import time
from dataclasses import replace

import pytest
from conftest import started, wait_until
from helpers import free_port
from test_view import config, get

from edge_agent.core.configfields import FieldError
from edge_agent.core.endpoint_config import ViewConfig
from edge_agent.core.source_config import SyntheticSourceConfig

CAP = 32  # edge_agent.service.view.server.MAX_CONNECTIONS
SLACK = 8  # descriptors the agent may open or close meanwhile (sockets, files)
SECURITY_HEADERS = {
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def thread_errors(monkeypatch) -> list[str]:
    """Exceptions that end a thread (a server loop dying prints a traceback, not a log record)."""
    seen: list[str] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(repr(args.exc_value)))
    return seen


def request(
    port: int, path: str, host: str | None = None, timeout_s: float = 30, address: str = "127.0.0.1"
) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection(address, port, timeout=timeout_s)
    try:
        conn.putrequest("GET", path, skip_host=host is not None)
        if host is not None:
            conn.putheader("Host", host)
        conn.endheaders()
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:  # refused or timed out: an attempt all the same
        return None


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (end of stream, a reset, or a 408 before it)."""
    ready, _, _ = select.select([sock], [], [], 0)
    if not ready:
        return False
    try:
        while sock.recv(65536):
            pass
    except BlockingIOError:
        return False
    except OSError:
        pass
    return True


class Tricklers:
    """``n`` clients that each send one byte of a request every ``every_s`` seconds, in a
    thread, until the server closes them or ``limit_s`` passes; when each was closed."""

    def __init__(self, port: int, n: int, every_s: float, limit_s: float) -> None:
        self.request = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        self.socks = [s for s in (connect(port) for _ in range(n)) if s is not None]
        for s in self.socks:
            s.setblocking(False)
        self.opened = time.monotonic()
        self.closed_after: dict[int, float] = {}
        self.every_s, self.limit_s = every_s, limit_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tricklers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        sent = 0
        while not self._stop.is_set() and time.monotonic() - self.opened < self.limit_s:
            for i, s in enumerate(self.socks):
                if i in self.closed_after:
                    continue
                if closed_by_server(s):
                    self.closed_after[i] = time.monotonic() - self.opened
                    continue
                with contextlib.suppress(BlockingIOError):
                    try:
                        s.send(self.request[sent : sent + 1])
                    except OSError:
                        self.closed_after[i] = time.monotonic() - self.opened
            sent = min(sent + 1, len(self.request) - 1)
            if len(self.closed_after) == len(self.socks):
                return
            self._stop.wait(self.every_s)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for s in self.socks:
            s.close()


def server_held(baseline: int, clients: int) -> int:
    return fd_count() - clients - baseline


def test_a_flood_and_slow_tricklers_hold_at_most_the_cap_and_a_get_is_still_answered(
    const_model, many_fds, thread_errors, caplog
):
    port = free_port()
    flood: list[socket.socket] = []
    tricklers: Tricklers | None = None
    with caplog.at_level(logging.DEBUG), started(config(const_model, port)) as agent:
        try:
            wait_until(lambda: agent.pipeline.published() >= 5, 30, message="frames flow")
            gc.collect()
            baseline, threads = fd_count(), threading.active_count()
            for _ in range(400):
                s = connect(port)
                if s is not None:
                    flood.append(s)
            # 50 clients sending one byte every 2 s: each keeps a per-read timeout alive forever.
            tricklers = Tricklers(port, 50, every_s=2.0, limit_s=40)
            time.sleep(1.0)  # the server has taken what it takes
            clients = len(flood) + len(tricklers.socks)
            held = server_held(baseline, clients)
            assert held <= CAP + SLACK, f"the view holds {held} descriptors for {clients} connections"
            assert threading.active_count() <= threads + 2, "no thread per connection"
            began = time.monotonic()
            status, _, body = request(port, "/api/health", timeout_s=30)
            answered_s = time.monotonic() - began
            assert status == 200 and b"cam0" in body
            assert answered_s < 10, f"a GET under the flood took {answered_s:.1f} s"  # loose: a busy host
            assert server_held(baseline, clients) <= CAP + SLACK
            # Every trickler is closed by the request deadline (5 s), however often it sends.
            wait_until(
                lambda: len(tricklers.closed_after) == len(tricklers.socks),
                35,
                interval_s=0.2,
                message="the server closes every slow-trickle client",
            )
            assert max(tricklers.closed_after.values()) < 30
            print(f"GET answered in {answered_s * 1000:.0f} ms under the flood")
        finally:
            if tricklers is not None:
                tricklers.close()
            for s in flood:
                s.close()
    assert not thread_errors, thread_errors
    bad = [
        r
        for r in caplog.records
        if r.exc_info or "Traceback" in r.getMessage() or "too many" in r.getMessage()
    ]
    assert not bad, [r.getMessage() for r in bad]


def test_a_foreign_host_is_refused_and_every_answer_carries_the_security_headers(const_model):
    port = free_port()
    with started(config(const_model, port)) as agent:
        wait_until(lambda: agent.pipeline.published() >= 3, 30, message="frames flow")
        # DNS rebinding: a page from attacker.example, its name now pointing at 127.0.0.1.
        for path in ("/snapshot/cam0.jpg", "/api/health", "/", "/stream/cam0.mjpg"):
            status, headers, body = request(port, path, host=f"attacker.example:{port}")
            assert status == 421, (path, status)
            assert b"cam0" not in body and b"view.allowed_hosts" in body
            assert SECURITY_HEADERS.items() <= headers.items(), headers
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}"):
            status, headers, body = request(port, "/snapshot/cam0.jpg", host=host)
            assert status == 200 and body[:2] == b"\xff\xd8", host
            assert SECURITY_HEADERS.items() <= headers.items(), headers
        assert request(port, "/api/health", host="127.0.0.1.attacker.example")[0] == 421
        status, headers, _ = request(port, "/nope")
        assert status == 404 and SECURITY_HEADERS.items() <= headers.items()


def test_names_in_allowed_hosts_are_accepted(const_model):
    port = free_port()
    with started(config(const_model, port, allowed_hosts=("cam.example", "10.1.2.3"))):
        for host in (f"cam.example:{port}", "CAM.EXAMPLE.", f"10.1.2.3:{port}"):
            assert request(port, "/api/health", host=host)[0] == 200, host
        assert request(port, "/api/health", host="other.example")[0] == 421


def test_a_slow_trickle_client_is_cut_off_at_the_request_deadline(const_model):
    port = free_port()
    with started(config(const_model, port)):
        # One byte a second: a timeout per read (5 s) would never fire.
        tricklers = Tricklers(port, 3, every_s=1.0, limit_s=25)
        try:
            wait_until(
                lambda: len(tricklers.closed_after) == len(tricklers.socks),
                25,
                interval_s=0.2,
                message="the server closes slow-trickle clients at the request deadline",
            )
        finally:
            tricklers.close()


def test_a_stream_carries_the_security_headers(const_model):
    port = free_port()
    with started(config(const_model, port)), socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET /stream/cam0.mjpg HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(4096)
            assert chunk, head
            head += chunk
        lines = head.split(b"\r\n\r\n")[0].decode().lower().split("\r\n")
        assert lines[0].split()[1] == "200"
        headers = dict(line.split(": ", 1) for line in lines[1:])
        assert headers["content-type"].startswith("multipart/x-mixed-replace")
        assert all(headers.get(k) == v.lower() for k, v in SECURITY_HEADERS.items()), headers


def test_a_non_ascii_source_name_is_served_at_its_percent_encoded_url(const_model):
    port = free_port()
    cfg = replace(
        config(const_model, port), source=SyntheticSourceConfig(name="süd", fps=30, width=320, height=240)
    )
    with started(cfg) as agent:
        wait_until(lambda: agent.pipeline.published() >= 3, 30, message="frames flow")
        jpeg = get(f"http://127.0.0.1:{port}/snapshot/s%C3%BCd.jpg")
        assert jpeg[:2] == b"\xff\xd8"
        # Undecodable percent escapes are a bad request, not a server error.
        assert request(port, "/snapshot/s%FFd.jpg")[0] == 400
        assert request(port, "/snapshot/nope.jpg")[0] == 404


def test_a_taken_view_port_is_named_and_the_agent_runs_without_the_view(const_model, caplog):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with caplog.at_level(logging.WARNING), started(config(const_model, port)) as agent:
            wait_until(lambda: agent.pipeline.published() >= 3, 30, message="frames flow without the view")
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert any("view" in w and "view.port" in w and str(port) in w for w in warnings), warnings


def test_an_ipv6_loopback_host_is_served():
    ViewConfig(host="::1")  # valid ...
    for bad in ("not a host!", "::1]", "a b"):
        with pytest.raises(FieldError) as e:
            ViewConfig(host=bad)
        assert e.value.key == "host"


def test_the_view_on_ipv6_loopback_answers(const_model):
    port = free_port()
    with started(config(const_model, port, host="::1")) as agent:
        wait_until(lambda: agent.pipeline.published() >= 3, 30, message="frames flow")
        assert agent.view.url == f"http://[::1]:{port}/"
        status, _, body = request(port, "/", address="::1")
        assert status == 200 and body.startswith(b"<!doctype html>")


def read_head(sock: socket.socket) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    return head


def test_streams_are_capped_and_every_closed_stream_gives_its_slot_back(const_model):
    from edge_agent.service.view.server import MAX_STREAMS

    port = free_port()
    socks: list[socket.socket] = []
    with started(config(const_model, port)) as agent:
        try:
            for _ in range(MAX_STREAMS):
                s = socket.create_connection(("127.0.0.1", port), timeout=30)
                socks.append(s)
                s.sendall(b"GET /stream/cam0.mjpg HTTP/1.1\r\nHost: localhost\r\n\r\n")
                assert b" 200 " in read_head(s).split(b"\r\n")[0]
            status, _, body = request(port, "/stream/cam0.mjpg")
            assert status == 503 and b"too many viewers" in body
            # HEAD of a stream: the head only, and no slot kept.
            for s in socks:
                s.close()
            socks.clear()
            wait_until(lambda: sum(agent.view._streams.values()) == 0, 30, message="every slot given back")
            with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
                s.sendall(b"HEAD /stream/cam0.mjpg HTTP/1.1\r\nHost: localhost\r\n\r\n")
                head = read_head(s)
                assert b" 200 " in head.split(b"\r\n")[0] and s.recv(4096) == b""
            wait_until(lambda: sum(agent.view._streams.values()) == 0, 30, message="HEAD keeps no slot")
            wait_until(lambda: not agent.view.taps["cam0"].active, 30, message="the tap goes quiet")
        finally:
            for s in socks:
                s.close()


def test_snapshots_waiting_for_a_frame_cannot_lock_new_clients_out():
    """A camera with no fresh frame: each snapshot waits up to 3 s. MAX_CONNECTIONS of them
    must not hold every slot: a new client is answered, the oldest waiting one gets 503."""
    from edge_agent.service.view.server import MAX_CONNECTIONS, ViewServer

    view = ViewServer(ViewConfig(enabled=True, port=0), lambda: {"cam0": {}})
    view.tap("cam0", 10)  # a source whose camera sends nothing
    waiting: list[socket.socket] = []
    view.start()
    try:
        assert view._http is not None
        port = view._http.port
        for _ in range(MAX_CONNECTIONS):
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            waiting.append(s)
            s.sendall(b"GET /snapshot/cam0.jpg HTTP/1.1\r\nHost: localhost\r\n\r\n")
        wait_until(
            lambda: sum(c.state == "waiting" for c in list(view._http._conns)) == MAX_CONNECTIONS,
            30,
            message="every slot holds a waiting snapshot",
        )
        status, _, body = request(port, "/api/health")
        assert status == 200 and b"cam0" in body
        assert read_head(waiting[0]).startswith(b"HTTP/1.1 503 "), "the oldest waiting one made room"
    finally:
        for s in waiting:
            s.close()
        view.stop()


@pytest.mark.parametrize(
    "host", ["[::1]evil.example", "localhost:notaport", "localhost:80:evil", "local host", "localhost\x00x"]
)
def test_a_host_that_only_starts_like_an_allowed_one_is_refused(host):
    """The name was cut at the first ']' or ':' and compared: ``[::1]evil.example`` passed
    as the loopback. A Host that is not ``host[:port]`` is a bad request (RFC 9112 §3.2)."""
    from edge_agent.service.view.server import ViewServer

    view = ViewServer(ViewConfig(enabled=True, port=0), lambda: {"cam0": {}})
    view.start()
    try:
        assert view._http is not None
        status, headers, _ = request(view._http.port, "/api/health", host=host)
        assert status in (400, 421), (host, status)
        assert SECURITY_HEADERS.items() <= headers.items(), headers
        assert request(view._http.port, "/api/health", host="localhost")[0] == 200
    finally:
        view.stop()
