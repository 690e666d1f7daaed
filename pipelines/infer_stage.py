"""The inference stage: one thread that takes batches from the scheduler, admits their
frames, runs the model, and hands each frame on to the post stage.

Where a frame is postprocessed is decided here, in one place (``run_batch``): while no
frame waits for inference and the post thread is idle, this thread postprocesses and
publishes the frame itself (the post thread would only have to be woken for it, tens of
microseconds, more on a virtual machine, while this one waited); otherwise the post
stage's inbox takes it, and inference goes on with the next batch.

An inference that does not return in time at a stop (a hung backend) is abandoned by the
owner (``abandon``): its frames and those waiting for it are accounted as dropped
(``shutdown``) at once, its buffers are never reused, and whatever it returns later is
discarded.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from edge_agent.core.config import ResilienceConfig
from edge_agent.core.stages import INFER_END, INFER_START
from edge_agent.pipelines.handoff import Closed, FrameSlot
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.post_stage import FrameQueue, PostStage
from edge_agent.pipelines.scheduler import BatchScheduler
from edge_agent.pipelines.stage_control import POLL_S, StageControl

log = logging.getLogger(__name__)


class InferStage:
    """The inference thread: batches from the ``scheduler``, frames on to the ``post``
    stage (inline) or its ``inbox`` (queued). ``breaker`` is set once
    ``resilience.max_consecutive_errors`` inferences in a row have failed: the owner (the
    agent's supervisor) reloads, falls back, or gives up."""

    name = "infer"  # its thread's

    def __init__(
        self,
        lanes: Sequence[Lane],
        scheduler: BatchScheduler,
        post: PostStage,
        inbox: FrameQueue,
        control: StageControl,
        resilience: ResilienceConfig,
        breaker: threading.Event,
    ) -> None:
        self.lanes = lanes
        self.scheduler = scheduler
        self.post = post
        self.inbox = inbox
        self.control = control
        self.breaker = breaker
        self.max_consecutive_errors = resilience.max_consecutive_errors
        self._consecutive_errors = 0
        # The batch inside the backend now: ``abandon`` takes it over if the backend hangs.
        self._lock = threading.Lock()
        self._running: list[FrameSlot] = []
        self._abandoned = False

    def run(self) -> None:
        """The thread: until every source's cell is closed and drained, or a bug; then the
        post stage's inbox is closed behind the last frame."""
        scheduler, control = self.scheduler, self.control
        try:
            while True:
                control.beat(self.name)
                try:
                    batch = scheduler.next_batch(POLL_S)
                    if batch is None:
                        continue
                    self.run_batch(batch)
                except Closed:
                    break
                except Exception as e:  # a bug: stop; frames still waiting are accounted
                    control.fatal("infer", e)
                    for slot in scheduler.drain():
                        self.lanes[slot.lane].drop(slot, "error")
                    break
        finally:
            self.inbox.close()

    def run_batch(self, batch: list[FrameSlot]) -> list[FrameSlot]:
        """Admit a batch's frames, infer those admitted and hand each on to the post stage;
        returns the frames that ran (the others are accounted as dropped). Once handed on,
        a frame is no longer this stage's: the list is for counting only."""
        lanes = self.lanes
        now = time.monotonic_ns()
        expected = batch[0].expected_ns or None
        ran = []
        for slot in batch:
            lane = lanes[slot.lane]
            # A file's frames are all processed: lateness is recorded, never a drop.
            if lane.every_frame or lane.monitor.admit(slot.stamps, now, slot.profile.name, expected):
                ran.append(slot)
            else:
                lane.drop(slot, "stale")
        if not ran:
            return ran
        profile = ran[0].profile
        with self._lock:
            abandoned = self._abandoned
            if not abandoned:
                self._running = ran
        if abandoned:  # the owner gave up on this thread: these frames never reach the backend
            for slot in ran:
                lanes[slot.lane].drop(slot, "shutdown")
            return []
        try:
            profile.infer(ran)
        except Exception as e:
            self._failed(ran, e)
            return []
        with self._lock:  # the batch is this thread's again, unless abandoned meanwhile
            self._running = []
            if self._abandoned:
                return []
        end = time.monotonic_ns()
        n = len(ran)
        for slot in ran:
            slot.stamps[INFER_START] = now
            slot.stamps[INFER_END] = end
            slot.batch = n
        # Where each frame is postprocessed: the one place that decides it (see above).
        for slot in ran:
            if not self.scheduler.waiting and self.inbox.claim():
                try:
                    self.post.process(slot)
                finally:
                    self.inbox.unclaim()
            elif not self.inbox.put(slot):  # the owner gave up on this thread meanwhile
                lanes[slot.lane].drop(slot, "shutdown")
        # The frames first, the bookkeeping after.
        self._consecutive_errors = 0
        self.scheduler.record(profile, n, end - now)
        self.control.inferred(end - now)
        return ran

    def _failed(self, batch: list[FrameSlot], e: Exception) -> None:
        """Account a batch whose inference raised ``e``; opens the breaker after too many in a row."""
        with self._lock:
            self._running = []
            if self._abandoned:
                return  # abandoned by the owner meanwhile: already accounted
        self._consecutive_errors += 1
        # One line per failure, not a traceback per frame: a broken backend can fail
        # hundreds of times a second.
        ids = ", ".join(f"{s.source}:{s.frame_id}" for s in batch)
        log.error("pipeline: inference failed for frame(s) %s: %s", ids, e)
        for slot in batch:
            self.lanes[slot.lane].drop(slot, "error")
        if self._consecutive_errors >= self.max_consecutive_errors and not self.breaker.is_set():
            log.error("pipeline: %d inferences in a row failed: breaker open", self._consecutive_errors)
            self.breaker.set()

    def abandon(self) -> None:
        """The thread is stuck in the backend (the owner's stop gave up on it): account its
        batch and every frame waiting for it as dropped now, and let the post stage finish
        what it has."""
        with self._lock:
            self._abandoned = True
            stuck, self._running = self._running, []
        for slot in stuck:
            # Counted, but the slot stays out of its pool: the backend may still write to
            # its buffers, and a reload's pipeline may share the pool.
            self.lanes[slot.lane].drop(None, "shutdown")
        waiting = self.scheduler.drain()
        for slot in waiting:
            self.lanes[slot.lane].drop(slot, "shutdown")
        self.inbox.close()
        if stuck:
            log.error(
                "pipeline: an inference did not return; %d frame(s) in it and %d waiting for it "
                "abandoned (dropped: shutdown)",
                len(stuck),
                len(waiting),
            )
        else:
            log.error(
                "pipeline: the inference thread did not end (waiting on a stuck stage); "
                "%d waiting frame(s) dropped (shutdown)",
                len(waiting),
            )
