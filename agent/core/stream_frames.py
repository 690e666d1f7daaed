"""The result stream's frames decoded within bounds: ``<topic> <body>``, the body JSON or
msgpack (told apart by its first byte), held to the JSON data model and to ``BOUNDS``
before and while it is built. Every reader of the stream decodes through it: the client
(``edge_agent.client``), the uplink, the tools.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

#: A stream frame larger than this is rejected before it is decoded (a result with the most
#: detections a model gives is tens of kB; with segmentation masks as RLE (``model.masks:
#: rle``) a hundred large objects at 1080p or 4K come near it: polygons are the default).
MAX_FRAME_BYTES = 1 << 20

#: The JSON data model's bounds on every stream message (docs/fleet.md lists them). Depth:
#: a result is 6 deep (detections, a mask's polygons, their points). Keys: a heartbeat's
#: maps hold tens. Items: an RLE mask holds at most 20,000 runs (tasks/segment.py), a
#: result at most a few hundred detections. Ints: signed 64-bit, as msgpack carries them
#: (``capture_mono_ns`` passes 2**53 after 104 days of uptime).
BOUNDS = {
    "depth": 32,
    "keys": 1024,
    "items": 65536,
    "string_chars": 65536,
    "values": 262144,
    "int_abs": 2**63,
}
_INT_DIGITS = 19  # a JSON int longer than this is refused before int() builds it


class MessageError(ValueError):
    """A stream message refused: the message says what is wrong and where."""


# A JSON string (escapes included) and everything that is not a bracket: what remains of a
# body is its brackets only, so its depth is counted without parsing (json recurses).
# An unterminated string runs to the end (the body is then not JSON, which json.loads says):
# without that, each of n quotes would start a scan to the end, n² in all.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_INNERMOST = re.compile(rb"\[\]|\{\}")


def _json_depth_problem(body: bytes) -> str | None:
    """Nesting past BOUNDS["depth"], found in O(size * depth) without recursion: each pass
    removes the innermost pairs of brackets; what is left after ``depth`` passes is deeper."""
    brackets = _JSON_STRING.sub(b"", body).translate(None, _NOT_BRACKETS)
    if brackets.count(b"[") + brackets.count(b"{") != brackets.count(b"]") + brackets.count(b"}"):
        return "not JSON (its brackets do not pair up)"
    for _ in range(BOUNDS["depth"]):
        if not brackets:
            return None
        brackets = _INNERMOST.sub(b"", brackets)
    return f"nested deeper than {BOUNDS['depth']}" if brackets else None


def _json_int(text: str) -> int:
    if len(text.lstrip("-")) > _INT_DIGITS:
        raise MessageError(f"an integer of {len(text)} digits, outside ±2**63")
    return int(text)


def _json_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MessageError(f"a number out of range ({text[:32]})")
    return value


def _json_constant(name: str) -> Any:
    raise MessageError(f"{name} is not JSON (numbers must be finite)")


def _where(path: list[Any]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)[:200] or "the body"


def data_model_problem(value: Any) -> str | None:
    """Why ``value`` is not JSON's data model within :data:`BOUNDS` (None when it is), with
    where: only dicts with str keys, lists, str, int, finite floats, bool and None. Walked
    without recursion, so a deep value costs a loop, not the stack."""
    b = BOUNDS
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    values = 0
    while stack:
        v, path = stack.pop()
        values += 1
        if values > b["values"]:
            return f"more than {b['values']} values"
        if len(path) > b["depth"]:
            return f"{_where(path)}: nested deeper than {b['depth']}"
        if isinstance(v, str):
            if len(v) > b["string_chars"]:
                return f"{_where(path)}: a string over {b['string_chars']} characters"
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not -b["int_abs"] < v < b["int_abs"]:
                return f"{_where(path)}: an integer outside ±2**63"
        elif isinstance(v, float):
            if not math.isfinite(v):
                return f"{_where(path)}: {v} (numbers must be finite)"
        elif isinstance(v, dict):
            if len(v) > b["keys"]:
                return f"{_where(path)}: a map of more than {b['keys']} keys"
            for k, item in v.items():
                if not isinstance(k, str):
                    return f"{_where(path)}: a key of type {type(k).__name__} (keys are strings)"
                if len(k) > b["string_chars"]:
                    return f"{_where(path)}: a key over {b['string_chars']} characters"
                stack.append((item, [*path, k[:64]]))
        elif isinstance(v, list):
            if len(v) > b["items"]:
                return f"{_where(path)}: a list of more than {b['items']} items"
            stack.extend((item, [*path, i]) for i, item in enumerate(v))
        else:  # bytes, msgpack's ExtType or Timestamp, a tuple: nothing JSON can carry
            return f"{_where(path)}: a {type(v).__name__}, not a JSON value"
    return None


def _msgpack_problem(e: Exception) -> str:
    """msgpack's refusal in words: its bounds on bin and ext lengths are 0, so a bytes value
    or an ExtType is refused before it is built."""
    text = str(e)
    if "max_bin_len" in text:
        return "a bytes value (msgpack bin), not a JSON value"
    if "max_ext_len" in text:
        return "an ExtType (msgpack ext), not a JSON value"
    return f"not msgpack of JSON values ({type(e).__name__}: {text[:80]})"


def decode(frame: bytes, max_bytes: int = MAX_FRAME_BYTES) -> tuple[str, Any]:
    """Split a stream frame into its topic and body (JSON, or msgpack when it does not start
    with ``{``), held to the JSON data model within :data:`BOUNDS`: bounded before it is
    built where the decoder allows (``max_bytes``, msgpack's length limits, JSON's depth),
    and walked after. Raises MessageError saying what and where."""
    if len(frame) > max_bytes:
        raise MessageError(f"{len(frame)} bytes, over {max_bytes}")
    raw_topic, _, body = frame.partition(b" ")
    try:
        topic = raw_topic.decode()
    except UnicodeDecodeError as e:
        raise MessageError(f"the topic is not UTF-8 ({e.reason})") from None
    where = f"{topic[:64]!r}"
    if body[:1] == b"{":
        problem = _json_depth_problem(body)
        if problem is not None:
            raise MessageError(f"{where}: {problem}")
        try:
            value = json.loads(
                body, parse_int=_json_int, parse_float=_json_float, parse_constant=_json_constant
            )
        except MessageError as e:
            raise MessageError(f"{where}: {e}") from None
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8
            raise MessageError(f"{where}: not JSON ({str(e)[:80]})") from None
    else:
        import msgpack

        b = BOUNDS
        try:
            value = msgpack.unpackb(
                body,
                raw=False,
                max_str_len=b["string_chars"] * 4,  # bytes of UTF-8
                max_bin_len=0,
                max_ext_len=0,
                max_array_len=b["items"],
                max_map_len=b["keys"],
            )
        except Exception as e:  # msgpack raises several types, all meaning "not this"
            raise MessageError(f"{where}: {_msgpack_problem(e)}") from None
    problem = data_model_problem(value)
    if problem is not None:
        raise MessageError(f"{where}: {problem}")
    return topic, value
