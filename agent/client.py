"""A small client for the result stream: typed results, gap detection, CURVE.

    from edge_agent.client import subscribe

    for msg in subscribe("tcp://jetson-07:5556", topics=("det",)):
        if msg.gap:
            print(f"lost {msg.gap} messages before seq {msg.seq}")
        for d in msg.detections:
            print(msg.source, d.label, d.score, d.box_xyxy, d.track_id)

Each ZeroMQ frame is ``<topic> <body>``; the body is JSON, or msgpack when the agent
publishes with ``publish.encoding: msgpack`` (told apart by its first byte). The schema
is ``pipelines/schema/message-v2.schema.json`` (version 2 added the tracker's fields to
version 1's, then the events of zones and lines on ``event.<source>``); fields may be added
within a version, so unknown fields are kept in ``raw`` and otherwise ignored. Messages of
either version parse.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq


@dataclass(frozen=True)
class Detection:
    label: str
    class_id: int
    score: float
    box_xyxy: tuple[float, float, float, float]  # source pixels
    track_id: int | None = None  # the source's tracker's (None: untracked, or no tracker)
    track_age: int = 0  # frames since the track's first detection
    # A pose model's keypoints ([x, y, conf] each, source pixels); an oriented-box model's
    # rotated box (center, size, angle, corners); a segmentation model's mask (polygons or
    # rle). None for a plain detector.
    keypoints: tuple[tuple[float, ...], ...] | None = None
    obb: dict[str, Any] | None = None
    mask: dict[str, Any] | None = None


@dataclass(frozen=True)
class Result:
    topic: str
    source: str
    seq: int
    frame_id: int
    capture_unix_s: float
    latency_ms: dict[str, float]
    deadline_missed: bool
    throttled: bool
    detections: tuple[Detection, ...]
    gap: int  # messages lost on this topic just before this one (from seq)
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Health:
    topic: str
    fps: float
    counts: dict[str, Any]
    final: bool
    raw: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Event:
    """A zone's or line's event (docs/analytics.md): ``kind`` enter, exit, cross or dwell,
    ``where`` the zone's or line's name, ``direction`` in or out for a crossing."""

    topic: str
    source: str
    seq: int  # per source and run (``run_id``): a gap is lost events, a repeat a duplicate
    run_id: str
    kind: str
    where: str
    direction: str | None
    track_id: int
    label: str
    frame_id: int
    at_unix_s: float
    gap: int
    raw: dict[str, Any] = field(repr=False)


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


def parse(topic: str, body: Any, gap: int = 0) -> Result | Health | Event:
    """The typed message of a decoded body; MessageError when it lacks a field its type
    needs or holds one of the wrong type (anyone may publish on an endpoint)."""
    if not isinstance(body, dict):
        raise MessageError(f"{topic[:64]!r}: the body is not an object")
    try:
        return _parse(topic, body, gap)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise MessageError(
            f"{topic[:64]!r}: a malformed message ({type(e).__name__}: {str(e)[:80]})"
        ) from None


def _parse(topic: str, body: dict[str, Any], gap: int) -> Result | Health | Event:
    if body.get("type") == "health":
        return Health(
            topic, float(body.get("fps", 0.0)), body.get("counts", {}), bool(body.get("final")), body
        )
    if body.get("type") == "event":
        return Event(
            topic,
            body["source"],
            int(body["seq"]),
            str(body["run_id"]),
            body["kind"],
            body.get("zone") or body.get("line") or "",
            body.get("direction"),
            int(body["track_id"]),
            body["label"],
            int(body["frame_id"]),
            float(body["at_unix_s"]),
            gap,
            body,
        )
    dets = tuple(
        Detection(
            d["label"],
            int(d["class_id"]),
            float(d["score"]),
            tuple(d["box_xyxy"]),
            int(d["track_id"]) if d.get("track_id") is not None else None,
            int(d.get("track_age", 0)),
            tuple(tuple(k) for k in d["keypoints"]) if d.get("keypoints") is not None else None,
            d.get("obb"),
            d.get("mask"),
        )
        for d in body.get("detections", ())
    )
    return Result(
        topic,
        body["source"],
        int(body["seq"]),
        int(body["frame_id"]),
        float(body.get("capture_unix_s", 0.0)),
        body.get("latency_ms", {}),
        bool(body.get("deadline_missed")),
        bool(body.get("throttled")),
        dets,
        gap,
        body,
    )


class GapTracker:
    """Messages lost per topic, from the sequence numbers (a restart of the agent resets seq).

    ``joined`` is the seq each topic was first received at: the messages before it were
    published before this subscriber joined (or lost while its subscription was on its
    way), so a subscriber that must see a file's every result checks that it is 0.
    """

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.lost: dict[str, int] = {}
        self.joined: dict[str, int] = {}

    def update(self, topic: str, seq: int) -> int:
        prev = self.last.get(topic)
        if prev is None:
            self.joined[topic] = seq
        self.last[topic] = seq
        gap = seq - prev - 1 if prev is not None and seq > prev else 0
        if gap:
            self.lost[topic] = self.lost.get(topic, 0) + gap
        return gap


def stream_endpoint(endpoint: str) -> str:
    """The address to connect to for an agent's bind address: ``tcp://*:5556`` and
    ``tcp://0.0.0.0:5556`` are this host's loopback."""
    for wildcard in ("tcp://*:", "tcp://0.0.0.0:"):
        if endpoint.startswith(wildcard):
            return "tcp://127.0.0.1:" + endpoint[len(wildcard) :]
    return endpoint


def connect(
    endpoint: str,
    topics: tuple[str, ...] = ("",),
    server_key: str | None = None,
    client_cert: str | None = None,
    context: zmq.Context | None = None,
) -> zmq.Socket:
    """A SUB socket connected to the stream; with CURVE, ``server_key`` is the agent's public
    certificate and ``client_cert`` this client's secret one (`edge-agent keys generate`)."""
    ctx = context or zmq.Context.instance()
    sock = ctx.socket(zmq.SUB)
    sock.linger = 0
    if server_key or client_cert:
        from zmq import auth

        if not (server_key and client_cert):
            raise ValueError("CURVE needs both the server's public key and this client's certificate")
        server_public, _ = auth.load_certificate(server_key)
        public, secret = auth.load_certificate(client_cert)
        if secret is None:
            raise ValueError(f"{client_cert} holds no secret key (use the .key_secret file)")
        sock.curve_serverkey = server_public
        sock.curve_publickey = public
        sock.curve_secretkey = secret
    for topic in topics:
        sock.subscribe(topic)
    sock.connect(endpoint)
    return sock


def subscribe(
    endpoint: str,
    topics: tuple[str, ...] = ("det", "health"),
    server_key: str | None = None,
    client_cert: str | None = None,
    timeout_s: float | None = None,
) -> Iterator[Result | Health]:
    """Yield typed messages; stops (returns) after ``timeout_s`` without a message."""
    sock = connect(endpoint, topics, server_key, client_cert)
    sock.rcvtimeo = int(timeout_s * 1000) if timeout_s else -1
    gaps = GapTracker()
    try:
        while True:
            try:
                frame = sock.recv()
            except zmq.Again:
                return
            try:  # anyone may publish on the endpoint: a bad message is skipped
                topic, body = decode(frame)
                msg = parse(topic, body)
            except MessageError:
                continue
            if hasattr(msg, "seq"):
                msg = dataclasses.replace(msg, gap=gaps.update(topic, msg.seq))
            yield msg
    finally:
        sock.close()
