"""The heartbeat: one ``health`` message a second per source, with any ladder change.

The heartbeat comes from its own thread, not from the frame path, so a stalled pipeline
still reports (with fps 0 and growing drop counts) instead of going silent. With several
sources, each has its own message (its ``source`` field says which) with its own counts,
latencies, deadline and ladder; all carry the shared batch scheduler's figures.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from edge_agent import __version__
from edge_agent.core import resources
from edge_agent.core.stages import STAGES
from edge_agent.pipelines.deadline import LadderChange
from edge_agent.pipelines.publish import SCHEMA_VERSION, ZmqPublisher

log = logging.getLogger(__name__)

HEALTH_TOPIC = b"health"


class HealthReporter:
    def __init__(
        self,
        pipeline: Any,
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
        self.config_hash = ""  # of the effective config (the runner's), so a fleet shows drift
        self.latest: dict[str, Any] = {}  # the first source's last heartbeat, for the CLI
        self.latest_by_source: dict[str, dict[str, Any]] = {}
        self.beats = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = time.monotonic_ns()
        self._last: dict[str, tuple[int, int]] = {}  # by source: (ns, published) at its last beat
        self._unix_offset_ns = time.time_ns() - time.monotonic_ns()

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
        for lane in self.pipeline.lanes:
            change = lane.monitor.take_change()  # the monitor steps its ladder itself
            msg = self.snapshot(now, change, lane)
            if final:
                msg["final"] = True
            self.publisher.send(HEALTH_TOPIC, self.publisher.encode(msg))
            self.latest_by_source[lane.name] = msg
            first = first or msg
        self.latest = first
        self.beats += 1
        return first

    def snapshot(self, now: int, change: LadderChange | None = None, lane: Any = None) -> dict[str, Any]:
        p = self.pipeline
        lane = lane or p.lanes[0]
        stats, monitor = lane.stats, lane.monitor
        window = stats.take_window()
        published = stats.published
        last_ns, last_published = self._last.get(lane.name, (self._t0, 0))
        dt = (now - last_ns) / 1e9
        fps = (published - last_published) / dt if dt > 0 else 0.0
        self._last[lane.name] = (now, published)
        miss_rate, ended = monitor.miss_rate(now)
        msg: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "type": "health",
            "device": self.device_id,
            "source": lane.name,
            "version": __version__,
            "config_hash": self.config_hash,
            "ts_unix_s": round((now + self._unix_offset_ns) / 1e9, 3),
            "uptime_s": round((now - self._t0) / 1e9, 3),
            "fps": round(fps, 2),
            "counts": stats.counts(),
            "miss_rate": round(miss_rate, 4),
            "miss_window_frames": ended,
            "latency_ms": {
                "window": window.summary_ms(),
                "cumulative": stats.total.summary_ms(),
                "stages": {name: _short(stats.stages[name]) for name in STAGES},
                "backend": {name: _short(h) for name, h in list(stats.backend_parts.items())},
            },
            "deadline": {
                "budget_ms": monitor.config.budget_ms,
                "stage_budgets_ms": dict(monitor.config.stage_budgets_ms),
                "stage_overruns": dict(monitor.stage_overruns),
                "admission": monitor.config.admission,
                "miss_window_s": monitor.config.miss_window_s,
                "estimate_ms": monitor.estimates_ms(),
            },
            "ladder": {
                "step": monitor.step,
                "name": monitor.current.name,
                "steps": [s.name for s in monitor.ladder],
                "changes": monitor.changes,
                "step_up_after_s": monitor.config.step_up_after_s * monitor.up_backoff,
            },
            "source_state": {**lane.source.describe(), "priority": lane.priority, "error": lane.error},
            "batching": p.scheduler.summary(),
            "process": resources.snapshot(),
        }
        if self.power is not None:
            msg["power"] = self.power.snapshot()
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
