"""The deadline monitor's decisions, driven with explicit timestamps (no clocks, no sleeps)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from edge_agent.core.configfields import FieldError
from edge_agent.core.deadline_config import DeadlineConfig, LadderStep
from edge_agent.core.stamps import CAPTURED, INFER_START, N_STAMPS, PUBLISH
from edge_agent.pipelines.deadline import DROP_REASONS, DeadlineMonitor, MissWindow

MS = 1_000_000
S = 1_000_000_000
LADDER = (LadderStep("full"), LadderStep("half", frame_stride=2), LadderStep("alert", infer=False))


def stamps(captured_ns: int, stage_ms: float) -> np.ndarray:
    """Stamps of a frame whose seven stages each took ``stage_ms``."""
    return captured_ns + np.arange(N_STAMPS, dtype=np.int64) * int(stage_ms * MS)


def monitor(by_hand: bool = True, **kw) -> DeadlineMonitor:
    """``by_hand``: the test judges the ladder with ``tick`` at the times it chooses; else
    the frames it feeds do, once a second, as in the pipeline."""
    base = dict(
        budget_ms=50.0,
        miss_window_s=1.0,
        step_down_miss_rate=0.2,
        step_up_miss_rate=0.02,
        step_up_after_s=3.0,
        ladder=LADDER,
    )
    base.update(kw)
    m = DeadlineMonitor(DeadlineConfig(**base))
    m.fixed = by_hand
    return m


def feed(m: DeadlineMonitor, start_ns: int, seconds: float, fps: int, late: bool) -> int:
    """Publish frames at ``fps`` for ``seconds``; 7 x 10 ms = 70 ms (late) or 7 x 1 ms."""
    t = start_ns
    for _ in range(int(seconds * fps)):
        st = stamps(t, 10.0 if late else 1.0)
        m.published(st, int(st[PUBLISH]))
        t += S // fps
    return t


def test_miss_window_counts_only_recent_frames():
    w = MissWindow(1.0)
    for i in range(10):
        w.add(i * 10 * MS, missed=i % 2 == 0)
    assert w.rate(100 * MS) == (0.5, 10)
    # 1.5 s later every bucket has expired.
    assert w.rate(1600 * MS) == (0.0, 0)


@pytest.mark.parametrize(
    "age_ms, estimate_ms, admitted",
    [(0, 10, True), (30, 10, True), (41, 10, False), (49, 0, True), (60, 0, False)],
)
def test_admission_by_age_plus_estimated_remaining_time(age_ms, estimate_ms, admitted):
    m = monitor()
    m.estimates()[INFER_START:PUBLISH] = estimate_ms * MS / (PUBLISH - INFER_START)
    fresh = np.zeros(N_STAMPS, np.int64)
    fresh[CAPTURED] = 1 * S
    assert m.admit(fresh, 1 * S), "a fresh frame is admitted"
    st = np.zeros(N_STAMPS, np.int64)
    st[CAPTURED] = 1 * S
    assert m.admit(st, 1 * S + age_ms * MS) is admitted


def test_one_frame_per_window_is_admitted_to_refresh_the_estimates():
    m = monitor(miss_window_s=1.0)
    m.estimates()[INFER_START:PUBLISH] = 100 * MS  # far over budget
    admitted = []
    for i in range(30):  # 3 s of frames at 10 fps, each captured right now
        now = 5 * S + i * 100 * MS
        st = np.zeros(N_STAMPS, np.int64)
        st[CAPTURED] = now
        admitted.append(m.admit(st, now))
    assert sum(admitted) == 3, admitted


def test_admission_takes_the_lower_of_the_batch_and_the_source_inference_estimates():
    def judged(own_infer_ms: float, batch_infer_ms: float | None) -> bool:
        m = monitor(budget_ms=50.0)
        m.estimates()[INFER_START] = own_infer_ms * MS
        m.estimates()[INFER_START + 1 : PUBLISH] = 1 * MS
        fresh = np.zeros(N_STAMPS, np.int64)
        fresh[CAPTURED] = 1 * S
        assert m.admit(fresh, 1 * S)  # this window's probe goes to a fresh frame
        st = np.zeros(N_STAMPS, np.int64)
        st[CAPTURED] = 1 * S
        infer_ns = None if batch_infer_ms is None else batch_infer_ms * MS
        return m.admit(st, 1 * S + 20 * MS, infer_ns=infer_ns)  # 20 ms old

    assert not judged(40, None), "its frames last ran in a large batch: 40 ms more does not fit"
    assert judged(40, 10), "its batch now is small: it fits"
    assert judged(10, 40), "an old batch figure does not overrule a fresh one"
    assert not judged(40, 40)


def test_admission_can_be_turned_off():
    m = monitor(admission=False)
    st = np.zeros(N_STAMPS, np.int64)
    assert m.admit(st, 10 * S)


def test_published_frames_are_late_exactly_when_over_budget():
    m = monitor(budget_ms=50.0)
    on_time = stamps(0, 50 / 7)  # 49.99 ms after rounding down
    late = stamps(0, 51 / 7)
    assert m.published(on_time, int(on_time[PUBLISH])) is False
    assert m.published(late, int(late[PUBLISH])) is True


def test_estimates_follow_the_stage_durations():
    m = monitor()
    st = stamps(0, 2.0)
    m.published(st, int(st[PUBLISH]))
    np.testing.assert_allclose(m.estimates(), 2.0 * MS)
    for _ in range(100):
        st = stamps(0, 4.0)
        m.published(st, int(st[PUBLISH]))
    np.testing.assert_allclose(m.estimates(), 4.0 * MS, rtol=1e-3)


def test_stage_budget_overruns_are_counted_per_stage():
    m = monitor(stage_budgets_ms={"infer": 5.0, "preprocess": 20.0})
    st = stamps(0, 10.0)
    m.published(st, int(st[PUBLISH]))
    assert m.stage_overruns == {"infer": 1, "preprocess": 0}


def test_ladder_steps_down_under_sustained_misses_and_back_up_after_recovery():
    m = monitor()
    t = feed(m, 10 * S, 1.0, 30, late=True)
    change = m.tick(t)
    assert change is not None and (change.previous, change.name) == ("full", "half")
    # Still missing right after the change: the new step gets a full window first.
    t = feed(m, t, 0.5, 30, late=True)
    assert m.tick(t) is None
    # Recovered: on time for longer than step_up_after_s → back to full, once.
    changes = []
    for _ in range(8):
        t = feed(m, t, 1.0, 30, late=False)
        c = m.tick(t)
        if c:
            changes.append((c.previous, c.name))
    assert changes == [("half", "full")]
    assert m.step == 0 and m.changes == 2
    assert [h["to"] for h in m.history] == ["half", "full"]


def test_the_frames_that_end_step_the_ladder_once_a_second_and_each_change_is_reported_once():
    """No thread ticks it: published and dropped frames drive the ladder, as in the pipeline."""
    m = monitor(by_hand=False)
    t = feed(m, 10 * S, 0.9, 30, late=True)
    assert m.step == 0, "the first judgement waits a second after the first frame"
    t = feed(m, t, 0.2, 30, late=True)
    assert m.current.name == "half"
    change = m.take_change()
    assert change is not None and (change.previous, change.name) == ("full", "half")
    assert m.take_change() is None
    # At alert only, nothing is published: the frames the ladder drops drive it too.
    t = feed(m, t, 2.0, 30, late=True)
    assert m.current.name == "alert" and m.take_change().name == "alert"
    for _ in range(5 * 30):
        m.dropped("ladder", t)
        t += S // 30
    assert m.current.name == "half" and m.take_change().name == "half"
    # A file's lane: its frames never step the ladder.
    fixed = monitor(by_hand=True)
    feed(fixed, 10 * S, 5.0, 30, late=True)
    assert fixed.step == 0 and fixed.take_change() is None


def test_a_stall_is_not_healthy_time():
    """Frames that stop for longer than a window do not count as healthy when they resume."""
    m = monitor(by_hand=False, step_up_after_s=2.0)
    t = feed(m, 10 * S, 1.1, 30, late=True)
    assert m.current.name == "half"
    t = feed(m, t, 1.5, 30, late=False)  # healthy since the judgement after the window
    t += 10 * S  # nothing ends for 10 s
    feed(m, t, 1.1, 30, late=False)
    assert m.current.name == "half", "the stall reset the healthy period"


def test_ladder_does_not_flap_between_thresholds():
    """A miss rate between step_up and step_down moves the ladder neither way."""
    m = monitor()
    t = feed(m, 10 * S, 1.0, 30, late=True)
    assert m.tick(t).name == "half"
    for _ in range(10):
        # 1 frame in 10 late: 10 %, above step_up (2 %) and below step_down (20 %).
        for i in range(10):
            t = feed(m, t, 0.1, 10, late=(i == 0))
        assert m.tick(t) is None
    assert m.step == 1


def test_ladder_stops_at_its_last_step_and_climbs_back_from_alert_only():
    m = monitor()
    t = 10 * S
    for _ in range(3):
        t = feed(m, t, 1.0, 30, late=True)
        m.tick(t)
    assert m.current.name == "alert" and m.changes == 2
    # Alert only: nothing is inferred, so no frame is published; frames are dropped by
    # the ladder. The quiet must not keep the ladder down for good.
    for _ in range(5):
        for i in range(30):
            m.dropped("ladder", t + i * (S // 30))
        t += S
        if m.tick(t):
            break
    assert m.current.name == "half", "after step_up_after_s the ladder must try inference again"


def test_stale_drops_count_as_misses():
    m = monitor()
    for i in range(20):
        m.dropped("stale", 10 * S + i * MS)
    assert m.miss_rate(10 * S + 30 * MS) == (1.0, 20)
    m.dropped("overrun", 10 * S + 31 * MS)  # a newer frame replaced it: not a miss
    # Latency mode passed it over for the next, fresher one: not a miss either.
    m.dropped("not_fresh", 10 * S + 31 * MS)
    assert m.miss_rate(10 * S + 32 * MS) == (1.0, 20)


def test_latency_mode_is_a_deadline_setting_and_not_fresh_a_drop_reason():
    assert DeadlineConfig().mode == "throughput" and DeadlineConfig(mode="latency").mode == "latency"
    assert "not_fresh" in DROP_REASONS and len(set(DROP_REASONS)) == len(DROP_REASONS)


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"stage_budgets_ms": {"inference": 3.0}}, "stage_budgets_ms"),
        ({"step_up_miss_rate": 0.5}, "step_up_miss_rate"),
        ({"ladder": (LadderStep("slow", frame_stride=2),)}, "ladder"),
        ({"ladder": (LadderStep("full"), LadderStep("full", frame_stride=2))}, "ladder"),
    ],
)
def test_bad_deadline_configs_name_the_key(kw, key):
    with pytest.raises(FieldError) as e:
        DeadlineConfig(**kw)
    assert e.value.key == key


def test_a_step_up_that_does_not_hold_doubles_the_wait_for_the_next():
    m = monitor(ladder=LADDER[:2])
    t = feed(m, 10 * S, 1.0, 30, late=True)
    assert m.tick(t).name == "half"
    ups = []
    for _ in range(60):  # a lasting overload: every try at "full" misses again
        t = feed(m, t, 1.0, 30, late=(m.current.name == "full"))
        c = m.tick(t)
        if c and c.name == "full":
            ups.append(t)
    gaps = [(b - a) / S for a, b in itertools.pairwise(ups)]
    assert len(ups) >= 3 and all(b > a for a, b in itertools.pairwise(gaps)), gaps
    assert m.up_backoff > 1
    # Once "full" holds, the backoff is forgotten.
    while m.current.name != "full":
        t = feed(m, t, 1.0, 30, late=False)
        m.tick(t)
    for _ in range(6):
        t = feed(m, t, 1.0, 30, late=False)
        assert m.tick(t) is None
    assert m.up_backoff == 1
