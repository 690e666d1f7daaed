"""A small client for the result stream: typed results, gap detection, CURVE.

    from edge_agent.client import subscribe

    for msg in subscribe("tcp://jetson-07:5556", topics=("det",)):
        if msg.gap:
            print(f"lost {msg.gap} messages before seq {msg.seq}")
        for d in msg.detections:
            print(msg.source, d.label, d.score, d.box_xyxy, d.track_id)

Each ZeroMQ frame is ``<topic> <body>``; the body is JSON, or msgpack when the agent
publishes with ``publish.encoding: msgpack`` (told apart by its first byte). The schema
is ``pipelines/schema/message-v<N>.schema.json``, N being :data:`SCHEMA_VERSION`
(``edge_agent.core.schema``). Each version only added fields to the one before, and fields
may be added within a version: unknown fields are kept in ``raw`` and otherwise ignored, and
a message of an earlier version parses. One that names a later version is refused
(:class:`MessageError`): its fields may mean what this client does not know.

:class:`Subscriber` is the stream's one reader (socket, topics, CURVE, timeouts, decoding);
:func:`subscribe` adds the typed messages and their gaps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import zmq

from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.stream_frames import MessageError, decode


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
    # The journey its track continues: the id of the journey's first track (the tracker
    # linked a track that broke while its object was hidden); track_id when none.
    journey_id: int | None = None


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
    journey_id: int = 0  # the track's journey (what counting follows); track_id when none


def parse(topic: str, body: Any, gap: int = 0) -> Result | Health | Event:
    """The typed message of a decoded body; MessageError when it lacks a field its type
    needs, holds one of the wrong type (anyone may publish on an endpoint), or names a
    ``schema`` other than 1 to :data:`SCHEMA_VERSION` (a message without one is read as
    this version's)."""
    if not isinstance(body, dict):
        raise MessageError(f"{topic[:64]!r}: the body is not an object")
    schema = body.get("schema", SCHEMA_VERSION)
    if isinstance(schema, bool) or not isinstance(schema, int) or not 1 <= schema <= SCHEMA_VERSION:
        raise MessageError(
            f"{topic[:64]!r}: schema {str(schema)[:20]}, not 1 to {SCHEMA_VERSION}"
            " (this client reads up to its own version)"
        )
    try:
        return _parse(topic, body, gap)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise MessageError(
            f"{topic[:64]!r}: a malformed message ({type(e).__name__}: {str(e)[:80]})"
        ) from None


def _journey(journeys: dict[str, Any], track_id: Any) -> int | None:
    """A detection's journey: its track's entry in the result's ``tracking.journeys``, or
    its track id."""
    if track_id is None:
        return None
    track = int(track_id)
    journey = journeys.get(str(track), track)
    if isinstance(journey, bool) or not isinstance(journey, int) or journey < 1:
        raise ValueError(f"journey {str(journey)[:20]!r} of track {track} is no id")
    return journey


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
            int(body.get("journey_id", body["track_id"])),
        )
    journeys = (body.get("tracking") or {}).get("journeys") or {}
    if not isinstance(journeys, dict):
        raise TypeError("tracking.journeys is not an object")
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
            _journey(journeys, d.get("track_id")),
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


def _sub_socket(
    ctx: zmq.Context,
    endpoint: str,
    topics: Iterable[str | bytes],
    server_key: str | None,
    client_cert: str | None,
    rcvhwm: int | None = None,
    sndhwm: int | None = None,
) -> zmq.Socket:
    """A SUB socket, its options set before it connects (ZeroMQ applies the high-water marks
    and the CURVE keys to connections made after they are set)."""
    sock = ctx.socket(zmq.SUB)
    sock.linger = 0
    try:
        if rcvhwm is not None:
            sock.rcvhwm = rcvhwm
        if sndhwm is not None:
            sock.sndhwm = sndhwm
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
    except BaseException:
        sock.close()
        raise
    return sock


def connect(
    endpoint: str,
    topics: tuple[str, ...] = ("",),
    server_key: str | None = None,
    client_cert: str | None = None,
    context: zmq.Context | None = None,
) -> zmq.Socket:
    """A SUB socket connected to the stream; with CURVE, ``server_key`` is the agent's public
    certificate and ``client_cert`` this client's secret one (`edge-agent keys generate`).
    Raises ValueError for CURVE keys that cannot be used. (:class:`Subscriber` is the same
    socket with receiving and decoding.)"""
    return _sub_socket(context or zmq.Context.instance(), endpoint, topics, server_key, client_cert)


class Subscriber:
    """A reader of the result stream: a SUB socket connected to ``endpoint``, subscribed to
    the topic prefixes ``topics`` (``""``: every topic), each frame received split into its
    topic and body and decoded by :func:`decode` (JSON or msgpack, within :data:`BOUNDS`).

    ``server_key`` and ``client_cert``: CURVE, as :func:`connect` takes them (ValueError when
    they cannot be used). ``timeout_s``: how long a receive waits before it returns None
    (None: until a message comes; 0: not at all). ``rcvhwm``: frames ZeroMQ queues for this
    reader before it drops the newest (0: no limit, for a reader counting seq gaps, which must
    not cause them; None: ZeroMQ's 1000). ``sndhwm``: subscription messages queued toward the
    agent (0: no limit; None: ZeroMQ's 1000, past which libzmq drops them itself).
    ``context``: the ZeroMQ context (default: the process's shared one; it is not ended
    here). A context manager; :meth:`close` may be called more than once.

        with Subscriber("tcp://127.0.0.1:5556", ("det.", "health"), timeout_s=1.0) as sub:
            while (got := sub.recv()) is not None:
                topic, body = got
    """

    def __init__(
        self,
        endpoint: str,
        topics: Iterable[str | bytes] = ("",),
        *,
        server_key: str | None = None,
        client_cert: str | None = None,
        timeout_s: float | None = None,
        rcvhwm: int | None = None,
        sndhwm: int | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = endpoint
        ctx = context or zmq.Context.instance()
        self._sock = _sub_socket(ctx, endpoint, topics, server_key, client_cert, rcvhwm, sndhwm)
        self._sock.rcvtimeo = -1 if timeout_s is None else int(timeout_s * 1000)

    def subscribe(self, topic: str | bytes) -> None:
        """Receive the topics that start with ``topic`` too."""
        self._sock.subscribe(topic)

    def unsubscribe(self, topic: str | bytes) -> None:
        """Undo one :meth:`subscribe` (or one prefix given at the start) of ``topic``."""
        self._sock.unsubscribe(topic)

    def poll(self, timeout_s: float) -> bool:
        """Whether a frame is waiting, after waiting up to ``timeout_s`` for one."""
        return bool(self._sock.poll(int(timeout_s * 1000)))

    def recv_frame(self) -> bytes | None:
        """The next frame as it came (``<topic> <body>``, not decoded), or None when none came
        within ``timeout_s``: for a reader that stamps or counts a frame before decoding it."""
        try:
            return self._sock.recv()
        except zmq.Again:
            return None

    def recv(self) -> tuple[str, Any] | None:
        """The next frame's topic and decoded body, or None when none came within
        ``timeout_s``. Raises MessageError for a frame :func:`decode` refuses (anyone may
        publish on the endpoint: the caller skips it, or tells it)."""
        frame = self.recv_frame()
        return None if frame is None else decode(frame)

    def close(self) -> None:
        self._sock.close(linger=0)

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def subscribe(
    endpoint: str,
    topics: tuple[str, ...] = ("det", "health"),
    server_key: str | None = None,
    client_cert: str | None = None,
    timeout_s: float | None = None,
) -> Iterator[Result | Health | Event]:
    """Yield typed messages, each with the messages lost on its topic just before it (``gap``);
    one the decoder or the parser refuses is skipped. Stops (returns) after ``timeout_s``
    without a message (None or 0: never)."""
    gaps = GapTracker()
    with Subscriber(
        endpoint, topics, server_key=server_key, client_cert=client_cert, timeout_s=timeout_s or None
    ) as sub:
        while True:
            try:  # anyone may publish on the endpoint: a bad message is skipped
                got = sub.recv()
                if got is None:
                    return
                msg = parse(*got)
            except MessageError:
                continue
            if hasattr(msg, "seq"):
                msg = dataclasses.replace(msg, gap=gaps.update(msg.topic, msg.seq))
            yield msg
