"""A source's tracker in the frame path: ``SourceTracker`` (its lane's: the tracker, the
time between its frames, its cost) and ``TrackStep``, the post step that runs each
frame's lane's tracker between decoding and publishing.

Elapsed time is the difference of frame ids: a source numbers the frames it produced,
those it skipped included (a ladder stride, a frame dropped in front of inference, a live
camera's skipped frames), so the motion model predicts over the frames that passed, not
over one step.
"""

from __future__ import annotations

import logging
import time

from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.snapshot import TrackingSnapshot, frozen_copy
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

log = logging.getLogger(__name__)


class SourceTracker:
    """One source's tracker. Used by the thread that publishes its frames only (the post
    stage's or the inference thread's, never both at once); the heartbeat reads counts."""

    def __init__(self, config: TrackerConfig, model: str, restarts: int = 0) -> None:
        """Its ids start at 1: after a reload, ``Pipeline.adopt`` moves them on past every id
        the source had in the run."""
        self.config = config
        self.model = model  # the model it tracks the detections of: another one restarts it
        self.tracker = ByteTracker(config)
        self.restarts = restarts
        self.cost = LatencyHistogram()  # per frame, since it started
        # since the heartbeat last took it (a frame timed while it is taken may count in
        # neither: a figure, not an account)
        self.window = LatencyHistogram()
        self._last_frame = -1

    def run(self, slot: FrameSlot) -> None:
        t0 = time.perf_counter_ns()
        last, self._last_frame = self._last_frame, slot.frame_id
        dt = slot.frame_id - last if 0 <= last < slot.frame_id else 1
        n = slot.det_count
        self.tracker.update(
            slot.det_xyxy[:n],
            slot.det_score[:n],
            slot.det_class[:n],
            float(dt),
            slot.det_track,
            slot.det_track_age,
        )
        ns = time.perf_counter_ns() - t0
        self.cost.record(ns)
        self.window.record(ns)

    def carry_on(self, config: TrackerConfig, model: str, same_source: bool = True) -> SourceTracker:
        """This source's tracker for a new config (a reload): this one, tracks kept, when its
        settings, its model and its capture (``same_source``: the source kept running) are
        the same; else a new one (its ids go on: ``Pipeline.adopt``)."""
        if config == self.config and model == self.model and same_source:
            return self
        why = "its settings" if config != self.config else "its model" if model != self.model else "its input"
        log.info(
            "tracker restarted: %s changed; its %d tracks end, ids go on from %d",
            why,
            self.tracker.live,
            self.tracker.next_id,
        )
        return SourceTracker(config, model, self.restarts + 1)

    def snapshot(self, take: bool = False) -> TrackingSnapshot:
        """``take``: with the cost since the last take (the heartbeat's)."""
        t = self.tracker
        window = None
        if take:
            window, self.window = self.window, LatencyHistogram()
        tentative, tracked, lost = t.counts()
        return TrackingSnapshot(
            self.config.type,
            tentative + tracked + lost,
            tentative,
            tracked,
            lost,
            t.next_id - 1,
            t.overflow,
            self.restarts,
            frozen_copy(self.cost),
            window,
        )


class TrackStep:
    """The post step: the frame's source's tracker, if it has one."""

    def run(self, slot: FrameSlot, lane) -> None:
        tracker = lane.tracker
        if tracker is not None:
            tracker.run(slot)
