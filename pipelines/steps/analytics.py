"""The analytics step: a source's zones and lines counted over its tracks, after the
tracker (``analytics/counter.py``); its events are sent on ``event.<source>``, its running
counts ride on each result message under ``analytics``."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core.analytics_config import AnalyticsConfig
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.stamps import CAPTURED
from edge_agent.core.yamlnodes import ConfigError, Problem
from edge_agent.pipelines.analytics.counter import DWELL_BUCKETS_S, IN, OUT, Counter
from edge_agent.pipelines.analytics.geometry import Shapes, shapes_of
from edge_agent.pipelines.steps.base import LaneStep, Step, StepContext, figures_dict

log = logging.getLogger(__name__)

EVENT_TOPIC = "event"


@dataclass(frozen=True)
class AnalyticsFigures:
    """A source's counts by zone or line and label, as the heartbeat and metrics show them."""

    zones: dict[str, dict[str, Any]]
    lines: dict[str, dict[str, Any]]
    events: int
    overflow: int
    cost: LatencyHistogram  # per frame, since it started
    window: LatencyHistogram | None = None  # per frame since the last take (the heartbeat's)

    def as_dict(self) -> dict:
        return figures_dict(self)


class SourceAnalytics(Step):
    """One source's zones and lines over its tracks."""

    name = "analytics"

    def __init__(
        self,
        config: AnalyticsConfig,
        labels: tuple[str, ...],
        lost_frames: float,
        capacity: int,
        source: str,
        device_id: str,
        run_id: str,
        send: Any,
        encode: Any,
    ) -> None:
        """``send(topic, body)`` and ``encode(message)``: the result stream's."""
        super().__init__()
        self.config = config
        self.labels = labels
        self.counter = Counter(config, labels, lost_frames, capacity)
        self.source = source
        self.topic = f"{EVENT_TOPIC}.{source}".encode()
        # the agent's snapshot writer (``offer``) when this source saves event snapshots
        self.snapshots: Any = None
        self._head = {
            "schema": SCHEMA_VERSION,
            "type": "event",
            "device": device_id,
            "source": source,
            "run_id": run_id,
        }
        self._send, self._encode = send, encode
        self.seq = 0  # the next event's number (per source and run)
        self._events: list[dict] = []
        self._unix_offset_ns = time.time_ns() - time.monotonic_ns()

    @property
    def compiled(self) -> bool:
        """Whether its frames run the compiled kernel (``pipelines/jit.py``), else numpy."""
        return self.counter.compiled

    @property
    def keeps_pixels(self) -> bool:
        """Each frame's image is kept for its events' snapshots."""
        return self.snapshots is not None

    def run(self, slot: Any) -> None:
        t0 = time.perf_counter_ns()
        n = slot.det_count
        captured_s = (int(slot.stamps[CAPTURED]) + self._unix_offset_ns) / 1e9
        events = self._events
        self.counter.update(
            slot.det_xyxy[:n],
            slot.det_class[:n],
            slot.det_track[:n],
            slot.det_journey[:n],
            slot.frame_id,
            captured_s,
            slot.geo.src_w,
            slot.geo.src_h,
            events,
        )
        if events:
            sent = [self._publish(event) for event in events]
            events.clear()
            if self.snapshots is not None and slot.pixels is not None:
                self.snapshots.offer(self, slot, sent)
        self.timing.record(time.perf_counter_ns() - t0)

    def _publish(self, event: dict) -> dict:
        """Sends ``event`` as a message (numbered); returns the message."""
        event["at_unix_s"] = round(event["at_unix_s"], 6)
        msg = {**self._head, "seq": self.seq, **event}
        self.seq += 1
        try:
            self._send(self.topic, self._encode(msg))
        except Exception:  # the stream's own failure: counted there, never the frame's
            log.exception("analytics: event %d of %s not sent", msg["seq"], self.topic.decode())
        return msg

    def message_block(self) -> dict:
        """The running counts for the frame's result message."""
        return self.counter.block()

    def to_view(self, frame: Any, slot: Any) -> None:
        """Its zones and lines in the frame's pixels, and the counts."""
        frame.shapes = self.shapes(frame.width, frame.height)
        frame.counts = self.counter.block()

    def shapes(self, width: int, height: int) -> Shapes:
        """The zones and lines in the pixels of a ``width`` x ``height`` frame (the
        counter's, once it saw a frame that size)."""
        geo = self.counter.geometry
        if geo is not None and (geo.width, geo.height) == (width, height):
            return geo.shapes
        return shapes_of(self.config, width, height)

    def adopt(self, last: LaneStep, continuous: bool, same_source: bool) -> LaneStep:
        """This one, with ``last``'s event numbering, tracks and counts for the zones and
        lines whose definition (and the model's labels) did not change, when ``last`` ran
        until now (its tracks are this source's current ones)."""
        assert isinstance(last, SourceAnalytics)
        if not continuous:
            return self
        return last.carry_on(self)

    def carry_on(self, new: SourceAnalytics) -> SourceAnalytics:
        """``new`` with this one's event numbering, tracks and counts (``adopt``)."""
        new.seq = self.seq
        old_c, new_c = self.counter, new.counter
        if self.labels != new.labels:
            return new
        zones = _kept(self.config.zones, new.config.zones)
        lines = _kept(self.config.lines, new.config.lines)
        n = min(old_c.n, new_c.capacity)
        for name in ("ids", "last_seen", "track", "seen_t"):  # (per row; the zones and lines below)
            getattr(new_c, name)[:n] = getattr(old_c, name)[:n]
        new_c.n = n
        for a, b in zones:
            for name in ("z_in", "z_run", "z_run_t", "z_enter_t", "z_step", "z_cls"):
                getattr(new_c, name)[:n, b] = getattr(old_c, name)[:n, a]
            for name in ("objects", "entered", "exited", "dwell_hist", "dwell_sum"):
                getattr(new_c, name)[b] = getattr(old_c, name)[a]
        for a, b in lines:
            for name in ("l_side", "l_pend", "l_run", "l_run_t", "l_done"):
                getattr(new_c, name)[:n, b] = getattr(old_c, name)[:n, a]
            new_c.crossed[b] = old_c.crossed[a]
        new_c.events = old_c.events
        return new

    def figures_of(self, cost: LatencyHistogram, window: LatencyHistogram | None) -> AnalyticsFigures:
        c = self.counter
        labels = self.labels or ("0",)

        def by_label(row: np.ndarray) -> dict[str, int]:
            return {labels[i]: int(v) for i, v in enumerate(row.tolist()) if v}

        zones = {
            name: {
                "objects": by_label(c.objects[k]),
                "entered": by_label(c.entered[k]),
                "exited": by_label(c.exited[k]),
                "dwell_s": {
                    "count": int(c.dwell_hist[k].sum()),
                    "sum": round(float(c.dwell_sum[k]), 3),
                    "buckets": dict(
                        zip([*map(str, DWELL_BUCKETS_S), "+Inf"], np.cumsum(c.dwell_hist[k]).tolist())
                    ),
                },
            }
            for k, name in enumerate(c.zone_names)
        }
        lines = {
            name: {"in": by_label(c.crossed[k, IN]), "out": by_label(c.crossed[k, OUT])}
            for k, name in enumerate(c.line_names)
        }
        return AnalyticsFigures(zones, lines, c.events, c.overflow, cost, window)


def _kept(old: tuple, new: tuple) -> list[tuple[int, int]]:
    """(old index, new index) of the items defined the same in both (by name)."""
    at = {item.name: (i, item) for i, item in enumerate(old)}
    return [
        (at[item.name][0], j) for j, item in enumerate(new) if item.name in at and at[item.name][1] == item
    ]


class Analytics:
    """The plug-in: zones and lines for each source that has any (on its tracker's tracks)."""

    name = "analytics"
    order = 20

    def build(self, ctx: StepContext) -> SourceAnalytics | None:
        src = ctx.source
        if not src.analytics.enabled:
            return None
        check_labels(src.analytics, ctx.labels, f"{ctx.key}.analytics")
        step = SourceAnalytics(
            src.analytics,
            ctx.labels,
            src.tracker.lost_frames,
            2 * src.tracker.max_tracks,
            src.name,
            ctx.device_id,
            ctx.run_id,
            ctx.send,
            ctx.encode,
        )
        if src.analytics.snapshots.enabled:
            step.snapshots = ctx.snapshots
        return step


def check_labels(config: AnalyticsConfig, labels: tuple[str, ...], key: str) -> None:
    """A zone or line that counts a label the source's model does not have: a config error
    (raised at start, and by a reload, which then keeps the running config)."""
    problems = []
    for kind, items in (("zones", config.zones), ("lines", config.lines)):
        for i, item in enumerate(items):
            unknown = [name for name in item.labels if name not in labels]
            if unknown:
                known = ", ".join(map(repr, labels))  # repr: a model's label may hold control characters
                message = f"label {', '.join(map(repr, unknown))} is not one of the model's ({known})"
                problems.append(Problem("config", 0, 0, f"{key}.{kind}[{i}].labels", message))
    if problems:
        raise ConfigError(problems)


STEP = Analytics()
