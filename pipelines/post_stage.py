"""The post stage: decode an inferred frame, run the per-result steps on it, publish its
result, and account it. Its thread takes frames from its inbox (``FrameQueue``); the
inference thread runs ``process`` itself while that thread is idle and nothing is queued
(``infer_stage``).

Per-result steps run in order between decoding and publishing, each given the frame's
slot (its detections in source pixels) and its lane: a tracker (per source, after decode,
before publish), analytics on its tracks. A step is a ``PostStep``; the pipeline's owner
hands the list in, and no other stage changes for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Protocol

from edge_agent.core.stages import CAPTURED, POST_END, POST_START, PUBLISH
from edge_agent.pipelines.handoff import Closed, FrameSlot
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.preprocess import boxes_to_source
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.stage_control import POLL_S, StageControl

log = logging.getLogger(__name__)


class PostStep(Protocol):
    """One step on every decoded frame, before its result is published (postprocess stage
    time). It may read and extend the slot's detections; it must not allocate per frame
    in steady state. An exception drops the frame (``error``)."""

    def run(self, slot: FrameSlot, lane: Lane) -> None: ...


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


class PostStage:
    """Decodes, runs ``steps``, publishes on ``publisher`` and accounts (through the
    frame's lane), on its own thread or inline on the inference thread."""

    name = "post"  # its thread's

    def __init__(
        self,
        lanes: Sequence[Lane],
        publisher: ZmqPublisher,
        inbox: FrameQueue,
        control: StageControl,
        steps: Sequence[PostStep] = (),
    ) -> None:
        self.lanes = lanes
        self.publisher = publisher
        self.inbox = inbox
        self.control = control
        self.steps = tuple(steps)

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
            control.finished.set()

    def process(self, slot: FrameSlot) -> None:
        """Decode, run the steps, publish and account one frame, then give its slot back.

        A frame that fails here is accounted as dropped (``error``); anything else that
        raises is a bug, which stops the pipeline.
        """
        try:
            lane = self.lanes[slot.lane]
            st = slot.stamps
            try:
                st[POST_START] = time.monotonic_ns()
                model = slot.profile.model
                xyxy, scores, classes = model.decode(slot.io.outputs, model.params)
                n = min(len(scores), len(slot.det_score))
                slot.det_xyxy[:n] = xyxy[:n]
                slot.det_score[:n] = scores[:n]
                slot.det_class[:n] = classes[:n]
                slot.det_count = n
                boxes_to_source(slot.det_xyxy[:n], slot.geo)
                for step in self.steps:
                    step.run(slot, lane)
                st[POST_END] = time.monotonic_ns()
                builder = lane.builder
                message = builder.build(slot, lane.seq, slot.profile.name)
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
                    tap.offer_result(slot, missed)
                except Exception:  # the view must never fail a frame that is already published
                    log.exception("view: the frame's detections could not be handed over")
            # Accounted only once the message is out, so a frame is never both sent and dropped.
            lane.published(slot, time.monotonic_ns())
        except Exception as e:
            self.control.fatal("post", e)
