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
import os
import threading
import time

from edge_agent.core.budget_fit import BudgetFit
from edge_agent.pipelines.frame_steps import POLL_S, FrameSteps
from edge_agent.pipelines.handoff import Closed, FrameQueue, FrameSlot
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.profile import Profile, prepare_buffers
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.scheduler import BatchScheduler, LaneSpec
from edge_agent.pipelines.source_base import EndOfStream, Pacer, SourceError

log = logging.getLogger(__name__)


class Pipeline(FrameSteps):
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

    def budget_advice(self, settings: dict[str, str]) -> list[str]:
        """Per source whose model's warm-up inference does not fit its budget: one line with
        the figures and the choices (``core.budget_fit``). ``settings``: by source, the key
        that sets its budget (its own ``budget_ms``, or ``deadline.budget_ms``)."""
        lines = []
        for lane in self.lanes:
            profile = lane.primary
            if 1 not in profile.warm_ns:
                continue
            fit = BudgetFit(profile.warm_ns[1] / 1e6, lane.monitor.config.budget_ms, lane.frame_period_ms())
            model = os.path.basename(profile.model.resolved.path)
            advice = fit.advice(f"source {lane.name}, model {model}", settings[lane.name])
            if advice:
                lines.append(advice)
        return lines

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
        # The frame-rate cap: at most one read per period, the source's frames in between
        # skipped by the source (a camera's, counted as source_gap); a stop cuts a wait short.
        cap = Pacer(lane.max_fps, self._stop.wait)
        name = threading.current_thread().name
        try:
            while not self._stop.is_set():
                self._progress[name] = time.monotonic_ns()
                if self.max_frames and lane.stats.captured >= self.max_frames:
                    break
                if not read_ahead and not self.scheduler.wait_room(lane.index, POLL_S):
                    continue
                if cap.period_ns and cap.tick(POLL_S) is None:
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
                tap = lane.view_tap
                # Someone watches: this frame's pixels, if one is due and it goes on (not one
                # the ladder skips); the source's image stays valid until its next read.
                if slot is not None and tap is not None and tap.active:
                    tap.offer_pixels(frame)
                if slot is not None and not self.scheduler.put(lane.index, slot, self._abort):
                    self._drop(lane, slot, "shutdown")
        finally:
            self.scheduler.close(lane.index)

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
                    batch = self.scheduler.next_batch(POLL_S)
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
                    slot = self._to_post.get(POLL_S)
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

