"""Fuzz target: retained health payloads into `fleet status` (``status.parse_health``, then
``safe_row``, the table and --json). Whatever is retained under the prefix, a row is
always produced, valid or ``invalid``, and it prints; never an exception, never a hang."""

from __future__ import annotations

import json
import math

from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.service.uplink.status import parse_health, safe_row, table
from edge_agent.service.uplink.validate import MessageError

NOW = 1_800_000_000.0

NUMBERS = st.one_of(
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([2**53, 2**53 - 1, -1, 10**4299, 1e308]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=20))
KEYS = st.one_of(
    st.text(max_size=10),
    st.sampled_from(["fps", "events", "miss_rate", "e2e_p99_ms", "ts_unix_s", "sources", "model"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=25,
)


def health() -> dict:
    return {
        "device": "d",
        "ts_unix_s": NOW,
        "health_interval_s": 5.0,
        "agent_silent_s": 0.1,
        "agent_silent_after_s": 2.0,
        "last_heartbeat_unix_s": NOW,
        "version": "1.0",
        "config_hash": "abc",
        "model": "m",
        "throttled": False,
        "power_mode": "",
        "events_interval_s": 5.0,
        "sources": {"cam0": {"fps": 30.0, "e2e_p99_ms": 9.0, "miss_rate": 0.0, "events": 3}},
    }


def dumps(value: object) -> bytes:
    """JSON as any publisher may write it: NaN, Infinity and ints of any length included."""
    return json.dumps(value, default=repr).encode()


def shown(payload: bytes, status: str = "online") -> dict:
    """The property: a row comes out, and it prints in the table and as JSON."""

    def show() -> dict:
        row = safe_row("dev", status, parse_health(payload), NOW)
        table([row])
        json.dumps(row, allow_nan=False)
        return row

    row = bounded(show, MessageError)
    assert row is not None and row["status"] in (status, "invalid", "stale", "silent"), row
    return row


@st.composite
def near_valid(draw: st.DrawFn) -> dict:
    """A valid health with one field (of it, or of its source) replaced by any value."""
    body = health()
    target = draw(st.sampled_from([body, body["sources"]["cam0"]]))
    key = draw(st.one_of(st.sampled_from(sorted(target)), KEYS))
    target[key] = draw(VALUES)
    return body


@settings(max_examples=examples(70))
@given(near_valid())
@example(health() | {"sources": {f"c{i}": {"events": 10**4299} for i in range(10)}})
@example(health() | {"ts_unix_s": math.nan})
@example(health() | {"sources": {"c": {"fps": 2.0**53}}})
def test_near_valid_healths(body: dict) -> None:
    shown(dumps(body))


@settings(max_examples=examples(70))
@given(VALUES)
def test_any_json_value(value: object) -> None:
    shown(dumps(value))


@given(st.binary(max_size=512), st.text(max_size=8))
@example(b"[" * 100_000, "online")
@example(b'{"ts_unix_s": 1' + b"0" * 5000 + b"}", "online")
@example(b"\xff", "\x1b[2J")
def test_raw_bytes(payload: bytes, status: str) -> None:
    shown(payload, status)


@settings(max_examples=examples(5))
@given(st.integers(1, 3))
def test_payloads_past_the_size_cap(mib: int) -> None:
    row = shown(dumps(health() | {"model": "m" * (mib << 20)}))
    assert row["status"] == "invalid" and "too large" in row["error"]
