"""What the uplink sends up, decided per message: small policies behind one interface.

The uplink reads the agent's ZeroMQ stream (results on ``det.<source>``, heartbeats on
``health``, zone and line events on ``event.<source>``) and asks a :class:`Forwarder` what
to publish. A policy answers with ``(subtopic, payload)`` pairs; the caller prefixes
``<prefix>/<device>/`` and owns health. Policies are chosen by name from :data:`FORWARDERS`
through :func:`make_forwarder`, so a new one is a class and a line, and the uplink's loop
never changes.

The policies thin out results. Events are not thinned: :class:`WithEvents` adds every one,
unchanged and in order, to whatever a policy sends (``uplink.events``), and no policy caps
or summarises them away (a summary counts them besides).

Times are the caller's: ``now_s`` schedules (the monotonic clock, or Unix seconds when no
``wall_s`` is given) and ``wall_s``, the wall clock at that moment, stamps what is sent, so
a clock step (NTP) moves the stamps at once and never the schedule. No policy reads a
clock, which keeps them testable.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from edge_agent.service.uplink.summary import Interval, analytics_block, nearest_rank
from edge_agent.service.uplink.validate import EVENT_PREFIX

__all__ = [
    "FORWARDERS",
    "Counts",
    "ForwardAll",
    "ForwardNone",
    "ForwardWithDetections",
    "Forwarder",
    "Summarize",
    "WithEvents",
    "event_source",
    "make_forwarder",
    "nearest_rank",
    "result_source",
]

Message = tuple[str, dict[str, Any]]

HEALTH_TOPIC = "health"
RESULT_PREFIX = "det."

#: The key of :attr:`Forwarder.rate_limited` that holds the counts of forgotten sources.
FORGOTTEN = "(forgotten sources)"

#: Slack on time comparisons: interval ends and gaps are sums of floats near 1.7e9 s.
_EPS_S = 1e-6


class Counts(dict[str, int]):
    """Counts by subtopic, with their sum (what a metric or a log line wants)."""

    def bump(self, key: str) -> None:
        self[key] = self.get(key, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.values())


class Forwarder(ABC):
    """One policy. ``offer`` is called per incoming message, ``flush`` about 10 times a
    second and once at shutdown with ``final=True``; both return the messages to send.

    The rate cap lives here so every policy honours it the same way: a message on a
    subtopic less than ``1/max_rate_hz`` after the last one *sent* there is not sent and is
    counted in :attr:`rate_limited` (``0`` means no cap).
    """

    def __init__(self, max_rate_hz: float = 0.0, result_topic: str = "det") -> None:
        """``result_topic``: the agent's ``publish.topic`` (its results are ``<topic>.<source>``)."""
        self.result_prefix = result_topic + "."
        if not max_rate_hz >= 0:
            raise ValueError(f"max_rate_hz must be >= 0 (0: no cap), not {max_rate_hz!r}")
        self._gap_s = 1.0 / max_rate_hz if max_rate_hz > 0 else 0.0
        self._last_sent: dict[str, float] = {}
        self.rate_limited = Counts()

    @abstractmethod
    def offer(
        self, topic: str, body: dict[str, Any], now_s: float, wall_s: float | None = None
    ) -> list[Message]:
        """What to send for one incoming message (``body`` decoded, ``topic`` as on ZeroMQ)."""

    def flush(self, now_s: float, final: bool = False, wall_s: float | None = None) -> list[Message]:
        """What is due by time alone; ``final`` also emits what is held for a later time."""
        return []

    def forget(self, source: str, now_s: float, wall_s: float | None = None) -> list[Message]:
        """Drop what is kept for ``source`` (the uplink tracks a bounded number of sources,
        the least recently seen is forgotten); returns what is still due for it. Its
        rate-limited count is kept, under :data:`FORGOTTEN`, so the total never goes down."""
        subtopic = "det/" + source
        self._last_sent.pop(subtopic, None)
        count = self.rate_limited.pop(subtopic, 0)
        if count:
            self.rate_limited[FORGOTTEN] = self.rate_limited.get(FORGOTTEN, 0) + count
        return []

    def _admit(self, subtopic: str, at_s: float) -> bool:
        """Whether a message stamped ``at_s`` may go out on ``subtopic`` under the cap."""
        if self._gap_s:
            last = self._last_sent.get(subtopic)
            if last is not None and at_s - last < self._gap_s - _EPS_S:
                self.rate_limited.bump(subtopic)
                return False
            self._last_sent[subtopic] = at_s
        return True


def result_source(topic: str, body: dict[str, Any], prefix: str = RESULT_PREFIX) -> str | None:
    """The source of a result message (None for anything else, heartbeats included)."""
    if not topic.startswith(prefix):
        return None
    return body.get("source") or topic[len(prefix) :]


def event_source(topic: str) -> str | None:
    """The source of an event message (None for anything else); the uplink has checked
    that the body names the same one."""
    return topic[len(EVENT_PREFIX) :] if topic.startswith(EVENT_PREFIX) else None


class ForwardAll(Forwarder):
    """Every result, body unchanged, on ``det/<source>``: full fidelity, full bandwidth."""

    def keep(self, body: dict[str, Any]) -> bool:
        return True

    def offer(
        self, topic: str, body: dict[str, Any], now_s: float, wall_s: float | None = None
    ) -> list[Message]:
        source = result_source(topic, body, self.result_prefix)
        if source is None or not self.keep(body):
            return []
        subtopic = "det/" + source
        return [(subtopic, body)] if self._admit(subtopic, now_s) else []


class ForwardWithDetections(ForwardAll):
    """Only results that found something: an idle camera costs no uplink."""

    def keep(self, body: dict[str, Any]) -> bool:
        return bool(body.get("detections"))


class ForwardNone(Forwarder):
    """No result goes up (the device's health does, and the events with ``WithEvents``)."""

    def offer(
        self, topic: str, body: dict[str, Any], now_s: float, wall_s: float | None = None
    ) -> list[Message]:
        return []


class WithEvents(Forwarder):
    """``inner``'s messages and, besides, every event on ``event/<source>``, the body
    unchanged, in the order read: no cap (``max_rate_hz`` is ``inner``'s, for results) and
    no summary stands in for an event, since each one counts. ``inner`` sees the events
    too (a summary counts them)."""

    def __init__(self, inner: Forwarder) -> None:
        super().__init__(0.0, inner.result_prefix[:-1])
        self.inner = inner
        self.rate_limited = inner.rate_limited  # events are never capped: the count is inner's

    def offer(
        self, topic: str, body: dict[str, Any], now_s: float, wall_s: float | None = None
    ) -> list[Message]:
        out = self.inner.offer(topic, body, now_s, wall_s)
        source = event_source(topic)
        if source is not None:
            out.append(("event/" + source, body))
        return out

    def flush(self, now_s: float, final: bool = False, wall_s: float | None = None) -> list[Message]:
        return self.inner.flush(now_s, final, wall_s)

    def forget(self, source: str, now_s: float, wall_s: float | None = None) -> list[Message]:
        return self.inner.forget(source, now_s, wall_s)


def _offset(now_s: float, wall_s: float | None) -> float:
    """What turns a scheduling time into a wall-clock stamp (0: ``now_s`` is wall time)."""
    return 0.0 if wall_s is None else wall_s - now_s


class Summarize(Forwarder):
    """One message per source per ``interval_s`` on ``summary/<source>``: a bounded uplink
    whatever the frame rate, with every result and every event counted in exactly one
    summary (events by kind, zone and line), and the latest running counts of the source's
    zones and lines (``analytics``: the last result's of the interval, None without one).

    Intervals are aligned to the arrival of the source's first message (result, heartbeat
    or event). An interval in which nothing arrived sends nothing; one with only heartbeats
    or events sends ``frames: 0``. A summary is due once ``now_s`` reaches its interval's end, either
    from ``flush`` or from the next ``offer`` of that source.

    ``interval_s`` is the cap: ``max_rate_hz`` does not apply to summaries (dropping one
    would lose its frames from the count). ``run`` tells this uplink's summaries from those
    of an earlier run still in the spool (their ``seq`` starts at 0 again).
    """

    def __init__(self, interval_s: float, result_topic: str = "det", run: str = "") -> None:
        super().__init__(0.0, result_topic)
        self.run = run
        if not interval_s > 0:
            raise ValueError(f"summary interval_s must be > 0, not {interval_s!r}")
        self.interval_s = float(interval_s)
        self._windows: dict[str, Interval] = {}

    def offer(
        self, topic: str, body: dict[str, Any], now_s: float, wall_s: float | None = None
    ) -> list[Message]:
        if topic == HEALTH_TOPIC:
            source, add = body.get("source"), Interval.add_heartbeat
        elif (source := event_source(topic)) is not None:
            add = Interval.add_event
        else:
            source, add = result_source(topic, body, self.result_prefix), Interval.add_result
        if source is None:
            return []
        out: list[Message] = []
        win = self._windows.get(source)
        if win is None:
            win = self._windows[source] = Interval(now_s, self.interval_s)
        else:
            self._close_due(source, win, now_s, out, _offset(now_s, wall_s))
        device = body.get("device")
        if device is not None:
            win.device = device
        add(win, body)
        return out

    def flush(self, now_s: float, final: bool = False, wall_s: float | None = None) -> list[Message]:
        out: list[Message] = []
        offset = _offset(now_s, wall_s)
        for source, win in self._windows.items():
            self._close_due(source, win, now_s, out, offset)
            if final and win.busy():
                self._emit(source, win, now_s, out, offset)
                win.start_s = now_s
        return out

    def forget(self, source: str, now_s: float, wall_s: float | None = None) -> list[Message]:
        """Close ``source``'s open interval (its frames are counted in one last summary)."""
        out = super().forget(source, now_s, wall_s)
        win = self._windows.pop(source, None)
        if win is not None:
            offset = _offset(now_s, wall_s)
            self._close_due(source, win, now_s, out, offset)
            if win.busy():
                self._emit(source, win, now_s, out, offset)
        return out

    def _close_due(self, source: str, win: Interval, now_s: float, out: list[Message], offset: float) -> None:
        """Emit the open interval if ``now_s`` is past its end and move to the one holding
        ``now_s`` (skipping intervals in which nothing arrived)."""
        if now_s < win.end_s:
            return
        if win.busy():
            self._emit(source, win, win.end_s, out, offset)
        step = self.interval_s
        k = math.floor((now_s - win.origin_s) / step)
        while win.origin_s + (k + 1) * step <= now_s:  # floor of a rounded quotient
            k += 1
        win.start_s = win.origin_s + k * step
        win.end_s = win.origin_s + (k + 1) * step

    def _emit(self, source: str, win: Interval, end_s: float, out: list[Message], offset: float) -> None:
        """Close the interval ``[win.start_s, end_s)`` into a summary, stamped ``offset``
        seconds later (the wall clock's lead on the scheduling clock now)."""
        dropped = win.dropped()
        if win.hb_dropped is not None:
            win.prev_dropped = win.hb_dropped
        out.append(("summary/" + source, self._payload(source, win, end_s, dropped, offset)))
        win.seq += 1
        win.reset()

    def _payload(
        self, source: str, win: Interval, end_s: float, dropped: int, offset: float
    ) -> dict[str, Any]:
        span = end_s - win.start_s
        if span > self.interval_s - _EPS_S or span <= 0:
            span = self.interval_s
        lat = sorted(win.latencies)
        return {
            "type": "summary",
            "device": win.device,
            "source": source,
            "run": self.run,
            "seq": win.seq,
            "interval_s": self.interval_s,
            "start_unix_s": win.start_s + offset,
            "end_unix_s": end_s + offset,
            "frames": win.frames,
            "first_seq": win.first_seq,
            "last_seq": win.last_seq,
            "fps": win.frames / span,
            "detections_by_label": win.labels,
            "detections_other": win.labels_other,
            "latency_ms": {
                "p50": nearest_rank(lat, 50) if lat else None,
                "p99": nearest_rank(lat, 99) if lat else None,
                "max": lat[-1] if lat else None,
            },
            "deadline_missed": win.missed,
            "dropped": dropped,
            "throttled": win.throttled,
            "analytics": analytics_block(win.analytics),
            "events": win.events.as_dict(),
        }


#: The policies by the name a config gives; each is built from
#: ``(interval_s, max_rate_hz, result_topic, run)``.
FORWARDERS: dict[str, Callable[[float, float, str, str], Forwarder]] = {
    "all": lambda interval_s, max_rate_hz, topic, run: ForwardAll(max_rate_hz, topic),
    "with_detections": lambda interval_s, max_rate_hz, topic, run: ForwardWithDetections(max_rate_hz, topic),
    "summary": lambda interval_s, max_rate_hz, topic, run: Summarize(interval_s, topic, run),
    "none": lambda interval_s, max_rate_hz, topic, run: ForwardNone(max_rate_hz, topic),
}


def make_forwarder(
    kind: str,
    interval_s: float,
    max_rate_hz: float,
    result_topic: str = "det",
    run: str = "",
    events: bool = False,
) -> Forwarder:
    """The policy named ``kind``, with every event besides when ``events`` (:class:`WithEvents`);
    ``interval_s`` and ``run`` matter to ``summary`` only, ``max_rate_hz`` to the others."""
    factory = FORWARDERS.get(kind)
    if factory is None:
        known = ", ".join(sorted(FORWARDERS))
        raise ValueError(f"unknown uplink forward policy {kind!r} (known: {known})")
    policy = factory(interval_s, max_rate_hz, result_topic, run)
    return WithEvents(policy) if events else policy
