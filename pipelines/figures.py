"""What the pipeline shows of itself: the figures of every lane and of the batching, frozen
and taken at once (``Pipeline.figures``).

Metrics, the heartbeat, the CLI's summary, the bench, tune and the tools read only this;
the pipeline's lanes, scheduler and sources stay its own. Every histogram is a copy and
every mapping read-only, so a reader can keep them as long as it likes while the
frames go on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from edge_agent.core.latency import LatencyHistogram
from edge_agent.pipelines.deadline import DeadlineFigures, LadderChange
from edge_agent.pipelines.steps.base import StepFigures


def read_only(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only view of a copy of ``mapping``."""
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class Counts:
    """Every frame a source produced, by how it ended so far: ``captured`` == ``on_time`` +
    ``late`` + ``dropped`` + ``in_flight`` (in flight: 0 once the pipeline has drained)."""

    captured: int
    on_time: int
    late: int
    dropped: int
    in_flight: int
    dropped_by_reason: Mapping[str, int]  # by ``deadline.DROP_REASONS``

    @property
    def published(self) -> int:
        return self.on_time + self.late

    def as_dict(self) -> dict[str, Any]:
        """The counts as the heartbeat and the bench's result carry them."""
        return {
            "captured": self.captured,
            "on_time": self.on_time,
            "late": self.late,
            "dropped": self.dropped,
            "in_flight": self.in_flight,
            "dropped_by_reason": dict(self.dropped_by_reason),
        }


@dataclass(frozen=True)
class LaneFigures:
    """One source's lane: its counts, latency histograms (ns), source, deadline and ladder."""

    name: str
    priority: int
    counts: Counts
    stages: Mapping[str, LatencyHistogram]  # by ``core.stages.STAGES``
    total: LatencyHistogram  # capture to publish, per published frame
    send: LatencyHistogram  # encoding and socket send, after the publish stamp
    overhead: LatencyHistogram  # end to end minus the capture and inference stages
    by_profile: Mapping[str, LatencyHistogram]  # end to end, per model profile
    backend_parts: Mapping[str, LatencyHistogram]  # timed by the backend inside inference
    backend_counts: Mapping[str, int]  # counted by the backend, summed (rows dropped)
    source_state: Mapping[str, Any]  # the source's ``describe()``
    error: str | None  # why the source ended early, if it did
    lost: int  # frames a damaged input lost (files)
    damage: str  # what happened to them
    seq: int  # the next result's sequence number
    frame_period_ms: float | None  # a live source's frame interval; None for a file
    deadline: DeadlineFigures
    # By step name, in the steps' order: each per-frame step's figures (``steps.base``).
    steps: Mapping[str, StepFigures] = MappingProxyType({})
    # Handed out once, to the heartbeat (``Pipeline.take_figures``), else None: the
    # latencies since the last take, and the oldest ladder change not reported yet.
    window: LatencyHistogram | None = None
    change: LadderChange | None = None

    @property
    def published(self) -> int:
        return self.counts.published

    @property
    def tracking(self) -> Any:
        """Its tracker's figures (``steps.tracking.TrackingFigures``), if it tracks."""
        return self.steps.get("tracking")

    @property
    def analytics(self) -> Any:
        """Its zones' and lines' (``steps.analytics.AnalyticsFigures``), if it has any."""
        return self.steps.get("analytics")


@dataclass(frozen=True)
class BatchingFigures:
    """The scheduler's batches so far (across reloads)."""

    max_batch: int
    batches: int
    mean_size: float
    sizes: Mapping[str, int]  # batches run, by size (frames)
    # Latency mode: stale frames run anyway, their source's next one overdue or never to come.
    fresh_fallbacks: int

    def summary(self) -> dict[str, Any]:
        """As the heartbeat's ``batching`` section carries it."""
        return {
            "max_batch": self.max_batch,
            "batches": self.batches,
            "mean_size": self.mean_size,
            "sizes": dict(self.sizes),
        }


@dataclass(frozen=True)
class PipelineFigures:
    lanes: tuple[LaneFigures, ...]
    batching: BatchingFigures

    def lane(self, name: str) -> LaneFigures:
        """The lane of the source ``name``; KeyError if none."""
        for lane in self.lanes:
            if lane.name == name:
                return lane
        raise KeyError(name)

    @property
    def captured(self) -> int:
        return sum(lane.counts.captured for lane in self.lanes)

    @property
    def published(self) -> int:
        return sum(lane.published for lane in self.lanes)
