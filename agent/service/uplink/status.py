"""`edge-agent fleet status`: every device's retained ``status`` and ``health`` on the
broker, as one table. Nothing is polled on the devices: a device that died shows as
offline through its Last Will, with the last health it sent.

The ``events`` column is the zone and line events of the device's sources over the span
its health covers (``events_interval_s``, since the health before it), as the uplink
counted them: the retained health is the one message per device this view reads, so it
needs no subscription to every device's events (a fleet's firehose), and it shows them
whatever ``forward`` and ``events`` the device's uplink has. ``-``: no source has zones or
lines (or the uplink is older than the count).

Whoever may publish under the prefix writes what this reads, so a health is bounded before
it is parsed (MAX_PAYLOAD_BYTES, integers of at most 16 digits, no NaN) and every number a
row reads is range-checked (0 <= n < 2**53): a device whose health fails is shown
``invalid`` with the reason, and every other device still prints."""

from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from typing import Any

from edge_agent.core.text import printable
from edge_agent.core.uplink_config import UplinkConfig
from edge_agent.service.uplink.link import make_client
from edge_agent.service.uplink.validate import finite_number

#: A retained health larger than this is not parsed: the row says ``invalid`` (too large).
#: The uplink caps its own at 256 KiB (process.MAX_HEALTH_BYTES).
MAX_PAYLOAD_BYTES = 1 << 20
#: Every number a row reads is within 0 <= n < MAX_NUMBER (exact in a double, printable).
MAX_NUMBER = 2**53
_MAX_STATUS = 64  # a retained status is "online" or "offline"
_INT_DIGITS = 16  # digits of MAX_NUMBER: a longer JSON int is refused before int() builds it


class Unreadable(str):
    """A retained health that could not be read, and why (the row says ``invalid``)."""


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > _INT_DIGITS:
        raise ValueError(f"an integer of {len(text)} digits: out of range")
    return int(text)


def _json_constant(name: str) -> Any:
    raise ValueError(f"{name}: numbers must be finite")


def parse_health(payload: bytes) -> Any:
    """A retained health payload as JSON, or :class:`Unreadable` saying why not (too large,
    not JSON, nested too deep, a number out of range); never raises."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        return Unreadable(f"too large: {len(payload)} bytes, over {MAX_PAYLOAD_BYTES}")
    try:
        return json.loads(payload, parse_int=_json_int, parse_constant=_json_constant)
    except RecursionError:
        return Unreadable("not JSON: nested too deep")
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return Unreadable(f"not JSON: {str(e)[:80]}")


def number_ok(v: Any) -> bool:
    """A number a row may read: finite, not a bool, 0 <= v < 2**53."""
    return finite_number(v) and 0 <= v < MAX_NUMBER


COLUMNS = (
    ("device", 14),
    ("status", 8),
    ("last seen", 10),
    ("model", 16),
    ("config", 13),
    ("version", 8),
    ("fps", 7),
    ("e2e p99", 8),
    ("miss", 6),
    ("events", 9),
    ("throttled", 9),
    ("power", 14),
)


class FleetView:
    """A subscriber to ``<prefix>/+/status`` and ``<prefix>/+/health``, holding the latest
    of each per device (paho's thread writes, the caller reads under the lock)."""

    def __init__(self, cfg: UplinkConfig) -> None:
        self.cfg = cfg
        self.devices: dict[str, dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.connected = threading.Event()
        self.error = ""
        self.client = make_client(cfg, f"edge-agent-status-{uuid.uuid4().hex[:12]}")
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.subscribed = threading.Event()
        self.rtt_s = 0.0  # connect to CONNACK: how long the broker takes to answer
        # The last time a device's first status or first health came: the retained ones
        # come as a burst after the subscription (every status, then every health).
        self.last_new_device = 0.0

    def _on_connect(self, client: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if reason.is_failure:
            self.error = f"the broker refused the connection: {reason}"
            return
        self.rtt_s = time.monotonic() - self._connect_at
        client.subscribe([(f"{self.cfg.prefix}/+/status", 1), (f"{self.cfg.prefix}/+/health", 1)])
        self.connected.set()

    def _on_subscribe(self, _c: Any, _u: Any, _mid: int, reasons: Any, _p: Any) -> None:
        refused = [r for r in reasons if r.is_failure]
        if refused:
            self.error = f"the broker refused the subscription: {refused[0]} (an ACL?)"
        self.subscribed.set()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        parts = msg.topic.split("/")
        device, kind = parts[-2], parts[-1]
        if kind == "status":
            value: Any = bytes(msg.payload[:_MAX_STATUS]).decode(errors="replace")
        else:
            value = parse_health(msg.payload)  # bounded, outside the lock
        with self.lock:
            entry = self.devices.setdefault(device, {})
            if kind not in entry:  # a health still on its way must not end the settle
                self.last_new_device = time.monotonic()
            entry[kind] = value

    def start(self, timeout_s: float) -> None:
        host, port, _ = self.cfg.address()
        self._connect_at = time.monotonic()
        self.client.connect(host, port, keepalive=self.cfg.keepalive_s)  # OSError: unreachable
        self.client.loop_start()
        if not self.connected.wait(timeout_s):
            self.stop()
            raise ConnectionError(self.error or f"no answer from {self.cfg.broker} within {timeout_s:g} s")

    def settle(self, timeout_s: float = 3.0) -> None:
        """Wait for the retained messages, which the broker sends right after it has
        acknowledged the subscription: until no new device has appeared for a few round
        trips (live messages keep coming, so silence is not the sign) and every device online
        has its health, or ``timeout_s``."""
        end = time.monotonic() + timeout_s
        if not self.subscribed.wait(timeout_s):
            return
        if self.error:
            raise ConnectionError(self.error)
        quiet = max(0.3, 3 * self.rtt_s)
        start = time.monotonic()
        while time.monotonic() < end and (
            time.monotonic() - max(start, self.last_new_device) < quiet or self._healths_due()
        ):
            time.sleep(0.05)

    def _healths_due(self) -> bool:
        """A device online has no health yet: its retained health (which an online device's
        uplink keeps on the broker) is still on its way, e.g. a large one being read on a
        busy machine, for longer than the quiet window."""
        with self.lock:
            return any(d.get("status") == "online" and "health" not in d for d in self.devices.values())

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()

    def rows(self, now_unix: float | None = None) -> list[dict[str, Any]]:
        now_unix = time.time() if now_unix is None else now_unix
        with self.lock:
            devices = {k: dict(v) for k, v in self.devices.items()}
        return [
            safe_row(name, d.get("status", "unknown"), d.get("health", {}), now_unix)
            for name, d in sorted(devices.items())
        ]


#: A device clock this far ahead of ours is not believed (it would never go stale).
_FUTURE_S = 300.0
_NUMBERS = ("ts_unix_s", "health_interval_s", "agent_silent_s", "agent_silent_after_s", "events_interval_s")
_STRINGS = ("model", "config_hash", "version", "power_mode")


_RANGE = "is not a number within 0..2**53"


def _source_problem(name: str, s: Any) -> str | None:
    name = name[:64]
    if not isinstance(s, dict):
        return f"sources.{name} is not an object"
    for key in ("fps", "miss_rate", "e2e_p99_ms"):
        if key in s and not (number_ok(s[key]) or (key == "e2e_p99_ms" and s[key] is None)):
            return f"sources.{name}.{key} {_RANGE}"
    events = s.get("events", 0)
    if not (isinstance(events, int) and number_ok(events)):
        return f"sources.{name}.events is not a count within 0..2**53"
    return None


def health_problem(health: Any, now_unix: float) -> str | None:
    """Why a retained health cannot be shown (None when it can): it is written by whoever
    may publish under the prefix, so every field the row reads is checked, every number
    within 0 <= n < 2**53."""
    if isinstance(health, Unreadable):
        return str(health)
    if not isinstance(health, dict):
        return "not a JSON object"
    for key in _NUMBERS:
        if key in health and not number_ok(health[key]):
            return f"{key} {_RANGE}"
    seen = health.get("last_heartbeat_unix_s")
    if seen is not None and not number_ok(seen):
        return f"last_heartbeat_unix_s {_RANGE}"
    for key in _STRINGS:
        if key in health and not isinstance(health[key], str):
            return f"{key} is not a string"
    if health.get("throttled") is not None and not isinstance(health["throttled"], bool):
        return "throttled is not a boolean"
    if max(health.get("ts_unix_s", 0), seen or 0) > now_unix + _FUTURE_S:
        return "its time is in the future"
    sources = health.get("sources", {})
    if not isinstance(sources, dict):
        return "sources is not an object"
    return next((p for n, s in sources.items() if (p := _source_problem(n, s))), None)


def invalid_row(device: str, why: str) -> dict[str, Any]:
    """The line of a device whose health cannot be read: the rest of the fleet still prints."""
    return {
        "device": device,
        "status": "invalid",
        "last_seen_s": None,
        "model": "",
        "config_hash": "",
        "version": "",
        "fps": None,
        "e2e_p99_ms": None,
        "miss_rate": None,
        "events": None,
        "events_interval_s": None,
        "throttled": None,
        "power_mode": "",
        "sources": [],
        "error": why,
    }


def safe_row(device: str, status: Any, health: Any, now_unix: float) -> dict[str, Any]:
    """``row``, or ``invalid_row`` for a health that is not what an uplink sends."""
    why = health_problem(health, now_unix)
    if why is None:
        try:
            return row(device, str(status), health, now_unix)
        except Exception as e:  # a shape health_problem did not foresee: this row only
            why = f"{type(e).__name__}: {e}"
    return invalid_row(device, why)


def row(device: str, status: str, health: dict[str, Any], now_unix: float) -> dict[str, Any]:
    """One device's line, from its retained status and (checked) health."""
    sources = health.get("sources") or {}
    seen = health.get("last_heartbeat_unix_s") or health.get("ts_unix_s")
    if status == "online" and health:
        sent = health.get("ts_unix_s") or 0
        if now_unix - sent > 3 * health.get("health_interval_s", 5) + 2:
            status = "stale"  # the uplink holds the connection but sends no health
        elif (health.get("agent_silent_s") or 0) > health.get("agent_silent_after_s", 5):
            status = "silent"  # the uplink is up, the agent's stream is not
    p99s = [s["e2e_p99_ms"] for s in sources.values() if s.get("e2e_p99_ms") is not None]
    counted = [s["events"] for s in sources.values() if "events" in s]
    return {
        "device": device,
        "status": status,
        "last_seen_s": round(now_unix - seen, 1) if seen else None,
        "model": health.get("model", ""),
        "config_hash": health.get("config_hash", ""),
        "version": health.get("version", ""),
        "fps": round(sum(s.get("fps", 0.0) for s in sources.values()), 2),
        "e2e_p99_ms": max(p99s) if p99s else None,
        "miss_rate": max((s.get("miss_rate", 0.0) for s in sources.values()), default=None),
        "events": sum(counted) if counted else None,
        "events_interval_s": health.get("events_interval_s") if counted else None,
        "throttled": health.get("throttled"),
        "power_mode": health.get("power_mode", ""),
        "sources": sorted(sources),
        "error": None,
    }


def odd_configs(rows: list[dict[str, Any]]) -> set[str]:
    """Devices whose config hash differs from the most common one (config drift)."""
    hashes = collections.Counter(r["config_hash"] for r in rows if r["config_hash"])
    if len(hashes) < 2:
        return set()
    common = hashes.most_common(1)[0][0]
    return {r["device"] for r in rows if r["config_hash"] and r["config_hash"] != common}


_CELL_MAX = 48


def table(rows: list[dict[str, Any]]) -> str:
    odd = odd_configs(rows)

    def cells(r: dict[str, Any]) -> list[str]:
        def num(v: Any, fmt: str) -> str:
            return "-" if v is None else format(v, fmt)

        seen = "-" if r["last_seen_s"] is None else f"{r['last_seen_s']:.0f} s ago"
        drift = "*" if r["device"] in odd else ""
        throttled = "-" if r["throttled"] is None else ("yes" if r["throttled"] else "no")
        miss = "-" if r["miss_rate"] is None else f"{r['miss_rate']:.1%}"
        events = num(r["events"], "d")
        if r["events"] is not None and r["events_interval_s"] is not None:
            events += f"/{r['events_interval_s']:.0f}s"  # over the span the health covers
        texts = [
            r["device"],
            r["status"],
            seen,
            r["model"] or "-",
            (r["config_hash"] or "-") + drift,
            r["version"] or "-",
            num(r["fps"], ".1f"),
            num(r["e2e_p99_ms"], ".1f"),
            miss,
            events,
            throttled,
            r["power_mode"] or "-",
        ]
        return [printable(t, _CELL_MAX) for t in texts]

    lines = ["  ".join(name.ljust(width) for name, width in COLUMNS).rstrip()]
    for r in rows:
        try:
            texts = cells(r)
        except (TypeError, ValueError) as e:  # a value safe_row did not foresee: this row only
            r = invalid_row(r["device"], f"{type(e).__name__}: {e}")
            texts = cells(r)
        lines.append("  ".join(c.ljust(w) for c, (_, w) in zip(texts, COLUMNS)).rstrip())
        if r.get("error"):
            device, error = printable(r["device"], _CELL_MAX), printable(r["error"], _CELL_MAX)
            lines.append(f"  {device}: invalid health: {error}")
    if not rows:
        lines.append("(no device has reported under this prefix)")
    if odd:
        lines.append(
            "* config differs from the fleet's most common one: "
            + printable(", ".join(sorted(odd)), _CELL_MAX)
        )
    return "\n".join(lines)
