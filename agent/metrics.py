"""Prometheus metrics, read from the agent's own counters and histograms at scrape time.

Nothing is observed per frame for Prometheus: the pipeline already keeps counts and
fixed-bucket latency histograms, and a custom collector turns them into Prometheus
families when scraped, so the hot path pays nothing. Latency buckets suit a 50 ms
budget; every value is in base units (seconds, hertz, watts, bytes).

Metric names (the Grafana dashboard in tools/ uses exactly these):

- ``edge_agent_frames_captured_total{source}``
- ``edge_agent_frames_published_total{source,outcome}`` (on_time | late)
- ``edge_agent_frames_dropped_total{source,reason}``
- ``edge_agent_frames_in_flight{source}``
- ``edge_agent_source_connected{source}``, ``edge_agent_source_failures_total{source}`` (live sources)
- ``edge_agent_stage_latency_seconds{source,stage}`` (histogram)
- ``edge_agent_end_to_end_latency_seconds{source}`` (histogram)
- ``edge_agent_deadline_budget_seconds{source}``, ``edge_agent_deadline_miss_ratio{source}``
- ``edge_agent_ladder_step{source,step}`` (the step index; the name as a label)
- ``edge_agent_inference_batches_total{size}`` (batches of several sources' frames, by size)
- ``edge_agent_model_info{model,backend,device}`` (always 1)
- power telemetry, where present: ``edge_agent_gpu_frequency_hertz``, ``edge_agent_gpu_load_ratio``,
  ``edge_agent_cpu_frequency_hertz{cpu}``, ``edge_agent_emc_frequency_hertz``,
  ``edge_agent_temperature_celsius{zone}``, ``edge_agent_rail_power_watts{rail}``,
  ``edge_agent_power_watts``, ``edge_agent_throttled``
- ``process_resident_memory_bytes``, ``process_cpu_seconds_total``, ... (the client's process collector)

The HTTP server is our own, not prometheus_client's ``start_http_server``: that one keeps
every connection as long as the client likes, a thread and a file descriptor each, with no
read timeout, so idle or half-open connections (a port scanner, a TLS hello, an HTTP/0.9
line) could use up the process's descriptors and starve scrapes, the result stream and
reloads. Ours is one thread over non-blocking sockets with a cap on connections (the oldest
idle one makes room for a new one), a deadline for the request head, a size limit on it,
a deadline for taking the response, and ``Connection: close`` on every answer. It serves
``GET``/``HEAD /metrics`` only and has no authentication: keep it on loopback or firewalled.
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
from http import HTTPStatus
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from edge_agent.latency import _UPPER, LatencyHistogram
from edge_agent.pipelines.publish import _loopback

log = logging.getLogger(__name__)

#: Seconds; dense below the 50 ms budget, a few beyond to show how late late is.
BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 1.0)


def histogram_buckets(h: LatencyHistogram) -> tuple[list[tuple[str, float]], float]:
    """Cumulative Prometheus buckets from a log-bucket histogram, and the sum in seconds.

    A sample is counted under a bound when its bucket's upper edge is at or below it,
    so counts are exact to the histogram's 2 % resolution.
    """
    counts = h.counts.copy()
    cum = np.cumsum(counts)
    out = []
    for bound in BUCKETS_S:
        idx = int(np.searchsorted(_UPPER, bound * 1e9, side="right")) - 1
        out.append((repr(bound), float(cum[idx]) if idx >= 0 else 0.0))
    out.append(("+Inf", float(cum[-1]) if len(cum) else 0.0))
    return out, h.total_ns / 1e9


class AgentCollector:
    """Reads the running agent at scrape time (the agent object stays the owner)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent

    def collect(self):
        agent = self.agent
        pipeline = agent.pipeline
        if pipeline is None:
            return
        now = time.monotonic_ns()
        captured = CounterMetricFamily(
            "edge_agent_frames_captured", "Frames the source produced", labels=["source"]
        )
        published = CounterMetricFamily(
            "edge_agent_frames_published",
            "Frames published, by deadline outcome",
            labels=["source", "outcome"],
        )
        dropped = CounterMetricFamily(
            "edge_agent_frames_dropped", "Frames dropped, by reason", labels=["source", "reason"]
        )
        up = GaugeMetricFamily(
            "edge_agent_source_connected", "Live source delivering (1) or not", labels=["source"]
        )
        fails = CounterMetricFamily(
            "edge_agent_source_failures",
            "Camera failures (lost, errors, stalls, frozen)",
            labels=["source"],
        )
        in_flight = GaugeMetricFamily(
            "edge_agent_frames_in_flight", "Frames in the pipeline now", labels=["source"]
        )
        stage = HistogramMetricFamily(
            "edge_agent_stage_latency_seconds", "Time per pipeline stage", labels=["source", "stage"]
        )
        e2e = HistogramMetricFamily(
            "edge_agent_end_to_end_latency_seconds",
            "Capture to publish, per published frame",
            labels=["source"],
        )
        budget = GaugeMetricFamily(
            "edge_agent_deadline_budget_seconds", "The end-to-end budget", labels=["source"]
        )
        miss = GaugeMetricFamily(
            "edge_agent_deadline_miss_ratio", "Misses in the sliding window", labels=["source"]
        )
        step = GaugeMetricFamily(
            "edge_agent_ladder_step", "Degradation ladder step (0: normal)", labels=["source", "step"]
        )
        live = False
        for lane in pipeline.lanes:
            src, stats, monitor = lane.name, lane.stats, lane.monitor
            c = stats.counts()
            captured.add_metric([src], c["captured"])
            published.add_metric([src, "on_time"], c["on_time"])
            published.add_metric([src, "late"], c["late"])
            for reason, n in c["dropped_by_reason"].items():
                dropped.add_metric([src, reason], n)
            state = lane.source.describe()
            if "connected" in state:
                live = True
                up.add_metric([src], float(bool(state["connected"])))
                fails.add_metric([src], state.get("failures", 0))
            in_flight.add_metric([src], c["in_flight"])
            for name, h in stats.stages.items():
                buckets, total = histogram_buckets(h)
                stage.add_metric([src, name], buckets, total)
            buckets, total = histogram_buckets(stats.total)
            e2e.add_metric([src], buckets, total)
            budget.add_metric([src], monitor.config.budget_ms / 1e3)
            miss.add_metric([src], monitor.miss_rate(now)[0])
            step.add_metric([src, monitor.current.name], monitor.step)
        yield from (captured, published, dropped)
        if live:
            yield from (up, fails)
        yield from (in_flight, stage, e2e, budget, miss, step)
        batches = CounterMetricFamily(
            "edge_agent_inference_batches", "Inference batches run, by size (frames)", labels=["size"]
        )
        for size, n in pipeline.scheduler.summary()["sizes"].items():
            batches.add_metric([size], n)
        yield batches
        if agent.model is not None:
            info = agent.model.backend.describe()
            model = GaugeMetricFamily(
                "edge_agent_model_info", "Model and backend", labels=["model", "backend", "device"]
            )
            model.add_metric(
                [agent.model.manifest.name, str(info.get("backend", "")), str(info.get("device", "cpu"))], 1
            )
            yield model
        yield from self._power(agent.power)

    @staticmethod
    def _power(power: Any):
        t = power.latest if power is not None else None
        if t is None:
            return
        gauges = [
            ("edge_agent_gpu_frequency_hertz", "GPU clock", t.gpu_freq_hz),
            (
                "edge_agent_gpu_load_ratio",
                "GPU load",
                None if t.gpu_load_pct is None else t.gpu_load_pct / 100,
            ),
            ("edge_agent_emc_frequency_hertz", "Memory clock", t.emc_hz),
            ("edge_agent_power_watts", "Total board power", None if t.total_mw is None else t.total_mw / 1e3),
        ]
        for name, text, value in gauges:
            if value is not None:
                yield GaugeMetricFamily(name, text, value=value)
        cpu = GaugeMetricFamily("edge_agent_cpu_frequency_hertz", "CPU clock per core", labels=["cpu"])
        for name, khz in t.cpu_freq_khz.items():
            cpu.add_metric([name], khz * 1e3)
        temps = GaugeMetricFamily(
            "edge_agent_temperature_celsius", "Thermal zone temperature", labels=["zone"]
        )
        for zone, celsius in t.temps_c.items():
            temps.add_metric([zone], celsius)
        rails = GaugeMetricFamily("edge_agent_rail_power_watts", "Power per INA3221 rail", labels=["rail"])
        for rail, mw in t.rails_mw.items():
            rails.add_metric([rail], mw / 1e3)
        yield from (cpu, temps, rails)
        yield GaugeMetricFamily(
            "edge_agent_throttled", "Throttling now (1) or not (0)", value=float(bool(power.throttled))
        )


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


class MetricsServer:
    """The HTTP endpoint (``/metrics``); failure to bind is logged, never fatal.

    One thread ("metrics") runs a selector loop over non-blocking sockets. At most
    ``max_connections`` are held: one more closes the oldest that has not sent a whole
    request yet (or the new one when all are being answered). A request head must
    arrive within ``request_timeout_s`` and be at most ``max_request_bytes``; a response
    not taken by the client within ``write_timeout_s`` is abandoned. Every response
    closes its connection.
    """

    def __init__(
        self,
        agent: Any,
        host: str,
        port: int,
        *,
        max_connections: int = 16,
        request_timeout_s: float = 5.0,
        write_timeout_s: float = 10.0,
        max_request_bytes: int = 8192,
        backlog: int = 64,
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(AgentCollector(agent))
        self.registry.register(ProcessCollector(registry=None))
        self.host, self.port = host, port
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
                "metrics: cannot listen on %s:%d (%s); running without metrics", self.host, self.port, e
            )
            return
        self.port = self._sock.getsockname()[1]  # the real one when 0 asked for any
        url = f"http://{f'[{self.host}]' if ':' in self.host else self.host}:{self.port}/metrics"
        if not _loopback(f"tcp://{self.host}:{self.port}"):
            log.warning(
                "metrics on %s: anyone who can reach the port reads the agent's metrics "
                "(there is no auth on /metrics); set metrics.host to 127.0.0.1 with a scraper "
                "on the device, or firewall the port",
                url,
            )
        self._sel = selectors.DefaultSelector()
        self._wake = socket.socketpair()
        for s in self._wake:
            s.setblocking(False)
        self._sel.register(self._sock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake[0], selectors.EVENT_READ, "wake")
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()
        log.info("metrics on %s", url)

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
            log.warning("metrics: the server thread did not stop within 1 s")
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

    # The loop, all in the "metrics" thread.

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
            log.exception("metrics: the server loop failed; metrics are off until a restart")
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
            self._log_once(f"conn:{type(e).__name__}", "metrics: dropping a connection after an error")
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
                        "accept", "metrics: cannot accept a connection (%s); pausing 0.5 s", e.strerror
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
                    "metrics: %d connections open (max_connections); closing the oldest idle one "
                    "for each new one",
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
        elif target.split(b"?", 1)[0] != b"/metrics":
            self._respond(conn, _response(404, b"metrics are at /metrics\n"))
        else:
            self._respond(conn, self._scrape(head_only=method == b"HEAD"))

    def _scrape(self, head_only: bool) -> bytes:
        try:
            body = generate_latest(self.registry)
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
            if message != self._last_error:  # each new failure once, with its traceback
                log.exception("metrics: collecting failed; the scrape gets 500")
            else:
                log.debug("metrics: collecting failed again: %s", message)
            self._last_error = message
            return _response(500, head_only=head_only)
        self._last_error = ""
        return _response(200, body, CONTENT_TYPE_LATEST, head_only=head_only)

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
