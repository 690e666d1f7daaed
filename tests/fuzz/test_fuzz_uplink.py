"""Fuzz target: stream messages into the uplink's check (``validate.read_message``: the
frame bound, JSON or msgpack decoding held to the JSON data model, then the fields the
uplink uses). Whatever comes off the agent's endpoint, it returns a message the uplink can
encode as strict JSON, or raises MessageError; never another exception, never a hang."""

from __future__ import annotations

import json
import math

import msgpack
from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.service.uplink.validate import BOUNDS, MessageError, read_message

TOPICS = st.sampled_from(["det.cam0", "health", "event.cam0", "det.a#b", "det.", "other", "event.x/y"])

# Every value msgpack can carry, JSON's and the rest: bytes, ExtType, huge ints, NaN.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=8),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
)
KEYS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["seq", "source", "latency_ms", "detections", "kind", "journey_id", "tracking"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(KEYS, inner, max_size=5)),
    max_leaves=30,
)


def result(seq: int) -> dict:
    return {
        "schema": 2,
        "source": "cam0",
        "seq": seq,
        "latency_ms": {"total": 3.0},
        "detections": [{"label": "person", "class_id": 0, "score": 0.9, "box_xyxy": [0, 0, 1, 1]}],
    }


def beat() -> dict:
    return {"source": "cam0", "ts_unix_s": 1.7e9, "counts": {"dropped": 0}, "fps": 5.0}


def event(seq: int) -> dict:
    return {
        "schema": 2,
        "type": "event",
        "source": "cam0",
        "device": "d",
        "run_id": "r",
        "seq": seq,
        "kind": "enter",
        "zone": "door",
        "track_id": 1,
        "label": "person",
        "class_id": 0,
        "frame_id": seq,
        "at_unix_s": 1.7e9,
    }


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, dict]:
    """A valid message of each kind with one field replaced or added by any value."""
    topic, body = draw(
        st.sampled_from([("det.cam0", result(1)), ("health", beat()), ("event.cam0", event(1))])
    )
    key = draw(st.one_of(st.sampled_from(sorted(body)), KEYS))
    body[key] = draw(VALUES)
    return topic, body


def frame(topic: str, body: bytes) -> bytes:
    return topic.encode() + b" " + body


def check(frame_bytes: bytes) -> None:
    """The property: read_message returns something strict JSON carries, or raises MessageError."""

    def take() -> object:
        topic, body = read_message(frame_bytes, "det.")
        json.dumps(body, allow_nan=False)  # what the uplink does next: must not raise
        return topic

    bounded(take, MessageError)


def packb(value: object) -> bytes | None:
    """msgpack of ``value``; None for what msgpack itself cannot pack (an int past 64 bits)."""
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (ValueError, OverflowError, TypeError):
        return None


@settings(max_examples=examples(70))
@given(near_valid())
@example(("det.cam0", result(1) | {"x": b"\x00"}))
@example(("event.cam0", event(1) | {"note": msgpack.ExtType(1, b"")}))
@example(("det.cam0", result(1) | {"latency_ms": {"total": math.nan}}))
@example(("health", beat() | {"counts": {"dropped": 0, "x": 2**64 - 1}}))
def test_near_valid_msgpack_messages(message: tuple[str, dict]) -> None:
    topic, body = message
    data = packb(body)
    if data is not None:
        check(frame(topic, data))


@settings(max_examples=examples(70))
@given(near_valid())
@example(("det.cam0", result(1) | {"score": math.inf}))
@example(("health", beat() | {"ts_unix_s": 10**300}))  # finite_number raised OverflowError on it
def test_near_valid_json_messages(message: tuple[str, dict]) -> None:
    topic, body = message
    try:
        text = json.dumps(body, default=repr).encode()
    except (ValueError, OverflowError):
        return
    check(frame(topic, text))


@settings(max_examples=examples(70))
@given(TOPICS, VALUES)
def test_any_msgpack_value(topic: str, value: object) -> None:
    body = packb(value)
    if body is not None:
        check(frame(topic, body))


@settings(max_examples=examples(40))
@given(TOPICS, st.integers(0, 5000), st.sampled_from(["[", '{"a":', "\x91", "\x81\xa1a"]))
@example("det.cam0", 100_000, "[")
@example("det.cam0", 100_000, "\x91")
@example("health", BOUNDS["depth"] + 1, '{"a":')
def test_deep_nesting(topic: str, depth: int, opener: str) -> None:
    """Nesting far past the bound, in JSON (which recurses) and msgpack: refused cheaply."""
    if opener == "[":
        body = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    elif opener.startswith("{"):
        body = b'{"a":' * depth + b"1" + b"}" * depth
    else:
        body = b"\x81\xa1a" + opener.encode("latin-1") * depth + b"\xc0"
    check(frame(topic, body))


@given(st.binary(max_size=512))
@example(b'det.cam0 {"seq": NaN}')
@example(b'det.cam0 {"seq": 1' + b"0" * 5000 + b"}")
@example(b'det.cam0 {"s": "\\\\"}')
@example(b"\xff\xfe {}")
@example(b"det.cam0 \xc7\x00\x05")
def test_raw_bytes(raw: bytes) -> None:
    check(raw)


@given(st.binary(max_size=256))
def test_raw_bytes_after_a_topic(raw: bytes) -> None:
    check(b"det.cam0 " + raw)


@settings(max_examples=examples(20))
@given(st.integers(1, 4), st.sampled_from(["json", "msgpack"]))
def test_frames_near_the_size_bound(scale: int, encoding: str) -> None:
    """Large frames, within and past 1 MiB: bounded in time and memory either way."""
    pad = "x" * (scale << 18)
    body = {"source": "cam0", "seq": 1, "latency_ms": {"total": 1.0}, "detections": [], "pad": pad}
    data = json.dumps(body).encode() if encoding == "json" else packb(body)
    check(frame("det.cam0", data))
