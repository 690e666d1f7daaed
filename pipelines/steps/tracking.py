"""The tracker step: each frame's detections get their source's track ids (ByteTrack,
``tracking/bytetrack.py``) between decoding and publishing.

Elapsed time is the difference of frame ids: a source numbers the frames it produced,
those it skipped included (a ladder stride, a frame dropped in front of inference, a live
camera's skipped frames), so the motion model predicts over the frames that passed, not
over one step.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.steps.base import LaneStep, Step, StepContext, figures_dict
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackingFigures:
    """A source's tracker as the heartbeat shows it."""

    type: str
    live: int  # tracks held now: tentative + tracked + lost
    tentative: int
    tracked: int
    lost: int
    ids_issued: int  # confirmed tracks so far this run (the last id given)
    overflow: int  # new tracks refused by max_tracks
    restarts: int  # settings changed at a reload
    journey_links: int  # new tracks that continued a lost one's journey
    compiled: bool  # its frames run the compiled kernels (false: numpy; jit.state() says why)
    cost: LatencyHistogram  # per frame
    window: LatencyHistogram | None = None  # per frame since the last take (the heartbeat's)

    def as_dict(self) -> dict:
        return figures_dict(self)


class SourceTracker(Step):
    """One source's tracker. Its ids travel in the detections; a frame in which a track
    continues another's journey says so in the message (``tracking.journeys``)."""

    name = "tracking"

    def __init__(self, config: TrackerConfig, model: str) -> None:
        """Its ids start at 1; a reload's ``adopt`` moves them on past every id the source
        had in the run."""
        super().__init__()
        self.config = config
        self.model = model  # the model it tracks the detections of: another one restarts it
        self.tracker = ByteTracker(config)
        self.restarts = 0
        self._last_frame = -1
        self._journeys: dict | None = None  # the frame's block, when it has linked tracks
        self._linked = np.zeros(0, bool)  # scratch: which detections' tracks are linked
        if config.journeys:
            self.message_block = self._journey_block

    def run(self, slot: Any) -> None:
        t0 = time.perf_counter_ns()
        last, self._last_frame = self._last_frame, slot.frame_id
        dt = slot.frame_id - last if 0 <= last < slot.frame_id else 1
        n = slot.det_count
        geo = slot.geo
        view = self.tracker.view
        if view is None or view[0] != geo.src_w or view[1] != geo.src_h:
            self.tracker.view = (float(geo.src_w), float(geo.src_h))
        self.tracker.update(
            slot.det_xyxy[:n],
            slot.det_score[:n],
            slot.det_class[:n],
            float(dt),
            slot.det_track,
            slot.det_track_age,
            slot.det_journey,
        )
        self._journeys = None
        if self.tracker.links:  # none until a first link: no work per frame
            if n > len(self._linked):  # grows once, to the most detections a frame had
                self._linked = np.zeros(n, bool)
            linked = self._linked[:n]
            np.not_equal(slot.det_journey[:n], slot.det_track[:n], out=linked)
            if linked.any():  # (a frame with a linked track: its block is made)
                rows = linked.nonzero()[0]
                ids, journeys = slot.det_track[rows].tolist(), slot.det_journey[rows].tolist()
                self._journeys = {"journeys": {str(i): j for i, j in zip(ids, journeys)}}
        self.timing.record(time.perf_counter_ns() - t0)

    def _journey_block(self) -> dict | None:
        return self._journeys

    def adopt(self, last: LaneStep, continuous: bool, same_source: bool) -> LaneStep:
        """``last`` itself, tracks kept, when it ran until now with the same settings,
        model and capture; else this new one, its ids going on after ``last``'s."""
        assert isinstance(last, SourceTracker)
        if continuous and same_source and last.config == self.config and last.model == self.model:
            return last
        self.tracker.next_id = max(self.tracker.next_id, last.tracker.next_id)
        if continuous:
            self.restarts = last.restarts + 1
            why = (
                "its settings"
                if last.config != self.config
                else "its model"
                if last.model != self.model
                else "its input"
            )
            log.info(
                "tracker restarted: %s changed; its %d tracks end, ids go on from %d",
                why,
                last.tracker.live,
                self.tracker.next_id,
            )
        return self

    def to_view(self, frame: Any, slot: Any) -> None:
        n = frame.det_count
        frame.det_track[:n] = slot.det_track[:n]

    def figures_of(self, cost: LatencyHistogram, window: LatencyHistogram | None) -> TrackingFigures:
        t = self.tracker
        tentative, tracked, lost = t.counts()
        return TrackingFigures(
            self.config.type,
            tentative + tracked + lost,
            tentative,
            tracked,
            lost,
            t.next_id - 1,
            t.overflow,
            self.restarts,
            t.links,
            t.compiled,
            cost,
            window,
        )


class Tracking:
    """The plug-in: a tracker for each source whose ``tracker.enabled`` is on."""

    name = "tracking"
    order = 10

    def build(self, ctx: StepContext) -> SourceTracker | None:
        cfg = ctx.source.tracker
        return SourceTracker(cfg, ctx.model) if cfg.enabled else None


STEP = Tracking()
