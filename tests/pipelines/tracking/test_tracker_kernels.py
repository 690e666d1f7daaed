"""The tracker's compiled path (pipelines/tracking/track_kernels.py) against its numpy
path, the reference: both run over the same frames and must give the same ids, ages and
journeys in every frame and hold the same state, bit for bit; and the fallbacks to the
numpy path (EDGE_AGENT_KERNELS=numpy, a kernel that does not compile, a frame of other
dtypes)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import edge_agent.pipelines.tracking.bytetrack as bytetrack
from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines import jit
from edge_agent.pipelines.steps.tracking import SourceTracker
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

W, H = 640.0, 480.0
#: An occluder (x1, y1, x2, y2): an object whose centre is behind it is mostly not
#: detected, else detected with a low score.
OCCLUDER = (220.0, 140.0, 360.0, 340.0)

Frame = tuple[np.ndarray, np.ndarray, np.ndarray, float]


def scene(seed: int, frames: int = 240, objects: int = 14, size: tuple = (24, 90)) -> Iterator[Frame]:
    """Objects crossing the view and each other, entering and leaving at its edges, turning,
    stopping, hiding behind an occluder (detected with low scores or not at all), their
    class flickering; false detections, and some given twice; skipped frames (dt 2-4) and empty frames; the
    detections in random order. Boxes float32, as a decoder gives them."""
    rng = np.random.default_rng(seed)
    centre = rng.uniform((-40.0, -40.0), (W + 40, H + 40), (objects, 2))
    vel = rng.normal(0.0, 4.0, (objects, 2))
    wh = rng.uniform(size[0], size[1], (objects, 2))
    cls = rng.integers(0, 4, objects)
    for _ in range(frames):
        dt = float(rng.choice([1, 1, 1, 1, 1, 1, 2, 3, 4]))
        turn = rng.random(objects) < 0.03
        vel[turn] = rng.normal(0.0, 4.0, (int(turn.sum()), 2))
        vel[rng.random(objects) < 0.01] = 0.0  # a stop
        centre += vel * dt
        out = (centre < -80) | (centre > (W + 80, H + 80))
        gone = out.any(1)  # far out: a new object enters somewhere
        centre[gone] = rng.uniform((-30.0, -30.0), (W + 30, H + 30), (int(gone.sum()), 2))
        if rng.random() < 0.04:
            yield np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32), dt
            continue
        behind = (
            (centre[:, 0] > OCCLUDER[0])
            & (centre[:, 0] < OCCLUDER[2])
            & (centre[:, 1] > OCCLUDER[1])
            & (centre[:, 1] < OCCLUDER[3])
        )
        inside = (centre > (-10, -10)).all(1) & (centre < (W + 10, H + 10)).all(1)
        seen = inside & ~(behind & (rng.random(objects) < 0.7))
        k = int(seen.sum())
        half = wh[seen] / 2
        xyxy = np.concatenate([centre[seen] - half, centre[seen] + half], 1) + rng.normal(0.0, 1.5, (k, 4))
        score = np.where(behind[seen], rng.uniform(0.12, 0.48, k), rng.uniform(0.45, 0.97, k))
        c = np.where(rng.random(k) < 0.05, rng.integers(0, 4, k), cls[seen])
        false = int(rng.poisson(0.6))
        corner = rng.uniform((0, 0), (W - 40, H - 40), (false, 2))
        xyxy = np.concatenate([xyxy, np.concatenate([corner, corner + rng.uniform(10, 60, (false, 2))], 1)])
        score = np.concatenate([score, rng.uniform(0.1, 0.8, false)])
        c = np.concatenate([c, rng.integers(0, 4, false)])
        twice = rng.random(len(score)) < 0.05  # a detection given twice (ties in every cost)
        xyxy = np.concatenate([xyxy, xyxy[twice]])
        score = np.concatenate([score, score[twice]])
        c = np.concatenate([c, c[twice]])
        order = rng.permutation(len(score))
        yield (
            np.ascontiguousarray(xyxy[order], np.float32),
            score[order].astype(np.float32),
            c[order].astype(np.int32),
            dt,
        )


def exact_thresholds(frames: Iterator[Frame], values: tuple[float, ...]) -> Iterator[Frame]:
    """``frames`` with some scores exactly at the settings' float32 values (0.7 rounds down
    in float32: numpy compares a float32 score with the float32 setting)."""
    for i, (xyxy, score, c, dt) in enumerate(frames):
        if len(score):
            score[i % len(score)] = np.float32(values[i % len(values)])
        yield xyxy, score, c, dt


class Both:
    """A compiled tracker and a numpy one, fed the same frames; ``frame`` checks they agree."""

    def __init__(self, config: TrackerConfig, view: bool = True, journeys_out: bool = True) -> None:
        self.compiled = ByteTracker(config)
        assert self.compiled.compiled, f"the kernels did not load: {jit.state()}"
        self.numpy = ByteTracker(config, compiled=False)
        assert not self.numpy.compiled
        if view:
            self.compiled.view = self.numpy.view = (W, H)
        self.journeys_out = journeys_out
        # (filled with -7: a detection the update forgot to write shows)
        self.out = {t: [np.full(256, -7, d) for d in (np.int64, np.int32, np.int64)] for t in "cn"}
        self.frames = 0

    def frame(self, xyxy: np.ndarray, scores: np.ndarray, classes: np.ndarray, dt: float) -> None:
        m = len(scores)
        for key, t in (("c", self.compiled), ("n", self.numpy)):
            ids, age, journey = self.out[key]
            t.update(xyxy, scores, classes, dt, ids, age, journey if self.journeys_out else None)
        at = f"frame {self.frames}, {m} detections"
        for name, a, b in zip(("ids", "ages", "journeys"), self.out["c"], self.out["n"]):
            np.testing.assert_array_equal(a[:m], b[:m], err_msg=f"{name} differ at {at}")
        c, n = self.compiled, self.numpy
        assert (c.n, c.next_id, c.overflow, c.links) == (n.n, n.next_id, n.overflow, n.links), at
        assert c.counts() == n.counts(), at
        for a, b in zip(c._arrays, n._arrays):  # the state, bit for bit
            np.testing.assert_array_equal(a[: c.n], b[: n.n], err_msg=f"state differs at {at}")
        self.frames += 1

    def run(self, frames: Iterator[Frame]) -> Both:
        for f in frames:
            self.frame(*f)
        return self


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """Kernels on for each test (another test may have left the numpy path loaded), and
    forgotten after one that switched them."""
    monkeypatch.delenv("EDGE_AGENT_KERNELS", raising=False)
    if jit.state()["parts"].get("tracker") == "numpy":
        jit.reset()
    yield
    if jit.state()["parts"].get("tracker") == "numpy":
        jit.reset()


@pytest.fixture
def solver_calls(monkeypatch) -> list[int]:
    """Counts the compiled path's solver runs (two tracks wanting one detection)."""
    calls: list[int] = []
    real = bytetrack.solve
    monkeypatch.setattr(bytetrack, "solve", lambda *a: calls.append(1) or real(*a))
    return calls


CASES = {
    "defaults": {},
    "per-class": {"per_class": True},
    "confirm-1": {"confirm_frames": 1},
    "confirm-3": {"confirm_frames": 3},
    "no-journeys": {"journeys": False},
    "short-lost": {"lost_frames": 6.0, "journey_radius": 2.0},
    "wide-gate-confirm-1": {"confirm_frames": 1, "journey_radius": 3.0, "per_class": True},
    "thresholds": {"high_score": 0.7, "low_score": 0.3, "new_track_score": 0.7, "match_iou": 0.3},
    "cap": {"max_tracks": 8},
}


@pytest.mark.parametrize("params", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("seed", [1, 2])
def test_compiled_and_numpy_paths_agree_on_a_scene(params, seed):
    Both(TrackerConfig(**params)).run(scene(seed))


@pytest.mark.parametrize("confirm", [1, 2])
def test_they_agree_in_a_crowd_with_journeys_and_without_a_view(confirm, solver_calls):
    """60 small objects (many tracks wanting the same detection: the solver runs between
    the kernel's calls); no view (no track leaves it) and no journey array given."""
    both = Both(TrackerConfig(confirm_frames=confirm, journey_radius=1.5), view=False, journeys_out=False)
    both.run(scene(7, frames=200, objects=60, size=(12, 40)))
    assert solver_calls, "the crowd never made two tracks want one detection"
    assert both.numpy.links, "no journey was continued: the test lost its point"


def test_the_scenes_exercise_links_overflow_and_the_solver(solver_calls):
    """What the comparisons above are worth: the scenes do link journeys, overflow the cap,
    run the solver, lose tracks at the view's edge and confirm in three hits."""
    links = Both(TrackerConfig(journey_radius=2.0)).run(scene(1)).numpy
    assert links.links > 0
    assert Both(TrackerConfig(max_tracks=8)).run(scene(1)).numpy.overflow > 0
    edge = Both(TrackerConfig()).run(scene(2))
    assert edge.numpy.edge.any() or edge.numpy.next_id > 20
    assert solver_calls


def test_they_agree_on_0_1_and_many_detections_and_empty_frames():
    both = Both(TrackerConfig(confirm_frames=1))
    empty = (np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int32))
    one = (np.array([[100, 100, 140, 150]], np.float32), np.array([0.9], np.float32), np.array([2], np.int32))
    both.frame(*empty, 1.0)  # nothing, no tracks
    both.frame(*one, 1.0)
    both.frame(*empty, 3.0)  # tracks, no detections
    both.frame(*one, 1.0)
    for xyxy, s, c, dt in scene(3, frames=30, objects=40):
        both.frame(xyxy, s, c, dt)
        both.frame(*empty, 2.0)


def test_they_agree_with_scores_exactly_at_the_settings():
    params = {"high_score": 0.7, "low_score": 0.1, "new_track_score": 0.7}
    frames = exact_thresholds(scene(4), tuple(params.values()))
    Both(TrackerConfig(**params)).run(frames)


def test_a_frame_of_other_dtypes_runs_the_numpy_path_on_the_same_state():
    """float64 boxes or a strided score column: not what the kernel was compiled for (it
    compiles nothing more on a live frame); that frame runs in numpy, the next compiled."""
    both = Both(TrackerConfig())
    for i, (xyxy, s, c, dt) in enumerate(scene(5, frames=120)):
        if i % 3 == 1:
            xyxy = xyxy.astype(np.float64)
        elif i % 3 == 2:
            s = np.column_stack([s, s])[:, 0]  # not contiguous
        both.frame(xyxy, s, c, dt)
    assert both.compiled.compiled


def test_the_view_can_change_and_go():
    both = Both(TrackerConfig(lost_frames=30.0))
    for i, f in enumerate(scene(6, frames=150)):
        if i == 50:
            both.compiled.view = both.numpy.view = (320.0, 240.0)
        if i == 100:
            both.compiled.view = both.numpy.view = None
        both.frame(*f)


def test_numpy_mode_gives_the_numpy_path(monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_KERNELS", "numpy")
    jit.reset()
    assert not ByteTracker(TrackerConfig()).compiled
    state = jit.state()
    assert state["parts"]["tracker"] == "numpy" and "EDGE_AGENT_KERNELS" in state["fallback"]["tracker"]


def test_a_kernel_that_does_not_compile_falls_back_with_the_reason(monkeypatch):
    numba = pytest.importorskip("numba")

    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(numba, "njit", broken)
    jit.reset()
    t = ByteTracker(TrackerConfig(confirm_frames=1))
    assert not t.compiled
    assert "no compiler here" in jit.state()["fallback"]["tracker"], jit.state()
    ids, age = np.zeros(4, np.int64), np.zeros(4, np.int32)
    xyxy, score = np.array([[0, 0, 10, 10]], np.float32), np.array([0.9], np.float32)
    t.update(xyxy, score, np.zeros(1, np.int32), 1.0, ids, age)
    assert ids[0] == 1, "the numpy path tracks"


def test_the_step_says_whether_the_tracker_is_compiled():
    assert SourceTracker(TrackerConfig(), "model").figures().as_dict()["compiled"] is True
