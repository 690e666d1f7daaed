"""What one summary interval of one source holds: the counting behind ``forward: summary``
(:class:`edge_agent.service.uplink.forward.Summarize` schedules the intervals and sends).

An :class:`Interval` takes the source's results, heartbeats and zone and line events as
they arrive and turns them into a summary's counts: every result in exactly one interval,
every event too. The stream is checked before it gets here (validate.py), but a field of
the wrong type still costs at most its own count, never the interval.
"""

from __future__ import annotations

from typing import Any

from edge_agent.core.analytics_config import MAX_ITEMS
from edge_agent.service.uplink.validate import finite_number

#: Zones and lines an interval breaks its events out by: a source has at most MAX_ITEMS of
#: each, and a reload may rename them all within one interval. Events of further names (a
#: stray publisher's) are counted in ``other`` only, so a summary stays bounded.
MAX_EVENT_NAMES = 4 * MAX_ITEMS
#: Labels an interval breaks its detections out by, and their characters in all: enough
#: for any detector's classes (COCO's 80, a few hundred of an open vocabulary); detections
#: of further labels are counted in ``detections_other``, so a summary stays tens of kB.
MAX_SUMMARY_LABELS = 256
MAX_SUMMARY_LABEL_CHARS = 16384

_ZONE_KINDS = ("enter", "exit", "dwell")
_DIRECTIONS = ("in", "out")


def nearest_rank(ordered: list[float], q: int) -> float:
    """The ``q``-th percentile (integer 1..100) of sorted values by nearest rank: the smallest
    value with at least q % of the values at or below it (numpy's ``method="inverted_cdf"``).
    Always one of the values, so it is exact, not interpolated."""
    return ordered[max(1, -(-len(ordered) * q // 100)) - 1]


def analytics_block(block: Any) -> dict[str, Any] | None:
    """A copy of a result's ``analytics`` (running counts per zone and line, message-v2's
    ``$defs/analytics_block``) with only the fields the schema gives: what a summary carries."""
    if not isinstance(block, dict):
        return None
    fields = {"zones": ("objects", "entered", "exited"), "lines": ("in", "out")}
    out: dict[str, Any] = {}
    for part, keys in fields.items():
        items = block.get(part)
        items = items if isinstance(items, dict) else {}
        out[part] = {
            name: {k: item.get(k, 0) for k in keys} for name, item in items.items() if isinstance(item, dict)
        }
    return out


class EventTally:
    """One interval's events of one source: by kind, and by zone (enter, exit, dwell) and by
    line (crossings in, out). ``total`` counts them all; it is the sum of the zones' and
    the lines' counts and ``other`` (events of a name past MAX_EVENT_NAMES, or not of the
    schema's shape), and of ``by_kind`` and the events not of the schema's shape."""

    __slots__ = ("by_kind", "lines", "other", "total", "zones")

    def __init__(self) -> None:
        self.total = 0
        self.by_kind: dict[str, int] = {}
        self.zones: dict[str, dict[str, int]] = {}
        self.lines: dict[str, dict[str, int]] = {}
        self.other = 0

    def add(self, body: dict[str, Any]) -> None:
        self.total += 1
        kind = body.get("kind")
        if kind == "cross":
            table, name, key, keys = self.lines, body.get("line"), body.get("direction"), _DIRECTIONS
        else:
            table, name, key, keys = self.zones, body.get("zone"), kind, _ZONE_KINDS
        if key not in keys or not isinstance(name, str):
            self.other += 1
            return
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1  # kind: one of EVENT_KINDS here
        counts = table.get(name)
        if counts is None:
            if len(self.zones) + len(self.lines) >= MAX_EVENT_NAMES:
                self.other += 1
                return
            counts = table[name] = dict.fromkeys(keys, 0)
        counts[key] += 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "by_kind": self.by_kind,
            "zones": self.zones,
            "lines": self.lines,
            "other": self.other,
        }


class Interval:
    """One source's open summary interval and what carries across intervals."""

    __slots__ = (
        "analytics",
        "device",
        "end_s",
        "events",
        "first_seq",
        "frames",
        "hb_dropped",
        "heartbeat",
        "label_chars",
        "labels",
        "labels_other",
        "last_seq",
        "latencies",
        "missed",
        "origin_s",
        "prev_dropped",
        "seq",
        "start_s",
        "throttled",
    )

    def __init__(self, now_s: float, interval_s: float) -> None:
        self.origin_s = self.start_s = now_s
        self.end_s = now_s + interval_s
        self.device: Any = None
        self.seq = 0  # the next summary's number
        # counts.dropped of the latest heartbeat before this interval (at first: the first one)
        self.prev_dropped: int | None = None
        self.reset()

    def reset(self) -> None:
        self.frames = 0
        self.first_seq: int | None = None
        self.last_seq: int | None = None
        self.labels: dict[str, int] = {}
        self.labels_other = 0  # detections of labels past the caps
        self.label_chars = 0
        self.latencies: list[float] = []
        self.missed = 0
        self.throttled = False
        self.heartbeat = False
        self.hb_dropped: int | None = None
        self.analytics: Any = None  # the latest result's block (the body's own: copied when sent)
        self.events = EventTally()

    def busy(self) -> bool:
        """Something arrived in this interval (else no summary is sent for it)."""
        return bool(self.frames or self.heartbeat or self.events.total)

    def add_result(self, body: dict[str, Any]) -> None:
        self.frames += 1
        seq = body.get("seq")
        if self.first_seq is None:
            self.first_seq = seq
        self.last_seq = seq
        labels = self.labels
        for det in body.get("detections") or ():
            label = str(det.get("label", det.get("class_id")))
            count = labels.get(label)
            if count is not None:
                labels[label] = count + 1
            elif (
                len(labels) < MAX_SUMMARY_LABELS and self.label_chars + len(label) <= MAX_SUMMARY_LABEL_CHARS
            ):
                labels[label] = 1
                self.label_chars += len(label)
            else:
                self.labels_other += 1
        latency = body.get("latency_ms")
        total = latency.get("total") if isinstance(latency, dict) else None
        # Only numbers: one odd value would make every later sort() of this window raise.
        if finite_number(total):
            self.latencies.append(total)
        if body.get("deadline_missed"):
            self.missed += 1
        if body.get("throttled"):
            self.throttled = True
        if "analytics" in body:
            self.analytics = body["analytics"]

    def add_heartbeat(self, body: dict[str, Any]) -> None:
        self.heartbeat = True
        dropped = (body.get("counts") or {}).get("dropped")
        if dropped is not None:
            self.hb_dropped = dropped
            if self.prev_dropped is None:  # the first heartbeat ever is the baseline
                self.prev_dropped = dropped
        if (body.get("power") or {}).get("throttled"):
            self.throttled = True

    def add_event(self, body: dict[str, Any]) -> None:
        self.events.add(body)

    def dropped(self) -> int:
        """Drops reported over this interval; a counter that went down (the agent restarted)
        counts from zero again, so drops since the restart are not lost."""
        now, before = self.hb_dropped, self.prev_dropped
        if now is None or before is None:  # no heartbeat in this interval
            return 0
        return now - before if now >= before else now
