"""The uplink process: the agent's ZeroMQ stream in, MQTT out, a spool on disk between.

Three threads, each with one job: ``uplink-recv`` (this module) reads the stream, applies
the forwarding policy and appends to the spool in one transaction per batch; paho's
network thread keeps the broker connection; ``uplink-send`` (``link.Link``) moves the
spool to the broker in order. A slow or absent broker therefore only grows the spool
(bounded, oldest dropped and counted); it never reaches back into the agent, whose
socket drops for a slow subscriber instead of waiting for it.

The device's health (``<prefix>/<device>/health``, retained) is the latest heartbeat of
each source folded into one message with the uplink's own counters, sent at most every
``uplink.health_interval_s`` and only while connected (an old health is worth nothing).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import zmq

from edge_agent import __version__, client
from edge_agent.core.config import AgentConfig
from edge_agent.uplink.forward import make_forwarder
from edge_agent.uplink.link import Link
from edge_agent.uplink.spool import Spool

log = logging.getLogger(__name__)

_POLL_MS = 100
_BATCH = 256  # stream messages taken per spool transaction at most


def stream_endpoint(endpoint: str) -> str:
    """The address to connect to for the agent's bind address (``tcp://*:5556`` and
    ``tcp://0.0.0.0:5556`` are this host's loopback)."""
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard) :]
    return endpoint


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class Uplink:
    """Owns the stream socket, the spool, the forwarder and the link."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.up = cfg.uplink
        self.device_id = cfg.device_id
        self.spool = Spool(self.up.spool_path, int(self.up.spool_max_mib * 1024 * 1024))
        try:
            self.link = Link(self.up, cfg.device_id, self.spool)
        except BaseException:
            self.spool.close()
            raise
        self.forwarder = make_forwarder(self.up.forward, self.up.interval_s, self.up.max_rate_hz)
        self.received = 0
        self.spooled = 0
        self.beats: dict[str, dict[str, Any]] = {}  # the latest heartbeat per source
        self.models: dict[str, str] = {}  # the model of each source's latest result
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self._next_health = 0.0
        self.progress = time.monotonic()  # the receiving loop's last turn (for the watchdog)

    def start(self) -> None:
        p = self.cfg.publish
        server_key = p.curve_server_key or None
        cert = self.up.curve_client_cert or None
        self._sock = client.connect(stream_endpoint(p.endpoint), ("det", "health"), server_key, cert)
        self.link.start()
        self._thread = threading.Thread(target=self._receive_loop, name="uplink-recv", daemon=True)
        self._thread.start()
        log.info(
            "uplink: %s -> %s as %s/%s (forward: %s; spool %s, %d messages waiting)",
            stream_endpoint(p.endpoint),
            self.up.broker,
            self.up.prefix,
            self.device_id,
            self.up.forward,
            self.up.spool_path,
            self.spool.count,
        )

    def stop(self, timeout_s: float = 3.0) -> bool:
        self._stop.set()
        ok = True
        if self._thread is not None:
            self._thread.join(timeout_s)
            ok = not self._thread.is_alive()
        self._spool(self.forwarder.flush(time.time(), final=True))  # the partial summaries
        ok = self.link.stop(timeout_s) and ok
        if self._sock is not None:
            self._sock.close(linger=0)
        self.spool.close()
        return ok

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the receiving thread ---------------------------------------------------------

    def _receive_loop(self) -> None:
        assert self._sock is not None
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            self.progress = time.monotonic()
            try:
                out: list[tuple[str, dict[str, Any]]] = []
                if poller.poll(_POLL_MS):
                    for _ in range(_BATCH):
                        try:
                            frame = self._sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        out += self._take(frame)
                now = time.time()
                out += self.forwarder.flush(now)
                self._spool(out)
                if now >= self._next_health:
                    self._next_health = now + self.up.health_interval_s
                    self.link.publish_now("health", _encode(self.health()), retain=True)
            except Exception:  # one bad message or a full disk must not end the uplink
                log.exception("uplink: receiving failed")
                self._stop.wait(1.0)

    def _take(self, frame: bytes) -> list[tuple[str, dict[str, Any]]]:
        try:
            topic, body = client.decode(frame)
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("uplink: an undecodable stream message skipped: %s", e)
            return []
        self.received += 1
        if topic == "health":
            self.beats[str(body.get("source", ""))] = body
        elif "model" in body:
            self.models[str(body.get("source", ""))] = str(body["model"])
        return self.forwarder.offer(topic, body, time.time())

    def _spool(self, out: list[tuple[str, dict[str, Any]]]) -> None:
        if not out:
            return
        root = self.link.root
        self.spool.put_many([(f"{root}/{sub}", _encode(body), 1, False) for sub, body in out])
        self.spooled += len(out)
        self.link.wake()

    # -- health -----------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        c = self.link.counters
        return {
            "connected": self.link.connected.is_set(),
            "received": self.received,
            "spooled": self.spooled,
            "sent": c.sent,
            "rejected": c.rejected,
            "spool_messages": self.spool.count,
            "spool_bytes": self.spool.size_bytes,
            "dropped": self.spool.dropped,
            "rate_limited": self.forwarder.rate_limited.total,
            "reconnects": max(0, c.connects - 1),
            "connect_failures": c.connect_failures,
        }

    def health(self) -> dict[str, Any]:
        """The device's health: what `fleet status` shows, one message for all sources."""
        beats = dict(self.beats)
        first = next(iter(beats.values()), {})
        power = first.get("power") or {}
        return {
            "device": self.device_id,
            "ts_unix_s": round(time.time(), 3),
            "last_heartbeat_unix_s": max((b.get("ts_unix_s", 0) for b in beats.values()), default=None),
            "version": first.get("version", ""),
            "uplink_version": __version__,
            "config_hash": first.get("config_hash", ""),
            "model": ", ".join(sorted(set(self.models.values()))),
            "throttled": any((b.get("power") or {}).get("throttled", False) for b in beats.values()),
            "power_mode": "; ".join(power.get("applied") or []) or power.get("backend", ""),
            "sources": {name: _source_health(b) for name, b in sorted(beats.items())},
            "uplink": self.counters(),
        }


def _source_health(beat: dict[str, Any]) -> dict[str, Any]:
    window = (beat.get("latency_ms") or {}).get("window") or {}
    return {
        "fps": beat.get("fps", 0.0),
        "e2e_p50_ms": window.get("p50"),
        "e2e_p99_ms": window.get("p99"),
        "miss_rate": beat.get("miss_rate", 0.0),
        "ladder": (beat.get("ladder") or {}).get("name", ""),
        "counts": beat.get("counts", {}),
        "error": (beat.get("source_state") or {}).get("error"),
    }
