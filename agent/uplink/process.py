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
from edge_agent.uplink.link import Link, LinkError
from edge_agent.uplink.spool import Spool

log = logging.getLogger(__name__)

_POLL_MS = 100
_BATCH = 256  # stream messages taken per spool transaction at most


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


class Uplink:
    """Owns the stream socket, the spool, the forwarder and the link."""

    def __init__(self, cfg: AgentConfig) -> None:
        """Raises LinkError or SpoolError for settings that cannot work (exit 2, no restart)."""
        self.cfg = cfg
        self.up = cfg.uplink
        self.device_id = cfg.device_id
        p = cfg.publish
        if p.curve_server_key and not self.up.curve_client_cert:
            raise LinkError("the stream uses CURVE (publish.curve_server_key): set uplink.curve_client_cert")
        self.spool = Spool(self.up.spool_path, int(self.up.spool_max_mib * 1024 * 1024))
        try:
            self.link = Link(self.up, cfg.device_id, self.spool)
            topics = (p.topic + ".", "health")
            self._sock = client.connect(
                client.stream_endpoint(p.endpoint),
                topics,
                p.curve_server_key or None,
                self.up.curve_client_cert or None,
            )
        except ValueError as e:  # a certificate that does not load
            self.spool.close()
            raise LinkError(f"uplink.curve_client_cert: {e}") from e
        except BaseException:
            self.spool.close()
            raise
        # Scheduled on the monotonic clock, stamped in Unix time: a clock step at boot (NTP
        # on a device without an RTC battery) neither freezes nor bunches the summaries.
        self._unix0, self._mono0 = time.time(), time.monotonic()
        run = f"{int(self._unix0):x}"
        self.forwarder = make_forwarder(
            self.up.forward, self.up.interval_s, self.up.max_rate_hz, p.topic, run
        )
        self.received = 0
        self.spooled = 0
        self.lost = 0  # read from the stream but not spooled (the spool failed: a full disk)
        self.gaps = client.GapTracker()  # results the agent's socket dropped before the uplink read them
        self.beats: dict[str, dict[str, Any]] = {}  # the latest heartbeat per source
        self.models: dict[str, str] = {}  # the model of each source's latest result
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_health = 0.0
        self._connects_seen = 0
        self._last_stream = time.monotonic()
        self.progress = time.monotonic()  # the receiving loop's last turn (for the watchdog)

    def now(self) -> float:
        """Unix time that moves with the monotonic clock."""
        return self._unix0 + (time.monotonic() - self._mono0)

    def start(self) -> None:
        p = self.cfg.publish
        self.link.start()
        self._thread = threading.Thread(target=self._receive_loop, name="uplink-recv", daemon=True)
        self._thread.start()
        log.info(
            "uplink: %s -> %s as %s/%s (forward: %s; spool %s, %d messages waiting)",
            client.stream_endpoint(p.endpoint),
            self.up.broker,
            self.up.prefix,
            self.device_id,
            self.up.forward,
            self.up.spool_path,
            self.spool.count,
        )

    def stop(self, timeout_s: float = 3.0) -> bool:
        """Every step runs, whatever the one before did: the partial summaries go to the
        spool, the link drains and says offline, the socket and the spool close."""
        self._stop.set()
        ok = True
        try:
            if self._thread is not None:
                self._thread.join(timeout_s)
                ok = not self._thread.is_alive()
            self._spool(self.forwarder.flush(self.now(), final=True))
        finally:
            try:
                ok = self.link.stop(timeout_s) and ok
            finally:
                self._sock.close(linger=0)
                self.spool.close()
        return ok

    def alive(self) -> bool:
        """Every thread runs and turns (for the watchdog)."""
        receiving = self._thread is not None and self._thread.is_alive()
        return receiving and time.monotonic() - self.progress < 10 and self.link.alive()

    # -- the receiving thread ---------------------------------------------------------

    def _receive_loop(self) -> None:
        assert self._sock is not None
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            self.progress = time.monotonic()
            out: list[tuple[str, dict[str, Any]]] = []
            if poller.poll(_POLL_MS):
                for _ in range(_BATCH):
                    try:
                        frame = self._sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    try:
                        out += self._take(frame)
                    except Exception:  # one bad message must not end the uplink, nor cost the batch
                        log.exception("uplink: a stream message could not be forwarded")
            try:
                out += self.forwarder.flush(self.now())
                self._spool(out)
            except Exception:  # a full disk: counted and logged, the loop goes on
                self.lost += len(out)
                log.exception("uplink: %d messages could not be spooled", len(out))
                self._stop.wait(1.0)
            self._publish_health()

    def _publish_health(self) -> None:
        now = time.monotonic()
        connects = self.link.counters.connects
        if now >= self._next_health or connects != self._connects_seen:  # at once after a (re)connect
            self._next_health = now + self.up.health_interval_s
            try:
                if self.link.publish_now("health", _encode(self.health()), retain=True):
                    self._connects_seen = connects
            except Exception:
                log.exception("uplink: the health could not be sent")

    def _take(self, frame: bytes) -> list[tuple[str, dict[str, Any]]]:
        try:
            topic, body = client.decode(frame)
        except (ValueError, UnicodeDecodeError) as e:
            log.warning("uplink: an undecodable stream message skipped: %s", e)
            return []
        self.received += 1
        self._last_stream = time.monotonic()
        if topic == "health":
            self.beats[str(body.get("source", ""))] = body
        elif "seq" in body:
            self.gaps.update(topic, int(body["seq"]))
            self.models[str(body.get("source", ""))] = str(body.get("model", ""))
        return self.forwarder.offer(topic, body, self.now())

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
            "stream_gaps": sum(self.gaps.lost.values()),
            "lost": self.lost,
            "reconnects": max(0, c.connects - 1),
            "connect_failures": c.connect_failures,
            "last_error": self.link.last_error,
        }

    def health(self) -> dict[str, Any]:
        """The device's health: what `fleet status` shows, one message for all sources."""
        beats = dict(self.beats)
        first = next(iter(beats.values()), {})
        power = first.get("power") or {}
        return {
            "device": self.device_id,
            "ts_unix_s": round(time.time(), 3),
            "health_interval_s": self.up.health_interval_s,
            # The agent's stream has been silent this long (the agent is down, or CURVE
            # refuses the uplink): the sources' figures below are that old.
            "agent_silent_s": round(time.monotonic() - self._last_stream, 1),
            "agent_silent_after_s": max(2.0, 3 * self.cfg.publish.health_interval_s),  # 3 heartbeats missed
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
