"""The uplink's one check of every stream message against the JSON data model within
bounds (validate.decode_message), in both encodings, and the caps on what the health keeps
of a heartbeat (process.py)."""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest

from edge_agent.service.uplink.process import (
    MAX_COUNT_KEYS,
    MAX_HEALTH_BYTES,
    _beat_record,
    _capped_counts,
    _within_cap,
)
from edge_agent.service.uplink.validate import BOUNDS, MessageError, decode_message, read_message

RESULT = {
    "schema": 2,
    "source": "cam0",
    "seq": 1,
    "capture_mono_ns": 2**62,  # a device up for 146 years: still an int64
    "latency_ms": {"total": 3.0},
    "detections": [{"label": "person", "class_id": 0, "score": 0.9, "box_xyxy": [0, 0, 1, 1]}],
}


def as_json(body: Any) -> bytes:
    return b"det.cam0 " + json.dumps(body).encode()


def as_msgpack(body: Any) -> bytes:
    return b"det.cam0 " + msgpack.packb(body, use_bin_type=True)


@pytest.mark.parametrize("encode", [as_json, as_msgpack], ids=["json", "msgpack"])
def test_a_valid_result_passes_unchanged_in_both_encodings(encode):
    assert read_message(encode(RESULT), "det.") == ("det.cam0", RESULT)


DEEP = {"a": [{"b": []}]}
for _ in range(BOUNDS["depth"]):
    DEEP = {"a": [DEEP]}

# (what, a msgpack body, what the error names)
MSGPACK_REFUSED = [
    ("bytes", RESULT | {"x": b"\x00"}, "a bytes value (msgpack bin)"),
    ("empty bytes", RESULT | {"x": b""}, ".x: a bytes"),
    ("ExtType", RESULT | {"d": [msgpack.ExtType(1, b"ab")]}, "an ExtType (msgpack ext)"),
    ("empty ExtType", RESULT | {"d": [msgpack.ExtType(1, b"")]}, ".d[0]: a ExtType"),
    ("NaN", RESULT | {"latency_ms": {"total": math.nan}}, ".latency_ms.total: nan"),
    ("-Infinity", RESULT | {"s": [-math.inf]}, ".s[0]: -inf"),
    ("uint64", RESULT | {"n": 2**64 - 1}, ".n: an integer outside"),
    ("int64 min", RESULT | {"n": -(2**63)}, ".n: an integer outside"),
    ("bytes key", {b"k": 1}, "a bytes value"),
    ("empty bytes key", {b"": 1}, "a key of type bytes"),
    ("deep", DEEP, "nested deeper than"),
    ("too many keys", {str(k): k for k in range(BOUNDS["keys"] + 1)}, "not msgpack of JSON values"),
]


@pytest.mark.parametrize("what, body, named", MSGPACK_REFUSED, ids=[c[0] for c in MSGPACK_REFUSED])
def test_msgpack_outside_the_json_data_model_is_refused_naming_where(what, body, named):
    with pytest.raises(MessageError, match=r"det\.cam0") as e:
        decode_message(as_msgpack(body))
    assert named in str(e.value), str(e.value)


JSON_REFUSED = [
    ("NaN", b'{"seq": NaN}', "NaN is not JSON"),
    ("-Infinity", b'{"x": [-Infinity]}', "-Infinity is not JSON"),
    ("1e999", b'{"x": 1e999}', "a number out of range"),
    ("5000 digits", b'{"x": 1' + b"0" * 5000 + b"}", "an integer of 5001 digits"),
    ("deep lists", b'{"x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "nested deeper than"),
    ("deep maps", b'{"a":' * 40 + b"1" + b"}" * 40, "nested deeper than"),
    ("not JSON", b'{"a": ', "not JSON"),
    ("unpaired", b'{"a": [}', "do not pair up"),
]


@pytest.mark.parametrize("what, body, named", JSON_REFUSED, ids=[c[0] for c in JSON_REFUSED])
def test_json_outside_the_data_model_is_refused_before_it_is_built(what, body, named):
    with pytest.raises(MessageError) as e:
        decode_message(b"det.cam0 " + body)
    assert named in str(e.value), str(e.value)


def test_brackets_inside_strings_are_no_nesting():
    body = {"label": "[" * 10_000 + '\\"{' * 100, "seq": 1}
    assert decode_message(as_json(body))[1] == body


def test_a_heartbeats_counts_are_capped_in_keys_and_key_length():
    counts = {"captured": 5, "dropped_by_reason": {"late": 1}, "x" * 65: 1, "text": "no"}
    counts |= {f"k{i}": i for i in range(100)}
    kept, omitted = _capped_counts(counts)
    assert kept["captured"] == 5 and kept["dropped_by_reason"] == {"late": 1}
    assert "x" * 65 not in kept and "text" not in kept
    total = sum(len(v) if isinstance(v, dict) else 1 for v in kept.values())
    assert total == MAX_COUNT_KEYS and total + omitted == len(counts)
    line = _beat_record({"ts_unix_s": 1.0, "counts": counts, "version": "v" * 10_000})
    assert line["line"]["counts_omitted"] == omitted and len(line["version"]) == 256


def test_the_health_past_its_cap_leaves_sources_out_and_says_how_many():
    line = {"fps": 1.0, "counts": {"k" * 60: 1}, "error": "e" * 256}
    health = {"device": "d", "sources": {f"cam{i:04d}": line for i in range(2000)}}
    capped = _within_cap(health)
    size = len(json.dumps(capped, separators=(",", ":")))
    assert size <= MAX_HEALTH_BYTES and capped["sources_omitted"] > 0
    assert len(capped["sources"]) + capped["sources_omitted"] == 2000
    assert _within_cap({"device": "d", "sources": {"a": line}}) == {"device": "d", "sources": {"a": line}}
