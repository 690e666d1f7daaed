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

Inference time per batch size comes from an estimate per model profile, seeded at
warm-up and moved by every batch that runs; unmeasured sizes are extrapolated linearly
from a measured one (conservative: batching rarely costs more than linear).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.pipelines.handoff import CAPTURED, Closed, FrameSlot

_EWMA_ALPHA = 0.2
_INF = 1 << 62


@dataclass
class LaneSpec:
    """What the scheduler needs to know of one source."""

    name: str
    priority: int
    budget_ns: int
    newest_wins: bool  # live source: a newer frame replaces the waiting one
    on_replace: Callable[[FrameSlot], None]  # accounts a replaced frame (an overrun drop)
    # (before, after) inference: estimated ns of this source's stages up to the inference
    # stage (capture, preprocess) and after it (to the publish stamp).
    around_ns: Callable[[], tuple[float, float]]
    # The model profile its next frame will use (None: none, an alert-only ladder step).
    profile: Callable[[], Any] = lambda: None


class _Cell:
    __slots__ = ("closed", "interval_ns", "last_put_ns", "put_ns", "since_ns", "slot")

    def __init__(self) -> None:
        self.slot: FrameSlot | None = None
        self.since_ns = 0  # capture time of the first frame waiting since the last one taken
        self.closed = False
        self.put_ns = 0  # when the waiting frame was put
        self.last_put_ns = 0
        self.interval_ns = 0.0  # mean time between puts (0: not known yet)


class BatchScheduler:
    def __init__(
        self,
        lanes: list[LaneSpec],
        max_batch: int,
        max_wait_ms: float,
        margin_ms: float,
        batch_limit: Callable[[Any], int],
    ) -> None:
        """``max_batch``: the largest batch (0: one frame per source); ``batch_limit``:
        the largest batch a profile's model runs."""
        self.lanes = lanes
        self._cells = [_Cell() for _ in lanes]
        self.max_batch = min(max_batch or len(lanes), len(lanes))
        self.max_wait_ns = int(max_wait_ms * 1e6)
        self.margin_ns = int(margin_ms * 1e6)
        self._limit = batch_limit
        self._cond = threading.Condition()
        self._drained = False
        # Estimated inference ns per profile, indexed by batch size (0: not measured), from
        # the batches that ran, and from warm-up.
        self._est: dict[int, np.ndarray] = {}
        self._seeds: dict[int, np.ndarray] = {}
        self.sizes = np.zeros(self.max_batch + 1, np.int64)  # batches run, by size
        self.frames = 0  # frames in those batches

    # -- capture threads ----------------------------------------------------------

    def put(self, lane: int, slot: FrameSlot, stop: threading.Event) -> bool:
        """Hand a preprocessed frame over; False (not taken) if ``stop`` was set meanwhile."""
        cell, replaced = self._cells[lane], None
        with self._cond:
            if self._drained:
                return False
            if cell.slot is not None and self.lanes[lane].newest_wins:
                replaced = cell.slot
            else:
                while cell.slot is not None:
                    if stop.is_set():
                        return False
                    self._cond.wait(0.05)
                if self._drained:
                    return False
            now = time.monotonic_ns()
            if cell.last_put_ns:
                gap = now - cell.last_put_ns
                cell.interval_ns += (gap - cell.interval_ns) * (_EWMA_ALPHA if cell.interval_ns else 1.0)
            if cell.slot is None:
                cell.since_ns = int(slot.stamps[CAPTURED])
            cell.slot, cell.put_ns, cell.last_put_ns = slot, now, now
            self._cond.notify_all()
        if replaced is not None:
            self.lanes[lane].on_replace(replaced)
        return True

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
        end = time.monotonic_ns() + int(timeout_s * 1e9)
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
                    self._cond.wait((end - now) / 1e9)
                    continue
                ready.sort(
                    key=lambda i: (-self.lanes[i].priority, cells[i].since_ns + self.lanes[i].budget_ns)
                )
                batch, wait_ns = self._plan(ready, now)
                if wait_ns <= 0:
                    break
                self._cond.wait(wait_ns / 1e9)
            slots = []
            for i in batch:
                slots.append(cells[i].slot)
                cells[i].slot = None
            self._cond.notify_all()
        return slots  # type: ignore[return-value]

    def drain(self) -> list[FrameSlot]:
        """Take every waiting frame (the inference thread is stopping on an error); later
        puts are refused, so no frame lands where nobody reads."""
        with self._cond:
            self._drained = True
            slots = [c.slot for c in self._cells if c.slot is not None]
            for c in self._cells:
                c.slot = None
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

    def summary(self) -> dict[str, Any]:
        batches = int(self.sizes.sum())
        return {
            "max_batch": self.max_batch,
            "batches": batches,
            "mean_size": round(self.frames / batches, 3) if batches else 0.0,
            "sizes": {str(b): int(n) for b, n in enumerate(self.sizes) if n},
        }

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

    def _plan(self, ready: list[int], now: int) -> tuple[list[int], int]:
        """The batch to run now from ``ready`` (in serving order), and how long to wait
        for more frames first (<= 0: run it now)."""
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
        # Wait for another frame only while the batch, one frame larger, still ends in time,
        # and only for sources whose frame could join it (same model, past the guard).
        bigger = self.estimate_ns(profile, len(batch) + 1)
        idle = [
            i
            for i, c in enumerate(cells)
            if c.slot is None
            and not c.closed
            and c.interval_ns
            and lanes[i].profile() is profile
            and bigger <= self._guard_ns(lanes[i].priority, batch, profile, around)
        ]
        if not idle:
            return batch, 0
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
            return batch, 0
        return batch, wait_end - now

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
