"""The compiled analytics (pipelines/analytics/kernels.py) against the numpy path, the
reference: two counters fed the same frames, compared after every frame on their events
(order and content, as JSON), message blocks, counts and every state array. Sequences:
tracks moving through zones and lines, breaking and continuing as journeys, vanishing for
good, more of them than the capacity, two detections of one journey, anchors exactly on
edges and lines, a frame size that changes, dtypes the kernel was not compiled for. And
how the path is chosen: ``EDGE_AGENT_KERNELS=numpy``, a kernel that fails to compile."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.pipelines import jit
from edge_agent.pipelines.analytics import counter as counter_module
from edge_agent.pipelines.analytics.counter import Counter

W, H = 640, 480
LABELS = ("person", "car", "bike")


@pytest.fixture(autouse=True)
def kernels_auto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test picks the path afresh, in the default mode (the others' next ``load``
    finds it again: compiled, or from the disk cache)."""
    monkeypatch.delenv("EDGE_AGENT_KERNELS", raising=False)
    jit.reset()
    yield
    jit.reset()


class Twin:
    """The numpy path and the compiled one over ``config``, fed the same frames and
    compared after each (``frame``)."""

    def __init__(self, config: AnalyticsConfig, lost_frames: float = 30, capacity: int = 256) -> None:
        self.ref = Counter(config, LABELS, lost_frames, capacity, compiled=False)
        self.jit = Counter(config, LABELS, lost_frames, capacity)
        assert self.jit.compiled, jit.state()
        assert not self.ref.compiled
        self.frames = self.events = self.fallbacks = 0
        kernel = self.jit._kernel

        def counted(*args):  # a frame that ran the numpy path instead, by its dtypes
            try:
                return kernel(*args)
            except TypeError:
                self.fallbacks += 1
                raise

        self.jit._kernel = counted

    def frame(
        self, xyxy, classes, track_ids, journeys, frame_id: int, t: float, w: int = W, h: int = H
    ) -> None:
        out_ref: list[dict] = []
        out_jit: list[dict] = []
        self.ref.update(xyxy, classes, track_ids, journeys, frame_id, t, w, h, out_ref)
        self.jit.update(xyxy, classes, track_ids, journeys, frame_id, t, w, h, out_jit)
        where = f"frame {frame_id}"
        assert json.dumps(out_jit) == json.dumps(out_ref), where
        assert out_jit == out_ref, where
        assert self.jit.block() == self.ref.block(), where
        for name in ("n", "version", "events", "overflow"):
            assert getattr(self.jit, name) == getattr(self.ref, name), f"{where}: {name}"
        assert self.jit._refused == self.ref._refused, where
        n = self.ref.n
        for a, b in zip(self.jit._track_arrays(), self.ref._track_arrays()):
            assert a.dtype == b.dtype and np.array_equal(a[:n], b[:n]), where
        for name in ("objects", "entered", "exited", "crossed", "dwell_hist", "dwell_sum"):
            assert np.array_equal(getattr(self.jit, name), getattr(self.ref, name)), f"{where}: {name}"
        self.frames += 1
        self.events += len(out_ref)


def world(
    seed: int,
    frames: int,
    objects: int,
    grid: float = 0.0,
    box_dtype: type = np.float32,
    class_dtype: type = np.int32,
) -> Iterator[tuple]:
    """Frames of tracked boxes: objects bouncing round the frame, some hidden for a while
    (back as the same track, as a new track continuing its journey, or as a new journey),
    some gone for good and replaced, a few untracked boxes, labels the model has and does
    not; detections in a new order each frame. ``grid``: corners snapped to it (so anchors
    land exactly on edges and lines drawn on it)."""
    rng = np.random.default_rng(seed)
    pos = rng.uniform([0, 0], [W, H], (objects, 2))
    vel = rng.uniform(-6, 6, (objects, 2))
    size = rng.uniform([20, 40], [60, 120], (objects, 2))
    track = np.arange(1, objects + 1)
    journey = track.copy()
    cls = rng.integers(-1, len(LABELS) + 1, objects)  # -1 and 3: labels the model lacks
    hidden = np.zeros(objects, int)
    next_id = objects + 1
    for f in range(frames):
        pos += vel
        for axis, top in ((0, W), (1, H)):
            off = (pos[:, axis] < 0) | (pos[:, axis] > top)
            vel[off, axis] *= -1
            np.clip(pos[:, axis], 0, top, out=pos[:, axis])
        hidden[hidden > 0] -= 1
        back = hidden == 1
        for i in back.nonzero()[0]:
            how = rng.integers(3)
            if how >= 1:  # a new track: continuing the journey, or a new one
                track[i] = next_id
                journey[i] = journey[i] if how == 1 else next_id
                next_id += 1
        for i in (rng.random(objects) < 0.02).nonzero()[0]:
            hidden[i] = rng.choice([2, 5, 20, 40, 80])  # beyond lost_frames (30): ended
        seen = (hidden == 0).nonzero()[0]
        xy = pos[seen]
        wh = size[seen]
        boxes = np.hstack([xy - [0.5, 1.0] * wh, xy + [0.5, 0.0] * wh])
        if grid:
            boxes = np.round(boxes / grid) * grid
        ids, jids, classes = track[seen], journey[seen], cls[seen]
        extra = rng.integers(0, 4)  # untracked detections
        boxes = np.vstack([boxes, rng.uniform(0, 400, (extra, 4))])
        ids = np.concatenate([ids, np.zeros(extra, int)])
        jids = np.concatenate([jids, np.zeros(extra, int)])
        classes = np.concatenate([classes, np.zeros(extra, int)])
        order = rng.permutation(len(ids))
        yield (
            np.ascontiguousarray(boxes[order], box_dtype),
            np.ascontiguousarray(classes[order], class_dtype),
            np.ascontiguousarray(ids[order], np.int64),
            np.ascontiguousarray(jids[order], np.int64),
            f,
            1.7e9 + f / 30,
        )


def busy_config(units: str = "fraction") -> AnalyticsConfig:
    """8 zones (anchors, labels, dwell steps, min_frames, a concave one, horizontal edges)
    and 4 lines (both in sides, bands, anchors, labels)."""
    k = (1.0, 1.0) if units == "fraction" else (float(W), float(H))

    def pts(*p: tuple[float, float]) -> tuple[tuple[float, float], ...]:
        return tuple((x * k[0], y * k[1]) for x, y in p)

    anchors = ("bottom_center", "center", "top_left", "bottom_right")
    strips = tuple(
        ZoneConfig(
            name=f"z{i}",
            points=pts((0.1 * i, 0.1), (0.1 * i + 0.25, 0.1), (0.1 * i + 0.25, 0.9), (0.1 * i, 0.9)),
            anchor=anchors[i % 4],  # type: ignore[arg-type]
            min_frames=1 + i % 3,
            labels=(("person",), (), ("car", "bike"))[i % 3],
            dwell_s=((), (0.5, 1.0, 2.0))[i % 2],
        )
        for i in range(7)
    )
    u = ZoneConfig(  # concave (a U), with horizontal edges
        name="u",
        points=pts(
            (0.2, 0.2), (0.8, 0.2), (0.8, 0.8), (0.6, 0.8), (0.6, 0.4), (0.4, 0.4), (0.4, 0.8), (0.2, 0.8)
        ),
        dwell_s=(0.2,),
    )
    lines = (
        LineConfig(name="h", points=pts((0.05, 0.5), (0.95, 0.5))),
        LineConfig(name="d", points=pts((0.1, 0.1), (0.9, 0.8)), in_side="right", band=0.0, min_frames=1),
        LineConfig(name="v", points=pts((0.5, 0.05), (0.5, 0.95)), anchor="center", labels=("car",)),
        LineConfig(name="s", points=pts((0.3, 0.3), (0.4, 0.35)), band=0.2, min_frames=2),
    )
    return AnalyticsConfig(units=units, zones=(*strips, u), lines=lines)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("seed", "objects", "grid", "units"),
    [(1, 72, 0.0, "fraction"), (2, 120, 0.0, "pixels"), (3, 40, 10.0, "pixels"), (4, 72, 16.0, "fraction")],
)
def test_the_compiled_path_matches_numpy_frame_by_frame(seed, objects, grid, units):
    twin = Twin(busy_config(units))
    for frame in world(seed, 400, objects, grid=grid):
        twin.frame(*frame)
    assert twin.fallbacks == 0, "every frame ran the kernel"
    assert twin.events > 200, f"a sequence with events ({twin.events})"
    # the rare paths ran too: journeys that ended, and ones that continued
    assert twin.ref.exited.sum() > 0 and twin.ref.crossed.sum() > 0 and twin.ref.dwell_hist.sum() > 0


def test_anchors_exactly_on_edges_and_lines():
    # a zone and lines on a 10 px grid, boxes whose anchors walk that grid: every anchor
    # on an edge, a corner or a line is decided the same on both paths
    zone = ZoneConfig(
        name="z", points=((100, 100), (300, 100), (300, 300), (200, 200), (100, 300)), min_frames=1
    )
    lines = (
        LineConfig(name="a", points=((50, 200), (350, 200)), band=0.0, min_frames=1),
        LineConfig(name="b", points=((100, 100), (300, 300)), band=0.0, min_frames=1, in_side="right"),
    )
    twin = Twin(AnalyticsConfig(units="pixels", zones=(zone,), lines=lines))
    xs, ys = np.meshgrid(np.arange(60, 360, 10.0), np.arange(60, 360, 10.0))
    ax, ay = xs.ravel(), ys.ravel()
    n = len(ax)
    for f in range(12):
        shift = (f % 3) * 10.0  # anchors move on the grid, over the edges and lines
        x, y = ax + shift, ay + (f % 4) * 10.0 - 10.0
        xyxy = np.stack([x - 20, y - 80, x + 20, y], 1).astype(np.float32)
        ids = np.arange(1, n + 1, dtype=np.int64)
        twin.frame(xyxy, np.zeros(n, np.int32), ids, ids, f, f / 30)
    assert twin.fallbacks == 0 and twin.events > 100


def test_more_journeys_than_rows_and_two_boxes_of_one_journey():
    twin = Twin(busy_config(), capacity=24)
    for xyxy, classes, ids, jids, f, t in world(5, 200, 60):
        if f % 7 == 0 and len(jids) > 3:  # two detections of one journey
            jids = jids.copy()
            jids[1] = jids[0]
        twin.frame(xyxy, classes, ids, jids, f, t)
    assert twin.ref.overflow > 0
    assert twin.fallbacks == 0


def test_journeys_below_the_live_ones_and_a_frame_size_change():
    twin = Twin(busy_config(), lost_frames=5)
    frames = list(world(6, 240, 30))
    for xyxy, classes, ids, jids, f, t in frames:
        if 100 <= f < 200 and f % 10 == 0:  # an old journey continues, after it ended
            jids = np.where(ids > 0, np.maximum(jids - 25, 1), 0)
        size = (W, H) if f < 160 else (1280, 720)
        twin.frame(xyxy, classes, ids, jids, f, t, *size)
    assert twin.fallbacks == 0


@pytest.mark.parametrize(
    ("box_dtype", "class_dtype", "compiled"),
    [(np.float64, np.int64, True), (np.float16, np.int32, False), (np.float32, np.int16, False)],
)
def test_other_dtypes_compiled_or_on_the_numpy_path(box_dtype, class_dtype, compiled):
    twin = Twin(busy_config())
    for frame in world(7, 120, 50, box_dtype=box_dtype, class_dtype=class_dtype):
        twin.frame(*frame)
    # float64 boxes are compiled for; others run the numpy path, without compiling
    assert (twin.fallbacks == 0) is compiled
    assert twin.jit.compiled


def test_zones_only_lines_only_and_no_labels():
    for config in (
        AnalyticsConfig(zones=busy_config().zones),
        AnalyticsConfig(lines=busy_config().lines),
    ):
        twin = Twin(config)
        for frame in world(8, 150, 40):
            twin.frame(*frame)
        assert twin.fallbacks == 0
    # a model without labels: nothing is known, nothing counts, on both paths
    unlabelled = AnalyticsConfig(
        zones=(ZoneConfig(name="z", points=((0.1, 0.1), (0.9, 0.1), (0.5, 0.9))),),
        lines=(LineConfig(name="l", points=((0.0, 0.5), (1.0, 0.5))),),
    )
    bare = Counter(unlabelled, (), 30, 64)
    ref = Counter(unlabelled, (), 30, 64, compiled=False)
    for xyxy, classes, ids, jids, f, t in world(9, 60, 20):
        a: list[dict] = []
        b: list[dict] = []
        bare.update(xyxy, classes, ids, jids, f, t, W, H, a)
        ref.update(xyxy, classes, ids, jids, f, t, W, H, b)
        assert a == b and bare.block() == ref.block()


def test_numpy_mode_runs_the_numpy_path(monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_KERNELS", "numpy")
    jit.reset()
    counter = Counter(busy_config(), LABELS, 30, 64)
    assert not counter.compiled
    state = jit.state()
    assert state["parts"] == {"analytics": "numpy"}
    assert "EDGE_AGENT_KERNELS=numpy" in state["fallback"]["analytics"]


def test_a_kernel_that_fails_to_compile_falls_back_with_the_reason(monkeypatch):
    numba = pytest.importorskip("numba")

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler today")

    monkeypatch.setattr(numba, "njit", broken)
    jit.reset()
    counter = Counter(busy_config(), LABELS, 30, 64)
    assert not counter.compiled
    assert "no compiler today" in jit.state()["fallback"]["analytics"]
    # and it counts, on the numpy path
    out: list[dict] = []
    for frame in world(10, 60, 30):
        counter.update(*frame[:6], W, H, out)
    assert counter.events == len(out) > 0


def test_a_warm_that_did_not_compile_is_refused():
    # the warm-up drives update(), which runs the numpy path on a TypeError: a kernel
    # that compiled for none of the frames' dtypes must not pass for warmed
    class Stub:
        signatures = ()

        def __call__(self, *args):
            raise TypeError("no matching definition")

    with pytest.raises(RuntimeError, match="did not compile"):
        counter_module._warm({"analytics_frame": Stub()})
