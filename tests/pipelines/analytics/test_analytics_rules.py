"""The counting rules of pipelines/analytics/counter.py, each on hand-made tracked boxes in a
640x480 frame at 30 fps: jitter on a border, once per track and direction, unconfirmed
tracks, a line's ends, min_frames, dwell, lost tracks, the anchor, labels, capacity, a
reload's carry-over, and the zone test against a plain reference."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from edge_agent.core.analytics_config import MAX_COORDINATE, AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.stamps import CAPTURED, N_STAMPS
from edge_agent.pipelines.analytics.counter import IN, OUT, Counter
from edge_agent.pipelines.analytics.geometry import Geometry, clip_polygon, clip_segment, clip_window
from edge_agent.pipelines.steps.analytics import SourceAnalytics

W, H, FPS = 640, 480, 30.0
LABELS = ("person", "car")
PERSON, CAR = 0, 1
# facing from (100, 240) to (540, 240) (east), the left side is up: walking up is "in"
GATE = LineConfig(name="gate", points=((100.0, 240.0), (540.0, 240.0)))
HALL = ZoneConfig(name="hall", points=((200.0, 200.0), (440.0, 200.0), (440.0, 400.0), (200.0, 400.0)))
IN_HALL, OUT_HALL = (320.0, 300.0), (100.0, 300.0)  # bottom-centres
ABOVE, BELOW = 200.0, 280.0  # bottom-centre y either side of the gate


def box(x: float, y: float, w: float = 40.0, h: float = 80.0) -> list[float]:
    """xyxy of a box whose bottom-centre is (x, y)."""
    return [x - w / 2, y - h, x + w / 2, y]


def hold(x: float, y: float, n: int) -> list[tuple[float, float]]:
    return [(x, y)] * n


def walk_y(x: float, y0: float, y1: float, step: float = 10.0) -> list[tuple[float, float]]:
    n = int(abs(y1 - y0) / step)
    return [(x, y0 + (y1 - y0) * i / n) for i in range(n + 1)]


def config(*items) -> AnalyticsConfig:
    """Zones and lines in pixels."""
    zones = tuple(i for i in items if isinstance(i, ZoneConfig))
    return AnalyticsConfig(
        units="pixels", zones=zones, lines=tuple(i for i in items if isinstance(i, LineConfig))
    )


class Feed:
    """A Counter over zones and lines (pixels), fed one frame per call; keeps every event."""

    def __init__(self, *items, lost_frames: float = 30, capacity: int = 64) -> None:
        self.c = Counter(config(*items), LABELS, lost_frames, capacity)
        self.f = 0
        self.events: list[dict] = []

    def frame(self, *dets) -> list[dict]:
        """Detections (xyxy, track id[, class[, journey]]) (the journey: the track's id
        unless given); none: an empty frame."""
        xyxy = np.array([d[0] for d in dets], np.float32).reshape(-1, 4)
        ids = np.array([d[1] for d in dets], np.int64)
        cls = np.array([d[2] if len(d) > 2 else PERSON for d in dets], np.int32)
        journeys = np.array([d[3] if len(d) > 3 else d[1] for d in dets], np.int64)
        out: list[dict] = []
        self.c.update(xyxy, cls, ids, journeys, self.f, self.f / FPS, W, H, out)
        assert (self.c.objects >= 0).all()
        self.f += 1
        self.events += out
        return out

    def path(self, points, tid: int = 1, cls: int = PERSON, journey: int | None = None) -> None:
        for x, y in points:
            self.frame((box(x, y), tid, cls, tid if journey is None else journey))

    def empty(self, n: int) -> None:
        for _ in range(n):
            self.frame()

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["kind"] == kind]


def line_counts(feed: Feed, k: int = 0) -> tuple[int, int]:
    return int(feed.c.crossed[k, IN].sum()), int(feed.c.crossed[k, OUT].sum())


# -- lines ---------------------------------------------------------------------------------------


def test_jitter_on_a_line_is_no_crossing():
    ys = [BELOW] * 5 + [236.0 if i % 2 == 0 else 244.0 for i in range(60)]  # +-4 px, period 2
    path = [(320.0, y) for y in ys]
    feed = Feed(GATE)  # min_frames 3
    feed.path(path)
    assert line_counts(feed) == (0, 0) and feed.events == []
    # the naive rule, every change of the side of the line, counts each swing
    sides = np.sign(240.0 - np.array(ys))
    assert int((np.diff(sides) != 0).sum()) == 60
    # the band alone holds it too (the swing stays within a tenth of the box's height) ...
    no_run = Feed(LineConfig(name="gate", points=GATE.points, min_frames=1))
    no_run.path(path)
    assert line_counts(no_run) == (0, 0)
    # ... and min_frames alone: without either it would count (once per direction still)
    no_band = Feed(LineConfig(name="gate", points=GATE.points, band=0.0))
    no_band.path(path)
    assert line_counts(no_band) == (0, 0)
    eager = Feed(LineConfig(name="gate", points=GATE.points, min_frames=1, band=0.0))
    eager.path(path)
    assert line_counts(eager) == (1, 1)


def test_a_crossing_counts_once_per_track_and_direction():
    feed = Feed(GATE)
    up, down = walk_y(300.0, BELOW, ABOVE), walk_y(340.0, ABOVE, BELOW)
    assert (300.0, 240.0) in up  # a frame exactly on the line (the out side) loses no crossing
    feed.path(up, tid=1)
    feed.path(down, tid=2, cls=CAR)
    assert line_counts(feed) == (1, 1)
    assert feed.c.crossed[0, IN].tolist() == [1, 0] and feed.c.crossed[0, OUT].tolist() == [0, 1]
    got = [(e["kind"], e["line"], e["track_id"], e["label"], e["direction"]) for e in feed.events]
    assert got == [("cross", "gate", 1, "person", "in"), ("cross", "gate", 2, "car", "out")]
    # dated by the first frame on the new side
    first_above = next(i for i, (_x, y) in enumerate(up) if y < 240.0)
    assert feed.events[0]["at_unix_s"] == pytest.approx(first_above / FPS)
    assert feed.c.block()["lines"] == {"gate": {"in": 1, "out": 1}}
    # track 3 goes up and down three times: one in, one out
    for _ in range(3):
        feed.path(walk_y(200.0, BELOW, ABOVE) + walk_y(200.0, ABOVE, BELOW), tid=3)
    assert line_counts(feed) == (2, 2)
    assert [e["direction"] for e in feed.events if e["track_id"] == 3] == ["in", "out"]


def test_unconfirmed_tracks_never_count():
    feed = Feed(GATE, HALL)
    feed.path(walk_y(300.0, BELOW, ABOVE) + walk_y(300.0, ABOVE, 380.0) + hold(*IN_HALL, 10), tid=0)
    assert feed.events == [] and feed.c.n == 0
    assert line_counts(feed) == (0, 0) and feed.c.entered.sum() == 0 and feed.c.objects.sum() == 0


def test_walking_round_a_line_end_is_no_crossing():
    # below the gate, then right beyond its end (x 580 > 540), up, and back left above it
    path = hold(400.0, BELOW, 5) + [(x, BELOW) for x in range(400, 600, 20)]
    path += walk_y(580.0, BELOW, ABOVE) + [(x, ABOVE) for x in range(580, 380, -20)] + hold(400.0, ABOVE, 5)
    feed = Feed(GATE)
    feed.path(path)
    assert line_counts(feed) == (0, 0) and feed.events == []
    # the same walk through the segment counts
    feed.path(walk_y(400.0, ABOVE, BELOW), tid=2)
    assert line_counts(feed) == (0, 1)


# -- zones ---------------------------------------------------------------------------------------


def test_a_short_visit_is_no_entry_a_longer_one_is_one_entry_and_one_exit():
    feed = Feed(HALL)  # min_frames 3
    feed.path(hold(*OUT_HALL, 3) + hold(*IN_HALL, 2) + hold(*OUT_HALL, 5))
    assert feed.events == [] and feed.c.entered.sum() == 0
    feed.path(hold(*IN_HALL, 10) + hold(*OUT_HALL, 5))
    assert [(e["kind"], e["zone"], e["track_id"]) for e in feed.events] == [
        ("enter", "hall", 1),
        ("exit", "hall", 1),
    ]
    assert feed.of("exit")[0]["reason"] == "left"
    assert feed.c.entered[0].tolist() == [1, 0] and feed.c.exited[0].tolist() == [1, 0]
    assert feed.c.objects.sum() == 0
    assert feed.c.block()["zones"] == {"hall": {"objects": 0, "entered": 1, "exited": 1}}


@pytest.mark.parametrize("n", [10, 45, 95])
def test_dwell_is_the_time_inside_to_a_frame(n):
    feed = Feed(HALL)
    feed.path(hold(*OUT_HALL, 4) + hold(*IN_HALL, n) + hold(*OUT_HALL, 4))
    enter, exit_ = feed.of("enter")[0], feed.of("exit")[0]
    assert enter["at_unix_s"] == pytest.approx(4 / FPS)  # the first frame inside
    assert exit_["entered_unix_s"] == pytest.approx(4 / FPS)
    assert exit_["at_unix_s"] == pytest.approx((4 + n) / FPS)  # the first frame outside
    assert abs(exit_["dwell_s"] - n / FPS) <= 1 / FPS
    assert feed.c.dwell_sum[0] == pytest.approx(n / FPS, abs=1e-3)
    bucket = int(np.searchsorted([1.0, 2.0, 5.0], n / FPS))
    assert feed.c.dwell_hist[0].tolist() == [int(i == bucket) for i in range(12)]


def test_a_dwell_step_raises_one_event_once_reached():
    feed = Feed(ZoneConfig(name="hall", points=HALL.points, dwell_s=(1.0,)))
    feed.path(hold(*OUT_HALL, 3) + hold(*IN_HALL, 29))
    assert feed.of("dwell") == []  # 28 frames after the first inside: < 1 s
    feed.path(hold(*IN_HALL, 60))
    (dwell,) = feed.of("dwell")
    assert dwell["zone"] == "hall" and dwell["threshold_s"] == 1.0
    assert dwell["entered_unix_s"] == pytest.approx(3 / FPS)
    assert 1.0 <= dwell["at_unix_s"] - dwell["entered_unix_s"] < 1.0 + 1.5 / FPS


def test_a_track_lost_for_a_while_does_not_enter_again_one_lost_for_good_exits():
    feed = Feed(HALL, lost_frames=30)
    feed.path(hold(*OUT_HALL, 3) + hold(*IN_HALL, 5))
    feed.empty(10)
    feed.path(hold(*IN_HALL, 5))
    assert [e["kind"] for e in feed.events] == ["enter"]
    assert feed.c.entered.sum() == 1 and feed.c.objects.sum() == 1
    last_seen = feed.f - 1
    feed.empty(31)  # frame last_seen + 31: not yet ended (lost_frames + 1)
    assert feed.c.objects.sum() == 1 and feed.of("exit") == []
    feed.empty(1)
    (exit_,) = feed.of("exit")
    assert exit_["reason"] == "lost" and exit_["at_unix_s"] == pytest.approx(last_seen / FPS)
    assert feed.c.objects.sum() == 0 and feed.c.exited.sum() == 1 and feed.c.n == 0


def test_the_anchor_is_the_point_that_counts():
    feet = ZoneConfig(name="feet", points=HALL.points)  # bottom_center
    body = ZoneConfig(name="body", points=HALL.points, anchor="center")
    feed = Feed(feet, body)
    tall = box(320.0, 450.0, h=200.0)  # centre (320, 350) inside, bottom-centre (320, 450) outside
    for _ in range(5):
        feed.frame((tall, 1))
    assert feed.c.entered.sum(1).tolist() == [0, 1]
    assert [(e["kind"], e["zone"]) for e in feed.events] == [("enter", "body")]


def test_a_zone_counts_only_its_labels():
    feed = Feed(ZoneConfig(name="hall", points=HALL.points, labels=("car",)))
    feed.path(hold(*IN_HALL, 10), tid=1, cls=PERSON)
    assert feed.events == [] and feed.c.entered.sum() == 0
    feed.path(hold(*IN_HALL, 10), tid=2, cls=CAR)
    assert feed.c.entered[0].tolist() == [0, 1] and feed.events[0]["label"] == "car"


def test_a_track_exits_under_the_label_it_entered_with():
    feed = Feed(HALL)
    feed.path(hold(*IN_HALL, 5), cls=PERSON)
    feed.path(hold(*IN_HALL, 5), cls=CAR)
    feed.path(hold(*OUT_HALL, 5), cls=CAR)
    assert feed.c.entered[0].tolist() == [1, 0] and feed.c.exited[0].tolist() == [1, 0]
    assert feed.c.objects[0].tolist() == [0, 0]
    assert feed.of("exit")[0]["label"] == "person"


# -- capacity ------------------------------------------------------------------------------------


def three_tracks_in(feed: Feed, frames: int) -> None:
    for _ in range(frames):
        feed.frame(*[(box(IN_HALL[0] + 30 * i, IN_HALL[1]), i + 1) for i in range(3)])


def test_tracks_beyond_capacity_are_not_followed_and_counted():
    feed = Feed(HALL, capacity=2)
    three_tracks_in(feed, 1)
    assert feed.c.overflow == 1 and feed.c.n == 2
    three_tracks_in(feed, 4)
    assert feed.c.entered.sum() == 2 and sorted(e["track_id"] for e in feed.events) == [1, 2]


def test_a_track_not_followed_is_counted_once():
    feed = Feed(HALL, capacity=2)
    three_tracks_in(feed, 5)
    assert feed.c.overflow == 1


def test_a_journey_below_the_live_ones_takes_its_place_and_keeps_its_state():
    """Journey 3 comes back after the counter dropped it (not seen for longer than
    lost_frames) while journey 5 is live: its new row goes in its sorted place, 5 keeps its
    state, and 3 starts afresh (it knows no side: no crossing from its first frame)."""
    feed = Feed(GATE, HALL, lost_frames=5)
    feed.path(walk_y(300.0, BELOW, ABOVE), tid=3)  # journey 3 crosses in
    feed.empty(8)  # dropped
    for y in (BELOW, BELOW, BELOW):
        feed.frame((box(IN_HALL[0], y), 5))
    assert feed.c.ids[: feed.c.n].tolist() == [5]
    for _ in range(4):  # journey 3 again, now on the track 7, above the gate
        feed.frame((box(IN_HALL[0], BELOW), 5), (box(150.0, ABOVE), 7, PERSON, 3))
    assert feed.c.ids[: feed.c.n].tolist() == [3, 5]
    assert line_counts(feed) == (1, 0), "journey 3's first crossing only; nothing new"
    for _, y in walk_y(150.0, ABOVE, BELOW):  # journey 3 (track 7) crosses out
        feed.frame((box(IN_HALL[0], BELOW), 5), (box(150.0, y), 7, PERSON, 3))
    assert line_counts(feed) == (1, 1)
    assert feed.events[-1]["track_id"] == 7 and feed.events[-1]["journey_id"] == 3


# -- a reload ------------------------------------------------------------------------------------


def source_analytics(*items, sent: list) -> SourceAnalytics:
    return SourceAnalytics(
        config(*items),
        LABELS,
        30,
        64,
        "cam0",
        "dev1",
        "run1",
        send=lambda topic, body: sent.append((topic, body)),
        encode=lambda m: json.dumps(m).encode(),
    )


def run_frame(sa: SourceAnalytics, frame_id: int, dets) -> None:
    """One frame through ``SourceAnalytics.run`` (what the post step calls)."""
    stamps = np.zeros(N_STAMPS, np.int64)
    stamps[CAPTURED] = int(frame_id / FPS * 1e9)
    slot = SimpleNamespace(
        det_count=len(dets),
        det_xyxy=np.array([d[0] for d in dets], np.float32).reshape(-1, 4),
        det_class=np.zeros(len(dets), np.int32),
        det_track=np.array([d[1] for d in dets], np.int64),
        det_journey=np.array([d[1] for d in dets], np.int64),
        frame_id=frame_id,
        stamps=stamps,
        geo=SimpleNamespace(src_w=W, src_h=H),
    )
    sa.run(slot)


def test_a_reload_keeps_the_counts_of_what_stayed_the_same():
    sent: list = []
    old = source_analytics(HALL, GATE, sent=sent)
    f = 0
    for (x1, y1), (x2, y2) in zip(walk_y(500.0, BELOW, ABOVE), hold(*IN_HALL, 9)):
        run_frame(old, f, [(box(x1, y1), 1), (box(x2, y2), 2)])  # 1 crosses the gate, 2 enters the hall
        f += 1
    assert old.counter.crossed[0].sum() == 1 and old.counter.entered.sum() == 1 and old.seq == 2

    moved = LineConfig(name="gate", points=((100.0, 260.0), (540.0, 260.0)))
    new = old.carry_on(source_analytics(HALL, moved, sent=sent))
    c = new.counter
    assert new.seq == 2 and c.events == 2
    assert c.entered[0].tolist() == [1, 0] and c.objects[0].tolist() == [1, 0]  # hall: kept
    assert c.crossed.sum() == 0  # gate: moved, from 0
    assert c.block() == {
        "zones": {"hall": {"objects": 1, "entered": 1, "exited": 0}},
        "lines": {"gate": {"in": 0, "out": 0}},
    }
    # track 2 (inside the hall before the reload) leaves: an exit, numbered on
    for (x1, y1), (x2, y2) in zip(walk_y(500.0, ABOVE, BELOW + 40), hold(*OUT_HALL, 13), strict=True):
        run_frame(new, f, [(box(x1, y1), 1), (box(x2, y2), 2)])
        f += 1
    assert c.exited[0].tolist() == [1, 0] and c.objects.sum() == 0
    assert c.crossed[0, OUT].sum() == 1
    msgs = [json.loads(body) for _topic, body in sent]
    assert {topic for topic, _ in sent} == {b"event.cam0"}
    assert [(m["seq"], m["kind"]) for m in msgs] == [(0, "enter"), (1, "cross"), (2, "exit"), (3, "cross")]
    assert all(m["source"] == "cam0" and m["run_id"] == "run1" and m["type"] == "event" for m in msgs)


def test_a_journey_kept_over_a_reload_exits_lost_under_its_track():
    """Track 2 is inside the hall at a reload; it is never seen again: its exit (lost) names
    its track and journey, as before the reload."""
    sent: list = []
    old = source_analytics(HALL, sent=sent)
    for f in range(5):
        run_frame(old, f, [(box(*IN_HALL), 2)])
    new = old.carry_on(source_analytics(HALL, sent=sent))
    for f in range(5, 5 + 40):  # 30 lost_frames go by
        run_frame(new, f, [])
    last = json.loads(sent[-1][1])
    assert (last["kind"], last["reason"], last["track_id"], last["journey_id"]) == ("exit", "lost", 2, 2)


# -- geometry ------------------------------------------------------------------------------------


def ray_cast(x: float, y: float, poly: list[tuple[float, float]]) -> bool:
    inside = False
    for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1]):
        if (y0 > y) != (y1 > y) and x < x0 + (y - y0) * (x1 - x0) / (y1 - y0):
            inside = not inside
    return inside


def test_inside_agrees_with_ray_casting_on_a_concave_polygon():
    # a slanted "C" opening to the right: concave, no edge axis-aligned
    poly = [(60, 40), (600, 60), (560, 170), (250, 190), (280, 300)]
    poly += [(590, 330), (520, 450), (90, 420), (160, 230)]
    rng = np.random.default_rng(7)
    pts = rng.uniform((0, 0), (W, H), size=(500, 2))
    want = np.array([ray_cast(x, y, poly) for x, y in pts])
    assert 100 < want.sum() < 400
    zone = ZoneConfig(name="c", points=tuple((float(x), float(y)) for x, y in poly), anchor="center")
    dots = np.hstack([pts, pts]).astype(np.float64)  # zero-size boxes: every anchor is the point
    got = Geometry(config(zone), W, H, LABELS).inside(dots)
    assert got.shape == (500, 1) and (got[:, 0] == want).all()
    # the same polygon in fractions of the frame
    frac = ZoneConfig(name="c", points=tuple((x / W, y / H) for x, y in poly), anchor="center")
    got = Geometry(AnalyticsConfig(zones=(frac,)), W, H, LABELS).inside(dots)
    assert (got[:, 0] == want).all()


def test_the_counter_keeps_nothing_per_frame_or_per_track():
    """Tracks come and go through a zone and a line for 6,000 frames: the state stays in
    its preallocated rows (tracemalloc: no growth between the 2,000th and the last frame,
    no frame-sized peak), and ended tracks leave it."""
    import tracemalloc

    feed = Feed(HALL, GATE, lost_frames=5, capacity=32)
    rng = np.random.default_rng(0)
    xs = rng.uniform(150, 500, 40)

    def frame(f: int) -> None:
        dets = []
        for k in range(8):  # 8 objects at a time, each a new track every 50 frames
            tid = 1 + k + 8 * (f // 50)
            y = 180 + (f % 50) * 4 + k
            dets.append((box(float(xs[(k + f // 50) % 40]), float(y)), tid))
        feed.frame(*dets)
        feed.events.clear()

    for f in range(2000):
        frame(f)
    tracemalloc.start()
    mid, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for f in range(2000, 6000):
        frame(f)
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert feed.c.n <= 16, "ended tracks left the rows"
    assert feed.c.entered.sum() > 500 and feed.c.crossed.sum() > 500
    assert current - mid < 16 * 1024, f"grew by {current - mid} B"
    assert peak - mid < 64 * 1024, f"peak {peak - mid} B"


# -- far beyond the frame: clipped shapes, exact counts ------------------------------------------

WINDOW = (-80.0, -80.0, 720.0, 560.0)  # 640 x 480 and its clip margin


@pytest.mark.parametrize(
    "points, want",
    [
        ([(10, 10), (100, 10), (50, 90)], [(10, 10), (100, 10), (50, 90)]),  # inside: as it is
        ([(0, 0), (1000, 0), (1000, 100), (0, 100)], [(0, 0), (720, 0), (720, 100), (0, 100)]),
        ([(800, 0), (900, 0), (900, 100)], []),  # wholly beyond: nothing
        (
            [(-65536, 240), (65536, 240), (0, 300)],
            [(-80, 240), (720, 240), (720, 299.3408203125), (0, 300), (-80, 299.9267578125)],
        ),
    ],
    ids=["inside", "one-side", "beyond", "far-triangle"],
)
def test_clip_polygon_keeps_the_part_inside_the_window(points, want):
    got = clip_polygon(np.array(points, float), WINDOW)
    assert got.shape[1:] == (2,)
    # the same corners up to where the cycle starts (Sutherland-Hodgman starts it anywhere)
    got_set = {(round(x, 6), round(y, 6)) for x, y in got.tolist()}
    assert got_set == {(round(x, 6), round(y, 6)) for x, y in want}, got.tolist()


def test_a_polygon_inside_the_window_comes_back_unchanged():
    points = np.array([(10.0, 10.0), (100.0, 10.0), (50.0, 90.0)])
    assert clip_polygon(points, WINDOW) is points


@pytest.mark.parametrize(
    "points, want",
    [
        ([(10, 10), (100, 90)], [(10, 10), (100, 90)]),
        ([(320, -65536), (320, 65536)], [(320, -80), (320, 560)]),  # its direction kept
        ([(65536, 65536), (0, 0)], [(560, 560), (0, 0)]),
        ([(800, 0), (900, 400)], []),
        ([(-200, 600), (900, 600)], []),  # parallel to the window's bottom, below it
    ],
    ids=["inside", "vertical", "diagonal-reversed", "beyond", "parallel-beyond"],
)
def test_clip_segment_keeps_the_part_inside_the_window(points, want):
    got = clip_segment(np.array(points, float), WINDOW)
    assert np.allclose(got, np.array(want, float).reshape(-1, 2)), got.tolist()


def test_a_far_zone_and_line_are_shaped_clipped_and_counted_as_given():
    """Corners and ends at the load's bound on a 640x480 frame: the shapes the view and the
    snapshots draw are clipped to the frame and its margin, while the counting uses the
    points as given (a clipped line would shorten what an anchor is alongside)."""
    far = MAX_COORDINATE
    poly = [(200.0, 150.0), (far, 100.0), (100.0, far)]
    zone = ZoneConfig(name="far", points=tuple(poly), anchor="center")
    line = LineConfig(name="long", points=((0.0, 240.0), (far, 240.0)))
    geo = Geometry(config(zone, line), W, H, LABELS)
    lo, hi = np.array(clip_window(W, H)[:2]), np.array(clip_window(W, H)[2:])
    for shape in (*geo.shapes.zones, *geo.shapes.lines):
        assert (shape.points >= lo).all() and (shape.points <= hi).all(), shape.points.tolist()
    assert geo.shapes.lines[0].points.tolist() == [[0.0, 240.0], [hi[0], 240.0]]
    rng = np.random.default_rng(3)
    pts = rng.uniform((0, 0), (W, H), size=(400, 2))
    dots = np.hstack([pts, pts])
    want = np.array([ray_cast(x, y, poly) for x, y in pts])
    assert 50 < want.sum() < 350
    assert (geo.inside(dots)[:, 0] == want).all()
    # and so does the clipped polygon, inside the frame: what is drawn is what counts
    shape = [tuple(p) for p in geo.shapes.zones[0].points.tolist()]
    assert all(ray_cast(x, y, shape) == w for (x, y), w in zip(pts, want))
    feed = Feed(line)
    feed.path(walk_y(320, BELOW, ABOVE))  # up across y = 240, far from either end
    assert line_counts(feed) == (1, 0)
