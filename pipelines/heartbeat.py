"""The heartbeat: one ``health`` message a second per source, with any ladder change.

The heartbeat comes from its own thread, not from the frame path, so a stalled pipeline
still reports (with fps 0 and growing drop counts) instead of going silent. With several
sources, each has its own message (its ``source`` field says which) with its own counts,
latencies, deadline and ladder; all carry the shared batch scheduler's figures. Each beat
reads the pipeline's figures once (``Pipeline.figures``), taking what is handed out once:
the latencies since the last beat and the ladder's changes.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

from edge_agent import __version__
from edge_agent.core import resources
from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.stamps import STAGES
from edge_agent.pipelines.figures import BatchingFigures, LaneFigures
from edge_agent.pipelines.pipeline import Pipeline
from edge_agent.pipelines.publish import ZmqPublisher

log = logging.getLogger(__name__)

HEALTH_TOPIC = b"health"


class HealthReporter:
    def __init__(
        self,
        pipeline: Pipeline,
        publisher: ZmqPublisher,
        device_id: str,
        interval_s: float = 1.0,
        power: Any = None,
    ) -> None:
        self.power = power
        self.pipeline = pipeline
        self.publisher = publisher
        self.device_id = device_id
        self.interval_s = interval_s
        # This run of the agent: track ids are unique within a run and source, so a new
        # run_id tells a consumer that ids start again (a restart; a reload keeps it).
        self.run_id = uuid.uuid4().hex[:16]
        self.config_hash = ""  # of the effective config (the runner's), so a fleet shows drift
        # The emulated accelerator's description when a model runs on it (set by the runner):
        # every beat says so, so no consumer takes a measurement for a real run.
        self.emulated: dict[str, Any] | None = None
        self.latest: dict[str, Any] = {}  # the first source's last heartbeat, for the CLI
        self.latest_by_source: dict[str, dict[str, Any]] = {}
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic_ns()
        self._last: dict[str, tuple[int, int]] = {}  # by source: (ns, published) at its last beat
        self._unix_offset_ns = time.time_ns() - time.monotonic_ns()

    def attach(self, pipeline: Pipeline, publisher: ZmqPublisher, power: Any) -> None:
        """Report on ``pipeline`` through ``publisher`` from the next beat on (a reload)."""
        self.pipeline, self.publisher, self.power = pipeline, publisher, power

    def start(self) -> None:
        self._t0 = time.monotonic_ns()
        self._thread = threading.Thread(target=self._run, name="health")
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> bool:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(max(timeout_s, 1.0))  # a beat in progress finishes its sends
            return not thread.is_alive()
        return True

    def close(self) -> None:
        self.stop()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.beat()
            except Exception:  # the heartbeat must outlive any one bad beat
                log.exception("health: heartbeat failed")

    def beat(self, final: bool = False) -> dict[str, Any]:
        """Publish one heartbeat per source; returns the first.

        ``final``: the agent is stopping and the pipeline has drained; marked so a
        consumer knows the counts are complete.
        """
        now = time.monotonic_ns()
        first: dict[str, Any] = {}
        self.publisher.poll_subscriptions()
        snap = self.pipeline.take_figures(now)  # the monitors step their ladders themselves
        for lane in snap.lanes:
            msg = self.message(now, lane, snap.batching)
            if final:
                msg["final"] = True
            self.publisher.send(HEALTH_TOPIC, self.publisher.encode(msg))
            self.latest_by_source[lane.name] = msg
            first = first or msg
        self.latest = first
        self.beats += 1
        return first

    def message(self, now: int, lane: LaneFigures, batching: BatchingFigures) -> dict[str, Any]:
        """One source's heartbeat from its figures (taken at ``now``, with its window)."""
        published = lane.published
        last_ns, last_published = self._last.get(lane.name, (self._t0, 0))
        dt = (now - last_ns) / 1e9
        fps = (published - last_published) / dt if dt > 0 else 0.0
        self._last[lane.name] = (now, published)
        d = lane.deadline
        window = lane.window.summary_ms() if lane.window is not None else {}
        msg: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "type": "health",
            "device": self.device_id,
            "source": lane.name,
            "version": __version__,
            "run_id": self.run_id,
            "config_hash": self.config_hash,
            "ts_unix_s": round((now + self._unix_offset_ns) / 1e9, 3),
            "uptime_s": round((now - self._t0) / 1e9, 3),
            "fps": round(fps, 2),
            "counts": lane.counts.as_dict(),
            "backend_counts": dict(lane.backend_counts),
            "miss_rate": round(d.miss_rate, 4),
            "miss_window_frames": d.miss_window_frames,
            "latency_ms": {
                "window": window,
                "cumulative": lane.total.summary_ms(),
                "stages": {name: _short(lane.stages[name]) for name in STAGES},
                "backend": {name: _short(h) for name, h in lane.backend_parts.items()},
            },
            "deadline": {
                "budget_ms": d.budget_ms,
                "stage_budgets_ms": dict(d.stage_budgets_ms),
                "stage_overruns": dict(d.stage_overruns),
                "admission": d.admission,
                "miss_window_s": d.miss_window_s,
                "estimate_ms": dict(d.estimate_ms),
            },
            "ladder": {
                "step": d.step,
                "name": d.step_name,
                "steps": list(d.steps),
                "changes": d.changes,
                "step_up_after_s": d.step_up_after_s,
            },
            "source_state": {**lane.source_state, "priority": lane.priority, "error": lane.error},
            "batching": batching.summary(),
            "process": resources.snapshot(),
        }
        if self.power is not None:
            msg["power"] = self.power.snapshot()
        if self.emulated is not None:
            msg["emulated"] = self.emulated
        for name, step in lane.steps.items():
            msg[name] = step.as_dict()
        change = lane.change
        if change is not None:
            msg["event"] = {
                "kind": "ladder",
                "from": change.previous,
                "to": change.name,
                "step": change.step,
                "miss_rate": round(change.miss_rate, 4),
                "reason": change.reason,
            }
        return msg


def _short(hist: Any) -> dict[str, float]:
    return {
        "p50": round(hist.percentile_ms(50), 3),
        "p99": round(hist.percentile_ms(99), 3),
        "max": round(hist.max_ns / 1e6, 3),
    }
