"""The batch scheduler between the sources' capture threads and the inference thread.

Each source (a pipeline lane) has one cell: the frame preprocessed and waiting for
inference. A live source's newer frame replaces the waiting one (``overrun``); a file
source waits for the cell to empty. The inference thread asks for the next batch:

- **Order**: frames by priority (higher first), then by deadline (earliest first), where
  a source whose waiting frames kept being replaced by newer ones keeps the deadline of
  the first of them: so among equals, overloaded sources take turns instead of the one
  whose camera happens to run a little ahead winning every time.
- **Composition**: the first frame always goes in; more frames of the same model join
  while the batch's estimated inference time keeps every frame already in it within its
  deadline, and leaves a higher-priority source that has no frame in it (it may deliver
  one any moment) enough of its own budget to wait for this batch and then run alone.
  So the urgent source never waits behind more of the others than it can afford.
- **Waiting**: with fewer frames than the batch could take, the scheduler waits for more
  only while the most urgent frame in hand keeps its slack (and at most ``max_wait``,
  and never until a frame in hand is replaced by its source's next one), and only when
  a source with no frame waiting is expected to deliver one within that time. Cameras
  out of step under light load run one frame at a time; under load frames pile up
  during each inference and batches grow, up to one frame per source (or the model's
  batch); cameras in step meet in full batches at any load.
- **Freshness** (``deadline.mode: latency``, live sources only): under overload a frame
  that waited in its cell while inference was busy is *passed over* when it waited there
  (or its age exceeds a frame's usual age at hand-over, the estimated capture and
  preprocess time) by more than half its source's frame interval *and* more than
  ``FRESH_SHARE`` of its expected processing time (capture, preprocess, inference, post
  stages, as estimated): the inference then waits for the source's next frame instead of
  starting on a stale one. Within the share, the frame keeps to the latency goal anyway;
  within half an interval, waiting would gain nothing (the next frame would be ready no
  sooner than this one is late). So a published frame is at most that much older than
  one handed over at once, at the price of inference idling for part of an interval:
  end to end stays within the processing time plus the larger of a quarter of it and
  half an interval, under 1.5 x the processing time at any overload. The passed-over
  frame stays in its cell until the next one replaces it (then it is accounted
  ``not_fresh``); if that one is overdue by half an interval (a stall), or the source
  ended, the stale frame runs after all (counted in ``fresh_fallbacks``). A frame that
  arrived while the inference was idle is always fresh, and one that waited less than
  half an interval too: at normal load every frame is inferred, as in throughput mode.

Inference time per batch size comes from an estimate per model profile, seeded at
warm-up and moved by every batch that runs; unmeasured sizes are extrapolated linearly
from a measured one (conservative: batching rarely costs more than linear). Each frame of
a batch carries the estimate for it (``FrameSlot.expected_ns``) to its admission.

The scheduler knows each source through its lane (``SchedulerLane``: priority, budget,
buffer policy, the estimated time around inference, the profile of its next frame), and
accounts a waiting frame that a newer one replaced as a drop of that lane.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

from edge_agent.core.deadline_config import BatchingConfig
from edge_agent.core.stamps import CAPTURED
from edge_agent.pipelines.figures import BatchingFigures, read_only
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.slots import Closed, FrameSlot

_EWMA_ALPHA = 0.2
_INF = 1 << 62
#: Latency mode: the share of a frame's expected processing time (capture, preprocess,
#: inference, postprocess, publish) it may have waited for a busy inference and still be
#: fresh (or half its source's frame interval, if more). At an overload of two frame
#: intervals or more, end to end stays within 1.25 x that time plus the estimates' error,
#: under the goal of 1.5 x; nearer to one interval, half an interval decides.
FRESH_SHARE = 0.25


class SchedulerLane(Protocol):
    """What the scheduler reads of one source's lane (``lane.Lane``)."""

    priority: int
    budget_ns: int
    newest_wins: bool  # live source: a newer frame replaces the waiting one
    # Latency mode (live sources only): inference takes its frame only while it is fresh,
    # else waits for the source's next one (see "Freshness" above).
    fresh_only: bool

    def around_ns(self) -> tuple[float, float]:
        """(before, after) inference: estimated ns of this source's stages up to the
        inference stage (capture, preprocess) and after it (to the publish stamp)."""
        ...

    def current(self) -> Any:
        """The model profile its next frame will use (None: none, an alert-only ladder step)."""
        ...

    def drop(self, slot: FrameSlot | None, reason: str) -> None:
        """Account a frame of it that will never be published (a replaced one: ``overrun``,
        or ``not_fresh`` when it had been passed over as not fresh)."""
        ...


class _Cell:
    __slots__ = (
        "closed",
        "fallback",
        "gap_ns",
        "interval_ns",
        "last_put_ns",
        "passed",
        "put_ns",
        "since_ns",
        "slot",
    )

    def __init__(self) -> None:
        self.slot: FrameSlot | None = None
        self.since_ns = 0  # capture time of the first frame waiting since the last one taken
        self.closed = False
        self.put_ns = 0  # when the waiting frame was put
        self.last_put_ns = 0
        self.interval_ns = 0.0  # mean time between puts (0: not known yet)
        self.gap_ns = 0  # the last time between puts
        self.passed = False  # the waiting frame was passed over as not fresh (latency mode)
        self.fallback = False  # ... and is to run after all: its source's next one is overdue


class BatchScheduler:
    def __init__(
        self,
        lanes: Sequence[SchedulerLane],
        batching: BatchingConfig,
        batch_limit: Callable[[Any], int] = Profile.batch_limit,
    ) -> None:
        """``batching``: the largest batch (``max_batch``, 0: one frame per source), the
        longest wait for more frames and the margin kept free of each budget;
        ``batch_limit``: the largest batch a profile's model runs."""
        self.lanes = lanes
        self._cells = [_Cell() for _ in lanes]
        self.max_batch = min(batching.max_batch or len(lanes), len(lanes))
        self.max_wait_ns = int(batching.max_wait_ms * 1e6)
        self.margin_ns = int(batching.margin_ms * 1e6)
        self._limit = batch_limit
        self._cond = threading.Condition()
        # Frames in the cells. Read without the lock, it is a glance that may change at
        # once: the inference thread reads it to decide where a frame is postprocessed.
        self.waiting = 0
        self._idle = False  # the inference thread sleeps: no frame waits (or only stale ones)
        # Latency mode, by lane: a file (every frame processed) is never passed over.
        self._judge_fresh = [lane.fresh_only and lane.newest_wins for lane in lanes]
        self._fresh_only = any(self._judge_fresh)
        self._drained = False
        # Estimated inference ns per profile, indexed by batch size (0: not measured), from
        # the batches that ran, and from warm-up.
        self._est: dict[int, np.ndarray] = {}
        self._seeds: dict[int, np.ndarray] = {}
        self.sizes = np.zeros(self.max_batch + 1, np.int64)  # batches run, by size
        self.frames = 0  # frames in those batches
        # Latency mode: frames run although not fresh, their source's next one overdue
        # (or never to come: the source ended).
        self.fresh_fallbacks = 0

    # -- capture threads ----------------------------------------------------------

    def put(self, lane: int, slot: FrameSlot, stop: threading.Event) -> bool:
        """Hand a preprocessed frame over; False (not taken) if ``stop`` was set meanwhile."""
        cell, spec, replaced, passed = self._cells[lane], self.lanes[lane], None, False
        with self._cond:
            if self._drained:
                return False
            if cell.slot is not None and spec.newest_wins:
                replaced, passed = cell.slot, cell.passed
            else:
                while cell.slot is not None:
                    if stop.is_set():
                        return False
                    self._cond.wait(0.05)
                if self._drained:
                    return False
            now = time.monotonic_ns()
            if replaced is None:
                cell.since_ns = int(slot.stamps[CAPTURED])
                self.waiting += 1
            cell.slot, cell.put_ns, cell.passed = slot, now, False
            # The wake-up first: the inference thread takes a while to get going (it
            # needs this lock, and this thread's GIL, only once this returns anyway).
            self._cond.notify_all()
            if cell.last_put_ns:
                gap = cell.gap_ns = now - cell.last_put_ns
                cell.interval_ns += (gap - cell.interval_ns) * (_EWMA_ALPHA if cell.interval_ns else 1.0)
            cell.last_put_ns = now
        if replaced is not None:
            spec.drop(replaced, "not_fresh" if passed else "overrun")
        return True

    def expect(self) -> None:
        """A capture thread has a frame and starts preprocessing it: wake the inference
        thread now if it sleeps with nothing to do, so that it is awake when the frame
        comes. From a long sleep a thread takes tens of microseconds to wake (more on a
        virtual machine: its CPU was halted); that much of the hand-off then overlaps the
        preprocessing, and the put finds a thread that has just gone back to sleep."""
        if self._idle:  # a glance without the lock: a wake-up missed or spared is harmless
            with self._cond:
                self._cond.notify_all()

    def wait_room(self, lane: int, timeout_s: float) -> bool:
        """Wait until the lane's cell is empty; False on timeout."""
        cell = self._cells[lane]
        with self._cond:
            return self._cond.wait_for(lambda: cell.slot is None, timeout_s)

    def close(self, lane: int) -> None:
        """The lane's source ended: nothing more comes from it (its waiting frame still runs)."""
        with self._cond:
            self._cells[lane].closed = True
            self._cond.notify_all()

    # -- the inference thread -----------------------------------------------------

    def next_batch(self, timeout_s: float) -> list[FrameSlot] | None:
        """The next batch (frames of one profile), or None after ``timeout_s``.

        Raises Closed once every lane is closed and nothing waits.
        """
        entered = time.monotonic_ns()  # frames put from now on did not wait for inference
        end = entered + int(timeout_s * 1e9)
        cells = self._cells
        with self._cond:
            while True:
                now = time.monotonic_ns()
                ready = [i for i, c in enumerate(cells) if c.slot is not None]
                if not ready:
                    if all(c.closed for c in cells):
                        raise Closed("scheduler")
                    if now >= end:
                        return None
                    self._idle = True
                    self._cond.wait((end - now) / 1e9)
                    self._idle = False
                    continue
                passed: list[int] = []
                if self._fresh_only:
                    ready, passed, until = self._fresh(ready, now, entered)
                    if not ready:  # wait for a source's next frame (a put wakes us sooner)
                        if now >= end:
                            return None
                        self._idle = True
                        self._cond.wait((min(until, end) - now) / 1e9)
                        self._idle = False
                        continue
                if len(ready) > 1:
                    ready.sort(
                        key=lambda i: (-self.lanes[i].priority, cells[i].since_ns + self.lanes[i].budget_ns)
                    )
                if self.max_batch == 1:  # one frame at a time (one source): nothing to plan
                    batch = ready[:1]
                    break
                batch, wait_ns = self._plan(ready, now, passed)
                if wait_ns <= 0:
                    break
                self._cond.wait(wait_ns / 1e9)
            slots = []
            for i in batch:
                c = cells[i]
                slots.append(c.slot)
                if c.fallback:
                    self.fresh_fallbacks += 1
                c.slot, c.passed, c.fallback = None, False, False
            self.waiting -= len(batch)
            self._cond.notify_all()
        # What this batch is expected to take, for its frames' admission: an estimate only
        # once a batch of this model has run (until then each source's own times judge).
        # Only this thread moves the estimates, so the figure is the one it will run with.
        expected = self.estimate_ns(slots[0].profile, len(slots), measured_only=True)  # type: ignore[union-attr]
        for slot in slots:
            slot.expected_ns = expected  # type: ignore[union-attr]
        return slots  # type: ignore[return-value]

    def _fresh(self, ready: list[int], now: int, entered: int) -> tuple[list[int], list[int], int]:
        """Latency mode: split ``ready`` into the frames to serve and those passed over as
        not fresh; with the time (ns) at which the first of the latter is taken after all."""
        cells, lanes = self._cells, self.lanes
        fresh, passed, until = [], [], _INF
        for i in ready:
            c, lane = cells[i], lanes[i]
            # Only a frame that waited for a busy inference can be stale: one that came
            # while the inference waited is as fresh as the source can make it.
            if not self._judge_fresh[i] or not c.gap_ns or c.put_ns >= entered:
                c.passed = c.fallback = False
                fresh.append(i)
                continue
            # How much older it is than a frame handed over at once: its wait here, or
            # more if its capture and preprocessing took longer than usual. (Not less if
            # they took less: the usual time is an estimate, inflated by a loaded
            # machine's outliers; the wait here is exact.)
            before, after = lane.around_ns()
            captured = int(c.slot.stamps[CAPTURED])  # type: ignore[union-attr]
            excess = now - min(c.put_ns, captured + int(before))
            # Stale only beyond a share of its expected processing time (within it, the
            # latency goal holds anyway) and beyond half an interval: its source's next
            # frame is captured one interval after it and ready as long after that as
            # usual, so only then is that one ready sooner than this one is late. The
            # interval: the mean, unless the last was shorter (the mean takes a while to
            # forget a stall, or a slow start, and would judge too leniently).
            interval = min(c.interval_ns, c.gap_ns)
            work = before + self.estimate_ns(c.slot.profile, 1) + after  # type: ignore[union-attr]
            tolerance = max(interval / 2, FRESH_SHARE * work)
            # Once that next frame is overdue by half an interval (a stall), or will never
            # come (the source ended), this one runs after all.
            give_up = captured + int(before + interval * 1.5)
            if excess <= tolerance or now >= give_up or c.closed:
                c.passed, c.fallback = False, excess > tolerance
                fresh.append(i)
            else:
                c.passed, c.fallback = True, False
                passed.append(i)
                until = min(until, give_up)
        return fresh, passed, until

    def drain(self) -> list[FrameSlot]:
        """Take every waiting frame (the inference thread is stopping on an error); later
        puts are refused, so no frame lands where nobody reads."""
        with self._cond:
            self._drained = True
            slots = [c.slot for c in self._cells if c.slot is not None]
            for c in self._cells:
                c.slot = None
            self.waiting = 0
            self._cond.notify_all()
        return slots  # type: ignore[return-value]

    def adopt(self, old: BatchScheduler) -> None:
        """Keep counting batches where ``old`` (the pipeline before a reload) stopped."""
        n = min(len(self.sizes), len(old.sizes))
        self.sizes[:n] += old.sizes[:n]
        self.sizes[-1] += old.sizes[n:].sum()
        self.frames += old.frames

    def record(self, profile: Any, size: int, infer_ns: int) -> None:
        """The inference thread ran a batch of ``size`` in ``infer_ns``."""
        est = self._estimates(profile)
        est[size] = infer_ns if not est[size] else est[size] + _EWMA_ALPHA * (infer_ns - est[size])
        self.sizes[min(size, self.max_batch)] += 1
        self.frames += size

    def seed(self, profile: Any, size: int, infer_ns: int) -> None:
        """A warm-up measurement, before any frame ran: it shapes batches until batches of
        that size have run (it does not judge admission: one slow warm-up must not drop
        frames until enough probes have corrected it)."""
        seeds = self._estimates(profile, self._seeds)
        if size < len(seeds):
            seeds[size] = infer_ns

    def estimate_ns(self, profile: Any, size: int, measured_only: bool = False) -> float:
        """Estimated ns of a batch of ``size``: measured, else extrapolated from the nearest
        measured size, else (unless ``measured_only``) from warm-up; 0.0 when unknown."""
        tables = [self._estimates(profile)]
        if not measured_only:
            tables.append(self._estimates(profile, self._seeds))
        for est in tables:
            if est[size]:
                return float(est[size])
            known = np.flatnonzero(est)
            if len(known):
                k = int(known[np.abs(known - size).argmin()])
                return float(est[k]) * size / k
        return 0.0

    def figures(self) -> BatchingFigures:
        """The batches run so far, by size."""
        sizes = self.sizes.copy()
        batches = int(sizes.sum())
        return BatchingFigures(
            max_batch=self.max_batch,
            batches=batches,
            mean_size=round(self.frames / batches, 3) if batches else 0.0,
            sizes=read_only({str(b): int(n) for b, n in enumerate(sizes) if n}),
            fresh_fallbacks=self.fresh_fallbacks,
        )

    # -- planning -----------------------------------------------------------------

    def _estimates(self, profile: Any, table: dict[int, np.ndarray] | None = None) -> np.ndarray:
        table = self._est if table is None else table
        est = table.get(id(profile))
        if est is None:
            est = table[id(profile)] = np.zeros(self.max_batch + 1, np.float64)
        return est

    def _deadline(self, lane: int) -> int:
        slot = self._cells[lane].slot
        assert slot is not None
        return int(slot.stamps[CAPTURED]) + self.lanes[lane].budget_ns

    def _plan(self, ready: list[int], now: int, passed: Sequence[int] = ()) -> tuple[list[int], int]:
        """The batch to run now from ``ready`` (in serving order), and how long to wait
        for more frames first (<= 0: run it now). ``passed``: sources whose waiting frame
        was passed over (latency mode): their next frame is waited for like an idle
        source's."""
        lanes, cells, margin = self.lanes, self._cells, self.margin_ns
        first = ready[0]
        profile = cells[first].slot.profile  # type: ignore[union-attr]
        cap = min(self.max_batch, self._limit(profile))
        around = [lane.around_ns() for lane in lanes]  # once per plan: each is a small sum
        # The latest the batch may end: the earliest deadline among its frames that can
        # still be met (a frame already past saving must not shrink every batch).
        finish_by = _INF
        batch = [first]

        def tighten(i: int) -> None:
            nonlocal finish_by
            end = self._deadline(i) - margin - around[i][1]
            if end >= now + self.estimate_ns(profile, 1):
                finish_by = min(finish_by, end)

        tighten(first)
        for i in ready[1:]:
            if len(batch) >= cap:
                break
            if cells[i].slot.profile is not profile:  # type: ignore[union-attr]
                continue
            t = self.estimate_ns(profile, len(batch) + 1)
            if now + t > finish_by or t > self._guard_ns(lanes[i].priority, batch, profile, around):
                continue
            batch.append(i)
            tighten(i)
        if len(batch) >= cap or finish_by == _INF:  # full, or no frame in hand can be saved
            return batch, 0
        return batch, self._wait_ns(batch, now, passed, profile, finish_by, around)

    def _wait_ns(
        self,
        batch: list[int],
        now: int,
        passed: Sequence[int],
        profile: Any,
        finish_by: int,
        around: list[tuple[float, float]],
    ) -> int:
        """How long to wait for one more frame to join ``batch`` (<= 0: run it now)."""
        lanes, cells = self.lanes, self._cells
        # Wait for another frame only while the batch, one frame larger, still ends in time,
        # and only for sources whose frame could join it (same model, past the guard).
        bigger = self.estimate_ns(profile, len(batch) + 1)
        idle = [
            i
            for i, c in enumerate(cells)
            if (c.slot is None or i in passed)
            and not c.closed
            and c.interval_ns
            and lanes[i].current() is profile
            and bigger <= self._guard_ns(lanes[i].priority, batch, profile, around)
        ]
        if not idle:
            return 0
        oldest = min(cells[i].put_ns for i in batch)
        wait_end = min(oldest + self.max_wait_ns, finish_by - int(bigger))
        # Nor until a frame in hand is about to be replaced by its own source's next one.
        for i in batch:
            if cells[i].interval_ns and lanes[i].newest_wins:
                wait_end = min(wait_end, cells[i].last_put_ns + int(cells[i].interval_ns * 0.75))
        # A source's next frame is expected one interval after its last; one overdue by
        # a whole interval more has stalled, and is not waited for.
        expected = min(
            (
                due
                for i in idle
                if (due := cells[i].last_put_ns + int(cells[i].interval_ns)) + cells[i].interval_ns >= now
            ),
            default=_INF,
        )
        if expected > wait_end:
            return 0
        return wait_end - now

    def _guard_ns(
        self, priority: int, batch: list[int], profile: Any, around: list[tuple[float, float]]
    ) -> float:
        """The longest batch that a source of higher priority than ``priority`` with no
        frame in ``batch`` can wait for and still run its own frame within its budget."""
        guard = float(_INF)
        own = self.estimate_ns(profile, 1)
        for j, lane in enumerate(self.lanes):
            if lane.priority <= priority or j in batch or self._cells[j].closed:
                continue
            before, after = around[j]
            guard = min(guard, lane.budget_ns - self.margin_ns - before - after - own)
        return guard
