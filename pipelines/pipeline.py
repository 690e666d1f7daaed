"""The staged pipeline: capture+preprocess per source → batch scheduler → infer → postprocess+publish.

Frame N+1 is captured and preprocessed while frame N is inferred and frame N-1 is decoded
and published; OpenCV and ONNX Runtime release the GIL, so the stages overlap on separate
cores. Each stage is a class handed its collaborators: ``CaptureStage`` (a lane and the
scheduler), ``InferStage`` (the scheduler and the post stage), ``PostStage`` (the
publisher; the frame's lane runs its steps and accounts it). The pipeline builds
them, runs each on its own thread, stops them, and hands out its figures
(``figures``): it owns the threads and the stop, the stages do the work.

Several sources share one accelerator: each source is a *lane* (``lane.py``) with its own
capture thread, deadline monitor, counts, topic and sequence numbers, so a slow or dead
camera only stalls its own lane. The lanes meet in the batch scheduler (``scheduler.py``),
which orders frames by priority and deadline and forms batches across sources; one
inference thread runs them, and a postprocessing thread publishes every lane's frames
(or, for a model on the CPU, the inference thread itself while nothing is queued:
``stages.InferStage``). With a model on an accelerator and several sources there are two
post threads, each with every other lane (``post_threads``): a lane's frames stay one
thread's, in order.

Every frame a source produced ends exactly once: published (on time or late) or
dropped with a reason (see ``deadline.DROP_REASONS``).

Shutdown: ``stop`` ends capture; the scheduler and the post inboxes are closed behind the
last frame, so the frames in flight are drained and published before the threads exit.
An inference that does not return in time (a hung backend) is abandoned
(``InferStage.abandon``): every frame is accounted before ``stop`` returns.

Each stage thread stamps its progress on every loop turn (idle ones every poll), so the
owner can tell a stage that is stuck (inside a backend, a driver) from one that waits.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from edge_agent.core.budget_fit import BudgetFit
from edge_agent.core.deadline_config import BatchingConfig
from edge_agent.core.resilience_config import ResilienceConfig
from edge_agent.pipelines.figures import PipelineFigures
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.profile import prepare_profiles
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.scheduler import BatchScheduler
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.stages import (
    POLL_S,
    CaptureStage,
    Countdown,
    FrameQueue,
    InferStage,
    PostStage,
    StageControl,
)
from edge_agent.pipelines.steps.base import LaneStep

log = logging.getLogger(__name__)


def post_threads(lanes: list[Lane]) -> int:
    """Post threads: two when a model runs on an accelerator, several sources share it and
    the host has the cores; else one. With the model off the CPU the post stage's work is
    the host's largest (decoding, steps, the message): one thread becomes the bound of
    the cameras a device serves (docs/figures.md, "Cameras per device"), and two overlap
    what runs without the GIL (the compiled kernels, the send) and halve each one's queue.
    A model on the CPU keeps one: its inference wants the cores."""
    off_cpu = any(p.model.backend.off_cpu for lane in lanes for p in lane.profiles)
    return 2 if off_cpu and len(lanes) > 1 and (os.cpu_count() or 1) > 1 else 1


class Pipeline:
    def __init__(
        self,
        lanes: list[Lane],
        publisher: ZmqPublisher,
        batching: BatchingConfig,
        resilience: ResilienceConfig,
    ) -> None:
        """``batching``: how the scheduler batches; ``resilience``: when the breaker opens."""
        self._lanes = lanes
        self._control = StageControl(len(lanes))
        self.finished = self._control.finished  # set once the last frame has been published
        # Set by the inference thread when too many inferences in a row have failed: the
        # owner (the agent's supervisor) reloads, falls back, or gives up.
        self.breaker = threading.Event()
        self._max_batch = batching.max_batch
        self._scheduler = BatchScheduler(lanes, batching)
        n = post_threads(lanes)
        ended = Countdown(n, self._control.finished.set)
        inboxes = [FrameQueue("post" if i == 0 else f"post-{i}") for i in range(n)]
        self._posts = [PostStage(lanes, publisher, q, self._control, ended.done) for q in inboxes]
        self._infer = InferStage(lanes, self._scheduler, self._posts, self._control, resilience, self.breaker)
        self._captures = [CaptureStage(lane, self._scheduler, self._control) for lane in lanes]
        self._threads: list[threading.Thread] = []
        # By source, then step name, the state each step of a source had last in the run, kept
        # across reloads that turn it off or remove the source: a tracker turned on again
        # goes on with its ids, which never repeat in a run.
        self._last_steps: dict[str, dict[str, LaneStep]] = {}

    @property
    def error(self) -> str | None:
        """Why the run failed: a stage's unexpected error, every source failed, or the
        owner's verdict (it may set it)."""
        return self._control.error

    @error.setter
    def error(self, value: str | None) -> None:
        self._control.error = value

    def warm_up(self) -> None:
        """Allocate every buffer set the lanes need and warm up those not warmed yet, then
        seed the scheduler's estimates with the warm-up times. Runs inferences: call it
        before ``start``, while no other pipeline runs these models (a reload: after the
        drain)."""
        prepare_profiles([(lane.name, lane.profiles) for lane in self._lanes], self._max_batch)
        profiles = {p.name: p for lane in self._lanes for p in lane.profiles}
        for profile in profiles.values():
            for size, ns in profile.warm_ns.items():
                self._scheduler.seed(profile, size, ns)
                self._control.inferred(ns)

    def budget_advice(self, settings: dict[str, str]) -> list[str]:
        """Per source whose model's warm-up inference does not fit its budget: one line with
        the figures and the choices (``core.budget_fit``). ``settings``: by source, the key
        that sets its budget (its own ``budget_ms``, or ``deadline.budget_ms``)."""
        lines = []
        for lane in self._lanes:
            profile = lane.primary
            if 1 not in profile.warm_ns:
                continue
            fit = BudgetFit(profile.warm_ns[1] / 1e6, lane.monitor.config.budget_ms, lane.frame_period_ms())
            model = os.path.basename(profile.model.resolved.path)
            advice = fit.advice(f"source {lane.name}, model {model}", settings[lane.name])
            if advice:
                lines.append(advice)
        return lines

    def published(self) -> int:
        """Frames published so far, every source's (a cheap count to poll)."""
        return sum(lane.stats.published for lane in self._lanes)

    def figures(self, now_ns: int | None = None) -> PipelineFigures:
        """Every lane and the batching, frozen (``figures.py``), as of ``now_ns`` (None: now)."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        return PipelineFigures(tuple(lane.figures(now) for lane in self._lanes), self._scheduler.figures())

    def take_figures(self, now_ns: int) -> PipelineFigures:
        """``figures`` with what is handed out once, for the heartbeat: each lane's
        latencies since the last take and its oldest ladder change not yet reported
        (``Lane.take_figures``)."""
        lanes = tuple(lane.take_figures(now_ns) for lane in self._lanes)
        return PipelineFigures(lanes, self._scheduler.figures())

    def failure(self) -> str | None:
        """Why the run failed, if it did: the pipeline's error, or the sources that died
        while the others went on."""
        if self.error is not None:
            return self.error
        dead = [lane.error for lane in self._lanes if lane.error]
        return "; ".join(dead) if dead else None

    def adopt(self, old: Pipeline) -> None:
        """Continue where ``old`` stopped (a reload): per source, its sequence numbers,
        counts and steps' states (``Lane.adopt``); a source new in this config starts afresh
        (its steps after any state they had earlier in the run)."""
        previous = {lane.name: lane for lane in old._lanes}
        self._last_steps = {name: dict(steps) for name, steps in old._last_steps.items()}
        for lane in old._lanes:
            self._last_steps.setdefault(lane.name, {}).update((step.name, step) for step in lane.steps)
        for lane in self._lanes:
            lane.adopt(previous.get(lane.name), self._last_steps.get(lane.name, {}))
        self._scheduler.adopt(old._scheduler)

    # -- one frame on the caller's thread (the bench; the stage threads not running) ----

    def take_one(self, timeout_s: float = POLL_S) -> FrameSlot | None:
        """The first source's next frame, preprocessed into a frame slot as the capture
        stage does it (``slot.frame``: the source's frame, until its next read); None if
        none came within ``timeout_s`` or it was dropped. The slot goes on with
        ``run_one`` (its frame is counted as captured: only ``run_one`` ends it)."""
        return self._captures[0].next_slot(timeout_s)

    def run_one(self, slot: FrameSlot) -> bool:
        """Infer, decode and publish ``slot`` on this thread, as the inference stage does
        it; False if the frame was dropped (stale, or an error)."""
        return bool(self._infer.run_batch([slot], here=True))

    # -- the threads --------------------------------------------------------------------

    def start(self) -> None:
        stages = [(c.name, c.run) for c in self._captures]
        stages += [(self._infer.name, self._infer.run)] + [(p.name, p.run) for p in self._posts]
        now = time.monotonic_ns()
        for name, target in stages:
            self._control.progress[name] = now
            t = threading.Thread(target=target, name=name)
            t.start()
            self._threads.append(t)

    def threads(self) -> list[threading.Thread]:
        """The stage threads, by name (``capture-<source>``, ``infer``, ``post``): the
        bench reads their CPU time."""
        return list(self._threads)

    def stuck_stages(self, after_s: float) -> list[str]:
        """The stage threads still running that made no progress for ``after_s``: blocked
        in a backend or a driver (an idle stage polls, and so progresses). A model that
        legitimately takes longer (a CPU fallback of a large model) is given three times
        its slowest inference so far before it counts as stuck."""
        now = time.monotonic_ns()
        progress = self._control.progress
        limit = max(int(after_s * 1e9), 3 * self._control.slowest_ns)
        return [t.name for t in self._threads if t.is_alive() and now - progress.get(t.name, 0) > limit]

    def stop(self, timeout_s: float = 1.5) -> bool:
        """Stop capturing, drain the frames in flight, join; True if all threads ended.

        Takes at most ``timeout_s`` plus 0.6 s when a stage is stuck. An inference that is
        still running then is abandoned: every frame is accounted before this returns.
        """
        self._control.stop.set()
        self._join(timeout_s)
        alive = self.alive()
        if alive:
            # A stage is stuck (e.g. inside the backend): give up draining.
            log.warning("pipeline: %s did not drain in %.1f s; aborting", alive, timeout_s)
            self._control.abort.set()
            self._join(0.3)
            if self._infer.name in self.alive():
                self._infer.abandon()
                self._join(0.3)
            alive = self.alive()
            if alive:
                log.error("pipeline: threads still running after abort: %s", alive)
        return not alive

    def _join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def alive(self) -> list[str]:
        """The stage threads still running (after a stop: the stuck ones)."""
        return [t.name for t in self._threads if t.is_alive()]
