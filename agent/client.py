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

import json
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


def decode(frame: bytes) -> tuple[str, dict[str, Any]]:
    """Split a stream frame into its topic and decoded body (JSON or msgpack)."""
    topic, _, body = frame.partition(b" ")
    if body[:1] == b"{":
        return topic.decode(), json.loads(body)
    import msgpack

    return topic.decode(), msgpack.unpackb(body, raw=False)


def parse(topic: str, body: dict[str, Any], gap: int = 0) -> Result | Health | Event:
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
            topic, body = decode(frame)
            gap = gaps.update(topic, int(body["seq"])) if "seq" in body else 0
            yield parse(topic, body, gap)
    finally:
        sock.close()
