"""Fuzz target: the Python client's reading of a decoded stream message (``client.parse``),
above all the tracker's fields a result or an event carries (``tracking.journeys``,
``journey_id``, ``track_id``). Whatever a publisher on the endpoint sends, it returns a
typed message or raises MessageError; never another exception, never a hang."""

from __future__ import annotations

from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.client import Event, Health, Result, parse
from edge_agent.core.stream_frames import MessageError

# What a decoded JSON or msgpack body holds (stream_frames.decode keeps to JSON's data model).
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
KEYS = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["track_id", "journey_id", "tracking", "journeys", "detections", "seq", "1", "2"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=20,
)
DETECTION = {
    "label": "a", "class_id": 0, "score": 0.9, "box_xyxy": [0, 0, 1, 1], "track_id": 2, "track_age": 5,
}  # fmt: skip
RESULT = {
    "source": "cam0", "seq": 1, "frame_id": 1, "latency_ms": {"total": 4.0},
    "detections": [DETECTION, DETECTION | {"track_id": 1}], "tracking": {"journeys": {"2": 1}},
}  # fmt: skip
EVENT = {
    "type": "event", "source": "cam0", "seq": 0, "run_id": "r", "kind": "cross", "line": "door",
    "direction": "in", "track_id": 2, "journey_id": 1, "label": "a", "frame_id": 9, "at_unix_s": 1.0,
}  # fmt: skip


@st.composite
def near_valid(draw: st.DrawFn) -> tuple[str, dict]:
    """A valid result or event with one field (at the top, in the tracking block or in a
    detection) replaced or added by any value."""
    topic, body = draw(st.sampled_from([("det.cam0", RESULT), ("event.cam0", EVENT)]))
    body = {**body, "detections": [dict(d) for d in body.get("detections", [])]}
    if topic == "event.cam0":
        body.pop("detections")
    where = draw(st.sampled_from(["top", "journeys", "detection"] if topic == "det.cam0" else ["top"]))
    target = (
        body
        if where == "top"
        else body.setdefault("tracking", {}).setdefault("journeys", {})
        if where == "journeys"
        else body["detections"][0]
    )
    target[draw(KEYS)] = draw(VALUES)
    return topic, body


def check(topic: str, body: object) -> None:
    def take() -> object:
        message = parse(topic, body)
        assert isinstance(message, (Result, Health, Event))
        if isinstance(message, Result):
            for d in message.detections:  # a tracked detection's journey is an id
                assert d.journey_id is None or (type(d.journey_id) is int and d.journey_id >= 1)
        return message

    bounded(take, MessageError)


@settings(max_examples=examples(100))
@given(near_valid())
@example(("det.cam0", RESULT | {"tracking": {"journeys": {"2": 0}}}))
@example(("det.cam0", RESULT | {"tracking": {"journeys": {"2": True}}}))
@example(("det.cam0", RESULT | {"tracking": {"journeys": {"2": 2.5}}}))
@example(("det.cam0", RESULT | {"tracking": {"journeys": [[2, 1]]}}))
@example(("det.cam0", RESULT | {"tracking": "x"}))
@example(("event.cam0", EVENT | {"journey_id": "1"}))
def test_near_valid_messages(message: tuple[str, dict]) -> None:
    check(*message)


@settings(max_examples=examples(50))
@given(st.sampled_from(["det.cam0", "event.cam0", "health"]), VALUES)
def test_any_body(topic: str, body: object) -> None:
    check(topic, body)
