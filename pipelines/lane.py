"""One source's lane through the pipeline: its source, the models it may run (the
degradation ladder switches among them), its deadline monitor, message builder, counts and
sequence numbers.

What the stages ask of a source goes through its lane: its next frame (``take``), and how
each frame ended (``drop``, ``published``). The batch scheduler reads a lane as a
``scheduler.SchedulerLane``. Every frame a source produced ends exactly once, here:
published (on time or late) or dropped with a reason; ``LaneStats`` keeps the counts and
latency histograms.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import numpy as np

from edge_agent.core.budget_fit import DEFAULT_CAMERA_FPS
from edge_agent.core.deadline_config import LadderStep
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stamps import CAPTURED, INFER_END, INFER_START, PRE_START, PUBLISH, STAGES
from edge_agent.pipelines.deadline import DROP_REASONS, DeadlineMonitor
from edge_agent.pipelines.figures import Counts, LaneFigures, read_only
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.sources.base import BufferPolicy, Source, SourceFrame
from edge_agent.pipelines.steps.base import LaneStep
from edge_agent.pipelines.view_tap import ViewTap

log = logging.getLogger(__name__)


class LaneStats:
    """Frame counts and latency histograms.

    Counts change under one lock so that their figures (``counts``) are consistent while
    frames move: captured == on time + late + dropped + in flight, with in flight
    bounded by the number of frame slots. A histogram's records and takes are its own
    (``LatencyHistogram`` locks them); the frame's histograms have one writer at a time
    anyway (the post thread, or the inference thread publishing while the post thread is
    idle; the post queue's claim keeps them apart).
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
        # What the backend counted in its inferences, summed (``InferenceBackend.counts``:
        # rows past MAX_ROWS dropped).
        self.backend_counts: dict[str, int] = {}
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

    def record(
        self,
        stamps: np.ndarray,
        end_ns: int,
        profile: str,
        backend_ms: dict[str, float],
        backend_counts: dict[str, int],
    ) -> None:
        """A published frame's latencies: its stages, end to end (``profile``: its model's),
        the send (publish stamp to ``end_ns``), the agent's overhead, and the parts the
        backend timed (``backend_ms``); and what the backend counted (``backend_counts``)."""
        st = stamps
        total = int(st[PUBLISH] - st[CAPTURED])
        self.send.record(end_ns - int(st[PUBLISH]))
        for i, hist in enumerate(self.stages.values()):
            hist.record(int(st[i + 1] - st[i]))
        self.total.record(total)
        self.by_profile[profile].record(total)
        self.overhead.record(end_ns - int(st[PRE_START]) - int(st[INFER_END] - st[INFER_START]))
        for part, ms in backend_ms.items():
            self.backend_part(part).record(int(ms * 1e6))
        for name, n in backend_counts.items():
            if n:
                self.backend_counts[name] = self.backend_counts.get(name, 0) + n

    def add_published(self, total_ns: int, late: bool) -> None:
        with self._lock:
            self.published += 1
            self.late += late
            self.window.record(total_ns)

    def dropped_total(self) -> int:
        with self._lock:
            return sum(self.dropped.values())

    def counts(self) -> Counts:
        with self._lock:
            dropped = dict(self.dropped)
            captured, published, late = self.captured, self.published, self.late
        n_dropped = sum(dropped.values())
        return Counts(
            captured=captured,
            on_time=published - late,
            late=late,
            dropped=n_dropped,
            in_flight=captured - published - n_dropped,
            dropped_by_reason=read_only(dropped),
        )

    def backend_part(self, name: str) -> LatencyHistogram:
        hist = self.backend_parts.get(name)
        if hist is None:
            hist = self.backend_parts[name] = LatencyHistogram()
        return hist

    def take_window(self) -> LatencyHistogram:
        return self.window.take()


class Lane:
    """One source's share of the pipeline: its deadline monitor (with its own budget and
    ladder), counts, result topic and sequence numbers."""

    def __init__(
        self,
        index: int,
        source: Source,
        primary: Profile,
        ladder: Mapping[str, Profile],
        monitor: DeadlineMonitor,
        builder: MessageBuilder,
        topic: str,
        priority: int = 0,
        max_fps: float = 0.0,
        max_frames: int = 0,
    ) -> None:
        """``primary``: the source's own model's profile; ``ladder``: by model path, the
        profiles the ladder's model steps may switch it to (none for a source with a model
        of its own). ``max_frames``: the source ends after that many frames (0: it runs on)."""
        self.index = index
        self.source = source
        self.name = source.name
        self.primary = primary
        self.ladder = ladder
        # Every profile it may run, the primary first (each once).
        self.profiles: tuple[Profile, ...] = tuple({id(p): p for p in (primary, *ladder.values())}.values())
        self.monitor = monitor
        self.builder = builder
        self.topic = f"{topic}.{source.name}".encode()
        self.priority = priority
        # A file (or an unpaced source) hands over every frame and waits for the pipeline:
        # each one is processed, late or not; the ladder never skips its frames.
        self.every_frame = source.policy is BufferPolicy.WAIT
        monitor.fixed = self.every_frame
        # What the scheduler reads (``SchedulerLane``): a live source's newer frame replaces
        # its waiting one, and in latency mode its stale frames are passed over.
        self.newest_wins = not self.every_frame
        self.budget_ns = monitor.budget_ns
        self.fresh_only = monitor.config.mode == "latency" and self.newest_wins
        self.max_fps = max_fps
        self.max_frames = max_frames
        self.stats = LaneStats()
        for p in self.profiles:
            self.stats.by_profile.setdefault(p.name, LatencyHistogram())
        self.seq = 0
        self.view_tap: ViewTap | None = None  # the live view's, when enabled
        # Its per-frame steps, in order (``pipelines/steps``: a tracker, analytics, ...), and
        # those that add a block to the result message (``set_steps``).
        self.steps: tuple[LaneStep, ...] = ()
        self.blocks: tuple[LaneStep, ...] = ()
        self.keeps_pixels = False  # each frame's image copied into its slot (for a step)
        self.error: str | None = None  # why the source ended early, if it did
        self._stale_seen = source.stale  # the source's stale count already accounted
        self._stride_count = 0

    def set_steps(self, steps: tuple[LaneStep, ...]) -> None:
        """Run ``steps`` on its frames (before the first frame, or at a reload's ``adopt``)."""
        self.steps = steps
        self.blocks = tuple(step for step in steps if step.message_block is not None)
        # A step reads each frame's image after the source's next read (event snapshots).
        self.keeps_pixels = any(step.keeps_pixels for step in steps)

    # -- the capture stage ------------------------------------------------------------

    def done(self) -> bool:
        """The source produced its ``max_frames``."""
        return bool(self.max_frames) and self.stats.captured >= self.max_frames

    def take(self, timeout_s: float) -> tuple[SourceFrame, Profile] | None:
        """The source's next frame and the profile the ladder picks for it (whose buffers
        take it into a slot: ``SlotPool.take``); None when no frame came within
        ``timeout_s``, or the ladder skips the frame (accounted as a drop). ``frame`` holds
        the source's image until its next read.

        Counts the frames the source skipped or drained as stale. Raises what the source's
        ``read`` raises (``EndOfStream``, ``SourceError``).
        """
        frame = self._read(timeout_s)
        if frame is None:
            return None
        _, step = self.monitor.rung
        self._stride_count += 1
        skipped = step.frame_stride > 1 and self._stride_count % step.frame_stride
        profile = None if skipped else self._profile_of(step)
        if profile is None:  # a ladder stride's skipped frame, or an alert-only step
            self.drop(None, "ladder")
            return None
        return frame, profile

    def _read(self, timeout_s: float) -> SourceFrame | None:
        """The source's next frame (None on timeout), counting the frames it skipped."""
        source = self.source
        before = source.skipped
        frame = source.read(timeout_s)
        gap = source.skipped - before
        # A camera's reader drains stale frames on its own thread, whenever it reconnects.
        drained = source.stale
        stale, self._stale_seen = drained - self._stale_seen, drained
        if self.max_frames:  # --frames N counts source frames, skipped ones included
            room = max(self.max_frames - self.stats.captured - (frame is not None), 0)
            gap = min(gap, room)
            stale = min(stale, room - gap)
        self.stats.add_captured(int(frame is not None), gap, stale)
        return frame

    # -- how a frame ended ------------------------------------------------------------

    def drop(self, slot: FrameSlot | None, reason: str) -> None:
        """A frame that will never be published (``deadline.DROP_REASONS``); its slot, if
        any, goes back to its pool (None: none taken, or one that must stay out of it)."""
        self.stats.drop(reason)
        self.monitor.dropped(reason, time.monotonic_ns())
        if slot is not None:
            slot.pool.release(slot)  # type: ignore[union-attr]

    def published(self, slot: FrameSlot, end_ns: int) -> None:
        """A frame whose result went out (``end_ns``: after the send): its latencies, its
        deadline outcome, and its slot back to its pool."""
        st, stats = slot.stamps, self.stats
        profile = slot.profile
        name = profile.name
        backend = profile.model.backend
        stats.record(st, end_ns, name, backend.timings(slot.io), backend.counts(slot.io))
        stats.add_published(int(st[PUBLISH] - st[CAPTURED]), self.monitor.published(st, end_ns, name))
        slot.pool.release(slot)  # type: ignore[union-attr]

    # -- the scheduler ----------------------------------------------------------------

    def current(self) -> Profile | None:
        """The profile of the ladder's current step (None at an alert-only step): its
        model's, or the source's own when the step names none or one this source does not
        switch to."""
        return self._profile_of(self.monitor.rung[1])

    def _profile_of(self, step: LadderStep) -> Profile | None:
        return self.ladder.get(step.model, self.primary) if step.infer else None

    def around_ns(self) -> tuple[float, float]:
        """Estimated ns before the inference stage and after it, for the scheduler."""
        est = self.monitor.estimates(self.primary.name)
        return float(est[:2].sum()), float(est[INFER_END:PUBLISH].sum())

    # -- the owner --------------------------------------------------------------------

    def frame_period_ms(self) -> float | None:
        """The interval between this live source's frames (its rate, capped by ``max_fps``;
        a camera that has not said its rate yet: ``DEFAULT_CAMERA_FPS``); None when every
        frame is processed (a file)."""
        if self.every_frame:
            return None
        fps = self.source.describe().get("fps") or DEFAULT_CAMERA_FPS
        if self.max_fps:
            fps = min(fps, self.max_fps)
        return 1000.0 / fps

    def adopt(self, old: Lane | None, last_steps: dict[str, LaneStep]) -> None:
        """Continue where ``old`` (the same source before a reload; None: it had no lane
        there) stopped; ``last_steps``: by name, the state each step of this source had
        last in the run (a step it had before but not in ``old`` included)."""
        running = {step.name for step in old.steps} if old is not None else set()
        same_source = old is not None and self.source is old.source  # not reopened
        self.set_steps(
            tuple(
                step.adopt(last_steps[step.name], step.name in running, same_source)
                if step.name in last_steps
                else step
                for step in self.steps
            )
        )
        if old is None:
            return
        self.seq = old.seq
        # A file's ladder never steps: a camera's step is not carried over to it.
        if self.monitor.config == old.monitor.config and not self.every_frame:
            # Same deadline settings: the ladder's step, backoff and estimates carry over,
            # so a reload under overload does not start again from the top. (The old lane
            # may have been a file's, whose frames never stepped it: this one's do.)
            self.monitor = old.monitor
            self.monitor.fixed = False
        old.stats.by_profile.update(
            {k: v for k, v in self.stats.by_profile.items() if k not in old.stats.by_profile}
        )
        self.stats = old.stats

    def figures(self, now_ns: int) -> LaneFigures:
        """The lane at ``now_ns``.

        Not one instant: the counts are consistent among themselves (taken under the
        stats' lock: captured == on time + late + dropped + in flight), but the histograms
        and the steps' figures are copied after them, each whole (its own lock) but not all
        at one instant: stopping the frames for that would cost each frame, so a histogram
        may hold a frame or two that the counts do not yet. A figure beside an account."""
        return self._figures(now_ns, False)

    def take_figures(self, now_ns: int) -> LaneFigures:
        """``figures`` with what is handed out once (the heartbeat's): the latencies since
        the last take (the lane's and its steps') and the oldest ladder change not yet
        reported."""
        return self._figures(now_ns, True)

    def _figures(self, now_ns: int, take: bool) -> LaneFigures:
        stats, source = self.stats, self.source
        return LaneFigures(
            name=self.name,
            priority=self.priority,
            counts=stats.counts(),
            stages=read_only({k: h.copy() for k, h in stats.stages.items()}),
            total=stats.total.copy(),
            send=stats.send.copy(),
            overhead=stats.overhead.copy(),
            by_profile=read_only({k: h.copy() for k, h in list(stats.by_profile.items())}),
            backend_parts=read_only({k: h.copy() for k, h in list(stats.backend_parts.items())}),
            backend_counts=read_only(stats.backend_counts),
            source_state=read_only(source.describe()),
            error=self.error,
            lost=source.lost,
            damage=source.damage,
            seq=self.seq,
            frame_period_ms=self.frame_period_ms(),
            deadline=self.monitor.figures(now_ns),
            steps=read_only({s.name: s.take_figures() if take else s.figures() for s in self.steps}),
            window=stats.take_window() if take else None,
            change=self.monitor.take_change() if take else None,
        )
