"""The batch scheduler on its own: ordering, batch composition, waiting, closing.

Frames are real ``FrameSlot`` objects with hand-set capture stamps, and the inference
time estimates are seeded. Tests of a decision that needs no waiting stop the
scheduler's clock (``frozen``), so every such decision is deterministic: with a running
clock, a loaded machine that holds the test back for a millisecond between stamping a
frame and asking for a batch would age the frame past a 1 ms margin.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest

from edge_agent.core.stamps import CAPTURED
from edge_agent.pipelines import scheduler as scheduler_module
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.scheduler import BatchScheduler
from edge_agent.pipelines.slots import Closed, FrameSlot

MS = 1_000_000
PROFILE = object()  # the scheduler only compares profiles by identity
OTHER = object()


class FrozenClock:
    """The ``time`` module as the scheduler sees it, with ``monotonic_ns`` standing still."""

    def __init__(self) -> None:
        self.now_ns = time.monotonic_ns()

    def monotonic_ns(self) -> int:
        return self.now_ns

    def __getattr__(self, name: str):
        return getattr(time, name)


@pytest.fixture
def frozen(monkeypatch) -> FrozenClock:
    """The scheduler's clock stopped: only for decisions that need no waiting (a wait for
    time to pass would never end)."""
    clock = FrozenClock()
    monkeypatch.setattr(scheduler_module, "time", clock)
    return clock


def make_slot(lane: int, age_ms: float, profile: object = PROFILE) -> FrameSlot:
    io = IOSet({"images": np.zeros((1, 2, 2, 3), np.uint8)}, [np.zeros((1, 8, 4), np.float32)])
    slot = FrameSlot(0, io, "images", max_det=4, profile=profile)
    slot.lane_index = lane
    slot.stamps[CAPTURED] = scheduler_module.time.monotonic_ns() - int(age_ms * MS)  # frozen or not
    return slot


@dataclass
class StubLane:
    """A source's lane as the scheduler reads it (``scheduler.SchedulerLane``): 1 ms of
    work before inference and 1 ms after, and the frames it drops recorded."""

    priority: int
    budget_ns: int
    newest_wins: bool
    fresh_only: bool
    profile: object
    replaced: list = field(default_factory=list)  # replaced by a newer frame (overrun)
    passed: list = field(default_factory=list)  # passed over as not fresh, then replaced

    def around_ns(self) -> tuple[float, float]:
        return (1 * MS, 1 * MS)

    def current(self) -> object:
        return self.profile

    def drop(self, slot: FrameSlot | None, reason: str) -> None:
        (self.passed if reason == "not_fresh" else self.replaced).append(slot)


def make_scheduler(
    lanes: list[tuple[int, float]],  # (priority, budget ms) per lane
    models: dict[int, object] | None = None,  # a lane's next frame's profile, if not PROFILE
    max_batch: int = 0,
    max_wait_ms: float = 0.0,
    margin_ms: float = 2.0,
    newest_wins: bool = True,
    limit: int = 64,
    replaced: list | None = None,
    latency: bool = False,
    passed: list | None = None,
) -> BatchScheduler:
    """``latency``: every lane in latency mode; ``passed`` collects its frames passed over
    as not fresh (``replaced`` the others that a newer frame replaced)."""
    specs = [
        StubLane(
            prio,
            int(budget * MS),
            newest_wins,
            latency,
            (models or {}).get(i, PROFILE),
            replaced if replaced is not None else [],
            passed if passed is not None else [],
        )
        for i, (prio, budget) in enumerate(lanes)
    ]
    # The three keys of ``batching`` the scheduler reads; waits of seconds (past the
    # config's bound) let a test isolate the other rules.
    batching = SimpleNamespace(max_batch=max_batch, max_wait_ms=max_wait_ms, margin_ms=margin_ms)
    s = BatchScheduler(specs, batching, lambda profile: limit)  # type: ignore[arg-type]
    for size, ms in {1: 5, 2: 8, 3: 11, 4: 14}.items():
        if size <= s.max_batch:
            s.seed(PROFILE, size, ms * MS)
    return s


def put_all(s: BatchScheduler, slots: list[FrameSlot]) -> None:
    stop = threading.Event()
    for slot in slots:
        assert s.put(slot.lane_index, slot, stop)


def give_rhythm(s: BatchScheduler, lane: int, interval_s: float) -> None:
    """Two frames of ``lane`` ``interval_s`` apart: its next one is then expected."""
    for _ in range(2):
        assert s.put(lane, make_slot(lane, 0), threading.Event())
        s.next_batch(0.1)
        time.sleep(interval_s)


def lanes_of(batch) -> list[int]:
    return [slot.lane_index for slot in batch]


def test_higher_priority_is_served_first_even_with_a_later_deadline(frozen):
    # Lane 0 has the highest priority but the loosest budget: without priorities the
    # others' earlier deadlines would win.
    s = make_scheduler([(10, 100.0), (0, 20.0), (0, 20.0)], max_batch=1)
    put_all(s, [make_slot(1, 5), make_slot(2, 5), make_slot(0, 5)])
    assert lanes_of(s.next_batch(0.1)) == [0]
    # Among equal priorities: the earliest deadline first.
    s2 = make_scheduler([(0, 100.0), (0, 20.0), (0, 50.0)], max_batch=1)
    put_all(s2, [make_slot(0, 5), make_slot(1, 5), make_slot(2, 5)])
    assert [lanes_of(s2.next_batch(0.1)) for _ in range(3)] == [[1], [2], [0]]


def test_batch_takes_every_ready_frame_when_slack_allows(frozen):
    s = make_scheduler([(0, 100.0)] * 4)
    put_all(s, [make_slot(i, 1) for i in range(4)])
    assert sorted(lanes_of(s.next_batch(0.1))) == [0, 1, 2, 3]


def test_batch_shrinks_to_what_keeps_the_tightest_deadline(frozen):
    # 15 ms left for the oldest frame: minus 2 ms margin and 1 ms after inference leaves
    # 12 ms, so two frames (8 ms) fit but three (11 ms) fit only just and four (14) not.
    s = make_scheduler([(0, 20.0)] * 4)
    put_all(s, [make_slot(0, 5), make_slot(1, 1), make_slot(2, 1), make_slot(3, 1)])
    assert len(s.next_batch(0.1)) == 3
    s = make_scheduler([(0, 20.0)] * 4)
    put_all(s, [make_slot(0, 8), make_slot(1, 1), make_slot(2, 1), make_slot(3, 1)])
    assert len(s.next_batch(0.1)) == 2  # 9 ms: two frames (8 ms)
    s = make_scheduler([(0, 20.0)] * 4)
    put_all(s, [make_slot(i, 10) for i in range(4)])
    assert len(s.next_batch(0.1)) == 1  # 7 ms: one frame (5 ms) runs alone


def test_a_frame_past_saving_does_not_shrink_the_batch(frozen):
    s = make_scheduler([(0, 20.0)] * 3)
    put_all(s, [make_slot(0, 30), make_slot(1, 1), make_slot(2, 1)])
    assert len(s.next_batch(0.1)) == 3


def test_a_frame_past_saving_is_not_waited_with():
    s = make_scheduler([(0, 20.0)] * 2, max_wait_ms=5000.0)
    give_rhythm(s, 1, 0.02)
    put_all(s, [make_slot(0, 30)])
    t = time.monotonic()
    assert len(s.next_batch(1.0)) == 1  # admission drops it; waiting would help nobody
    assert time.monotonic() - t < 0.5


def test_batch_leaves_room_for_an_idle_higher_priority_source(frozen):
    # Lane 0 (priority 5, budget 20 ms) has no frame waiting; its next one may come any
    # moment and must still fit: 20 - 2 margin - 1 before - 1 after - 5 alone = 11 ms, so
    # a batch of the low-priority lanes stops at three frames (11 ms).
    s = make_scheduler([(5, 20.0), (0, 100.0), (0, 100.0), (0, 100.0), (0, 100.0)], max_batch=4)
    put_all(s, [make_slot(i, 1) for i in (1, 2, 3, 4)])
    assert len(s.next_batch(0.1)) == 3
    # Without a higher-priority source the same frames form a full batch.
    s = make_scheduler([(0, 20.0), (0, 100.0), (0, 100.0), (0, 100.0), (0, 100.0)], max_batch=4)
    put_all(s, [make_slot(i, 1) for i in (1, 2, 3, 4)])
    assert len(s.next_batch(0.1)) == 4


def test_only_frames_of_the_same_model_share_a_batch(frozen):
    s = make_scheduler([(0, 100.0)] * 3)
    put_all(s, [make_slot(0, 3), make_slot(1, 2, OTHER), make_slot(2, 1)])
    first = s.next_batch(0.1)
    assert lanes_of(first) == [0, 2] and all(f.profile is PROFILE for f in first)
    assert lanes_of(s.next_batch(0.1)) == [1]


def test_max_batch_and_the_models_limit_cap_the_batch(frozen):
    s = make_scheduler([(0, 100.0)] * 4, max_batch=2)
    put_all(s, [make_slot(i, 1) for i in range(4)])
    assert len(s.next_batch(0.1)) == 2
    s = make_scheduler([(0, 100.0)] * 4, limit=3)
    put_all(s, [make_slot(i, 1) for i in range(4)])
    assert len(s.next_batch(0.1)) == 3


def test_waits_for_an_expected_frame_while_slack_allows():
    s = make_scheduler([(0, 100.0), (0, 100.0)], max_wait_ms=2000.0)
    stop = threading.Event()
    give_rhythm(s, 1, 0.05)  # lane 1 delivers every ~50 ms
    s.put(0, make_slot(0, 0), stop)
    timer = threading.Timer(0.02, lambda: s.put(1, make_slot(1, 0), stop))
    timer.start()
    batch = s.next_batch(1.0)
    timer.join()
    assert sorted(lanes_of(batch)) == [0, 1], "it waited for the frame that was due"


def test_does_not_wait_for_a_source_that_never_delivered_stalled_or_ended():
    s = make_scheduler([(0, 100.0)] * 4, max_wait_ms=5000.0)
    give_rhythm(s, 3, 0.01)
    time.sleep(0.05)  # lane 3 is now overdue by more than its interval: stalled
    s.close(2)
    put_all(s, [make_slot(0, 0)])
    t = time.monotonic()
    assert lanes_of(s.next_batch(1.0)) == [0]
    assert time.monotonic() - t < 0.5  # lane 1 has no frame rate yet, lane 2 ended


def test_no_wait_once_the_slack_is_gone():
    s = make_scheduler([(0, 20.0), (0, 20.0)], max_wait_ms=5000.0)
    stop = threading.Event()
    give_rhythm(s, 1, 0.02)
    s.put(0, make_slot(0, 10), stop)  # 7 ms to spare: a batch of two (8 ms) no longer fits
    t = time.monotonic()
    assert lanes_of(s.next_batch(1.0)) == [0]
    assert time.monotonic() - t < 0.5


def test_newest_frame_replaces_a_waiting_one_and_is_accounted(frozen):
    replaced: list = []
    s = make_scheduler([(0, 100.0)], replaced=replaced)
    old, new = make_slot(0, 2), make_slot(0, 1)
    put_all(s, [old, new])
    assert replaced == [old]
    assert s.next_batch(0.1) == [new]


def test_a_file_source_waits_for_room_instead_of_replacing():
    s = make_scheduler([(0, 100.0)], newest_wins=False)
    stop = threading.Event()
    first, second = make_slot(0, 1), make_slot(0, 1)
    assert s.put(0, first, stop)
    assert not s.wait_room(0, 0.01)
    done = threading.Event()
    threading.Thread(target=lambda: (s.put(0, second, stop), done.set())).start()
    assert not done.wait(0.1), "the second put must wait while the first frame waits"
    assert s.next_batch(0.1) == [first]
    assert done.wait(1.0)
    assert s.next_batch(0.1) == [second]
    stop.set()


def test_closed_when_every_lane_ended_and_nothing_waits(frozen):
    s = make_scheduler([(0, 100.0), (0, 100.0)])
    put_all(s, [make_slot(0, 1)])
    s.close(0)
    s.close(1)
    assert lanes_of(s.next_batch(0.1)) == [0], "a frame put before the close still runs"
    with pytest.raises(Closed):
        s.next_batch(0.1)


def test_estimates_follow_the_measured_batches_and_extrapolate():
    s = make_scheduler([(0, 100.0)] * 4)
    s.record(PROFILE, 2, 20 * MS)
    assert s.estimate_ns(PROFILE, 2) == 20 * MS, "the first batch replaces the warm-up figure"
    s.record(PROFILE, 2, 10 * MS)
    assert 10 * MS < s.estimate_ns(PROFILE, 2) < 20 * MS  # moved towards the measurement
    fresh = make_scheduler([(0, 100.0)] * 4)
    fresh._seeds.clear()
    fresh.seed(PROFILE, 1, 4 * MS)
    assert fresh.estimate_ns(PROFILE, 3) == pytest.approx(12 * MS)  # linear from size 1
    assert fresh.estimate_ns(PROFILE, 3, measured_only=True) == 0.0, "a warm-up does not judge"
    fresh.record(PROFILE, 3, 9 * MS)
    assert fresh.estimate_ns(PROFILE, 3, measured_only=True) == 9 * MS
    assert fresh.figures().summary() == {"max_batch": 4, "batches": 1, "mean_size": 3.0, "sizes": {"3": 1}}


def test_each_frame_of_a_batch_carries_what_the_batch_is_expected_to_take(frozen):
    """Admission judges a frame by its batch's measured estimate, handed out with the batch
    (never a warm-up figure: one slow warm-up must not drop frames)."""
    s = make_scheduler([(0, 100.0)] * 4)
    put_all(s, [make_slot(i, 1) for i in range(2)])
    batch = s.next_batch(0.1)
    assert len(batch) == 2 and [slot.expected_ns for slot in batch] == [0.0, 0.0], "only warm-ups so far"
    s.record(PROFILE, 2, 20 * MS)
    put_all(s, [make_slot(i, 1) for i in range(2)])
    batch = s.next_batch(0.1)
    assert [slot.expected_ns for slot in batch] == [s.estimate_ns(PROFILE, 2, measured_only=True)] * 2
    assert batch[0].expected_ns == 20 * MS


def test_does_not_wait_for_a_source_whose_frame_could_not_join():
    # Lane 1 delivers regularly, but on another model: its frame would never share a batch.
    s = make_scheduler([(0, 100.0), (0, 100.0)], models={1: OTHER}, max_wait_ms=5000.0)
    give_rhythm(s, 1, 0.02)
    put_all(s, [make_slot(0, 0)])
    t = time.monotonic()
    assert lanes_of(s.next_batch(1.0)) == [0]
    assert time.monotonic() - t < 0.5


def test_batch_counts_carry_over_a_reload():
    old = make_scheduler([(0, 100.0)] * 4)
    old.record(PROFILE, 4, 10 * MS)
    old.record(PROFILE, 1, 3 * MS)
    new = make_scheduler([(0, 100.0)] * 2)  # a source fewer and one more removed
    new.adopt(old)
    assert new.figures().batches == 2 and new.frames == 5


def test_equal_sources_under_overload_take_turns(frozen):
    # Two cameras in step; one frame at a time. Lane 1 loses the first tie, its frame is
    # replaced by a newer one, and then it goes first: it has been waiting longer.
    s = make_scheduler([(0, 100.0), (0, 100.0)], max_batch=1)
    put_all(s, [make_slot(0, 10), make_slot(1, 10)])
    assert lanes_of(s.next_batch(0.1)) == [0]
    put_all(s, [make_slot(0, 0), make_slot(1, 0)])  # lane 1's older frame is replaced
    assert lanes_of(s.next_batch(0.1)) == [1]
    assert lanes_of(s.next_batch(0.1)) == [0]


# -- latency mode: fresh frames only -----------------------------------------------------
#
# The lanes below deliver every 10 ms (on the frozen clock); a frame's expected work is
# 1 ms before inference + 5 ms inference + 1 ms after = 7 ms, so a frame is fresh while it
# waited at most max(10 / 2, 0.25 x 7) = 5 ms for a busy inference (and is at most that
# much older than the 1 ms expected at hand-over). The scheduler waits for the
# replacement with a real condition wait: a put from a timer ends it. The clock being
# frozen, a scheduler that wrongly waits on would wait for ever: ``watchdog`` jumps the
# clock after a few seconds, so that such a test fails instead.

INTERVAL_MS = 10.0


@pytest.fixture
def watchdog(frozen):
    timer = threading.Timer(5.0, lambda: setattr(frozen, "now_ns", frozen.now_ns + 10**12))
    timer.start()
    yield frozen
    timer.cancel()


def in_rhythm(s: BatchScheduler, clock: FrozenClock, lanes: int = 1) -> None:
    """Each lane delivers twice, INTERVAL_MS apart, each frame taken at once; the clock
    ends one more interval on (when every lane's next frame is due)."""
    for _ in range(2):
        put_all(s, [make_slot(i, 0) for i in range(lanes)])
        while s.waiting:
            s.next_batch(0.1)
        clock.now_ns += int(INTERVAL_MS * MS)


def put_later(s: BatchScheduler, delay_s: float, slots: list[FrameSlot]) -> threading.Timer:
    timer = threading.Timer(delay_s, put_all, (s, slots))
    timer.start()
    return timer


def test_latency_mode_passes_over_a_frame_that_waited_for_a_busy_inference(frozen, watchdog):
    replaced: list = []
    passed: list = []
    s = make_scheduler([(0, 100.0)], latency=True, replaced=replaced, passed=passed)
    in_rhythm(s, frozen)
    old = make_slot(0, 0)
    put_all(s, [old])
    frozen.now_ns += 6 * MS  # inference was busy for 6 ms more: the frame is stale ...
    new = make_slot(0, 0)
    timer = put_later(s, 0.05, [new])  # ... and the source's next one is 4 ms away
    batch = s.next_batch(2.0)
    timer.join()
    assert batch == [new], "inference waited for the next frame"
    assert passed == [old] and replaced == [], "the stale one is accounted as not fresh"
    assert s.fresh_fallbacks == 0


def test_latency_mode_counts_a_late_capture_against_freshness(frozen, watchdog):
    # Captured 6 ms before it was put (the camera or its thread was late; 1 ms is usual):
    # after 1 ms in the cell it is 6 ms older than usual, past the 5 ms.
    passed: list = []
    s = make_scheduler([(0, 100.0)], latency=True, passed=passed)
    in_rhythm(s, frozen)
    old = make_slot(0, 6)
    put_all(s, [old])
    frozen.now_ns += 1 * MS
    new = make_slot(0, 0)
    timer = put_later(s, 0.05, [new])
    assert s.next_batch(2.0) == [new]
    timer.join()
    assert passed == [old] and s.fresh_fallbacks == 0


def test_throughput_mode_runs_the_waiting_frame_however_long_it_waited(frozen):
    replaced: list = []
    s = make_scheduler([(0, 100.0)], replaced=replaced)
    in_rhythm(s, frozen)
    old = make_slot(0, 0)
    put_all(s, [old])
    frozen.now_ns += 9 * MS
    assert s.next_batch(0.1) == [old]
    assert replaced == []


def test_latency_mode_runs_a_frame_that_is_fresh_enough(frozen, watchdog):
    passed: list = []
    s = make_scheduler([(0, 100.0)], latency=True, passed=passed)
    in_rhythm(s, frozen)
    frame = make_slot(0, 0)
    put_all(s, [frame])
    frozen.now_ns += int(4.5 * MS)  # within 5 ms
    assert s.next_batch(0.1) == [frame]
    assert s.fresh_fallbacks == 0
    # A frame stays fresh past half an interval while within a quarter of its expected
    # processing time: a slower model (28 ms: 30 ms in all, 7.5 ms allowed).
    s.seed(PROFILE, 1, 28 * MS)
    slower = make_slot(0, 0)
    put_all(s, [slower])
    frozen.now_ns += 7 * MS
    assert s.next_batch(0.1) == [slower]
    # Nor is a frame that came while the inference was waiting ever passed over, however
    # late the inference thread gets to it (a loaded machine).
    late = make_slot(0, 0)

    def put_then_stall() -> None:
        put_all(s, [late])
        frozen.now_ns += 9 * MS

    timer = threading.Timer(0.05, put_then_stall)
    timer.start()
    assert s.next_batch(2.0) == [late]
    timer.join()
    assert passed == []


def test_latency_mode_runs_a_stale_frame_when_the_next_one_is_overdue(frozen, watchdog):
    passed: list = []
    s = make_scheduler([(0, 100.0)], latency=True, passed=passed)
    in_rhythm(s, frozen)
    old = make_slot(0, 0)
    put_all(s, [old])
    # The next frame was due 10 ms after this one (+ 1 ms to hand it over) and is more
    # than half an interval late: a stall, not jitter.
    frozen.now_ns += 17 * MS
    assert s.next_batch(0.1) == [old]
    assert passed == [] and s.fresh_fallbacks == 1


def test_latency_mode_never_passes_over_a_file_sources_frame(frozen, watchdog):
    # A file hands over every frame and waits: its next frame only comes once this one is
    # taken, so passing it over would lose it for nothing (and stall the file).
    s = make_scheduler([(0, 100.0)], latency=True, newest_wins=False)
    in_rhythm(s, frozen)
    frame = make_slot(0, 0)
    put_all(s, [frame])
    frozen.now_ns += 9 * MS
    assert s.next_batch(0.1) == [frame]


def test_latency_mode_still_batches_the_sources_fresh_frames(frozen, watchdog):
    # Two cameras in step, both frames stale: the inference waits for the next ones, and
    # once the first is in, waits on for the other (due soon) to run both in one batch.
    passed: list = []
    s = make_scheduler([(0, 100.0)] * 2, latency=True, passed=passed, max_wait_ms=500.0)
    in_rhythm(s, frozen, lanes=2)
    old = [make_slot(0, 0), make_slot(1, 0)]
    put_all(s, old)
    frozen.now_ns += 7 * MS
    new = [make_slot(0, 0), make_slot(1, 0)]
    timers = [put_later(s, 0.05, new[:1]), put_later(s, 0.15, new[1:])]
    batch = s.next_batch(2.0)
    for t in timers:
        t.join()
    assert sorted(lanes_of(batch)) == [0, 1] and set(map(id, batch)) == set(map(id, new)), lanes_of(batch)
    assert passed == old and s.fresh_fallbacks == 0
