"""The deadline monitor: admission by age, miss accounting, and the degradation ladder.

Every frame ends as exactly one of: published on time, published late (a miss), or
dropped with a reason. The monitor decides the one drop that needs judgement: before
inference, a frame whose age plus the current estimate of the remaining stages would
already exceed the budget is dropped as ``stale`` instead of being processed late.

The monitor drives the ladder itself: the frame path tells it of every frame that ends
(published or dropped), and once a second of those events it judges the miss rate of a
sliding window: too many misses step it down (fewer frames, a lighter model, alerts
only); a long enough healthy period steps it back up. After any change the ladder waits
a full window before judging again, so it never acts on frames from the previous step.
A step up that does not hold doubles the healthy period required for the next one (up
to 32 times), so a lasting overload is re-probed rarely rather than flapping. Changes
wait in ``take_change`` for the heartbeat, which reports each one once; the heartbeat
never judges, so a stalled heartbeat thread cannot stall the ladder, nor the reverse.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np

from edge_agent.core.deadline_config import DeadlineConfig, LadderStep
from edge_agent.core.stamps import CAPTURED, INFER_START, N_STAMPS, PUBLISH, STAGES

log = logging.getLogger(__name__)

#: Why a frame was dropped. ``overrun``: a newer frame replaced it while it waited (live
#: sources); ``stale``: too old to finish in time; ``source_gap``: the source skipped it;
#: ``ladder``: the degradation ladder throttles the frame rate; ``error``: a stage raised;
#: ``shutdown``: the agent stopped while it was in flight; ``not_fresh``: latency mode
#: (``deadline.mode: latency``) passed it over, having waited too long for a busy
#: inference, for its source's next frame, which then replaced it.
DROP_REASONS = ("overrun", "stale", "source_gap", "ladder", "error", "shutdown", "not_fresh")
#: The drops that count as misses (with late frames): the frame was due and the agent failed
#: it. The others were replaced by a newer frame, skipped on purpose, or cut by a stop.
MISS_DROPS = ("stale", "error")

_EWMA_ALPHA = 0.1
_WAIT_POST = STAGES.index("wait_post")  # in the estimates (durations between stamps)
_BUCKET_NS = 100_000_000  # the miss window is kept in 100 ms buckets
_MAX_UP_BACKOFF = 32
_TICK_NS = 1_000_000_000  # the ladder is judged once a second


@dataclass
class LadderChange:
    step: int
    name: str
    previous: str
    miss_rate: float
    reason: str


@dataclass(frozen=True)
class DeadlineFigures:
    """One source's deadline settings, miss rate and ladder, at one moment."""

    budget_ms: float
    stage_budgets_ms: Mapping[str, float]
    stage_overruns: Mapping[str, int]  # frames over a stage's budget, by stage
    admission: bool
    miss_window_s: float
    estimate_ms: Mapping[str, Mapping[str, float]]  # per model profile, per stage
    miss_rate: float  # over the window ending now
    miss_window_frames: int  # the frames that ended in that window
    step: int  # the ladder's step (0: normal)
    step_name: str
    steps: tuple[str, ...]
    changes: int
    step_up_after_s: float  # the healthy time the next step up needs now (backoff included)
    history: tuple[Mapping[str, Any], ...]  # the latest ladder changes


class MissWindow:
    """Frames ended and frames missed over the last ``window_s``, in O(1) memory."""

    def __init__(self, window_s: float) -> None:
        self.n = max(1, round(window_s * 1e9 / _BUCKET_NS))
        self.ended = np.zeros(self.n, np.int64)
        self.missed = np.zeros(self.n, np.int64)
        self._bucket = -1

    def _advance(self, now_ns: int) -> int:
        b = now_ns // _BUCKET_NS
        if self._bucket < 0:
            self._bucket = b
        gap = b - self._bucket
        if gap > 0:
            for k in range(1, min(gap, self.n) + 1):
                i = (self._bucket + k) % self.n
                self.ended[i] = 0
                self.missed[i] = 0
            self._bucket = b
        return int(b % self.n)

    def add(self, now_ns: int, missed: bool) -> None:
        i = self._advance(now_ns)
        self.ended[i] += 1
        if missed:
            self.missed[i] += 1

    def rate(self, now_ns: int) -> tuple[float, int]:
        """(miss rate, frames ended) over the window ending at ``now_ns``."""
        self._advance(now_ns)
        ended = int(self.ended.sum())
        return (int(self.missed.sum()) / ended if ended else 0.0), ended


class DeadlineMonitor:
    """Shared by the stage threads. ``admit`` runs on the inference thread, ``published`` on
    the publishing one; ``dropped`` on whichever thread drops a frame (capture, inference,
    post). Either of the last two may judge the ladder (``_frame_ended``): ``_tick_lock``
    lets one thread at a time do it, and the miss window has a lock of its own."""

    def __init__(self, config: DeadlineConfig) -> None:
        self.config = config
        # Ending frames do not judge the ladder: a file's frames are never skipped (and the
        # ladder's own tests judge by hand, with tick).
        self.fixed = False
        self.budget_ns = int(config.budget_ms * 1e6)
        self.stage_budget_ns = {k: int(v * 1e6) for k, v in config.stage_budgets_ms.items()}
        self.stage_overruns = {k: 0 for k in config.stage_budgets_ms}
        # Stage-time estimates per model profile: after a ladder switch, the frames of the
        # new model must be judged by its own times, not by those of the model it replaced.
        self._estimates: dict[str, np.ndarray] = {}
        self._last_admit_ns = 0
        self._window = MissWindow(config.miss_window_s)
        self._lock = threading.Lock()
        self.ladder: tuple[LadderStep, ...] = config.ladder
        # The rung in force and its settings, in one store: a reader (the capture thread, at
        # every frame) never pairs a new step's number with the old one's settings.
        self.rung: tuple[int, LadderStep] = (0, self.ladder[0])
        self._changed_ns: int | None = None  # None: no change yet, the window is all ours
        self._healthy_since_ns = 0
        self._up_ns: int | None = None  # when the last step up happened, until it has held
        self.up_backoff = 1  # multiplies step_up_after_s after step ups that did not hold
        self.changes = 0
        self.history: deque[dict] = deque(maxlen=32)  # the latest ladder changes
        self._changes: deque[LadderChange] = deque(maxlen=32)  # not yet reported
        self._tick_lock = threading.Lock()  # frames end on several threads; one judges
        self._next_tick_ns = 0
        self._last_tick_ns = 0

    # -- hot path ---------------------------------------------------------------

    def estimates(self, profile: str = "") -> np.ndarray:
        """Per-stage duration estimates (ns) of a profile's frames; zeros until one is seen."""
        est = self._estimates.get(profile)
        if est is None:
            est = self._estimates[profile] = np.zeros(N_STAMPS - 1, np.float64)
        return est

    def estimates_ms(self) -> dict[str, dict[str, float]]:
        return {
            p: {s: round(float(v) / 1e6, 3) for s, v in zip(STAGES, est)}
            for p, est in list(self._estimates.items())
        }

    def remaining_ns(self, profile: str = "") -> float:
        """Estimated time from the start of inference to the publish stamp."""
        return float(self.estimates(profile)[INFER_START:PUBLISH].sum())

    def admit(
        self,
        stamps: np.ndarray,
        now_ns: int,
        profile: str = "",
        infer_ns: float | None = None,
        post_ahead: int | None = None,
    ) -> bool:
        """Inference thread: False if the frame cannot be published within the budget.

        ``infer_ns``: the inference time expected for the batch the frame is about to run
        in (the scheduler's estimate for its size). The lower of it and this source's own
        recent inference time judges: the latter may come from larger batches, the former
        may predate a ladder move (and a frame wrongly dropped is lost for good, while a
        frame wrongly admitted is merely late).

        ``post_ahead``: the frames the post stage has queued or in hand now. The wait for it
        is then that many postprocessing times, not the recent frames' wait: a queue that
        built up once (a stall) would otherwise keep its wait in the estimate, every frame
        would be dropped, and nothing published would bring the estimate down again (a
        collapse the capacity bench showed: 20 cameras at 43 fps on a host with a core idle).

        One frame per miss window is admitted regardless: the estimates are only updated
        by published frames, so without a probe a model that got fast again (thermals,
        another process gone) would never be noticed.
        """
        if not self.config.admission:
            return True
        est = self.estimates(profile)
        remaining = float(est[INFER_START:PUBLISH].sum())  # as ``remaining_ns``
        if infer_ns is not None:
            remaining -= max(0.0, float(est[INFER_START]) - infer_ns)
        if post_ahead is not None:
            wait_post, post = float(est[_WAIT_POST]), float(est[_WAIT_POST + 1])
            remaining += post_ahead * post - wait_post
        fits = (now_ns - int(stamps[CAPTURED])) + remaining <= self.budget_ns
        if fits or now_ns - self._last_admit_ns >= self.config.miss_window_s * 1e9:
            self._last_admit_ns = now_ns
            return True
        return False

    def late(self, end_to_end_ns: int) -> bool:
        """The one definition of a missed deadline: capture to publish over the budget."""
        return end_to_end_ns > self.budget_ns

    def published(self, stamps: np.ndarray, now_ns: int, profile: str = "") -> bool:
        """After publishing (the post stage): update estimates; True if the frame was late."""
        durations = np.diff(stamps)
        # The first frame seeds the estimates, later ones move them by a fraction.
        est = self.estimates(profile)
        if not est.any():
            est[:] = durations
        else:
            est += _EWMA_ALPHA * (durations - est)
        for name, budget in self.stage_budget_ns.items():
            if durations[STAGES.index(name)] > budget:
                self.stage_overruns[name] += 1
        late = self.late(int(stamps[PUBLISH] - stamps[CAPTURED]))
        with self._lock:
            self._window.add(now_ns, late)
        self._frame_ended(now_ns)
        return late

    def dropped(self, reason: str, now_ns: int) -> None:
        """A frame that will never be published. Stale drops count as misses (a frame
        passed over as not fresh does not: like an overrun, a newer frame took its place)."""
        if reason in MISS_DROPS:
            with self._lock:
                self._window.add(now_ns, True)
        self._frame_ended(now_ns)

    def _frame_ended(self, now_ns: int) -> None:
        """Judge the ladder if a second has passed since it was last judged. Whichever
        stage thread ends a frame then does it; one at a time, the others do not wait."""
        if self.fixed or now_ns < self._next_tick_ns or not self._tick_lock.acquire(blocking=False):
            return
        try:
            if self._next_tick_ns == 0:  # the first frame: judge a second of them, not one
                self._next_tick_ns = now_ns + _TICK_NS
            elif now_ns >= self._next_tick_ns:
                self._next_tick_ns = now_ns + _TICK_NS
                change = self.tick(now_ns)
                if change is not None:
                    self._changes.append(change)
        finally:
            self._tick_lock.release()

    def take_change(self) -> LadderChange | None:
        """The oldest ladder change not yet reported (the heartbeat reports each once)."""
        try:
            return self._changes.popleft()
        except IndexError:
            return None

    # -- readers (the heartbeat, metrics) ----------------------------------------

    @property
    def step(self) -> int:
        """The ladder's current step's number (0: the top)."""
        return self.rung[0]

    @property
    def current(self) -> LadderStep:
        """The ladder's current step's settings (what to run, which model, the stride)."""
        return self.rung[1]

    def figures(self, now_ns: int) -> DeadlineFigures:
        """The settings, the miss rate of the window ending at ``now_ns`` and the ladder."""
        c = self.config
        rate, ended = self.miss_rate(now_ns)
        return DeadlineFigures(
            budget_ms=c.budget_ms,
            stage_budgets_ms=MappingProxyType(dict(c.stage_budgets_ms)),
            stage_overruns=MappingProxyType(dict(self.stage_overruns)),
            admission=c.admission,
            miss_window_s=c.miss_window_s,
            estimate_ms=MappingProxyType(self.estimates_ms()),
            miss_rate=rate,
            miss_window_frames=ended,
            step=self.step,
            step_name=self.current.name,
            steps=tuple(s.name for s in self.ladder),
            changes=self.changes,
            step_up_after_s=c.step_up_after_s * self.up_backoff,
            history=tuple(self.history),
        )

    # -- once a second, from _frame_ended -----------------------------------------

    def miss_rate(self, now_ns: int) -> tuple[float, int]:
        with self._lock:
            return self._window.rate(now_ns)

    def tick(self, now_ns: int) -> LadderChange | None:
        """Step the ladder if the window says so; returns the change."""
        c = self.config
        rate, ended = self.miss_rate(now_ns)
        # No frame ended for a whole window (a stalled source or stage): not healthy time,
        # as when a judgement finds the window empty.
        quiet = self._last_tick_ns and now_ns - self._last_tick_ns >= c.miss_window_s * 1e9 + _TICK_NS
        self._last_tick_ns = now_ns
        settled = self._changed_ns is None or now_ns - self._changed_ns >= c.miss_window_s * 1e9
        unhealthy = rate > c.step_down_miss_rate and ended > 0
        # No frame ends at an alert-only step; there, quiet counts as healthy, so the
        # ladder does climb back and find out whether inference fits again.
        idle_by_design = not self.current.infer
        if rate > c.step_up_miss_rate or ((ended == 0 or quiet) and not idle_by_design):
            self._healthy_since_ns = 0
        elif self._healthy_since_ns == 0:
            self._healthy_since_ns = now_ns
        if unhealthy and settled and self.step < len(self.ladder) - 1:
            if self._up_ns is not None:
                # The step up did not hold: wait twice as long before the next try, so a
                # persistent overload is probed ever more rarely instead of flapping.
                self.up_backoff = min(self.up_backoff * 2, _MAX_UP_BACKOFF)
            self._up_ns = None
            why = f"miss rate {rate:.0%} > {c.step_down_miss_rate:.0%}"
            return self._move(self.step + 1, now_ns, rate, why)
        if self._up_ns is not None and now_ns - self._up_ns >= (c.miss_window_s + c.step_up_after_s) * 1e9:
            self._up_ns = None  # the step up held
            self.up_backoff = 1
        healthy_for = (now_ns - self._healthy_since_ns) / 1e9 if self._healthy_since_ns else 0.0
        needed = c.step_up_after_s * self.up_backoff
        if self.step > 0 and settled and healthy_for >= needed:
            self._up_ns = now_ns
            return self._move(self.step - 1, now_ns, rate, f"healthy for {healthy_for:.1f} s")
        return None

    def _move(self, step: int, now_ns: int, rate: float, reason: str) -> LadderChange:
        previous = self.current.name
        self.rung = (step, self.ladder[step])
        self._changed_ns = now_ns
        self._healthy_since_ns = 0
        self.changes += 1
        with self._lock:
            # Frames of the old step must not judge the new one: neither its misses nor
            # its stage times (estimates of a profile unused for a while are stale, and
            # would drop every frame of a model that has recovered in the meantime).
            self._window = MissWindow(self.config.miss_window_s)
            self._estimates.clear()
        change = LadderChange(step, self.current.name, previous, rate, reason)
        self.history.append(
            {"at_unix_s": round(time.time(), 3), "from": previous, "to": change.name, "reason": reason}
        )
        log.warning("deadline ladder: %s -> %s (%s)", previous, change.name, reason)
        return change
