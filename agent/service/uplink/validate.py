"""What the uplink accepts from the agent's stream: a hand-written check of the fields it
uses (pipelines/schema/message-v2.schema.json describes them all; jsonschema is a test
dependency only). Anyone on the host can publish on the agent's endpoint while the agent
is down and CURVE is off, so a message is checked before it reaches the spool: one that
could not be published, or would break a summary, is rejected there and counted, instead
of blocking everything queued behind it. An event goes up whole and is counted by the
summaries, so every field ``$defs/event`` requires is checked, and its size is bounded
before it is decoded (:func:`frame_problem`).

Before any of that, :func:`decode_message` holds every message, whatever its topic and
encoding, to the JSON data model within bounds (:data:`BOUNDS`): what the uplink forwards
is re-encoded as JSON for MQTT, so a msgpack ``bytes`` or ``ExtType``, a NaN or an infinity
would otherwise pass here and fail (or go out as invalid JSON) later.
"""

from __future__ import annotations

import math
from typing import Any

from edge_agent.core.analytics_config import MAX_ITEMS
from edge_agent.core.names import MAX_NAME, level_problem, name_ok
from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.stream_frames import BOUNDS, MAX_FRAME_BYTES, MessageError, data_model_problem, decode

__all__ = [
    "BOUNDS",
    "EVENT_KINDS",
    "EVENT_PREFIX",
    "MAX_EVENT_BYTES",
    "MAX_FRAME_BYTES",
    "MAX_NAME",
    "MessageError",
    "data_model_problem",
    "decode_message",
    "finite_number",
    "frame_problem",
    "message_problem",
    "name_problem",
    "read_message",
]

#: The agent's zone and line events are on ``event.<source>`` (whatever ``publish.topic`` is).
EVENT_PREFIX = "event."
#: An event frame larger than this is rejected before it is decoded: the agent's are about
#: 300 bytes, and each is forwarded whole, so a bloated one must not reach the spool.
MAX_EVENT_BYTES = 16 << 10
EVENT_KINDS = ("enter", "exit", "cross", "dwell")
_ZONE_KINDS = ("enter", "exit", "dwell")
#: A label is the model's (its manifest's) text, not a topic level: any string up to this.
_MAX_LABEL = 1024
#: ``device`` and ``model`` are names, carried into every summary and the health.
_MAX_SHORT = 256


#: Why a source name cannot be an MQTT topic level (None when it can): the config's rule
#: for names (edge_agent.core.names), so every source the config takes passes here.
name_problem = level_problem


def finite_number(v: Any) -> bool:
    """An int or a float that is finite, and not a bool (JSON's true is no number here).
    An int is finite whatever its size (math.isfinite would raise OverflowError past 1e308)."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _short(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= _MAX_SHORT


def _label(v: Any) -> bool:
    return isinstance(v, str) and len(v) <= _MAX_LABEL


def _opt(body: dict[str, Any], key: str, ok: Any) -> bool:
    return key not in body or ok(body[key])


def _is(t: type | tuple[type, ...]) -> Any:
    return lambda v: isinstance(v, t)


def _result_problem(body: dict[str, Any]) -> str | None:
    if not _count(body.get("seq")):
        return "seq is not a count"
    latency = body.get("latency_ms")
    if not isinstance(latency, dict) or not finite_number(latency.get("total")) or latency["total"] < 0:
        return "latency_ms.total is not a number >= 0"
    dets = body.get("detections")
    if not isinstance(dets, list):
        return "detections is not a list"
    for d in dets:
        if not isinstance(d, dict) or not _label(d.get("label")) or not _count(d.get("class_id")):
            return f"a detection without a string label (of at most {_MAX_LABEL}) and a class_id"
    checks = (
        ("model", _short),
        ("device", _short),
        ("deadline_missed", _is(bool)),
        ("throttled", _is(bool)),
    )
    for key, ok in checks:
        if not _opt(body, key, ok):
            return f"{key} has the wrong type"
    return _block_problem(body["analytics"]) if "analytics" in body else None


def _summary_ok(v: Any) -> bool:
    return isinstance(v, dict) and all(finite_number(v[k]) for k in ("p50", "p99") if k in v)


def _health_problem(body: dict[str, Any]) -> str | None:
    if not finite_number(body.get("ts_unix_s")):
        return "ts_unix_s is not a number"
    counts = body.get("counts")
    if not isinstance(counts, dict) or not _opt(counts, "dropped", _count):
        return "counts.dropped is not a count"
    latency = body.get("latency_ms", {})
    if not isinstance(latency, dict) or not _opt(latency, "window", _summary_ok):
        return "latency_ms.window is not a summary"
    power = body.get("power", {})
    if power is not None and not (
        isinstance(power, dict)
        and _opt(power, "throttled", _is(bool))
        and _opt(power, "backend", _is(str))
        and _opt(power, "applied", lambda a: isinstance(a, list) and all(isinstance(x, str) for x in a))
    ):
        return "power has the wrong shape"
    checks = (
        ("fps", finite_number),
        ("miss_rate", finite_number),
        ("version", _short),
        ("config_hash", _short),
        ("device", _short),
        ("ladder", lambda v: isinstance(v, dict) and _opt(v, "name", _is(str))),
        ("source_state", lambda v: isinstance(v, dict) and _opt(v, "error", _is((str, type(None))))),
    )
    for key, ok in checks:
        if not _opt(body, key, ok):
            return f"{key} has the wrong type"
    return None


def _block_problem(block: Any) -> str | None:
    """A result's ``analytics``: running counts per zone and line (summaries carry the latest)."""
    if not isinstance(block, dict):
        return "analytics is not an object"
    fields = {"zones": ("objects", "entered", "exited"), "lines": ("in", "out")}
    for part, counts in fields.items():
        items = block.get(part)
        if not isinstance(items, dict) or len(items) > MAX_ITEMS:
            return f"analytics.{part} is not an object of at most {MAX_ITEMS} entries"
        for name, item in items.items():
            if not name_ok(name):
                return f"analytics.{part} has a name the config would refuse"
            if not isinstance(item, dict) or not all(_count(item.get(k)) for k in counts):
                return f"analytics.{part}.{name} lacks a count of {', '.join(counts)}"
    return None


def _event_problem(body: dict[str, Any]) -> str | None:
    """An event as the message schema's ``$defs/event`` describes it, of this version
    (:data:`SCHEMA_VERSION`; unknown keys pass: the frame bound covers them, and a newer
    agent's field must not cost every event)."""
    if body.get("schema") != SCHEMA_VERSION or body.get("type") != "event":
        return f"not schema {SCHEMA_VERSION} and type event"
    run = body.get("run_id")
    if not isinstance(run, str) or not run or len(run) > MAX_NAME or not run.isprintable():
        return "run_id is not a printable string of 1..128 characters"
    checks = (
        ("seq", _count),
        ("frame_id", _count),
        ("class_id", _count),
        ("track_id", lambda v: _count(v) and v >= 1),
        ("at_unix_s", finite_number),
        ("device", _short),
        ("label", _label),
    )
    for key, ok in checks:
        if not ok(body.get(key)):
            return f"{key} is missing or has the wrong type"
    kind = body.get("kind")
    if kind not in EVENT_KINDS:
        return f"kind is not one of {', '.join(EVENT_KINDS)}"
    own, other = ("zone", "line") if kind in _ZONE_KINDS else ("line", "zone")
    if not name_ok(body.get(own)) or other in body:
        return f"a {kind} event names one {own} (a name the config takes) and no {other}"
    if kind == "cross" and body.get("direction") not in ("in", "out"):
        return "a cross event's direction is not in or out"
    needs = {"exit": ("entered_unix_s", "dwell_s", "reason"), "dwell": ("entered_unix_s", "threshold_s")}
    missing = [k for k in needs.get(kind, ()) if k not in body]
    if missing:
        return f"a {kind} event without {', '.join(missing)}"
    optional = (
        ("entered_unix_s", finite_number),
        ("threshold_s", finite_number),
        ("dwell_s", lambda v: finite_number(v) and v >= 0),
        ("reason", lambda v: v in ("left", "lost")),
        ("direction", lambda v: v in ("in", "out")),
        ("journey_id", lambda v: _count(v) and v >= 1),
    )
    for key, ok in optional:
        if not _opt(body, key, ok):
            return f"{key} has the wrong type"
    return None


def frame_problem(frame: bytes) -> str | None:
    """Why a stream frame is refused before it is decoded (None when it is not): its size."""
    limit = MAX_EVENT_BYTES if frame.startswith(EVENT_PREFIX.encode()) else MAX_FRAME_BYTES
    if len(frame) > limit:
        return f"{len(frame)} bytes, over {limit}"
    return None


def decode_message(frame: bytes) -> tuple[str, Any]:
    """:func:`edge_agent.core.stream_frames.decode` with the uplink's bound on the frame's size (an
    event's is smaller). Raises MessageError."""
    problem = frame_problem(frame)
    if problem is not None:
        raise MessageError(problem)
    return decode(frame)


def read_message(frame: bytes, result_prefix: str) -> tuple[str, dict[str, Any]]:
    """A stream frame the uplink may take: :func:`decode_message`, then
    :func:`message_problem`. Raises MessageError naming the topic and the reason."""
    topic, body = decode_message(frame)
    problem = message_problem(topic, body, result_prefix)
    if problem is not None:
        raise MessageError(f"{topic[:64]!r}: {problem}")
    return topic, body


def message_problem(topic: str, body: Any, result_prefix: str) -> str | None:
    """Why the uplink must not take this stream message (None when it may)."""
    if not isinstance(body, dict):
        return "the body is not an object"
    if topic == "health":
        source = body.get("source")
        problem = name_problem(source)
        return f"source {problem}" if problem else _health_problem(body)
    if topic.startswith(EVENT_PREFIX):
        source = topic[len(EVENT_PREFIX) :]
        problem = name_problem(source)
        if problem is None and body.get("source") != source:
            problem = "differs between the topic and the body"  # an event names its source
        return f"source {problem}" if problem else _event_problem(body)
    if not topic.startswith(result_prefix):
        return None  # not forwarded: nothing to check
    source = body.get("source", topic[len(result_prefix) :])
    problem = name_problem(source) or name_problem(topic[len(result_prefix) :])
    return f"source {problem}" if problem else _result_problem(body)
