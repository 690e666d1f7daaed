"""Journeys (pipelines/tracking): where the motion model loses an object and a new track
takes it up, the new track continues the lost one's journey; the gate, its failure modes
and its bounds on hand-made boxes; tracks that left the view; then the counting of a
journey's crossings (pipelines/analytics) and the step's message block."""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig
from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.analytics.counter import IN, OUT, Counter
from edge_agent.pipelines.tracking.bytetrack import ByteTracker


class Run:
    """A tracker fed frames of boxes; returns each frame's (track id, journey) pairs."""

    def __init__(self, **params) -> None:
        self.t = ByteTracker(TrackerConfig(**params))
        self.t.view = (640.0, 480.0)
        self.ids = np.zeros(256, np.int64)
        self.age = np.zeros(256, np.int32)
        self.journey = np.zeros(256, np.int64)

    def frame(self, boxes, scores=None, classes=None, dt: float = 1.0) -> list[tuple[int, int]]:
        xyxy = np.asarray(boxes, np.float32).reshape(-1, 4)
        m = len(xyxy)
        s = np.full(m, 0.9, np.float32) if scores is None else np.asarray(scores, np.float32)
        c = np.zeros(m, np.int32) if classes is None else np.asarray(classes, np.int32)
        self.t.update(xyxy, s, c, dt, self.ids, self.age, self.journey)
        return list(zip(self.ids[:m].tolist(), self.journey[:m].tolist()))


def box(x: float, y: float = 100.0, size: float = 40.0) -> list[float]:
    return [x, y, x + size, y + size]


def stop_behind(run: Run, hidden: range, speed: float = 6.0, frames: int = 80, cls: int = 0) -> set:
    """An object moving right at ``speed``, hidden during ``hidden``, in which it stops (the
    Kalman filter predicts it on at its speed); the (id, journey) pairs it was given."""
    seen, x = set(), 20.0
    for t in range(frames):
        if t not in hidden:
            x += speed
        out = run.frame([] if t in hidden else [box(x)], classes=[] if t in hidden else [cls])
        seen.update(p for p in out if p[0])
    return seen


def test_a_track_that_breaks_while_hidden_continues_in_a_new_one():
    """Hidden for 20 frames, during which it stopped: the Kalman filter puts it 120 px on,
    no IoU with where it comes back. It gets a new id, which continues the lost track's
    journey; the lost track ends at once."""
    run = Run()
    assert stop_behind(run, range(30, 50)) == {(1, 1), (2, 1)}
    assert run.t.links == 1 and run.t.live == 1


def test_no_journey_when_journeys_are_off():
    run = Run(journeys=False)
    assert stop_behind(run, range(30, 50)) == {(1, 1), (2, 2)}
    assert run.t.links == 0


def test_no_journey_for_another_label():
    """The same, but the object comes back as another class: a new journey."""
    run = Run()
    x, seen = 20.0, set()
    for t in range(80):
        if not 30 <= t < 50:
            x += 6
        hidden = 30 <= t < 50
        out = run.frame([] if hidden else [box(x)], classes=[] if hidden else [0 if t < 30 else 1])
        seen.update(p for p in out if p[0])
    assert seen == {(1, 1), (2, 2)}
    assert run.t.links == 0


def test_a_track_that_left_the_view_is_no_journey_and_ends_soon():
    """An object walks out of the right edge and another of its class walks in there 20
    frames later: the lost track left the view (its last box touched the edge), so the new
    one is a journey of its own; and the lost track ended after EDGE_LOST frames, not
    lost_frames."""
    run = Run(lost_frames=90)
    x, seen = 500.0, set()
    for _ in range(40):  # out through the right edge (640), gone for 16 frames
        x += 6
        out = run.frame([[x, 100, min(x + 40, 640.0), 140]] if x < 640 else [])
        seen.update(p for p in out if p[0])
    assert run.t.live == 0, "ended within EDGE_LOST frames of its last detection"
    for t in range(10):  # back in
        out = run.frame([[600 - 4 * t, 100, 640, 140]])
        seen.update(p for p in out if p[0])
    assert seen == {(1, 1), (2, 2)} and run.t.links == 0


def test_no_journey_across_a_gap_longer_than_lost_frames():
    run = Run(lost_frames=10)
    assert stop_behind(run, range(30, 42)) == {(1, 1), (2, 2)}
    assert run.t.links == 0


def test_no_journey_far_from_where_the_lost_track_would_be():
    """It comes back 200 px behind where it stopped: outside the gate (its size plus the
    way it could have gone at its speed over the gap)."""
    run = Run()
    x, seen = 300.0, set()
    for t in range(80):
        hidden = 30 <= t < 45
        if t < 30:
            x += 4
        elif t == 45:
            x -= 200
        elif t > 45:
            x += 4
        out = run.frame([] if hidden else [box(x)])
        seen.update(p for p in out if p[0])
    assert seen == {(1, 1), (2, 2)}


def test_no_journey_from_a_track_that_was_seen_while_the_new_one_lived():
    """Two objects side by side; the first disappears for good one frame after the second
    appeared: the second's track overlaps the first in time, so it is another object."""
    run = Run()
    for t in range(20):
        run.frame([box(100 + 2 * t)])
    for t in range(20, 23):  # the second appears right of it
        run.frame([box(100 + 2 * t), box(150 + 2 * t)])
    seen = set()
    for t in range(23, 40):
        seen.update(p for p in run.frame([box(150 + 2 * t)]) if p[0])
    assert seen == {(2, 2)} and run.t.links == 0


def test_a_chain_of_journeys_within_one_lost_frames():
    """A -> B -> C: each break within lost_frames of the last, each new track continuing
    the journey of the one before: every one carries A's id as its journey."""
    run = Run(lost_frames=30)
    seen, x = [], 20.0
    for t in range(100):
        hidden = 20 <= t < 30 or 50 <= t < 60
        if not hidden:
            x += 6
        out = run.frame([] if hidden else [box(x)])
        seen += [p for p in out if p[0]]
    assert sorted(set(seen)) == [(1, 1), (2, 1), (3, 1)]
    assert run.t.links == 2


def test_a_track_flickering_between_two_classes_keeps_its_journey_in_either():
    """Its detections say circle, square, circle, ...: its labels are both, so a new track
    of either class may continue its journey."""
    run = Run()
    seen, x = set(), 20.0
    for t in range(80):
        hidden = 30 <= t < 50
        if (not hidden and t < 30) or t >= 50:
            x += 6
        cls = (t % 2) if t < 30 else 1
        out = run.frame([] if hidden else [box(x)], classes=[] if hidden else [cls])
        seen.update(p for p in out if p[0])
    assert seen == {(1, 1), (2, 1)}


def test_two_objects_hidden_together_each_new_track_takes_the_nearest_journey():
    """Two objects of one class, 100 px apart, hidden together: each new track continues
    the journey of the lost track nearest where it is (relative to the gate), one each."""
    run = Run()
    seen = set()
    xa, xb = 20.0, 120.0
    for t in range(90):
        hidden = 30 <= t < 50
        if not hidden:
            xa += 4
            xb += 4
        dets = [] if hidden else [box(xa), box(xb, 200)]
        seen.update(p for p in run.frame(dets) if p[0])
    assert seen == {(1, 1), (2, 2), (3, 1), (4, 2)}


def test_max_tracks_overflow_while_journeys_are_open():
    """The cap of live tracks full of lost tracks whose journeys are open: the new tracks
    beyond it are refused (counted), the journeys end with their tracks, nothing grows."""
    run = Run(max_tracks=4, lost_frames=20)
    for t in range(5):
        run.frame([box(20 + 100 * i + 2 * t) for i in range(4)])
    for _ in range(10):  # all four lost
        run.frame([])
    for _ in range(5):  # four others, far away: no room, refused
        run.frame([box(20 + 100 * i, 350) for i in range(4)])
    assert run.t.overflow == 20 and run.t.live == 4 and run.t.links == 0
    for _ in range(12):  # the lost ones end: room again
        run.frame([])
    out = [run.frame([box(20 + 100 * i, 350) for i in range(4)]) for _ in range(3)][-1]
    assert [i for i, _ in out] == [5, 6, 7, 8] and [j for _, j in out] == [5, 6, 7, 8]
    assert len(run.t.ids) == 4


# -- counting on journeys ------------------------------------------------------------------------

W, H = 640, 480
#: A vertical line at x = 320: walking right through it is "in" (its in side is on the left
#: facing from its first point to its second, down the image: the image's right).
DOOR = LineConfig(name="door", points=((320.0, 0.0), (320.0, 480.0)))
#: A horizontal line at y = 240, across the frame.
FLOOR = LineConfig(name="floor", points=((0.0, 240.0), (640.0, 240.0)))


class Counted(Run):
    """A tracker and a counter over one line, as the agent runs them per frame."""

    def __init__(self, journeys: bool = True, line: LineConfig = DOOR, **params) -> None:
        super().__init__(journeys=journeys, **params)
        cfg = AnalyticsConfig(units="pixels", lines=(line,))
        self.counter = Counter(cfg, ("a", "b"), self.t.config.lost_frames, 2 * self.t.config.max_tracks)
        self.f = 0
        self.events: list[dict] = []

    def frame(self, boxes, scores=None, classes=None, dt: float = 1.0) -> list[tuple[int, int]]:
        out = super().frame(boxes, scores, classes, dt)
        m = len(out)
        xyxy = np.asarray(boxes, np.float32).reshape(-1, 4)
        c = np.zeros(m, np.int32) if classes is None else np.asarray(classes, np.int32)
        ev: list[dict] = []
        self.counter.update(xyxy, c, self.ids[:m], self.journey[:m], self.f, self.f / 30, W, H, ev)
        self.f += 1
        self.events += ev
        return out

    def crossed(self) -> tuple[int, int]:
        return int(self.counter.crossed[0, IN].sum()), int(self.counter.crossed[0, OUT].sum())


def cross_hidden(run: Run, back: bool = False) -> None:
    """An object walking right through the door at 6 px a frame, hidden for 20 frames on
    it (and stopping there for 10, so the tracker breaks); with ``back``, it then turns,
    is hidden on the door again, and walks back left."""
    x = 200.0
    path = []
    for t in range(70):
        if not (30 <= t < 40):
            x += 6
        path.append((x, 20 <= t < 40))
    if back:
        for t in range(70):
            if not (30 <= t < 40):
                x -= 6
            path.append((x, 20 <= t < 40))
    for x, hidden in path:
        run.frame([] if hidden else [box(x - 20, 200)])


def test_a_crossing_hidden_in_a_break_counts_once_on_the_journey():
    """The track breaks while the object is hidden on the line: without journeys neither
    track counts the crossing (one was only ever left of it, the other right); with them
    the new track continues the journey, and the crossing counts once, under both ids."""
    alone = Counted(journeys=False)
    cross_hidden(alone)
    assert alone.t.next_id == 3 and alone.crossed() == (0, 0)
    run = Counted()
    cross_hidden(run)
    assert run.t.links == 1 and run.crossed() == (1, 0)
    (event,) = run.events
    assert event["direction"] == "in" and event["track_id"] == 2 and event["journey_id"] == 1


def test_a_journey_back_and_forth_counts_once_per_direction():
    """Through the door hidden, back through it hidden: two breaks, one journey of three
    tracks, one crossing each way (and a third pass would add nothing)."""
    run = Counted()
    cross_hidden(run, back=True)
    assert run.t.links == 2 and run.crossed() == (1, 1)
    assert {e["journey_id"] for e in run.events} == {1}


def test_64_objects_stopping_on_a_line_count_nothing():
    """64 tracked objects (6 x 40 px, 7 px apart) walk down to a line across the frame,
    stop on it for 3 s with their feet swaying 4 px either side of it every other frame,
    and walk back up: no crossing, no journey, no id beyond the 64."""
    run = Counted(line=FLOOR, max_tracks=128)
    xs = 10.0 + 7.0 * np.arange(64)
    y = 120.0  # the boxes' bottom edge (the anchor's y)
    for t in range(30 + 90 + 30):
        if t < 30:
            y += 4.0  # to 240, on the line
        elif t >= 120:
            y -= 4.0
        sway = (4.0 if t % 2 else -4.0) if 30 <= t < 120 else 0.0
        run.frame([[x, y + sway - 40, x + 6, y + sway] for x in xs])
    assert run.crossed() == (0, 0) and run.events == []
    assert run.t.links == 0 and run.t.next_id - 1 == 64


def test_a_journey_gate_can_link_two_objects_crossing_at_once():
    """What the rule does when its gate links two different objects. Object A walks right
    up to the door and is hidden there, turns back and stays hidden; object B of its
    class, hidden on the far side before any track saw it, appears just right of the door
    where A would be. B's new track continues A's journey: a crossing is counted that
    nobody made (A went back). When A reappears left of the door its track is a journey of
    its own, which knew no side before: it counts nothing. The rule trades this false
    count for the real crossings a break would lose; docs/analytics.md says so."""
    run = Counted()
    x = 200.0
    for _ in range(20):  # A walks up to x 320 (its box's left edge 300)
        x += 6
        run.frame([box(x - 20, 200)])
    for _ in range(15):  # A hidden
        run.frame([])
    for t in range(10):  # B appears right of the door, where A would have walked on
        run.frame([box(345 + 2 * t, 200)])
    assert run.t.links == 1 and run.crossed() == (1, 0), "counted on A's journey: B's path"
    for t in range(10):  # A reappears left of the door, walking away
        run.frame([box(365 + 2 * (10 + t), 200), box(250 - 4 * t, 200)])
    assert run.crossed() == (1, 0), "A's new journey knew no side before: no crossing"


# -- in the message --------------------------------------------------------------------------------


def test_the_tracker_step_names_the_journeys_of_a_frame_in_its_message_block():
    """The step's block is None until a track continues a journey; in a frame with such a
    track it maps the track's id to its journey's; it validates against the schema."""
    import json
    from types import SimpleNamespace

    import jsonschema
    from conftest import REPO

    from edge_agent.pipelines.steps.tracking import SourceTracker

    step = SourceTracker(TrackerConfig(), "m")
    slot = SimpleNamespace(
        frame_id=0,
        det_count=0,
        det_xyxy=np.zeros((8, 4), np.float32),
        det_score=np.full(8, 0.9, np.float32),
        det_class=np.zeros(8, np.int32),
        det_track=np.zeros(8, np.int64),
        det_track_age=np.zeros(8, np.int32),
        det_journey=np.zeros(8, np.int64),
        geo=SimpleNamespace(src_w=640, src_h=480),
    )
    blocks = []
    x = 20.0
    for t in range(80):
        hidden = 30 <= t < 50
        if not hidden and (t < 30 or t >= 50):
            x += 6
        slot.frame_id = t
        slot.det_count = 0 if hidden else 1
        slot.det_xyxy[0] = box(x)
        step.run(slot)
        blocks.append(step.message_block())
    assert all(b is None for b in blocks[:50])
    assert blocks[-1] == {"journeys": {"2": 1}}
    assert step.figures().as_dict()["journey_links"] == 1
    schema = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())
    block_schema = schema["$defs"]["result"]["properties"]["tracking"]
    jsonschema.validate(blocks[-1], block_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"journeys": {"x": 1}}, block_schema)


def test_a_track_confirmed_at_its_first_hit_gets_its_journey_and_may_continue_one():
    """confirm_frames 1: the new track's first detection carries its journey (never 0), and
    a track confirmed that way links like any other; the lost one ends in that frame."""
    run = Run(confirm_frames=1)
    assert run.frame([box(20)]) == [(1, 1)]
    assert stop_behind(run, range(30, 50)) >= {(2, 1)}
    assert run.t.links == 1 and run.t.live == 1
    assert all(j for _, j in run.frame([box(400)]))


def test_a_track_lost_longer_than_lost_frames_takes_no_link_at_a_stride():
    """At a stride of 2 the frames unseen jump past lost_frames between two updates: the
    track is gone, so a new one is a journey of its own (the counter, which dropped the
    old journey, would count it again otherwise)."""
    run = Run(lost_frames=10)
    for t in range(10):
        run.frame([box(20 + 4 * t)], dt=2.0)
    for _ in range(6):  # 12 frames unseen
        run.frame([], dt=2.0)
    seen = set()
    for t in range(4):
        seen.update(p for p in run.frame([box(100 + 4 * t)], dt=2.0) if p[0])
    assert seen == {(2, 2)} and run.t.links == 0
