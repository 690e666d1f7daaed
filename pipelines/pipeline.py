"""The staged pipeline: capture+preprocess → infer → postprocess+publish, one thread each.

Frame N+1 is captured and preprocessed while frame N is inferred and frame N-1 is decoded
and published. Capture and preprocessing share a thread, as do postprocessing and
publishing: each pair is sub-millisecond, and a thread hand-off costs tens of
microseconds, so splitting them would add latency without adding throughput. OpenCV and
ONNX Runtime release the GIL, so the stages do overlap on separate cores.

Shutdown: ``stop`` ends capture; the hand-offs are closed behind the last frame, so the
frames in flight are drained and published before the threads exit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from edge_agent.latency import LatencyHistogram
from edge_agent.pipelines.backends.base import InferenceBackend
from edge_agent.pipelines.decode import Decoded, DecodeParams
from edge_agent.pipelines.handoff import (
    CAPTURED,
    INFER_END,
    INFER_START,
    POST_END,
    POST_START,
    PRE_END,
    PRE_START,
    PUBLISH,
    STAGES,
    Closed,
    FrameSlot,
    Handoff,
    SlotPool,
)
from edge_agent.pipelines.preprocess import Preprocessor, boxes_to_source
from edge_agent.pipelines.publish import MessageBuilder, ZmqPublisher
from edge_agent.pipelines.sources import BufferPolicy, EndOfStream, Source, SourceError

log = logging.getLogger(__name__)

#: capture+preprocess, its hand-off, inference, its hand-off, postprocess: one slot each.
SLOTS = 5
_POLL_S = 0.1


class PipelineStats:
    """Frame counts and latency histograms. Each counter has a single writer thread."""

    def __init__(self) -> None:
        self.captured = 0
        self.published = 0
        self.late = 0  # published after the deadline
        self.dropped: dict[str, int] = {"superseded": 0, "error": 0, "shutdown": 0}
        self.stages = {name: LatencyHistogram() for name in STAGES}
        self.total = LatencyHistogram()
        self.send = LatencyHistogram()  # JSON encoding + socket send, after the publish stamp
        self.window = LatencyHistogram()  # end-to-end since the last status line
        self._lock = threading.Lock()

    def drop(self, reason: str) -> None:
        with self._lock:
            self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def dropped_total(self) -> int:
        with self._lock:
            return sum(self.dropped.values())

    def take_window(self) -> LatencyHistogram:
        window, self.window = self.window, LatencyHistogram()
        return window


class Pipeline:
    def __init__(
        self,
        source: Source,
        preprocessor: Preprocessor,
        backend: InferenceBackend,
        decode: Callable[[np.ndarray, DecodeParams], Decoded],
        decode_params: DecodeParams,
        output_index: int,
        builder: MessageBuilder,
        publisher: ZmqPublisher,
        topic: str,
        max_frames: int = 0,
    ) -> None:
        self.source = source
        self.preprocessor = preprocessor
        self.backend = backend
        self.decode = decode
        self.params = decode_params
        self.output_index = output_index
        self.builder = builder
        self.publisher = publisher
        self.topic = f"{topic}.{source.name}".encode()
        self.max_frames = max_frames
        self.stats = PipelineStats()
        self.error: str | None = None
        self.finished = threading.Event()  # set once the last frame has been published
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._threads: list[threading.Thread] = []
        self.pool: SlotPool | None = None
        newest = source.policy is BufferPolicy.NEWEST
        self._to_infer = Handoff("infer", newest_wins=newest, on_replace=self._superseded)
        self._to_post = Handoff("post", newest_wins=False, on_replace=self._superseded)
        self._seq = 0

    def allocate(self, input_name: str, max_gt: int = 64) -> None:
        """Preallocate every slot and warm the backend up on one of them."""
        slots = [
            FrameSlot(i, self.backend.allocate(), input_name, self.params.max_detections, max_gt)
            for i in range(SLOTS)
        ]
        self.backend.warmup(slots[0].io)
        self.pool = SlotPool(slots)

    def start(self) -> None:
        if self.pool is None:
            raise RuntimeError("allocate() before start()")
        for name, target in (("capture", self._capture), ("infer", self._infer), ("post", self._post)):
            t = threading.Thread(target=target, name=f"{name}-{self.source.name}")
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 1.5) -> bool:
        """Stop capturing, drain the frames in flight, join; True if all threads ended."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            # A stage is stuck (e.g. inside the backend): give up draining.
            log.warning("pipeline: %s did not drain in %.1f s; aborting", alive, timeout_s)
            self._abort.set()
            for t in self._threads:
                t.join(0.5)
            alive = [t.name for t in self._threads if t.is_alive()]
            if alive:
                log.error("pipeline: threads still running after abort: %s", alive)
        return not alive

    # -- stages ---------------------------------------------------------------

    def _superseded(self, slot: FrameSlot) -> None:
        self.stats.drop("superseded")
        self._release(slot)

    def _release(self, slot: FrameSlot) -> None:
        assert self.pool is not None
        self.pool.release(slot)

    def _capture(self) -> None:
        assert self.pool is not None
        source, stats = self.source, self.stats
        try:
            while not self._stop.is_set():
                if self.max_frames and stats.captured >= self.max_frames:
                    break
                try:
                    frame = source.read(_POLL_S)
                except EndOfStream:
                    break
                except SourceError as e:
                    self.error = f"source {source.name}: {e}"
                    log.error("%s", self.error)
                    break
                if frame is None:
                    continue
                slot = None
                while slot is None and not self._stop.is_set():
                    slot = self.pool.acquire(_POLL_S)
                if slot is None:
                    break
                st = slot.stamps
                st[CAPTURED] = frame.capture_ns
                st[PRE_START] = time.monotonic_ns()
                slot.source = source.name
                slot.frame_id = frame.frame_id
                if frame.gt is not None:
                    n = min(len(frame.gt), len(slot.gt))
                    slot.gt[:n] = frame.gt[:n]
                    slot.gt_count = n
                stats.captured += 1
                try:
                    self.preprocessor(frame.image, slot.tensor, slot.geo)
                except Exception:
                    log.exception("pipeline: preprocessing failed for frame %d", frame.frame_id)
                    stats.drop("error")
                    self._release(slot)
                    continue
                st[PRE_END] = time.monotonic_ns()
                if not self._to_infer.put(slot, self._abort):
                    stats.drop("shutdown")
                    self._release(slot)
        finally:
            self._to_infer.close()

    def _infer(self) -> None:
        try:
            while True:
                try:
                    slot = self._to_infer.get(_POLL_S)
                except Closed:
                    break
                if slot is None:
                    continue
                slot.stamps[INFER_START] = time.monotonic_ns()
                try:
                    self.backend.infer(slot.io)
                except Exception:
                    log.exception("pipeline: inference failed for frame %d", slot.frame_id)
                    self.stats.drop("error")
                    self._release(slot)
                    continue
                slot.stamps[INFER_END] = time.monotonic_ns()
                if not self._to_post.put(slot, self._abort):
                    self.stats.drop("shutdown")
                    self._release(slot)
        finally:
            self._to_post.close()

    def _post(self) -> None:
        try:
            while True:
                try:
                    slot = self._to_post.get(_POLL_S)
                except Closed:
                    break
                if slot is None:
                    continue
                try:
                    self._publish(slot)
                except Exception:
                    log.exception("pipeline: postprocessing failed for frame %d", slot.frame_id)
                    self.stats.drop("error")
                finally:
                    self._release(slot)
        finally:
            self.finished.set()

    def _publish(self, slot: FrameSlot) -> None:
        st = slot.stamps
        st[POST_START] = time.monotonic_ns()
        xyxy, scores, classes = self.decode(slot.io.outputs[self.output_index], self.params)
        n = min(len(scores), len(slot.det_score))
        slot.det_xyxy[:n] = xyxy[:n]
        slot.det_score[:n] = scores[:n]
        slot.det_class[:n] = classes[:n]
        slot.det_count = n
        boxes_to_source(slot.det_xyxy[:n], slot.geo)
        st[POST_END] = time.monotonic_ns()
        message = self.builder.build(slot, self._seq)
        st[PUBLISH] = time.monotonic_ns()
        total = int(st[PUBLISH] - st[CAPTURED])
        message["latency_ms"] = self.builder.latencies(slot)
        message["deadline_missed"] = total > self.builder.budget_ns
        self.publisher.send(self.topic, self.builder.encode(message))
        self._seq += 1
        stats = self.stats
        stats.send.record(time.monotonic_ns() - int(st[PUBLISH]))
        for i, hist in enumerate(stats.stages.values()):
            hist.record(int(st[i + 1] - st[i]))
        stats.total.record(total)
        stats.window.record(total)
        stats.published += 1
        if total > self.builder.budget_ns:
            stats.late += 1
