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
It also says how many zone and line events each source had since the health before it
(``events``, over ``events_interval_s``): what `fleet status` shows without reading every
device's events.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import threading
import time
from typing import Any

import zmq

from edge_agent import __version__, client
from edge_agent.core.config import AgentConfig
from edge_agent.service.uplink.forward import Message, event_source, make_forwarder
from edge_agent.service.uplink.link import Link, LinkError
from edge_agent.service.uplink.spool import Spool
from edge_agent.service.uplink.validate import EVENT_PREFIX, MessageError, finite_number, read_message

log = logging.getLogger(__name__)

_POLL_MS = 100
_BATCH = 256  # stream messages taken per spool transaction at most
# Distinct sources tracked; a new one makes the uplink forget the least recently seen (a
# name only a stray publisher used must not lock out a real source not yet seen).
_MAX_SOURCES = 256
_LOG_EVERY_S = 60.0  # a condition that lasts (bad messages, a failing spool) is logged this often

#: The retained health's cap: past it, sources are left out (``sources_omitted`` says how
#: many). A source's line is at most a few kB (the caps below), so 60 fit with room.
MAX_HEALTH_BYTES = 256 << 10
#: What of a heartbeat goes into the health: its ``counts`` map capped in keys and key
#: length (numbers only; ``counts_omitted`` says how many were left out), its texts capped.
MAX_COUNT_KEYS = 32
MAX_COUNT_KEY_CHARS = 64
_MAX_TEXT = 256
_MAX_MODEL_TEXT = 1024  # the health's ``model``: the sources' models, joined


def _encode(body: dict[str, Any]) -> bytes:
    """Strict JSON (no NaN or infinities: a strict parser refuses them); ValueError or
    TypeError for what JSON cannot carry."""
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


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
            topics = (p.topic + ".", "health", EVENT_PREFIX)
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
        # Scheduled on the monotonic clock, stamped with the wall clock at send time: a clock
        # step (NTP on a device without an RTC battery) neither freezes nor bunches the
        # summaries, and their stamps follow the step at once.
        run = f"{int(time.time()):x}"
        self.forwarder = make_forwarder(
            self.up.forward, self.up.interval_s, self.up.max_rate_hz, p.topic, run, events=self.up.events
        )
        self.received = 0
        self.spooled = 0
        self.lost = 0  # read from the stream but not spooled (the spool failed: a full disk)
        self.invalid = 0  # read from the stream but not what the schema allows: dropped
        self.gaps = client.GapTracker()  # results the agent's socket dropped before the uplink read them
        self.events = 0  # valid events read (forwarded when uplink.events, counted by summaries)
        # Events of one run the agent's socket dropped before the uplink read them: a gap in
        # seq within a source's run (a new run_id numbers from 0 again).
        self.event_gaps = client.GapTracker()
        self._event_runs: dict[str, str] = {}  # each source's latest run_id
        self._events_since: dict[str, int] = {}  # events per source since the last health sent
        self._events_since_at = time.monotonic()
        self.beats: dict[str, dict[str, Any]] = {}  # the latest heartbeat per source
        self.models: dict[str, str] = {}  # the model of each source's latest result
        self._recent: collections.OrderedDict[str, None] = collections.OrderedDict()  # LRU first
        self._gaps_forgotten = 0  # stream gaps of the sources forgotten
        self._event_gaps_forgotten = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_health = 0.0
        self._connects_seen = 0
        self._last_stream = time.monotonic()
        self.progress = time.monotonic()  # the receiving loop's last turn (for the watchdog)
        self._last_log: dict[str, float] = {}
        self._spool_failures = 0  # in a row

    def start(self) -> None:
        p = self.cfg.publish
        self.link.start()
        self._thread = threading.Thread(target=self._receive_loop, name="uplink-recv", daemon=True)
        self._thread.start()
        log.info(
            "uplink: %s -> %s as %s/%s (forward: %s, events: %s; spool %s, %d messages waiting)",
            client.stream_endpoint(p.endpoint),
            self.up.broker,
            self.up.prefix,
            self.device_id,
            self.up.forward,
            "every one" if self.up.events else "counted in summaries only",
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
            self._spool(self.forwarder.flush(time.monotonic(), final=True, wall_s=time.time()))
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
                        self._reject("it could not be forwarded", exc_info=True)
            try:
                out += self.forwarder.flush(time.monotonic(), wall_s=time.time())
            except Exception:  # a policy's bug must not take the batch with it
                log.exception("uplink: the forwarding policy failed to flush")
            self._spool_or_count(out)
            self._publish_health()

    def _spool_or_count(self, out: list[tuple[str, dict[str, Any]]]) -> None:
        """Spool ``out``; when the spool fails (a full or read-only disk) count them as lost,
        say so once a minute (not every turn), and back off up to 10 s."""
        try:
            self._spool(out)
        except Exception as e:
            self.lost += len(out)
            self._spool_failures += 1
            self._log_every(
                "spool",
                logging.ERROR,
                "uplink: the spool %s fails (%s): %d messages lost so far; retrying with backoff",
                self.up.spool_path,
                e,
                self.lost,
            )
            self._stop.wait(min(10.0, float(self._spool_failures)))
        else:
            if self._spool_failures:
                log.info("uplink: the spool %s works again", self.up.spool_path)
            self._spool_failures = 0

    def _log_every(self, key: str, level: int, message: str, *args: Any, exc_info: bool = False) -> None:
        now = time.monotonic()
        if now - self._last_log.get(key, -1e9) >= _LOG_EVERY_S:
            self._last_log[key] = now
            log.log(level, message, *args, exc_info=exc_info)

    def _reject(self, why: str, exc_info: bool = False) -> list[tuple[str, dict[str, Any]]]:
        """Count a stream message that will not be forwarded (reported with ``rejected``)."""
        self.invalid += 1
        self._log_every(
            "invalid",
            logging.WARNING,
            "uplink: a stream message rejected: %s (%d so far; logged once a minute)",
            why,
            self.invalid,
            exc_info=exc_info,
        )
        return []

    def _publish_health(self) -> None:
        now = time.monotonic()
        connects = self.link.counters.connects
        if now >= self._next_health or connects != self._connects_seen:  # at once after a (re)connect
            self._next_health = now + self.up.health_interval_s
            try:
                if self.link.publish_now("health", _encode(self.health()), retain=True):
                    self._connects_seen = connects
                    # The next health counts the events from here: each event is in one
                    # health sent (a health not sent leaves its events to the next one).
                    self._events_since = {}
                    self._events_since_at = now
            except Exception:
                log.exception("uplink: the health could not be sent")

    def _take(self, frame: bytes) -> list[tuple[str, dict[str, Any]]]:
        self.received += 1
        prefix = self.forwarder.result_prefix
        try:  # the size, the JSON data model within bounds, then the fields the uplink uses
            topic, body = read_message(frame, prefix)
        except MessageError as e:
            return self._reject(str(e))
        problem = self._source_problem(topic, body, prefix)
        if problem is not None:
            return self._reject(f"{topic[:64]!r}: {problem}")
        self._last_stream = time.monotonic()
        out: list[Message] = []
        if topic == "health":
            out = self._touch(body["source"])
            self.beats[body["source"]] = _beat_record(body)  # only what the health shows, capped
        elif (source := event_source(topic)) is not None:
            out = self._touch(source)
            self._count_event(source, body)
        elif topic.startswith(prefix):
            out = self._touch(topic[len(prefix) :])
            self.gaps.update(topic, body["seq"])
            self.models[topic[len(prefix) :]] = body.get("model", "")
        return out + self.forwarder.offer(topic, body, time.monotonic(), wall_s=time.time())

    def _count_event(self, source: str, body: dict[str, Any]) -> None:
        self.events += 1
        self._events_since[source] = self._events_since.get(source, 0) + 1
        if self._event_runs.get(source) != body["run_id"]:  # a new run numbers from 0 again
            self._event_runs[source] = body["run_id"]
            self.event_gaps.last.pop(source, None)
        self.event_gaps.update(source, body["seq"])

    def _touch(self, source: str) -> list[Message]:
        """Mark ``source`` the most recently seen; past _MAX_SOURCES, forget the least
        recently seen. What is still due for a forgotten source is returned."""
        recent = self._recent
        if source in recent:
            recent.move_to_end(source)
            return []
        recent[source] = None
        out: list[Message] = []
        while len(recent) > _MAX_SOURCES:
            old, _ = recent.popitem(last=False)
            out += self._forget(old)
        return out

    def _forget(self, source: str) -> list[Message]:
        self.beats.pop(source, None)
        self.models.pop(source, None)
        topic = self.forwarder.result_prefix + source
        self._gaps_forgotten += self.gaps.lost.pop(topic, 0)  # stream_gaps never goes down
        self.gaps.last.pop(topic, None)
        self.gaps.joined.pop(topic, None)
        self._event_gaps_forgotten += self.event_gaps.lost.pop(source, 0)
        self.event_gaps.last.pop(source, None)
        self.event_gaps.joined.pop(source, None)
        self._event_runs.pop(source, None)
        self._events_since.pop(source, None)
        return self.forwarder.forget(source, time.monotonic(), wall_s=time.time())

    def _source_problem(self, topic: str, body: dict[str, Any], prefix: str) -> str | None:
        """A result's topic and body name the same source."""
        if topic.startswith(prefix):
            source = topic[len(prefix) :]
            if body.get("source", source) != source:
                return "the topic names another source than the body"
        return None

    def _spool(self, out: list[tuple[str, dict[str, Any]]]) -> None:
        if not out:
            return
        root = self.link.root
        rows = []
        for sub, body in out:
            try:
                rows.append((f"{root}/{sub}", _encode(body), 1, False))
            except (TypeError, ValueError) as e:  # checked on the way in: a bug, for this one only
                self._reject(f"{sub[:64]!r} not encodable as JSON ({e})")
        if not rows:
            return
        self.spool.put_many(rows)
        self.spooled += len(rows)
        self.link.wake()

    # -- health -----------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        c = self.link.counters
        return {
            "connected": self.link.connected.is_set(),
            "received": self.received,
            "spooled": self.spooled,
            "sent": c.sent,
            "rejected": c.rejected + self.invalid,
            "spool_messages": self.spool.count,
            "spool_bytes": self.spool.size_bytes,
            "dropped": self.spool.dropped,
            "rate_limited": self.forwarder.rate_limited.total,
            "stream_gaps": sum(self.gaps.lost.values()) + self._gaps_forgotten,
            "events": self.events,
            "event_gaps": sum(self.event_gaps.lost.values()) + self._event_gaps_forgotten,
            "lost": self.lost,
            "reconnects": max(0, c.connects - 1),
            "connect_failures": c.connect_failures,
            "last_error": self.link.last_error,
        }

    def health(self) -> dict[str, Any]:
        """The device's health: what `fleet status` shows, one message for all sources, at
        most MAX_HEALTH_BYTES encoded (sources past it are left out and counted)."""
        beats = dict(self.beats)
        first = next(iter(beats.values()), {})
        health = {
            "device": self.device_id,
            "ts_unix_s": round(time.time(), 3),
            "health_interval_s": self.up.health_interval_s,
            # The agent's stream has been silent this long (the agent is down, or CURVE
            # refuses the uplink): the sources' figures below are that old.
            "agent_silent_s": round(time.monotonic() - self._last_stream, 1),
            "agent_silent_after_s": max(2.0, 3 * self.cfg.publish.health_interval_s),  # 3 heartbeats missed
            "last_heartbeat_unix_s": max((b["ts_unix_s"] for b in beats.values()), default=None),
            "version": first.get("version", ""),
            "uplink_version": __version__,
            "config_hash": first.get("config_hash", ""),
            "model": ", ".join(sorted(set(self.models.values())))[:_MAX_MODEL_TEXT],
            "throttled": any(b["throttled"] for b in beats.values()),
            "power_mode": first.get("power_mode", ""),
            "sources": {
                name: _source_health(b, self._events_since.get(name)) for name, b in sorted(beats.items())
            },
            # the span the sources' "events" cover: since the health sent before this one
            "events_interval_s": round(time.monotonic() - self._events_since_at, 1),
            "uplink": self.counters(),
        }
        return _within_cap(health)


def _within_cap(health: dict[str, Any]) -> dict[str, Any]:
    """``health``, with the sources past MAX_HEALTH_BYTES (in name order) left out and
    counted in ``sources_omitted``."""
    if len(_encode(health)) <= MAX_HEALTH_BYTES:
        return health
    sources = health["sources"]
    room = MAX_HEALTH_BYTES - len(_encode(health | {"sources": {}, "sources_omitted": len(sources)}))
    kept: dict[str, Any] = {}
    for name, line in sources.items():
        size = len(_encode({name: line}))  # its share of the map, a comma give or take
        if size + 1 > room:
            break
        kept[name] = line
        room -= size + 1
    return health | {"sources": kept, "sources_omitted": len(sources) - len(kept)}


def _text(v: Any, limit: int = _MAX_TEXT) -> str:
    return v[:limit] if isinstance(v, str) else ""


def _capped_counts(counts: Any) -> tuple[dict[str, Any], int]:
    """A heartbeat's ``counts`` as the health carries it: numbers, and maps of numbers one
    level down (``dropped_by_reason``), at most MAX_COUNT_KEYS keys in all, each of at most
    MAX_COUNT_KEY_CHARS; and how many were left out."""
    if not isinstance(counts, dict):
        return {}, 0
    kept: dict[str, Any] = {}
    room, seen = MAX_COUNT_KEYS, 0
    for key, value in counts.items():
        inner = value if isinstance(value, dict) else {None: value}
        seen += len(inner)
        if room <= 0 or len(key) > MAX_COUNT_KEY_CHARS:
            continue
        items = {
            k: v
            for k, v in itertools.islice(inner.items(), room)
            if finite_number(v) and (k is None or len(k) <= MAX_COUNT_KEY_CHARS)
        }
        if isinstance(value, dict):
            kept[key] = items
            room -= len(items)
        elif items:
            kept[key] = value
            room -= 1
    return kept, seen - sum(len(v) if isinstance(v, dict) else 1 for v in kept.values())


def _beat_record(beat: dict[str, Any]) -> dict[str, Any]:
    """What the health keeps of a (checked) heartbeat: its source's line and the few device
    fields, each capped, so a heartbeat of up to a MiB costs a few kB while it is kept."""
    window = (beat.get("latency_ms") or {}).get("window") or {}
    power = beat.get("power") or {}
    applied = (power.get("applied") or [])[:16]
    counts, omitted = _capped_counts(beat.get("counts"))
    line: dict[str, Any] = {
        "fps": beat.get("fps", 0.0),
        "e2e_p50_ms": window.get("p50"),
        "e2e_p99_ms": window.get("p99"),
        "miss_rate": beat.get("miss_rate", 0.0),
        "ladder": _text((beat.get("ladder") or {}).get("name", ""), 128),
        "counts": counts,
        "error": _text(err) if (err := (beat.get("source_state") or {}).get("error")) is not None else None,
    }
    if omitted:
        line["counts_omitted"] = omitted
    return {
        "ts_unix_s": beat["ts_unix_s"],
        "version": _text(beat.get("version", "")),
        "config_hash": _text(beat.get("config_hash", "")),
        "throttled": bool(power.get("throttled", False)),
        "power_mode": _text("; ".join(applied) or power.get("backend", "")),
        "zones": "analytics" in beat,
        "line": line,
    }


def _source_health(record: dict[str, Any], events: int | None) -> dict[str, Any]:
    """A source's line of the health; ``events``: its events since the last health sent."""
    out = dict(record["line"])
    if events is not None or record["zones"]:  # a source without zones or lines has no count
        out["events"] = events or 0
    return out
