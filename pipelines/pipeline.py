"""The staged pipeline: capture+preprocess → infer → postprocess+publish, one thread each.

Frame N+1 is captured and preprocessed while frame N is inferred and frame N-1 is decoded
and published. Capture and preprocessing share a thread, as do postprocessing and
publishing: each pair is sub-millisecond, and a thread hand-off costs tens of
microseconds, so splitting them would add latency without adding throughput. OpenCV and
ONNX Runtime release the GIL, so the stages do overlap on separate cores.

Every frame the source produced ends exactly once: published (on time or late) or
dropped with a reason (see ``deadline.DROP_REASONS``).

Shutdown: ``stop`` ends capture; the hand-offs are closed behind the last frame, so the
frames in flight are drained and published before the threads exit.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from edge_agent.latency import LatencyHistogram
from edge_agent.pipelines.deadline import DROP_REASONS, DeadlineMonitor
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
from edge_agent.pipelines.preprocess import boxes_to_source
from edge_agent.pipelines.publish import MessageBuilder, ZmqPublisher
from edge_agent.pipelines.sources import BufferPolicy, EndOfStream, Source, SourceError

log = logging.getLogger(__name__)

#: capture+preprocess, its hand-off, inference, its hand-off, postprocess: one slot each.
SLOTS = 5
_POLL_S = 0.1


@dataclass
class Profile:
    """A loaded model with its own preallocated frame slots.

    The degradation ladder may switch models at a frame boundary; each frame carries the
    profile it was preprocessed for, so frames already in flight finish on their model.
    """

    name: str
    model: Any  # runner.LoadedModel: backend, preprocessor, decode, params
    pool: SlotPool

    @classmethod
    def allocate(cls, name: str, model: Any, slots: int = SLOTS, max_gt: int = 64) -> Profile:
        """Preallocate every slot's buffers and warm the backend up on one of them."""
        max_det = model.params.max_detections
        made = [
            FrameSlot(i, model.backend.allocate(), model.input_name, max_det, max_gt) for i in range(slots)
        ]
        model.backend.warmup(made[0].io)
        profile = cls(name, model, SlotPool(made))
        for s in made:
            s.profile = profile
        return profile


class PipelineStats:
    """Frame counts and latency histograms.

    Counts change under one lock so that a snapshot (``counts``) is consistent while
    frames move: captured == on time + late + dropped + in flight, with in flight
    bounded by the number of frame slots. Each histogram has a single writer thread.
    """

    def __init__(self) -> None:
        self.captured = 0  # frames the source produced, including those it skipped
        self.published = 0  # on time + late
        self.late = 0  # published after the deadline
        self.dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self.stages = {name: LatencyHistogram() for name in STAGES}
        self.total = LatencyHistogram()
        self.send = LatencyHistogram()  # JSON encoding + socket send, after the publish stamp
        # The agent's own cost around the model: end to end (through the send) minus the
        # capture and inference stages.
        self.overhead = LatencyHistogram()
        self.window = LatencyHistogram()  # end-to-end since the health thread last took it
        self.by_profile: dict[str, LatencyHistogram] = {}  # end-to-end per model profile
        # Parts the backend timed inside its inference stage (CUDA events on TensorRT).
        self.backend_parts: dict[str, LatencyHistogram] = {}
        self._lock = threading.Lock()

    def drop(self, reason: str, n: int = 1) -> None:
        with self._lock:
            self.dropped[reason] += n

    def add_captured(self, n: int = 1, gap: int = 0) -> None:
        """``n`` frames taken from the source, and ``gap`` frames it skipped (dropped)."""
        with self._lock:
            self.captured += n + gap
            self.dropped["source_gap"] += gap

    def add_published(self, total_ns: int, late: bool) -> None:
        with self._lock:
            self.published += 1
            self.late += late
            self.window.record(total_ns)

    def dropped_total(self) -> int:
        with self._lock:
            return sum(self.dropped.values())

    def counts(self) -> dict[str, Any]:
        with self._lock:
            dropped = dict(self.dropped)
            captured, published, late = self.captured, self.published, self.late
        n_dropped = sum(dropped.values())
        return {
            "captured": captured,
            "on_time": published - late,
            "late": late,
            "dropped": n_dropped,
            "in_flight": captured - published - n_dropped,  # 0 once the pipeline has drained
            "dropped_by_reason": dropped,
        }

    def backend_part(self, name: str) -> LatencyHistogram:
        hist = self.backend_parts.get(name)
        if hist is None:
            hist = self.backend_parts[name] = LatencyHistogram()
        return hist

    def take_window(self) -> LatencyHistogram:
        with self._lock:
            window, self.window = self.window, LatencyHistogram()
        return window


class Pipeline:
    def __init__(
        self,
        source: Source,
        profiles: dict[str, Profile],
        monitor: DeadlineMonitor,
        builder: MessageBuilder,
        publisher: ZmqPublisher,
        topic: str,
        max_frames: int = 0,
        max_consecutive_errors: int = 10,
    ) -> None:
        self.source = source
        self.profiles = profiles
        self.primary = next(iter(profiles.values()))
        self.monitor = monitor
        self.builder = builder
        self.publisher = publisher
        self.topic = f"{topic}.{source.name}".encode()
        self.max_frames = max_frames
        self.stats = PipelineStats()
        for p in profiles.values():
            self.stats.by_profile[p.name] = LatencyHistogram()
        self.error: str | None = None
        self.finished = threading.Event()  # set once the last frame has been published
        # Set by the inference thread when that many inferences in a row have failed: the
        # owner (the agent's supervisor) reloads, falls back, or gives up.
        self.breaker = threading.Event()
        self.max_consecutive_errors = max_consecutive_errors
        self._consecutive_errors = 0
        self._stop = threading.Event()
        self._abort = threading.Event()
        self._threads: list[threading.Thread] = []
        newest = source.policy is BufferPolicy.NEWEST
        self._to_infer = Handoff("infer", newest_wins=newest, on_replace=self._overrun)
        self._to_post = Handoff("post", newest_wins=False, on_replace=self._overrun)
        self._seq = 0
        self._stride_count = 0

    def adopt(self, old: Pipeline) -> None:
        """Continue where ``old`` stopped (a reload): its sequence numbers and its counts."""
        self._seq = old._seq
        if self.monitor.config == old.monitor.config:
            # Same deadline settings: the ladder's step, backoff and estimates carry over,
            # so a reload under overload does not start again from the top.
            self.monitor = old.monitor
        old.stats.by_profile.update(
            {k: v for k, v in self.stats.by_profile.items() if k not in old.stats.by_profile}
        )
        self.stats = old.stats

    def start(self) -> None:
        for name, target in (("capture", self._capture), ("infer", self._infer), ("post", self._post)):
            t = threading.Thread(target=target, name=f"{name}-{self.source.name}")
            t.start()
            self._threads.append(t)

    def stop(self, timeout_s: float = 1.5) -> bool:
        """Stop capturing, drain the frames in flight, join; True if all threads ended.

        Takes at most ``timeout_s`` plus 0.3 s when a stage is stuck.
        """
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if alive:
            # A stage is stuck (e.g. inside the backend): give up draining.
            log.warning("pipeline: %s did not drain in %.1f s; aborting", alive, timeout_s)
            self._abort.set()
            deadline = time.monotonic() + 0.3
            for t in self._threads:
                t.join(max(0.0, deadline - time.monotonic()))
            alive = [t.name for t in self._threads if t.is_alive()]
            if alive:
                log.error("pipeline: threads still running after abort: %s", alive)
        return not alive

    # -- accounting ---------------------------------------------------------------

    def _drop(self, slot: FrameSlot | None, reason: str) -> None:
        self.stats.drop(reason)
        self.monitor.dropped(reason, time.monotonic_ns())
        if slot is not None:
            slot.profile.pool.release(slot)

    def _overrun(self, slot: FrameSlot) -> None:
        self._drop(slot, "overrun")

    def _profile(self) -> Profile | None:
        """The profile the ladder asks for, or None when this frame is not processed."""
        step = self.monitor.current
        if not step.infer:
            return None
        self._stride_count += 1
        if step.frame_stride > 1 and self._stride_count % step.frame_stride:
            return None
        return self.profiles[step.model] if step.model else self.primary

    # -- stages -------------------------------------------------------------------

    def _capture(self) -> None:
        source = self.source
        # A file source is read only once the previous frame has been taken by the
        # inference stage: reading ahead would not raise throughput (one frame already
        # waits) but would age every frame by a whole inference time.
        read_ahead = source.policy is BufferPolicy.NEWEST
        try:
            while not self._stop.is_set():
                if self.max_frames and self.stats.captured >= self.max_frames:
                    break
                if not read_ahead and not self._to_infer.wait_room(_POLL_S):
                    continue
                try:
                    frame = self.read_frame()
                except EndOfStream:
                    break
                except SourceError as e:
                    self.error = f"source {source.name}: {e}"
                    log.error("%s", self.error)
                    break
                except Exception as e:  # a bug or a driver error: fail loudly, not silently
                    self._fatal("capture", e)
                    break
                if frame is None:
                    continue
                slot = self.prepare(frame)
                if slot is not None and not self._to_infer.put(slot, self._abort):
                    self._drop(slot, "shutdown")
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
                try:
                    if self.infer_one(slot) and not self._to_post.put(slot, self._abort):
                        self._drop(slot, "shutdown")
                except Exception as e:
                    self._drop(slot, "error")
                    self._fatal("infer", e)
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
                    self.publish_one(slot)
                except Exception as e:  # publish_one accounts frame errors; this is a bug
                    self._fatal("post", e)
        finally:
            self.finished.set()

    def _fatal(self, stage: str, exc: BaseException) -> None:
        """An unexpected error in a stage thread: record it and stop the pipeline."""
        log.error("pipeline: unexpected error in the %s stage", stage, exc_info=exc)
        if self.error is None:
            self.error = f"{stage} stage: {type(exc).__name__}: {exc}"
        self._stop.set()

    # -- one frame, one stage (the threads above, and the sequential benchmark) ----

    def read_frame(self) -> Any:
        """The next source frame (or None on timeout); counts frames the source skipped."""
        source = self.source
        before = source.skipped
        frame = source.read(_POLL_S)
        gap = source.skipped - before
        if self.max_frames:  # --frames N counts source frames, skipped ones included
            gap = min(gap, max(self.max_frames - self.stats.captured - (frame is not None), 0))
        self.stats.add_captured(int(frame is not None), gap)
        return frame

    def prepare(self, frame: Any) -> FrameSlot | None:
        """Take a slot of the current profile and preprocess ``frame`` into it.

        Returns None when the frame is not processed (ladder, error, shutdown).
        """
        profile = self._profile()
        if profile is None:
            self._drop(None, "ladder")
            return None
        # Try at least once: a frame read just before stop is still processed.
        slot = profile.pool.acquire(_POLL_S)
        while slot is None and not self._stop.is_set():
            slot = profile.pool.acquire(_POLL_S)
        if slot is None:
            self._drop(None, "shutdown")
            return None
        st = slot.stamps
        st[CAPTURED] = frame.capture_ns
        st[PRE_START] = time.monotonic_ns()
        slot.source = self.source.name
        slot.frame_id = frame.frame_id
        if frame.gt is not None:
            n = min(len(frame.gt), len(slot.gt))
            slot.gt[:n] = frame.gt[:n]
            slot.gt_count = n
        try:
            profile.model.preprocessor(frame.image, slot.tensor, slot.geo)
        except Exception:
            log.exception("pipeline: preprocessing failed for frame %d", frame.frame_id)
            self._drop(slot, "error")
            return None
        profile.model.backend.upload(slot.io)
        st[PRE_END] = time.monotonic_ns()
        return slot

    def infer_one(self, slot: FrameSlot) -> bool:
        """Admit and infer one frame; False if it was dropped (stale or error)."""
        now = time.monotonic_ns()
        if not self.monitor.admit(slot.stamps, now, slot.profile.name):
            self._drop(slot, "stale")
            return False
        slot.stamps[INFER_START] = now
        try:
            slot.profile.model.backend.infer(slot.io)
        except Exception as e:
            self._consecutive_errors += 1
            # One line per failure, not a traceback per frame: a broken backend can fail
            # hundreds of times a second.
            log.error("pipeline: inference failed for frame %d: %s", slot.frame_id, e)
            self._drop(slot, "error")
            if self._consecutive_errors >= self.max_consecutive_errors and not self.breaker.is_set():
                log.error("pipeline: %d inferences in a row failed: breaker open", self._consecutive_errors)
                self.breaker.set()
            return False
        self._consecutive_errors = 0
        slot.stamps[INFER_END] = time.monotonic_ns()
        return True

    def publish_one(self, slot: FrameSlot) -> None:
        """Decode, publish and account one frame, then give its slot back."""
        try:
            total = self._publish(slot)
        except Exception:
            log.exception("pipeline: postprocessing failed for frame %d", slot.frame_id)
            self._drop(slot, "error")
            return
        # Accounted only once the message is out, so a frame is never both sent and dropped.
        self._account(slot, total, time.monotonic_ns())
        slot.profile.pool.release(slot)

    def _publish(self, slot: FrameSlot) -> int:
        """Decode, build and send the result message; returns the end-to-end ns."""
        st = slot.stamps
        st[POST_START] = time.monotonic_ns()
        model = slot.profile.model
        xyxy, scores, classes = model.decode(slot.io.outputs[model.output_index], model.params)
        n = min(len(scores), len(slot.det_score))
        slot.det_xyxy[:n] = xyxy[:n]
        slot.det_score[:n] = scores[:n]
        slot.det_class[:n] = classes[:n]
        slot.det_count = n
        boxes_to_source(slot.det_xyxy[:n], slot.geo)
        st[POST_END] = time.monotonic_ns()
        message = self.builder.build(slot, self._seq, slot.profile.name)
        st[PUBLISH] = time.monotonic_ns()
        total = int(st[PUBLISH] - st[CAPTURED])
        message["latency_ms"] = self.builder.latencies(slot)
        message["deadline_missed"] = total > self.builder.budget_ns
        self.publisher.send(self.topic, self.publisher.encode(message))
        self._seq += 1
        return total

    def _account(self, slot: FrameSlot, total: int, end: int) -> None:
        st, stats = slot.stamps, self.stats
        stats.send.record(end - int(st[PUBLISH]))
        for i, hist in enumerate(stats.stages.values()):
            hist.record(int(st[i + 1] - st[i]))
        stats.total.record(total)
        stats.by_profile[slot.profile.name].record(total)
        stats.overhead.record(end - int(st[PRE_START]) - int(st[INFER_END] - st[INFER_START]))
        for part, ms in slot.profile.model.backend.timings(slot.io).items():
            stats.backend_part(part).record(int(ms * 1e6))
        stats.add_published(total, self.monitor.published(st, end, slot.profile.name))
