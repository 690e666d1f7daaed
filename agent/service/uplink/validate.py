"""What the uplink accepts from the agent's stream: a hand-written check of the fields it
uses (pipelines/schema/message-v2.schema.json describes them all; jsonschema is a test
dependency only). Anyone on the host can publish on the agent's endpoint while the agent
is down and CURVE is off, so a message is checked before it reaches the spool: one that
could not be published, or would break a summary, is rejected there and counted, instead
of blocking everything queued behind it.
"""

from __future__ import annotations

import math
from typing import Any

from edge_agent.core.names import MAX_NAME, level_problem

__all__ = ["MAX_FRAME_BYTES", "MAX_NAME", "finite_number", "message_problem", "name_problem"]

#: A stream frame larger than this is rejected before it is decoded (a result with the most
#: detections a model gives is tens of kB).
MAX_FRAME_BYTES = 1 << 20

#: Why a source name cannot be an MQTT topic level (None when it can): the config's rule
#: for names (edge_agent.core.names), so every source the config takes passes here.
name_problem = level_problem


def finite_number(v: Any) -> bool:
    """An int or a float that is finite, and not a bool (JSON's true is no number here)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


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
        if not isinstance(d, dict) or not isinstance(d.get("label"), str) or not _count(d.get("class_id")):
            return "a detection without a string label and a class_id"
    checks = (
        ("model", _is(str)),
        ("device", _is(str)),
        ("deadline_missed", _is(bool)),
        ("throttled", _is(bool)),
    )
    for key, ok in checks:
        if not _opt(body, key, ok):
            return f"{key} has the wrong type"
    return None


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
        ("version", _is(str)),
        ("config_hash", _is(str)),
        ("device", _is(str)),
        ("ladder", lambda v: isinstance(v, dict) and _opt(v, "name", _is(str))),
        ("source_state", lambda v: isinstance(v, dict) and _opt(v, "error", _is((str, type(None))))),
    )
    for key, ok in checks:
        if not _opt(body, key, ok):
            return f"{key} has the wrong type"
    return None


def message_problem(topic: str, body: Any, result_prefix: str) -> str | None:
    """Why the uplink must not take this stream message (None when it may)."""
    if not isinstance(body, dict):
        return "the body is not an object"
    if topic == "health":
        source = body.get("source")
        problem = name_problem(source)
        return f"source {problem}" if problem else _health_problem(body)
    if not topic.startswith(result_prefix):
        return None  # not forwarded: nothing to check
    source = body.get("source", topic[len(result_prefix) :])
    problem = name_problem(source) or name_problem(topic[len(result_prefix) :])
    return f"source {problem}" if problem else _result_problem(body)
