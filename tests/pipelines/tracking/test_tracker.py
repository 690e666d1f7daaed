"""The tracker (pipelines/tracking): ids through occlusions, new ids where a track ended,
elapsed time over skipped frames, bounded state, and its parts (the assignment, the
Kalman filter) against plain references."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.tracking.assign import assign
from edge_agent.pipelines.tracking.bytetrack import STD_POS, STD_VEL, ByteTracker


class Run:
    """A tracker fed frames of (boxes, scores, classes); keeps each frame's ids."""

    def __init__(self, **params) -> None:
        self.t = ByteTracker(TrackerConfig(**params))
        self.ids = np.zeros(64, np.int64)
        self.age = np.zeros(64, np.int32)

    def frame(self, boxes, scores=None, classes=None, dt: float = 1.0) -> list[int]:
        xyxy = np.asarray(boxes, np.float32).reshape(-1, 4)
        m = len(xyxy)
        s = np.full(m, 0.9, np.float32) if scores is None else np.asarray(scores, np.float32)
        c = np.zeros(m, np.int32) if classes is None else np.asarray(classes, np.int32)
        self.t.update(xyxy, s, c, dt, self.ids, self.age)
        return self.ids[:m].tolist()


def box(x: float, y: float = 100.0, size: float = 40.0) -> list[float]:
    return [x, y, x + size, y + size]


def test_an_object_gets_an_id_once_confirmed_and_keeps_it():
    run = Run(confirm_frames=2)
    first = [run.frame([box(10 + 4 * t)])[0] for t in range(10)]
    assert first[0] == 0, "not confirmed after one hit"
    assert set(first[1:]) == {1}
    assert run.age[0] == 9, "age counts frames since the first detection"


def test_one_hit_confirms_when_confirm_frames_is_1_and_unconfirmed_tracks_have_no_age():
    run = Run(confirm_frames=1)
    assert run.frame([box(10)]) == [1] and run.age[0] == 0, "an id at the first hit"
    slow = Run(confirm_frames=3)
    for t in range(2):
        assert slow.frame([box(10 + t)]) == [0] and slow.age[0] == 0, "no id, no age yet"
    assert slow.frame([box(12)]) == [1] and slow.age[0] == 2


def test_an_occlusion_the_tracker_should_bridge_keeps_the_id():
    """A moving object hidden for 15 frames (half a second) comes back where its motion
    says: the same id. Another one, hidden behind it with a low score, keeps its id too."""
    run = Run()
    ids_a, ids_b = set(), set()
    for t in range(60):
        a = box(20 + 4 * t, 100)
        b = box(400 - 3 * t, 200)
        hidden = 20 <= t < 35
        dets = [b] if hidden else [a, b]
        scores = [0.3 if hidden else 0.9] if hidden else [0.9, 0.9]
        out = run.frame(dets, scores)
        if not hidden:
            ids_a.add(out[0])
        ids_b.add(out[-1])
    assert ids_a - {0} == {1} and ids_b - {0} == {2}


def test_a_gap_longer_than_lost_frames_gives_a_new_id():
    run = Run(lost_frames=10)
    before = {run.frame([box(100)])[0] for _ in range(5)} - {0}
    for _ in range(11):
        run.frame([])
    after = {run.frame([box(100)])[0] for _ in range(5)} - {0}
    assert before == {1} and after == {2}, "a track lost for longer than lost_frames ends"
    assert run.t.live == 1


def test_an_object_far_from_every_track_is_a_new_one():
    run = Run()
    for t in range(5):
        run.frame([box(10 + t)])
    out = [run.frame([box(500)])[0] for _ in range(3)]
    assert out[-1] == 2


def test_elapsed_frames_carry_the_motion_over_a_gap():
    """Frames 0-9 every frame, then 6 skipped (a ladder stride, a dropped frame): given the
    elapsed time the prediction lands on the object; told one step, it is 50 px short, the
    40 px box does not overlap and the track is lost (the control: this test can fail)."""

    def track(dt_after_gap: float) -> list[int]:
        run = Run()
        for t in range(10):
            run.frame([box(10 * t)])
        return [run.frame([box(10 * t)], dt=dt_after_gap if t == 16 else 1.0)[0] for t in (16, 17, 18)]

    assert track(6.0) == [1, 1, 1]
    assert track(1.0)[-1] != 1


def test_a_stride_keeps_the_ids_of_fast_objects():
    """Every third frame of two objects crossing each other's path at 5 px/frame (15 px
    between processed frames), told dt=3: no id changes."""
    run = Run()
    seen: dict[int, set[int]] = {0: set(), 1: set()}
    for t in range(0, 150, 3):
        dets = [box(5 * t, 100), box(750 - 5 * t, 125)]
        for obj, i in enumerate(run.frame(dets, dt=3.0)):
            seen[obj].add(i)
    assert seen[0] - {0} == {1} and seen[1] - {0} == {2}


def test_per_class_tracks_take_only_their_own_class():
    run = Run(per_class=True)
    for _ in range(3):
        run.frame([box(100)], classes=[0])
    assert run.frame([box(100)], classes=[1]) == [0], "another class: a new (tentative) track"
    mixed = Run()
    for _ in range(3):
        mixed.frame([box(100)], classes=[0])
    assert mixed.frame([box(100)], classes=[1]) == [1], "class-agnostic: the same track"


def test_ids_are_never_reused_and_state_stays_bounded():
    """Thousands of objects passing through: every id is new, ids only grow, the live
    tracks stay within the cap and refusals are counted."""
    rng = np.random.default_rng(3)
    run = Run(max_tracks=16)
    ended: set[int] = set()
    alive: dict[int, int] = {}
    objects: list[list[float]] = []
    for t in range(3000):
        if rng.random() < 0.3:
            objects.append([-40.0, rng.uniform(0, 600), rng.uniform(4, 9)])  # x, y, speed
        objects = [o for o in objects if o[0] < 900]
        for o in objects:
            o[0] += o[2]
        out = run.frame([box(x, y, 30) for x, y, _ in objects]) if objects else run.frame([])
        new = [i for i in out if i and i not in alive and i not in ended]
        assert all(i > max(alive, default=0) for i in new), "a new id is above every id so far"
        for i in out:
            if i:
                assert i not in ended, f"id {i} came back after its track ended"
                alive[i] = t
        for i, last in list(alive.items()):
            if t - last > 40:
                del alive[i]
                ended.add(i)
        assert run.t.live <= 16
    assert run.t.next_id - 1 >= 300
    assert run.t.overflow > 0, "more than 16 objects at once: new tracks were refused"
    assert run.t.pos.shape == (16, 4), "the arrays never grow"


def test_assign_never_pairs_at_the_limit():
    """A pair costing exactly the limit ties with leaving both unmatched (lapjv may take
    it): no pair at or above the limit, in the solver's path as in the fast one."""
    for cost, limit in (
        ([[1, 0.2, 1], [0.5, 1, 0.2], [1, 0.5, 1]], 1.0),  # match_iou 0: no overlap costs 1
        ([[0.7, 0.3], [0.5, 0.1], [0.7, 0.3]], 0.7),
    ):
        c = np.array(cost)
        rows, cols = assign(c, limit)
        assert len(rows) and all(c[r, k] < limit for r, k in zip(rows, cols)), (rows, cols)


@pytest.mark.parametrize("seed", range(20))
def test_assign_is_optimal_under_the_limit(seed):
    """Against every assignment of a small problem, counting a pair only below the limit."""
    rng = np.random.default_rng(seed)
    n, m = (int(v) for v in rng.integers(1, 6, 2))
    cost = rng.uniform(0, 1, (n, m))
    cost[rng.random((n, m)) < 0.4] = 1.0  # most pairs far apart, as in a scene
    limit = 0.7
    rows, cols = assign(cost, limit)
    assert len(set(rows)) == len(rows) and len(set(cols)) == len(cols)
    assert all(cost[r, c] < limit for r, c in zip(rows, cols))

    def total(pairs) -> float:  # unmatched rows and columns cost limit / 2 each
        used = [(r, c) for r, c in pairs if cost[r, c] < limit]
        return sum(cost[r, c] for r, c in used) + (n + m - 2 * len(used)) * limit / 2

    k = min(n, m)
    best = min(
        total(zip(r, c))
        for r in itertools.permutations(range(n), k)
        for c in itertools.combinations(range(m), k)
    )
    assert total(zip(rows, cols)) == pytest.approx(best)


def test_the_kalman_filter_equals_the_full_8x8_filter():
    """The per-coordinate filter against the textbook one (x' = Fx, P' = FPF' + Q; K = PH'S^-1)
    with BoT-SORT's noise, over a noisy path with varying elapsed times."""
    rng = np.random.default_rng(0)
    t = ByteTracker(TrackerConfig(max_tracks=4))
    z0 = np.array([100.0, 120.0, 40.0, 60.0])
    # two tracks: the first gets a detection every step, the second none (predicted only)
    boxes = np.array([[80.0, 90.0, 120.0, 150.0], [300.0, 300.0, 340.0, 360.0]])
    t._add(boxes, np.zeros(2, np.int32), np.arange(2), np.zeros(2, np.int64), None)
    other = t.pos[1].copy(), t.p_pp[1].copy()
    x = np.r_[z0, np.zeros(4)]
    s = np.r_[z0[2:], z0[2:]]
    p = np.diag(np.r_[(2 * STD_POS * s) ** 2, (10 * STD_VEL * s) ** 2])
    h = np.hstack([np.eye(4), np.zeros((4, 4))])
    for k in range(30):
        dt = float(rng.choice([1, 2, 3]))
        f = np.eye(8)
        f[:4, 4:] = np.eye(4) * dt
        s = np.r_[x[2:4], x[2:4]]
        q = np.diag(np.r_[(STD_POS * s) ** 2, (STD_VEL * s) ** 2] * dt)
        x, p = f @ x, f @ p @ f.T + q
        t._predict(dt)
        z = np.array([100 + 5 * k, 120 + 3 * k, 40 + k % 3, 60]) + rng.normal(0, 2, 4)
        s = np.r_[x[2:4], x[2:4]]
        r = np.diag((STD_POS * s) ** 2)
        gain = p @ h.T @ np.linalg.inv(h @ p @ h.T + r)
        x = x + gain @ (z - h @ x)
        p = (np.eye(8) - gain @ h) @ p
        t._z[0] = z
        t._z[1] = (1e6, 1e6, 1e6, 1e6)  # what a track that was not hit holds there: ignored
        t._correct(np.array([True, False]))
        np.testing.assert_allclose(t.pos[0], x[:4], rtol=1e-9)
        np.testing.assert_allclose(t.vel[0], x[4:], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(t.p_pp[0], np.diag(p)[:4], rtol=1e-9)
        np.testing.assert_allclose(t.p_pv[0], np.diag(p[:4, 4:]), rtol=1e-9)
        np.testing.assert_allclose(t.p_vv[0], np.diag(p)[4:], rtol=1e-9)
    np.testing.assert_array_equal(t.pos[1], other[0])  # no velocity, never corrected: never moved
    assert (t.p_pp[1] > other[1]).all(), "its uncertainty grew with every prediction"


def test_assign_runs_the_solver_only_when_two_rows_want_one_column(monkeypatch):
    """Rows whose best columns differ are the optimal assignment as they stand, even with a
    second candidate each; two rows wanting the same column go to the solver."""
    import edge_agent.pipelines.tracking.assign as module

    calls = []
    real = module.lap.lapjv
    monkeypatch.setattr(module.lap, "lapjv", lambda *a, **k: calls.append(1) or real(*a, **k))
    near = np.array([[0.1, 0.5, 1.0], [0.6, 0.2, 1.0], [1.0, 1.0, 0.9]])  # row 2: nothing below
    rows, cols = assign(near, 0.8)
    assert (rows.tolist(), cols.tolist()) == ([0, 1], [0, 1]) and not calls
    rival = np.array([[0.1, 0.3], [0.2, 0.7]])  # both want column 0: 0.3 + 0.2 beats 0.1 + 0.7
    rows, cols = assign(rival, 0.8)
    assert sorted(zip(rows.tolist(), cols.tolist())) == [(0, 1), (1, 0)] and calls == [1]
