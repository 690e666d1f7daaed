"""The staged pipeline: capture+preprocess per source → batch scheduler → infer → postprocess+publish.

Frame N+1 is captured and preprocessed while frame N is inferred and frame N-1 is decoded
and published. Capture and preprocessing share a thread, as do postprocessing and
publishing: each pair is sub-millisecond, and a thread hand-off costs tens of
microseconds, so splitting them would add latency without adding throughput. OpenCV and
ONNX Runtime release the GIL, so the stages do overlap on separate cores.

The hand-offs are kept short where nothing is queued: while the post thread is idle and
no frame waits for inference, the inference thread postprocesses and publishes its frame
itself (the post thread would only have to be woken for it); and a capture thread that
has a frame wakes an idle inference thread before preprocessing it, so that the wake-up
(tens of microseconds from a long sleep, more on a virtual machine) overlaps the
preprocessing instead of following it.

Several sources share one accelerator: each source is a *lane* with its own capture
thread, deadline monitor, counts, topic and sequence numbers, so a slow or dead camera
only stalls its own lane. The lanes meet in the batch scheduler (``scheduler.py``),
which orders frames by priority and deadline and forms batches across sources; one
inference thread runs them, and one postprocessing thread publishes every lane's frames.

Every frame a source produced ends exactly once: published (on time or late) or
dropped with a reason (see ``deadline.DROP_REASONS``).

Shutdown: ``stop`` ends capture; the scheduler and the post queue are closed behind the
last frame, so the frames in flight are drained and published before the threads exit.
An inference that does not return in time (a hung backend) is abandoned: its frames and
those waiting for it are accounted as dropped (``shutdown``) at once, its buffers are
never reused, and whatever it returns later is discarded.

Each stage thread stamps its progress on every loop turn (idle ones every poll), so the
owner can tell a stage that is stuck (inside a backend, a driver) from one that waits.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stages import (
    CAPTURED,
    INFER_END,
    INFER_START,
    POST_END,
    POST_START,
    PRE_END,
    PRE_START,
    PUBLISH,
    STAGES,
)
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.deadline import DROP_REASONS, DeadlineMonitor
from edge_agent.pipelines.handoff import Closed, FrameQueue, FrameSlot, SlotPool
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.preprocess import boxes_to_source
from edge_agent.pipelines.publish import MessageBuilder, ZmqPublisher
from edge_agent.pipelines.scheduler import BatchScheduler, LaneSpec
from edge_agent.pipelines.source_base import BufferPolicy, EndOfStream, Source, SourceError

log = logging.getLogger(__name__)

#: Per source and model: capture+preprocess, the scheduler's cell, inference, the post
#: queue, postprocess: one slot each.
SLOTS = 5
_POLL_S = 0.1
_UNLIMITED = 1 << 30


@dataclass
class Profile:
    """A loaded model with its preallocated buffers: frame slots per source, and one
    input/output set per batch size for batches of several sources.

    The degradation ladder may switch models at a frame boundary; each frame carries the
    profile it was preprocessed for, so frames already in flight finish on their model.
    Buffers are kept across reloads that keep the model.
    """

    name: str
    model: LoadedModel
    pools: dict[str, SlotPool] = field(default_factory=dict)  # by source name
    batches: dict[int, IOSet] = field(default_factory=dict)  # by batch size (2 and up)
    warm_ns: dict[int, int] = field(default_factory=dict)  # last warm-up run, by batch size

    def pool(self, source: str, slots: int = SLOTS, max_gt: int = 64) -> SlotPool:
        """The source's frame slots, allocated (and the backend warmed up) on first use."""
        pool = self.pools.get(source)
        if pool is None:
            m = self.model
            made = [
                FrameSlot(i, m.backend.allocate(), m.input_name, m.params.max_detections, max_gt, self)
                for i in range(slots)
            ]
            if not self.pools:
                self.warm_ns[1] = _warm(m.backend, made[0].io)
            pool = self.pools[source] = SlotPool(made)
        return pool

    def batch_limit(self) -> int:
        """The largest batch the model runs (its fixed batch, or unlimited)."""
        n, _ = self.model.backend.batch_axis()
        return n or _UNLIMITED

    def prepare_batches(self, largest: int, warm: bool = True) -> None:
        """Allocate the sets for batches of 2..``largest`` frames (a model with a fixed batch
        axis gets one set of its size, which smaller batches pad) and, with ``warm``, warm
        up those not warmed yet; their times seed the scheduler's estimates."""
        backend = self.model.backend
        _, fixed = backend.batch_axis()
        for size in range(2, min(largest, self.batch_limit()) + 1):
            if size not in self.batches:
                shared = fixed and self.batches
                self.batches[size] = next(iter(self.batches.values())) if shared else backend.allocate(size)
            if warm and size not in self.warm_ns:
                io = self.batches[size]
                same = [ns for s, ns in self.warm_ns.items() if s > 1 and self.batches[s] is io]
                self.warm_ns[size] = same[0] if same else _warm(backend, io)

    def infer(self, slots: list[FrameSlot]) -> None:
        """Run one batch: a single frame on its own buffers, several through the batch set
        (inputs copied in, outputs and the backend's timings copied back to each frame)."""
        backend = self.model.backend
        if len(slots) == 1:
            backend.infer(slots[0].io)
            return
        io = self.batches[len(slots)]
        batch_in = io.inputs[self.model.input_name]
        for k, s in enumerate(slots):
            batch_in[k] = s.tensor[0]
        backend.infer(io)
        for o, out in enumerate(io.outputs):
            for k, s in enumerate(slots):
                s.io.outputs[o][0] = out[k]
        if io.extra:
            for s in slots:
                s.io.extra.update(io.extra)


def prepare_buffers(lanes: list[tuple[str, dict[str, Profile]]], max_batch: int, warm: bool = True) -> None:
    """Allocate every source's frame slots in each profile it may use, and each profile's
    batch sets up to the number of sources that use it (and ``max_batch``).

    ``warm``: also warm up batch sets not warmed yet. A reload prepares its buffers while
    the old pipeline still runs, with ``warm`` off for profiles that pipeline is using
    (one backend must not run two inferences at once); the new pipeline warms them after
    the drain.
    """
    users: dict[int, list[Any]] = {}
    for name, profiles in lanes:
        for p in {id(p): p for p in profiles.values()}.values():
            p.pool(name)
            users.setdefault(id(p), [p, 0])[1] += 1
    cap = min(max_batch or len(lanes), len(lanes))
    for p, n in users.values():
        p.prepare_batches(min(cap, n), warm)


def _warm(backend: Any, io: IOSet) -> int:
    """Warm ``io`` up; returns the last run's ns (a first estimate for the scheduler)."""
    backend.warmup(io, runs=2)
    t = time.monotonic_ns()
    backend.warmup(io, runs=1)
    return time.monotonic_ns() - t


class PipelineStats:
    """Frame counts and latency histograms.

    Counts change under one lock so that a snapshot (``counts``) is consistent while
    frames move: captured == on time + late + dropped + in flight, with in flight
    bounded by the number of frame slots. Each histogram has one writer at a time (the
    frame's histograms: the post thread, or the inference thread publishing while the
    post thread is idle; the post queue's claim keeps them apart).
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

    def add_captured(self, n: int = 1, gap: int = 0, stale: int = 0) -> None:
        """``n`` frames taken from the source, ``gap`` frames it skipped and ``stale`` ones
        it drained as too old (both dropped)."""
        with self._lock:
            self.captured += n + gap + stale
            self.dropped["source_gap"] += gap
            self.dropped["stale"] += stale

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


class Lane:
    """One source's share of the pipeline: its capture thread, deadline monitor (with its
    own budget and ladder), counts, result topic and sequence numbers."""

    def __init__(
        self,
        index: int,
        source: Source,
        profiles: dict[str, Profile],
        monitor: DeadlineMonitor,
        builder: MessageBuilder,
        topic: str,
        priority: int = 0,
        max_fps: float = 0.0,
    ) -> None:
        """``profiles``: by the ladder's model path, the lane's own model under ""."""
        self.index = index
        self.source = source
        self.name = source.name
        self.profiles = profiles
        self.primary = profiles[""]
        self.monitor = monitor
        self.builder = builder
        self.topic = f"{topic}.{source.name}".encode()
        self.priority = priority
        # A file (or an unpaced source) hands over every frame and waits for the pipeline:
        # each one is processed, late or not; the ladder never skips its frames.
        self.every_frame = source.policy is BufferPolicy.WAIT
        self.period_ns = int(1e9 / max_fps) if max_fps > 0 else 0
        self.stats = PipelineStats()
        for p in profiles.values():
            self.stats.by_profile.setdefault(p.name, LatencyHistogram())
        self.seq = 0
        self.stale_seen = source.stale  # the source's stale count already accounted
        self.error: str | None = None  # why the source ended early, if it did
        self._stride_count = 0
        self._next_read_ns = 0

    def current(self) -> Profile | None:
        """The profile of the ladder's current step (None at an alert-only step)."""
        step = self.monitor.current
        if not step.infer:
            return None
        return self.profiles.get(step.model, self.primary)  # the main model is under ""

    def profile(self) -> Profile | None:
        """The profile for the next frame, or None when it is not processed (ladder)."""
        step = self.monitor.current
        self._stride_count += 1
        if step.frame_stride > 1 and self._stride_count % step.frame_stride:
            return None
        return self.current()

    def around_ns(self) -> tuple[float, float]:
        """Estimated ns before the inference stage and after it, for the scheduler."""
        est = self.monitor.estimates(self.primary.name)
        return float(est[:2].sum()), float(est[INFER_END:PUBLISH].sum())

    def adopt(self, old: Lane) -> None:
        """Continue where ``old`` (the same source before a reload) stopped."""
        self.seq = old.seq
        # A file's ladder never steps: a camera's step is not carried over to it.
        if self.monitor.config == old.monitor.config and not self.every_frame:
            # Same deadline settings: the ladder's step, backoff and estimates carry over,
            # so a reload under overload does not start again from the top.
            self.monitor = old.monitor
        old.stats.by_profile.update(
            {k: v for k, v in self.stats.by_profile.items() if k not in old.stats.by_profile}
        )
        self.stats = old.stats


class Pipeline:
    def __init__(
        self,
        lanes: list[Lane],
        publisher: ZmqPublisher,
        max_frames: int = 0,
        max_consecutive_errors: int = 10,
        max_batch: int = 0,
        max_wait_ms: float = 4.0,
        margin_ms: float = 2.0,
    ) -> None:
        """``max_frames``: stop each source after that many frames (0: run on)."""
        self.lanes = lanes
        self.publisher = publisher
        self.max_frames = max_frames
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
        self._progress: dict[str, int] = {}  # by stage thread: monotonic ns of its last loop turn
        # The batch inside the backend now: stop() takes it over if the backend hangs.
        self._batch_lock = threading.Lock()
        self._running: list[FrameSlot] = []
        self._abandoned = False
        self.scheduler = BatchScheduler(
            [
                LaneSpec(
                    lane.name,
                    lane.priority,
                    lane.monitor.budget_ns,
                    not lane.every_frame,
                    self._overrun,
                    lane.around_ns,
                    lane.current,
                    lane.monitor.config.mode == "latency" and not lane.every_frame,
                    self._not_fresh,
                )
                for lane in lanes
            ],
            max_batch,
            max_wait_ms,
            margin_ms,
            Profile.batch_limit,
        )
        self._max_batch = max_batch
        self._slowest_ns = 0  # the longest inference run so far (warm-ups included)
        self._to_post = FrameQueue("post")

    def warm_up(self) -> None:
        """Allocate every buffer set the lanes need and warm up those not warmed yet, then
        seed the scheduler's estimates with the warm-up times. Runs inferences: call it
        before ``start``, while no other pipeline runs these models (a reload: after the
        drain)."""
        prepare_buffers([(lane.name, lane.profiles) for lane in self.lanes], self._max_batch)
        for profile in self.profiles.values():
            for size, ns in profile.warm_ns.items():
                self.scheduler.seed(profile, size, ns)
                self._slowest_ns = max(self._slowest_ns, ns)

    @property
    def profiles(self) -> dict[str, Profile]:
        """Every profile of every lane, by name."""
        return {p.name: p for lane in self.lanes for p in lane.profiles.values()}

    def published(self) -> int:
        return sum(lane.stats.published for lane in self.lanes)

    def failure(self) -> str | None:
        """Why the run failed, if it did: the pipeline's error, or the sources that died
        while the others went on."""
        if self.error is not None:
            return self.error
        dead = [lane.error for lane in self.lanes if lane.error]
        return "; ".join(dead) if dead else None

    def adopt(self, old: Pipeline) -> None:
        """Continue where ``old`` stopped (a reload): per source, its sequence numbers and
        counts; a source new in this config starts afresh."""
        previous = {lane.name: lane for lane in old.lanes}
        for lane in self.lanes:
            if lane.name in previous:
                lane.adopt(previous[lane.name])
        self.scheduler.adopt(old.scheduler)

    def start(self) -> None:
        stages = [(f"capture-{lane.name}", self._capture, (lane,)) for lane in self.lanes]
        stages += [("infer", self._infer, ()), ("post", self._post, ())]
        now = time.monotonic_ns()
        for name, target, args in stages:
            self._progress[name] = now
            t = threading.Thread(target=target, args=args, name=name)
            t.start()
            self._threads.append(t)

    def stuck_stages(self, after_s: float) -> list[str]:
        """The stage threads still running that made no progress for ``after_s``: blocked
        in a backend or a driver (an idle stage polls, and so progresses). A model that
        legitimately takes longer (a CPU fallback of a large model) is given three times
        its slowest inference so far before it counts as stuck."""
        now = time.monotonic_ns()
        limit = max(int(after_s * 1e9), 3 * self._slowest_ns)
        return [t.name for t in self._threads if t.is_alive() and now - self._progress.get(t.name, 0) > limit]

    def stop(self, timeout_s: float = 1.5) -> bool:
        """Stop capturing, drain the frames in flight, join; True if all threads ended.

        Takes at most ``timeout_s`` plus 0.6 s when a stage is stuck. An inference that is
        still running then is abandoned: every frame is accounted before this returns.
        """
        self._stop.set()
        self._join(timeout_s)
        alive = self.alive()
        if alive:
            # A stage is stuck (e.g. inside the backend): give up draining.
            log.warning("pipeline: %s did not drain in %.1f s; aborting", alive, timeout_s)
            self._abort.set()
            self._join(0.3)
            if "infer" in self.alive():
                self._abandon()
                self._join(0.3)
            alive = self.alive()
            if alive:
                log.error("pipeline: threads still running after abort: %s", alive)
        return not alive

    def _join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _abandon(self) -> None:
        """The inference thread is stuck in the backend: account its batch and every frame
        waiting for it as dropped now, and let the post thread finish what it has."""
        with self._batch_lock:
            self._abandoned = True
            stuck, self._running = self._running, []
        for slot in stuck:
            # Counted, but the slot stays out of its pool: the backend may still write to
            # its buffers, and a reload's pipeline may share the pool.
            self._drop(self.lanes[slot.lane], None, "shutdown")
        waiting = self.scheduler.drain()
        for slot in waiting:
            self._drop(self.lanes[slot.lane], slot, "shutdown")
        self._to_post.close()
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

    def alive(self) -> list[str]:
        """The stage threads still running (after a stop: the stuck ones)."""
        return [t.name for t in self._threads if t.is_alive()]

    # -- accounting ---------------------------------------------------------------

    def _drop(self, lane: Lane, slot: FrameSlot | None, reason: str) -> None:
        lane.stats.drop(reason)
        lane.monitor.dropped(reason, time.monotonic_ns())
        if slot is not None:
            slot.pool.release(slot)  # type: ignore[union-attr]

    def _overrun(self, slot: FrameSlot) -> None:
        self._drop(self.lanes[slot.lane], slot, "overrun")

    def _not_fresh(self, slot: FrameSlot) -> None:
        self._drop(self.lanes[slot.lane], slot, "not_fresh")

    # -- stages -------------------------------------------------------------------

    def _capture(self, lane: Lane) -> None:
        source = lane.source
        # A file source is read only once the previous frame has been taken by the
        # scheduler: reading ahead would not raise throughput (one frame already waits)
        # but would age every frame by a whole inference time.
        read_ahead = not lane.every_frame
        name = threading.current_thread().name
        try:
            while not self._stop.is_set():
                self._progress[name] = time.monotonic_ns()
                if self.max_frames and lane.stats.captured >= self.max_frames:
                    break
                if not read_ahead and not self.scheduler.wait_room(lane.index, _POLL_S):
                    continue
                if lane.period_ns and not self._pace(lane):
                    continue
                try:
                    frame = self.read_frame(lane)
                except EndOfStream:
                    break
                except SourceError as e:
                    self._source_failed(lane, f"source {source.name}: {e}")
                    break
                except Exception as e:  # a bug or a driver error: fail loudly, not silently
                    self._fatal(f"capture ({source.name})", e)
                    break
                if frame is None:
                    continue
                self.scheduler.expect()  # the inference thread wakes while we preprocess
                slot = self.prepare(frame, lane)
                if slot is not None and not self.scheduler.put(lane.index, slot, self._abort):
                    self._drop(lane, slot, "shutdown")
        finally:
            self.scheduler.close(lane.index)

    def _pace(self, lane: Lane) -> bool:
        """The frame-rate cap: wait for the lane's next read time; False if that is more
        than a poll away (the loop comes back). A live source's frames in between are
        skipped by the source and counted as ``source_gap``."""
        now = time.monotonic_ns()
        if lane._next_read_ns > now:
            wait = (lane._next_read_ns - now) / 1e9
            if wait > _POLL_S:
                self._stop.wait(_POLL_S)
                return False
            if self._stop.wait(wait):
                return False
        # No catching up after a stall: at most one frame per period from now on.
        period = lane.period_ns
        lane._next_read_ns = max(lane._next_read_ns + period, time.monotonic_ns() - period // 2)
        return True

    def _source_failed(self, lane: Lane, error: str) -> None:
        lane.error = error
        log.error("%s", error)
        # One dead source does not stop the others; when none is left, the pipeline fails.
        if all(other.error for other in self.lanes) and self.error is None:
            self.error = error if len(self.lanes) == 1 else "every source failed: " + error

    def _infer(self) -> None:
        try:
            while True:
                self._progress["infer"] = time.monotonic_ns()
                try:
                    batch = self.scheduler.next_batch(_POLL_S)
                    if batch is None:
                        continue
                    self.infer_batch(batch, self._hand_on)
                except Closed:
                    break
                except Exception as e:  # a bug: stop; frames still waiting are accounted
                    self._fatal("infer", e)
                    for slot in self.scheduler.drain():
                        self._drop(self.lanes[slot.lane], slot, "error")
                    break
        finally:
            self._to_post.close()

    def _hand_on(self, batch: list[FrameSlot]) -> None:
        """Inferred frames on to postprocessing. While the post thread is idle and no frame
        waits for inference, this thread postprocesses and publishes a frame itself: a
        hand-off to a sleeping thread costs tens of microseconds (more on a virtual
        machine) and this thread would only wait meanwhile. Otherwise the post queue
        takes it, and inference goes on with the next batch."""
        for slot in batch:
            if self.scheduler.empty() and self._to_post.claim():
                try:
                    self._publish_or_fail(slot)
                finally:
                    self._to_post.unclaim()
            elif not self._to_post.put(slot):  # stop() gave up on this thread meanwhile
                self._drop(self.lanes[slot.lane], slot, "shutdown")

    def _post(self) -> None:
        try:
            while True:
                self._progress["post"] = time.monotonic_ns()
                try:
                    slot = self._to_post.get(_POLL_S)
                except Closed:
                    break
                if slot is None:
                    continue
                self._publish_or_fail(slot)
        finally:
            self.finished.set()

    def _publish_or_fail(self, slot: FrameSlot) -> None:
        """``publish_one``, on the post thread or inline on the inference thread."""
        try:
            self.publish_one(slot)
        except Exception as e:  # publish_one accounts frame errors; this is a bug
            self._fatal("post", e)

    def _fatal(self, stage: str, exc: BaseException) -> None:
        """An unexpected error in a stage thread: record it and stop the pipeline."""
        log.error("pipeline: unexpected error in the %s stage", stage, exc_info=exc)
        if self.error is None:
            self.error = f"{stage} stage: {type(exc).__name__}: {exc}"
        self._stop.set()

    # -- one frame, one stage (the threads above, and the sequential benchmark) ----

    def read_frame(self, lane: Lane | None = None) -> Any:
        """The next source frame (or None on timeout); counts frames the source skipped."""
        lane = lane or self.lanes[0]
        source = lane.source
        before = source.skipped
        frame = source.read(_POLL_S)
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
        slot = pool.acquire(_POLL_S)
        while slot is None and not self._stop.is_set():
            slot = pool.acquire(_POLL_S)
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
            if not self._took_back():
                return []  # abandoned by stop() meanwhile: already accounted
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
