"""One source's lane through the pipeline: its source, the profiles it may run (the
degradation ladder switches among them), its deadline monitor, message builder and stats."""

from __future__ import annotations

import logging

from edge_agent.core.budget_fit import DEFAULT_CAMERA_FPS
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stages import (
    INFER_END,
    PUBLISH,
)
from edge_agent.pipelines.deadline import DeadlineMonitor
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.publish import MessageBuilder
from edge_agent.pipelines.source_base import BufferPolicy, Source
from edge_agent.pipelines.stats import PipelineStats
from edge_agent.pipelines.view_tap import ViewTap

log = logging.getLogger(__name__)

#: Per source and model: capture+preprocess, the scheduler's cell, inference, the post
#: queue, postprocess: one slot each.


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
        monitor.fixed = self.every_frame
        self.max_fps = max_fps
        self.stats = PipelineStats()
        for p in profiles.values():
            self.stats.by_profile.setdefault(p.name, LatencyHistogram())
        self.seq = 0
        self.view_tap: ViewTap | None = None  # the live view's, when enabled
        self.stale_seen = source.stale  # the source's stale count already accounted
        self.error: str | None = None  # why the source ended early, if it did
        self._stride_count = 0

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
            # so a reload under overload does not start again from the top. (The old lane
            # may have been a file's, whose frames never stepped it: this one's do.)
            self.monitor = old.monitor
            self.monitor.fixed = False
        old.stats.by_profile.update(
            {k: v for k, v in self.stats.by_profile.items() if k not in old.stats.by_profile}
        )
        self.stats = old.stats
