"""Per-source accounting: every frame captured ends exactly once (published on time, late,
or dropped with its reason), with latency histograms per stage and end to end."""

from __future__ import annotations

import logging
import threading

import numpy as np

from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stages import CAPTURED, INFER_END, INFER_START, PRE_START, PUBLISH, STAGES
from edge_agent.pipelines.deadline import DROP_REASONS
from edge_agent.pipelines.snapshot import Counts, read_only

log = logging.getLogger(__name__)


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

    def record(self, stamps: np.ndarray, end_ns: int, profile: str, backend_ms: dict[str, float]) -> None:
        """A published frame's latencies: its stages, end to end (``profile``: its model's),
        the send (publish stamp to ``end_ns``), the agent's overhead, and the parts the
        backend timed (``backend_ms``)."""
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
        with self._lock:
            window, self.window = self.window, LatencyHistogram()
        return window
