"""The pipeline's work on one frame, step by step: read it, preprocess it into a slot, infer
(a batch of slots), decode and publish it, and account it. The stage threads run these
(``Pipeline``); the bench's sequential phase runs them one after another on one thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from edge_agent.core.stages import (
    CAPTURED,
    INFER_END,
    INFER_START,
    POST_END,
    POST_START,
    PRE_END,
    PRE_START,
    PUBLISH,
)
from edge_agent.pipelines.handoff import FrameSlot
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.preprocess import boxes_to_source

log = logging.getLogger(__name__)

#: How long a stage waits before it looks at the stop flag again.
POLL_S = 0.1


class FrameSteps:
    """The per-frame steps of ``Pipeline`` (its base class), over the pipeline's state."""

    lanes: list[Lane]
    scheduler: Any
    publisher: Any
    _batch_lock: Any
    _running: list[FrameSlot]
    _abandoned: bool

    def read_frame(self, lane: Lane | None = None) -> Any:
        """The next source frame (or None on timeout); counts frames the source skipped."""
        lane = lane or self.lanes[0]
        source = lane.source
        before = source.skipped
        frame = source.read(POLL_S)
        gap = source.skipped - before
        # A camera's reader drains stale frames on its own thread, whenever it reconnects.
        drained = source.stale
        stale, lane.stale_seen = drained - lane.stale_seen, drained
        if self.max_frames:  # --frames N counts source frames, skipped ones included
            room = max(self.max_frames - lane.stats.captured - (frame is not None), 0)
            gap = min(gap, room)
            stale = min(stale, room - gap)
        lane.stats.add_captured(int(frame is not None), gap, stale)
        return frame

    def prepare(self, frame: Any, lane: Lane | None = None) -> FrameSlot | None:
        """Take a slot of the lane's current profile and preprocess ``frame`` into it.

        Returns None when the frame is not processed (ladder, error, shutdown).
        """
        lane = lane or self.lanes[0]
        profile = lane.profile()
        if profile is None:
            self._drop(lane, None, "ladder")
            return None
        pool = profile.pools[lane.name]
        # Try at least once: a frame read just before stop is still processed.
        slot = pool.acquire(POLL_S)
        while slot is None and not self._stop.is_set():
            slot = pool.acquire(POLL_S)
        if slot is None:
            self._drop(lane, None, "shutdown")
            return None
        st = slot.stamps
        st[CAPTURED] = frame.capture_ns
        st[PRE_START] = time.monotonic_ns()
        slot.lane = lane.index
        slot.source = lane.name
        slot.frame_id = frame.frame_id
        slot.gt_count = 0
        if frame.gt is not None:
            n = min(len(frame.gt), len(slot.gt))
            slot.gt[:n] = frame.gt[:n]
            slot.gt_count = n
        try:
            profile.model.preprocessor(frame.image, slot.tensor, slot.geo)
            profile.model.backend.upload(slot.io)
        except Exception:
            log.exception("pipeline: preprocessing failed for frame %d of %s", frame.frame_id, lane.name)
            self._drop(lane, slot, "error")
            return None
        st[PRE_END] = time.monotonic_ns()
        return slot

    def infer_one(self, slot: FrameSlot) -> bool:
        """Admit and infer one frame; False if it was dropped (stale or error)."""
        return bool(self.infer_batch([slot]))

    def infer_batch(
        self, batch: list[FrameSlot], hand_on: Callable[[list[FrameSlot]], None] | None = None
    ) -> list[FrameSlot]:
        """Admit a batch's frames and infer those admitted; returns the frames that ran
        (the others are accounted as dropped).

        ``hand_on``: called with the frames that ran as soon as they are stamped, before
        the bookkeeping of the run (they are then no longer this caller's: the returned
        list is for counting only)."""
        now = time.monotonic_ns()
        ran = []
        # Judged by what a batch of this size is expected to take (an estimate only once a
        # batch of this model has run: until then each source's own times judge).
        expected = self.scheduler.estimate_ns(batch[0].profile, len(batch), measured_only=True) or None
        for slot in batch:
            lane = self.lanes[slot.lane]
            # A file's frames are all processed: lateness is recorded, never a drop.
            if lane.every_frame or lane.monitor.admit(slot.stamps, now, slot.profile.name, expected):
                ran.append(slot)
            else:
                self._drop(lane, slot, "stale")
        if not ran:
            return ran
        batch = ran
        profile = batch[0].profile
        with self._batch_lock:
            abandoned = self._abandoned
            if not abandoned:
                self._running = batch
        if abandoned:  # stop() gave up on this thread: these frames never reach the backend
            for slot in batch:
                self._drop(self.lanes[slot.lane], slot, "shutdown")
            return []
        try:
            profile.infer(batch)
        except Exception as e:
            self._inference_failed(batch, e)
            return []
        if not self._took_back():
            return []
        end = time.monotonic_ns()
        n = len(batch)
        for slot in batch:
            slot.stamps[INFER_START] = now
            slot.stamps[INFER_END] = end
            slot.batch = n
        if hand_on is not None:  # the frames first, the bookkeeping after
            hand_on(batch)
        self._consecutive_errors = 0
        self.scheduler.record(profile, n, end - now)
        self._slowest_ns = max(self._slowest_ns, end - now)
        return batch

    def _inference_failed(self, batch: list[FrameSlot], e: Exception) -> None:
        """Account a batch whose inference raised ``e``; opens the breaker after too many in a row."""
        if not self._took_back():
            return  # abandoned by stop() meanwhile: already accounted
        self._consecutive_errors += 1
        # One line per failure, not a traceback per frame: a broken backend can fail
        # hundreds of times a second.
        ids = ", ".join(f"{s.source}:{s.frame_id}" for s in batch)
        log.error("pipeline: inference failed for frame(s) %s: %s", ids, e)
        for slot in batch:
            self._drop(self.lanes[slot.lane], slot, "error")
        if self._consecutive_errors >= self.max_consecutive_errors and not self.breaker.is_set():
            log.error("pipeline: %d inferences in a row failed: breaker open", self._consecutive_errors)
            self.breaker.set()

    def _took_back(self) -> bool:
        """The backend returned: the batch is the inference thread's again, unless stop()
        abandoned it meanwhile (then its frames are accounted and its slots are lost)."""
        with self._batch_lock:
            self._running = []
            return not self._abandoned

    def publish_one(self, slot: FrameSlot) -> None:
        """Decode, publish and account one frame, then give its slot back."""
        lane = self.lanes[slot.lane]
        try:
            total = self._publish(lane, slot)
        except Exception:
            log.exception("pipeline: postprocessing failed for frame %d of %s", slot.frame_id, lane.name)
            self._drop(lane, slot, "error")
            return
        # Accounted only once the message is out, so a frame is never both sent and dropped.
        self._account(lane, slot, total, time.monotonic_ns())
        slot.pool.release(slot)  # type: ignore[union-attr]

    def _publish(self, lane: Lane, slot: FrameSlot) -> int:
        """Decode, build and send the result message; returns the end-to-end ns."""
        st = slot.stamps
        st[POST_START] = time.monotonic_ns()
        model = slot.profile.model
        xyxy, scores, classes = model.decode(slot.io.outputs, model.params)
        n = min(len(scores), len(slot.det_score))
        slot.det_xyxy[:n] = xyxy[:n]
        slot.det_score[:n] = scores[:n]
        slot.det_class[:n] = classes[:n]
        slot.det_count = n
        boxes_to_source(slot.det_xyxy[:n], slot.geo)
        st[POST_END] = time.monotonic_ns()
        message = lane.builder.build(slot, lane.seq, slot.profile.name)
        st[PUBLISH] = time.monotonic_ns()
        total = int(st[PUBLISH] - st[CAPTURED])
        message["latency_ms"] = lane.builder.latencies(slot)
        message["deadline_missed"] = lane.monitor.late(total)
        self.publisher.send(lane.topic, lane.builder.encode(message, slot))
        lane.seq += 1
        tap = lane.view_tap
        if tap is not None and tap.active:
            try:
                tap.offer_result(slot, message["deadline_missed"])
            except Exception:  # the view must never fail a frame that is already published
                log.exception("view: the frame's detections could not be handed over")
        return total

    def _account(self, lane: Lane, slot: FrameSlot, total: int, end: int) -> None:
        st, stats = slot.stamps, lane.stats
        stats.send.record(end - int(st[PUBLISH]))
        for i, hist in enumerate(stats.stages.values()):
            hist.record(int(st[i + 1] - st[i]))
        stats.total.record(total)
        stats.by_profile[slot.profile.name].record(total)
        stats.overhead.record(end - int(st[PRE_START]) - int(st[INFER_END] - st[INFER_START]))
        for part, ms in slot.profile.model.backend.timings(slot.io).items():
            stats.backend_part(part).record(int(ms * 1e6))
        stats.add_published(total, lane.monitor.published(st, end, slot.profile.name))
