"""The live view's zones and lines (issue 33): drawn by ``annotate`` with their counts,
handed from the lane's analytics through the view tap, and seen in a running agent's
snapshot. Real OpenCV drawing, asserted on pixels; a real agent over real HTTP."""

from __future__ import annotations

import threading
import urllib.request
from dataclasses import replace
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from conftest import free_endpoint, started, wait_until
from helpers import free_port

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig, ViewConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig, TrackerConfig
from edge_agent.core.stamps import CAPTURED, PUBLISH
from edge_agent.pipelines.analytics.geometry import Geometry, LineShape, Shapes, ZoneShape, shapes_of
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.sources.base import SourceFrame
from edge_agent.pipelines.steps.analytics import SourceAnalytics
from edge_agent.pipelines.steps.tracking import SourceTracker
from edge_agent.pipelines.view_tap import ViewFrame, ViewTap
from edge_agent.service.view.annotate import annotate, colour, line_colour, zone_colour

W, H = 320, 240
#: (80, 60) to (240, 180) in a 320 x 240 frame.
SQUARE = ZoneConfig(name="sq", points=((0.25, 0.25), (0.75, 0.25), (0.75, 0.75), (0.25, 0.75)), min_frames=1)
#: Down the middle of a 320 x 240 frame, x = 160 from y = 48 to 192.
DOWN = LineConfig(name="door", points=((0.5, 0.2), (0.5, 0.8)), min_frames=1)


def frame(shapes=None, counts=None) -> ViewFrame:
    f = ViewFrame(4)
    f.labels, f.frame_id, f.e2e_ms = ["a"], 1, 5.0
    f.shapes, f.counts = shapes, counts
    return f


def zone_counts(objects: int, entered: int, exited: int) -> dict:
    return {"zones": {"sq": {"objects": objects, "entered": entered, "exited": exited}}, "lines": {}}


def test_a_zone_is_outlined_tinted_and_labelled_with_its_counts():
    shapes = shapes_of(AnalyticsConfig(zones=(SQUARE,)), W, H)
    image = np.zeros((H, W, 3), np.uint8)
    annotate(image, frame(shapes, zone_counts(2, 5, 3)))
    c = np.array(zone_colour(0))
    for x, y in ((240, 120), (160, 180), (80, 150), (160, 60)):  # on its edges, clear of its tag
        assert (image[y, x] == c).all(), (x, y, image[y, x])
    inside, outside = image[150, 160].astype(int), image[230, 300]
    assert (inside > 0).any() and (inside <= c / 2).all(), f"a faint tint inside: {inside}"
    assert not outside.any(), "nothing outside the zone"
    # Its tag: just inside its top-left corner, black, with text in the zone's colour.
    tag = image[63:85, 83:240].astype(int)
    assert (tag == 0).all(axis=2).sum() > tag.shape[0] * tag.shape[1] // 2, "a black box"
    assert (np.abs(tag - c).max(axis=2) <= 60).sum() >= 40, "text in the zone's colour"
    # The counts are in that text: other counts, other pixels there (and nowhere else).
    other = np.zeros_like(image)
    annotate(other, frame(shapes, zone_counts(2, 6, 4)))
    rows, cols = np.nonzero((other != image).any(axis=2))
    assert len(rows) and rows.min() >= 63 and rows.max() < 85 and cols.min() >= 83, "only the tag changes"


def test_the_counts_stay_readable_over_a_box_and_the_zone_under_it():
    shapes = shapes_of(AnalyticsConfig(zones=(SQUARE,)), W, H)
    f = frame(None)
    f.det_xyxy[0], f.det_class[0], f.det_score[0], f.det_count = (90, 86, 200, 170), 1, 0.9, 1
    plain = annotate(np.zeros((H, W, 3), np.uint8), f)
    label = (plain == colour(1)).all(axis=2)
    assert label[63:85, 83:240].sum() > 200, "the box's label falls where the zone's tag goes"
    f.shapes, f.counts = shapes, zone_counts(2, 5, 3)
    image = annotate(np.zeros((H, W, 3), np.uint8), f)
    tag = image[63:85, 83:240].astype(int)
    assert not (tag == colour(1)).all(axis=2).any(), "the tag is over the label"
    assert (np.abs(tag - zone_colour(0)).max(axis=2) <= 60).sum() >= 40, "with its text"
    assert (image[120, 90] == colour(1)).all(), "the box's edge over the zone's tint"
    assert (image[180, 150] == zone_colour(0)).all(), "the zone's edge where no box is"


@pytest.mark.parametrize("in_side", ["left", "right"])
def test_a_line_points_its_arrow_at_the_side_the_counter_calls_in(in_side):
    config = AnalyticsConfig(lines=(replace(DOWN, in_side=in_side),))
    image = np.zeros((H, W, 3), np.uint8)
    counts = {"zones": {}, "lines": {"door": {"in": 3, "out": 7}}}
    annotate(image, frame(shapes_of(config, W, H), counts))
    ink = (image == np.array(line_colour(0))).all(axis=2).astype(np.uint8)
    assert ink[48:193, 159:162].all(axis=1).all(), "the segment, x = 160 from y = 48 to 192"
    # The arrow is what touches the segment off it; the tag's text is apart, on the other side.
    _, parts = cv2.connectedComponents(ink)
    ys, xs = np.nonzero((parts == parts[120, 160]) & ((np.arange(W) < 158) | (np.arange(W) > 162)))
    assert len(xs) >= 15 and np.ptp(ys) <= 20, "an arrow at the middle, off the segment"
    ahead = 1 if xs.mean() > 160 else -1
    assert (np.sign(xs - 160) == ahead).all(), "the arrow points one way"
    tag_ink = ink.astype(bool) & (parts != parts[120, 160])
    tag_ink[:30] = False  # the corner stamp's white text
    assert tag_ink.any() and (np.sign(np.nonzero(tag_ink)[1] - 160) == -ahead).all(), "its tag opposite"
    # The counter's own geometry: an anchor where the arrow points is on the in side.
    geo = Geometry(config, W, H, ("a",))
    tip_x = 160 + ahead * 20
    boxes = np.array([(tip_x - 5, 100, tip_x + 5, 120), (320 - tip_x - 5, 100, 320 - tip_x + 5, 120)], float)
    assert geo.sides(boxes)[:, 0].tolist() == [1, -1], (in_side, ahead)


def test_without_analytics_nothing_is_drawn_but_the_stamp():
    for shapes in (None, shapes_of(AnalyticsConfig(), W, H)):  # none, or none configured
        image = np.zeros((H, W, 3), np.uint8)
        annotate(image, frame(shapes))
        rows, cols = np.nonzero(image.any(axis=2))
        assert rows.max() < 30 and cols.max() < 200, "the corner stamp only"


def test_zones_and_lines_scale_with_the_image():
    shapes = shapes_of(AnalyticsConfig(zones=(SQUARE,)), W, H)
    image = np.zeros((H // 2, W // 2, 3), np.uint8)  # a view scaled to half the source
    annotate(image, frame(shapes, zone_counts(0, 0, 0)), 0.5)
    c = np.array(zone_colour(0))
    assert (image[60, 120] == c).all() and (image[75, 40] == c).all(), "the edges at x 40 and 120"


# -- the tap: from the lane's analytics to the view's frame ---------------------------------------


def lane_slot(frame_id: int, boxes: list[tuple[float, float, float, float]], tracks: list[int]) -> FrameSlot:
    io = IOSet({"images": np.zeros((1, 8, 8, 3), np.uint8)}, [])
    labels = SimpleNamespace(labels=("a",))  # what the tap reads of the slot's model profile
    slot = FrameSlot(
        0, io, "images", max_det=4, profile=SimpleNamespace(model=SimpleNamespace(manifest=labels))
    )
    slot.frame_id, slot.det_count = frame_id, len(boxes)
    slot.det_xyxy[: len(boxes)] = np.reshape(boxes, (-1, 4))
    slot.det_score[: len(boxes)] = 0.9
    slot.det_track[: len(boxes)] = tracks
    slot.geo.src_w, slot.geo.src_h = W, H
    slot.stamps[CAPTURED], slot.stamps[PUBLISH] = 1_000_000 * frame_id, 1_000_000 * frame_id + 2_000_000
    return slot


def through_tap(tap: ViewTap, slot: FrameSlot, analytics, size: tuple[int, int] = (W, H)) -> ViewFrame:
    """One frame through the tap as the lane's stages hand it over; what the view takes."""
    source_frame = SourceFrame()
    source_frame.image, source_frame.frame_id = np.zeros((size[1], size[0], 3), np.uint8), slot.frame_id
    tap._next_ns = 0  # due now: the view's rate is not what is tested here
    tap.offer_pixels(source_frame)
    steps = (SourceTracker(TrackerConfig(), "m.onnx"), analytics) if analytics is not None else ()
    tap.offer_result(slot, False, steps)  # the tracker hands its ids on too
    into = ViewFrame(4)
    assert tap.take(into, -1) == tap.ready_seq, "a frame is ready"
    return into


def analytics_of(config: AnalyticsConfig) -> SourceAnalytics:
    """A lane's analytics (its events sent nowhere: the tap reads its config and counter)."""
    return SourceAnalytics(config, ("a",), 30, 64, "cam0", "dev", "run", lambda t, b: None, lambda m: b"")


def test_the_tap_hands_the_view_the_zones_lines_and_counts_of_the_lane():
    config = AnalyticsConfig(zones=(SQUARE,), lines=(DOWN,))
    analytics = analytics_of(config)
    tap = ViewTap("cam0", 10.0, 4, threading.Event())
    box = [(150.0, 100.0, 170.0, 150.0)]  # its anchor (160, 150): inside the square
    slot = lane_slot(1, box, [7])
    analytics.run(slot)  # the post stage: analytics, then the message, then the tap
    first = through_tap(tap, slot, analytics)
    (zone,), (line,) = first.shapes.zones, first.shapes.lines
    assert zone.name == "sq" and zone.points.tolist() == [[80, 60], [240, 60], [240, 180], [80, 180]]
    assert line.name == "door" and line.points.tolist() == [[160, 48], [160, 192]] and line.in_side == "left"
    assert first.counts is analytics.counter.block(), "the counter's block itself, no copy"
    assert first.counts["zones"]["sq"] == {"objects": 1, "entered": 1, "exited": 0}
    # Same config and size: the same shapes, not built again; the counts as they are now.
    slot = lane_slot(2, [(10.0, 10.0, 30.0, 40.0)], [7])  # gone out of the square
    analytics.run(slot)
    second = through_tap(tap, slot, analytics)
    assert second.shapes is first.shapes
    assert second.counts["zones"]["sq"] == {"objects": 0, "entered": 1, "exited": 1}
    assert first.counts["zones"]["sq"]["objects"] == 1, "a block handed over is never changed"
    # A camera of another size, then a reload's new config: shapes built for them.
    bigger = through_tap(tap, lane_slot(3, [], []), analytics, (640, 480))
    assert bigger.shapes.zones[0].points.tolist() == [[160, 120], [480, 120], [480, 360], [160, 360]]
    moved = AnalyticsConfig(zones=(replace(SQUARE, points=((0, 0), (0.5, 0), (0.5, 0.5))),))
    after = through_tap(tap, lane_slot(4, [], []), analytics_of(moved))
    assert after.shapes.zones[0].points.tolist() == [[0, 0], [160, 0], [160, 120]] and not after.shapes.lines
    # A lane without analytics: nothing to draw.
    plain = through_tap(tap, lane_slot(5, [], []), None)
    assert plain.shapes is None and plain.counts is None


def test_zones_in_pixels_are_drawn_where_they_are():
    config = AnalyticsConfig(
        units="pixels", zones=(replace(SQUARE, points=((10, 100), (100, 100), (100, 200))),)
    )
    shapes = shapes_of(config, W, H)
    assert shapes.zones[0].points.tolist() == [[10, 100], [100, 100], [100, 200]]
    image = np.zeros((H, W, 3), np.uint8)
    annotate(image, frame(shapes, None))  # no counts yet: zeros
    assert (image[150, 100] == np.array(zone_colour(0))).all()


# -- hostile coordinates --------------------------------------------------------------------------


def spy_on_drawing(monkeypatch) -> list[np.ndarray]:
    """Every point OpenCV's polygon and line calls are handed while the test runs (the real
    calls still draw): a list that fills as they are made."""
    handed: list[np.ndarray] = []

    def spy(real):
        def call(image, *args, **kw):
            for a in args[:2]:
                if isinstance(a, (list, tuple)) and a and isinstance(a[0], np.ndarray):
                    handed.extend(np.asarray(p).reshape(-1, 2) for p in a)
                elif isinstance(a, tuple) and len(a) == 2:
                    handed.append(np.asarray([a]))
            return real(image, *args, **kw)

        return call

    for name in ("fillPoly", "polylines", "line", "arrowedLine"):
        monkeypatch.setattr(cv2, name, spy(getattr(cv2, name)))
    return handed


@pytest.mark.parametrize("far", [3e9, 1e308, -3e9, float("nan")], ids=["3e9", "1e308", "-3e9", "nan"])
def test_annotate_hands_opencv_only_points_near_the_image_whoever_made_the_shapes(far, monkeypatch):
    """Shapes made without ``shapes_of`` (so not clipped, not bounded): ``annotate`` clips
    them itself, and draws what shows (3e9 wrapped in int32 and took ~20 s per zone, then
    ``cv2.line`` raised on the line's ends)."""
    zones = (ZoneShape("z", np.array([(10.0, 10.0), (far, 10.0), (far, far), (10.0, 200.0)])),)
    lines = (LineShape("l", np.array([(20.0, 20.0), (far, far / 3)]), "left"),)
    handed = spy_on_drawing(monkeypatch)
    image = np.zeros((H, W, 3), np.uint8)
    annotate(image, frame(Shapes(zones, lines), None))
    limit = 2 * max(W, H)
    assert all(np.abs(p).max() <= limit for p in handed), [p.tolist() for p in handed]
    if far > 0:  # its left edge (x = 10) shows, in its colour
        assert (image[150, 10] == np.array(zone_colour(0))).all(), image[150, 10]


# -- a running agent ---------------------------------------------------------------------------------


def test_a_running_agent_draws_its_zones_and_lines_with_their_counts(const_model):
    """The const model's two boxes stand still inside a zone: once tracked, both are in it;
    the view's frames carry that count and the snapshot shows the zone and the line."""
    zone = ZoneConfig(
        name="all", points=((0.05, 0.05), (0.95, 0.05), (0.95, 0.95), (0.05, 0.95)), min_frames=2
    )
    line = LineConfig(name="gate", points=((0.8, 0.3), (0.8, 0.9)))
    port = free_port()
    cfg = AgentConfig(
        source=SyntheticSourceConfig(
            fps=30,
            width=W,
            height=H,
            num_objects=1,  # green (seed 0): never taken for the zone's yellow or the line's white
            analytics=AnalyticsConfig(zones=(zone,), lines=(line,)),
        ),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=free_endpoint()),
        metrics=MetricsConfig(enabled=False),
        view=ViewConfig(enabled=True, port=port, fps=10.0, quality=95),
    )
    url = f"http://127.0.0.1:{port}/snapshot/cam0.jpg"
    with started(cfg) as agent:
        tap, seen = agent.view.taps["cam0"], ViewFrame(agent.view.taps["cam0"].max_det)

        def counted() -> bytes | None:
            jpeg = urllib.request.urlopen(url, timeout=10).read()  # keeps the tap taking frames
            tap.take(seen, -1)
            return jpeg if seen.counts and seen.counts["zones"]["all"]["objects"] == 2 else None

        jpeg = wait_until(counted, 60, message="both boxes counted in the zone, in the view's frame")
    assert seen.counts["zones"]["all"]["entered"] == 2 and seen.counts["lines"]["gate"] == {"in": 0, "out": 0}
    assert seen.shapes.zones[0].points.tolist() == [[16, 12], [304, 12], [304, 228], [16, 228]]
    # The zone's yellow edge (x = 304) and the line's white (x = 256) in the JPEG, softened by
    # it: bright there, on the scene's mid-toned background, and not beside them.
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR).astype(int)
    yellow = (image[:, :, 1:].min(axis=2) >= 200) & (image[:, :, 0] <= 150)
    white = image.min(axis=2) >= 220
    assert zone_colour(0) == (0, 255, 255) and line_colour(0) == (255, 255, 255)
    assert yellow[160:220, 302:307].sum() >= 50 and yellow[160:220, 275:298].sum() < 5, "the zone's edge"
    assert white[160:220, 254:259].sum() >= 50 and white[160:220, 265:298].sum() < 5, "the line"


def test_a_zone_and_a_line_far_beyond_a_small_camera_are_drawn_clipped(const_model, tmp_path, monkeypatch):
    """Issue 43, trial 5: pixel coordinates far beyond a camera's frame (here at the bound, on
    160x120 frames) reach OpenCV clipped to the frame and its margin, never as given (3e9
    wrapped in int32 and took 17.6 s per ``cv2.fillPoly``), and still count. Loaded from
    YAML by the real loader; drawn by the real ``annotate`` in the agent's view thread."""
    from edge_agent.core.configload import load

    w, h, far = 160, 120, 65536
    limit = 2 * max(w, h)  # the frame, its margin, and room: nothing near ``far``
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((h, w, 3), 90 + 10 * i, np.uint8))
    port = free_port()
    text = (
        f"source:\n  type: images\n  path: {folder}\n  loop: true\n  analytics:\n    units: pixels\n"
        "    zones:\n      - name: far\n        min_frames: 1\n"
        f"        points: [[4, 4], [{far}, 4], [{far}, {far}], [4, {far}]]\n"
        f"    lines:\n      - {{name: long, points: [[{w // 2}, 0], [{far}, {far}]]}}\n"
        f"model: {{path: {const_model}}}\npublish: {{endpoint: '{free_endpoint()}'}}\n"
        f"metrics: {{enabled: false}}\nview: {{enabled: true, port: {port}, fps: 10}}\n"
    )
    cfg = load(AgentConfig, text, str(tmp_path / "agent.yaml"))
    handed = spy_on_drawing(monkeypatch)
    url = f"http://127.0.0.1:{port}/snapshot/cam0.jpg"
    with started(cfg) as agent:
        tap = agent.view.taps["cam0"]
        seen = ViewFrame(tap.max_det)

        def counted() -> bool:
            urllib.request.urlopen(url, timeout=10).read()  # keeps the tap taking frames
            tap.take(seen, -1)
            return bool(seen.counts and seen.counts["zones"]["far"]["objects"] == 2)

        wait_until(counted, 60, message="both boxes counted in the far zone, in the view's frame")
        urllib.request.urlopen(url, timeout=10).read()  # one more frame drawn with the counts
    zone, line = seen.shapes.zones[0].points, seen.shapes.lines[0].points
    assert np.abs(zone).max() <= limit and np.abs(line).max() <= limit, (zone.tolist(), line.tolist())
    assert handed, "the view drew the zone and the line"
    worst = max(int(np.abs(p).max()) for p in handed)
    assert worst <= limit, f"OpenCV was handed a point {worst} px out (the frame is {w}x{h})"
