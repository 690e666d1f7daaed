"""The frame path's three stages, in the order a frame meets them, and what they share.

- ``CaptureStage``, one thread per source: takes the source's next frame from its lane
  (``Lane.take``), preprocesses it into a frame slot of the model the ladder picked, and
  hands it to the batch scheduler. Capture and preprocessing share a thread: each is
  sub-millisecond, a thread hand-off costs tens of microseconds, and OpenCV releases the
  GIL, so this overlaps the inference of the previous frame.
- ``InferStage``, one thread: takes batches from the scheduler, admits their frames
  (``DeadlineMonitor.admit``), runs the model, and hands each frame on. Where a frame is
  postprocessed is decided here, in one place (``run_batch``): while no frame waits for
  inference and the post thread is idle, this thread postprocesses and publishes the
  frame itself (waking the post thread would cost tens of microseconds, more on a virtual
  machine); otherwise the post stage's inbox (``FrameQueue``) takes it. An inference that
  does not return in time at a stop (a hung backend) is abandoned by the owner
  (``abandon``): its frames and those waiting for it are accounted as dropped
  (``shutdown``), its buffers are never reused, and whatever it returns later is discarded.
- ``PostStage``, one thread (or the inference thread, as above): decodes, runs the frame's
  lane's per-frame steps (``pipelines/steps``: a tracker, analytics on its tracks, ...) in
  order between decoding and publishing, each given the frame's slot (its detections in
  source pixels), adds their blocks to the message, publishes and accounts the frame.

``StageControl`` is what the stage threads share with the pipeline that owns them: the
stop and abort events, the finished event, each thread's progress stamp, the first fatal
error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from edge_agent.core.resilience_config import ResilienceConfig
from edge_agent.core.stamps import (
    CAPTURED,
    INFER_END,
    INFER_START,
    POST_END,
    POST_START,
    PRE_END,
    PRE_START,
    PUBLISH,
)
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.scheduler import BatchScheduler
from edge_agent.pipelines.slots import Closed, FrameSlot
from edge_agent.pipelines.sources.base import EndOfStream, Pacer, SourceError

log = logging.getLogger(__name__)


#: How long a stage waits before it looks at the stop flag again.
POLL_S = 0.1


class StageControl:
    """One pipeline's run, as its stage threads see it.

    ``stop``: capture ends, the stages drain behind the last frame. ``abort``: the owner
    gave up draining (a stage is stuck); a capture thread waiting to hand a frame over
    stops waiting. ``finished``: the post stage published (or dropped) the last frame.
    """

    def __init__(self, sources: int) -> None:
        self.stop = threading.Event()
        self.abort = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None  # why the run failed (the first fatal error)
        self.progress: dict[str, int] = {}  # by stage thread: monotonic ns of its last loop turn
        self.slowest_ns = 0  # the longest inference run so far (warm-ups included)
        self._sources = sources
        self._failed_sources = 0
        self._lock = threading.Lock()

    def beat(self, stage: str) -> None:
        """``stage``'s thread went round its loop (it is not stuck)."""
        self.progress[stage] = time.monotonic_ns()

    def inferred(self, ns: int) -> None:
        """An inference took ``ns`` (the inference thread, or a warm-up)."""
        if ns > self.slowest_ns:
            self.slowest_ns = ns

    def fatal(self, stage: str, exc: BaseException) -> None:
        """An unexpected error in a stage thread: record it and stop the pipeline."""
        log.error("pipeline: unexpected error in the %s stage", stage, exc_info=exc)
        with self._lock:
            if self.error is None:
                self.error = f"{stage} stage: {type(exc).__name__}: {exc}"
        self.stop.set()

    def source_failed(self, error: str) -> None:
        """A source ended with ``error``. One dead source does not stop the others; when
        none is left, the pipeline fails."""
        log.error("%s", error)
        with self._lock:
            self._failed_sources += 1
            if self._failed_sources >= self._sources and self.error is None:
                self.error = error if self._sources == 1 else "every source failed: " + error


class CaptureStage:
    """One source's capture thread: its ``lane`` (the source, its ladder and slots) and the
    ``scheduler`` it hands frames to."""

    def __init__(self, lane: Lane, scheduler: BatchScheduler, control: StageControl) -> None:
        self.lane = lane
        self.scheduler = scheduler
        self.control = control
        self.name = f"capture-{lane.name}"  # its thread's

    def run(self) -> None:
        """The thread: until the stop, the source's end or its failure; then the source's
        cell in the scheduler is closed (its waiting frame still runs)."""
        lane, scheduler, control = self.lane, self.scheduler, self.control
        # A file source is read only once the previous frame has been taken by the
        # scheduler: reading ahead would not raise throughput (one frame already waits)
        # but would age every frame by a whole inference time.
        read_ahead = not lane.every_frame
        # The frame-rate cap: at most one read per period, the source's frames in between
        # skipped by the source (a camera's, counted as source_gap); a stop cuts a wait short.
        cap = Pacer(lane.max_fps, control.stop.wait)
        try:
            while not control.stop.is_set():
                control.beat(self.name)
                if lane.done():
                    break
                if not read_ahead and not scheduler.wait_room(lane.index, POLL_S):
                    continue
                if cap.period_ns and cap.tick(POLL_S) is None:
                    continue
                try:
                    slot = self.next_slot(POLL_S)
                except EndOfStream:
                    break
                except SourceError as e:
                    lane.error = f"source {lane.name}: {e}"
                    control.source_failed(lane.error)
                    break
                except Exception as e:  # a bug or a driver error: fail loudly, not silently
                    control.fatal(f"capture ({lane.name})", e)
                    break
                if slot is not None and not scheduler.put(lane.index, slot, control.abort):
                    lane.drop(slot, "shutdown")
        finally:
            scheduler.close(lane.index)

    def next_slot(self, timeout_s: float) -> FrameSlot | None:
        """The source's next frame, preprocessed into a slot of the model the ladder picked;
        None when no frame came within ``timeout_s`` or it was dropped (accounted). Raises
        what the source's read raises."""
        lane = self.lane
        taken = lane.take(timeout_s)
        if taken is None:
            return None
        frame, profile = taken
        self.scheduler.expect()  # the inference thread wakes while we preprocess
        pool = profile.pools[lane.name]  # the source's slots of the profile
        slot = pool.take(frame, lane.index, lane.name, self.control.stop, POLL_S)
        if slot is None:  # the stop came while every slot was taken
            lane.drop(None, "shutdown")
            return None
        return slot if self.prepare(slot) else None

    def prepare(self, slot: FrameSlot) -> bool:
        """Preprocess the slot's frame into its input (``Profile.preprocess``); False, and
        the frame accounted as dropped (``error``), when that failed."""
        lane = self.lane
        slot.stamps[PRE_START] = time.monotonic_ns()
        try:
            slot.profile.preprocess(slot)
        except Exception:
            log.exception("pipeline: preprocessing failed for frame %d of %s", slot.frame_id, lane.name)
            lane.drop(slot, "error")
            return False
        if lane.keeps_pixels:  # an event of this frame may save a snapshot after the next read
            slot.keep_pixels(slot.frame.image)  # type: ignore[union-attr]
        slot.stamps[PRE_END] = time.monotonic_ns()
        tap = lane.view_tap
        # Someone watches: this frame's pixels, if one is due (the source's image stays
        # valid until its next read).
        if tap is not None and tap.active:
            try:
                tap.offer_pixels(slot.frame)
            except Exception:  # the view must never cost a frame (nor its slot)
                log.exception("view: the frame's pixels could not be handed over")
        return True


class FrameQueue:
    """The post stage's inbox: first in, first out, for the frames of a batch on their way
    to postprocessing.

    Unbounded by design: every frame in it holds a slot, so the slot pools bound it.

    The producer may instead handle an item itself (``claim``) while the queue is empty
    and the consumer is not working on an item it took: the consumer's wake-up is then
    saved, and the order of the items is kept (nothing is queued or in the consumer's
    hands that came before).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: deque[FrameSlot] = deque()
        self._closed = False
        self._busy = False  # the consumer works on an item it took (until it asks again)
        self._claimed = False  # the producer handles an item itself
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def ahead(self) -> int:
        """Frames queued or being worked on now: what a frame put now waits behind."""
        return len(self._items) + self._busy  # a racy read is fine: an estimate

    def put(self, slot: FrameSlot) -> bool:
        """Hand ``slot`` on; False (not taken) once the queue was closed."""
        with self._cond:
            if self._closed:
                return False
            self._items.append(slot)
            self._cond.notify()
            return True

    def get(self, timeout_s: float) -> FrameSlot | None:
        """The oldest slot, or None after ``timeout_s``. Raises Closed when drained.

        Calling it again tells the queue the previous slot is done with."""
        with self._cond:
            self._busy = False
            if not self._items or self._claimed:
                if self._closed and not self._items:
                    raise Closed(self.name)
                self._cond.wait(timeout_s)
                if not self._items or self._claimed:
                    if self._closed and not self._items:
                        raise Closed(self.name)
                    return None
            self._busy = True
            return self._items.popleft()

    def claim(self) -> bool:
        """Producer: True if it may handle its next item itself (nothing queued, the
        consumer idle): the consumer then gets nothing until ``unclaim``."""
        with self._lock:
            if self._items or self._busy or self._claimed or self._closed:
                return False
            self._claimed = True
            return True

    def unclaim(self) -> None:
        with self._lock:
            self._claimed = False
            if self._items:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class Countdown:
    """Calls ``then`` when ``count`` parties have said ``done``: the run is finished once
    every post thread has ended."""

    def __init__(self, count: int, then: Callable[[], None]) -> None:
        self._left = count
        self._then = then
        self._lock = threading.Lock()

    def done(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._then()


class PostStage:
    """Decodes, runs the lane's steps, publishes on ``publisher`` and accounts (through the
    frame's lane), on its own thread or inline on the inference thread. With several post
    threads each takes the lanes of its own ``inbox`` (``Pipeline``): a lane's frames are
    always one thread's, in order."""

    def __init__(
        self,
        lanes: Sequence[Lane],
        publisher: ZmqPublisher,
        inbox: FrameQueue,
        control: StageControl,
        ended: Callable[[], None] | None = None,
    ) -> None:
        """``ended``: called when its thread ends (default: the run is finished)."""
        self.name = inbox.name  # its thread's: post, post-1, ...
        self.lanes = lanes
        self.publisher = publisher
        self.inbox = inbox
        self.control = control
        self._ended = ended or control.finished.set

    def run(self) -> None:
        """The thread: until the inbox is closed and drained; then the run is finished."""
        inbox, control = self.inbox, self.control
        try:
            while True:
                control.beat(self.name)
                try:
                    slot = inbox.get(POLL_S)
                except Closed:
                    break
                if slot is not None:
                    self.process(slot)
        finally:
            self._ended()

    def process(self, slot: FrameSlot) -> None:
        """Decode, run the steps, publish and account one frame, then give its slot back.

        A frame that fails here is accounted as dropped (``error``); anything else that
        raises is a bug, which stops the pipeline.
        """
        try:
            lane = self.lanes[slot.lane_index]
            st = slot.stamps
            try:
                st[POST_START] = time.monotonic_ns()
                model = slot.profile.model
                slot.fill(model.decode(slot.io.outputs, model.params))
                for step in lane.steps:
                    step.run(slot)
                st[POST_END] = time.monotonic_ns()
                builder = lane.builder
                message = builder.build(slot, lane.seq, slot.profile.name)
                for step in lane.blocks:
                    block = step.message_block()
                    if block is not None:  # (none in this frame)
                        message[step.name] = block
                st[PUBLISH] = time.monotonic_ns()
                message["latency_ms"] = builder.latencies(slot)
                message["deadline_missed"] = missed = lane.monitor.late(int(st[PUBLISH] - st[CAPTURED]))
                self.publisher.send(lane.topic, builder.encode(message, slot))
            except Exception:
                log.exception("pipeline: postprocessing failed for frame %d of %s", slot.frame_id, lane.name)
                lane.drop(slot, "error")
                return
            lane.seq += 1
            tap = lane.view_tap
            if tap is not None and tap.active:
                try:
                    tap.offer_result(slot, missed, lane.steps)
                except Exception:  # the view must never fail a frame that is already published
                    log.exception("view: the frame's detections could not be handed over")
            # Accounted only once the message is out, so a frame is never both sent and dropped.
            lane.published(slot, time.monotonic_ns())
        except Exception as e:
            self.control.fatal("post", e)


class InferStage:
    """The inference thread: batches from the ``scheduler``, frames on to their lane's
    post stage (inline) or its inbox (queued): ``posts[i]`` takes the lanes whose index is
    i modulo their number. ``breaker`` is set once
    ``resilience.max_consecutive_errors`` inferences in a row have failed: the owner (the
    agent's supervisor) reloads, falls back, or gives up."""

    name = "infer"  # its thread's

    def __init__(
        self,
        lanes: Sequence[Lane],
        scheduler: BatchScheduler,
        posts: Sequence[PostStage],
        control: StageControl,
        resilience: ResilienceConfig,
        breaker: threading.Event,
    ) -> None:
        self.lanes = lanes
        self.scheduler = scheduler
        self.posts = posts
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
                        self.lanes[slot.lane_index].drop(slot, "error")
                    break
        finally:
            for post in self.posts:
                post.inbox.close()

    def run_batch(self, batch: list[FrameSlot], here: bool = False) -> list[FrameSlot]:
        """Admit a batch's frames, infer those admitted and hand each on to the post stage;
        returns the frames that ran (the others are accounted as dropped). Once handed on,
        a frame is no longer this stage's: the list is for counting only. ``here``: each
        frame is postprocessed on this thread (the caller's, with no stage thread running:
        ``Pipeline.run_one``)."""
        lanes = self.lanes
        now = time.monotonic_ns()
        expected = batch[0].expected_ns or None
        posts = self.posts
        ran = []
        for slot in batch:
            lane = lanes[slot.lane_index]
            ahead = posts[slot.lane_index % len(posts)].inbox.ahead()
            # A file's frames are all processed: lateness is recorded, never a drop.
            if lane.every_frame or lane.monitor.admit(slot.stamps, now, slot.profile.name, expected, ahead):
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
                lanes[slot.lane_index].drop(slot, "shutdown")
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
        # Where each frame is postprocessed: the one place that decides it (see above). With
        # an accelerator the post thread takes every frame: this one goes back to feed it.
        inline = not profile.model.backend.off_cpu
        for slot in ran:
            post = posts[slot.lane_index % len(posts)]
            inbox = post.inbox
            if here:
                post.process(slot)
            elif inline and not self.scheduler.waiting and inbox.claim():
                try:
                    post.process(slot)
                finally:
                    inbox.unclaim()
            elif not inbox.put(slot):  # the owner gave up on this thread meanwhile
                lanes[slot.lane_index].drop(slot, "shutdown")
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
            self.lanes[slot.lane_index].drop(slot, "error")
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
            self.lanes[slot.lane_index].drop(None, "shutdown")
        waiting = self.scheduler.drain()
        for slot in waiting:
            self.lanes[slot.lane_index].drop(slot, "shutdown")
        for post in self.posts:
            post.inbox.close()
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
