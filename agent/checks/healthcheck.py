"""`edge-agent health`: is the agent on this device doing its job? For a rollout to wait
on (the Ansible role does) and for a person to ask.

It listens to the agent's own heartbeats on the stream and judges each source on the
frames that ended while it listened, from the difference of the heartbeats' cumulative
counts, never on the heartbeat's own ``miss_rate`` (a 2 s window: at 15 fps one late
frame more or less moves it by 3 %, so two checks in a row could disagree). A source is
judged once at least ``min_frames`` of its frames ended: frames flow (results were
published), its miss rate is at most ``max_miss_rate``, and, with ``expect_hash``, the
agent runs that config (its heartbeat's ``config_hash``), so a check right after a reload
judges the new config, not the old one. The miss rate is the agent's own definition
(``pipelines/deadline.py``): misses are frames published late and frames dropped as
``stale`` or on an ``error``, over those frames and the ones published on time; frames
dropped for other reasons (overrun, ladder, source gap, not fresh, shutdown) are neither.
Too few frames before the timeout is said as such, not judged.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from edge_agent import client
from edge_agent.core import stream_frames
from edge_agent.core.text import printable
from edge_agent.pipelines.deadline import MISS_DROPS

#: Frames a verdict needs: one miss moves the rate by 1 %, a fifth of the default 5 %.
DEFAULT_MIN_FRAMES = 100


@dataclass(frozen=True)
class Window:
    """One source's frames that ended between two of its heartbeats (count differences)."""

    on_time: int = 0
    late: int = 0
    dropped_by_reason: dict[str, int] = field(default_factory=dict)
    span_s: float = 0.0

    @classmethod
    def between(cls, first: dict[str, Any], last: dict[str, Any]) -> Window:
        a, b = first.get("counts", {}), last.get("counts", {})
        reasons_a, reasons_b = a.get("dropped_by_reason", {}), b.get("dropped_by_reason", {})
        return cls(
            int(b.get("on_time", 0)) - int(a.get("on_time", 0)),
            int(b.get("late", 0)) - int(a.get("late", 0)),
            {r: int(n) - int(reasons_a.get(r, 0)) for r, n in reasons_b.items()},
            float(last.get("uptime_s", 0.0)) - float(first.get("uptime_s", 0.0)),
        )

    @property
    def published(self) -> int:
        return self.on_time + self.late

    @property
    def misses(self) -> int:
        return self.late + sum(self.dropped_by_reason.get(r, 0) for r in MISS_DROPS)

    @property
    def frames(self) -> int:
        """The frames the miss rate is over: published, or dropped as a miss."""
        return self.on_time + self.misses

    @property
    def miss_rate(self) -> float:
        return self.misses / self.frames if self.frames else 0.0

    @property
    def fps(self) -> float:
        return self.published / self.span_s if self.span_s > 0 else 0.0

    def counts(self) -> dict[str, Any]:
        dropped = {r: n for r, n in self.dropped_by_reason.items() if n}
        return {
            "on_time": self.on_time,
            "late": self.late,
            "dropped": sum(dropped.values()),
            "dropped_by_reason": dropped,
        }

    def figures(self) -> str:
        """The counts beside a rate: ``2 of 30 frames in 2.0 s``."""
        return f"{self.misses} of {self.frames} frames in {self.span_s:.1f} s"


@dataclass
class SourceVerdict:
    source: str
    ok: bool
    reason: str
    fps: float = 0.0
    miss_rate: float = 0.0
    config_hash: str = ""
    frames: int = 0  # judged: published, or dropped as a miss
    misses: int = 0
    span_s: float = 0.0
    counts: dict[str, Any] = field(default_factory=dict)  # of the frames judged

    def as_dict(self) -> dict[str, Any]:
        return {**vars(self), "miss_rate": round(self.miss_rate, 4), "span_s": round(self.span_s, 3)}


@dataclass
class Verdict:
    healthy: bool
    reason: str
    sources: list[SourceVerdict] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "reason": self.reason,
            "sources": [s.as_dict() for s in self.sources],
        }


def usage_error(timeout_s: float, max_miss_rate: float, min_frames: int) -> str:
    """What is wrong with the check's options ("" if nothing): an infinite timeout would
    wait forever, a nan rate would call any rate healthy."""
    if not (math.isfinite(timeout_s) and timeout_s > 0):
        return f"--timeout {timeout_s:g}: must be a number of seconds > 0"
    if not 0 <= max_miss_rate <= 1:  # nan too
        return f"--max-miss-rate {max_miss_rate:g}: must be within 0..1 (0.05: 5 %)"
    if min_frames < 1:
        return f"--min-frames {min_frames}: must be >= 1"
    return ""


def endpoint_error(endpoint: str) -> str:
    """What is wrong with a stream address to connect to ("" if nothing): ZeroMQ refuses a
    malformed one with a bare "Invalid argument" (a traceback), and port 99999 without a word."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme not in ("tcp", "ipc"):
        return f"{printable(endpoint)}: expected a ZeroMQ address, tcp://HOST:PORT or ipc://PATH"
    if scheme == "ipc":
        return "" if rest else f"{printable(endpoint)}: expected ipc://PATH, got no path"
    host, colon, port = rest.rpartition(":")
    if not (colon and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return f"{printable(endpoint)}: expected tcp://HOST:PORT, a port within 1..65535"
    return ""


def counts_line(counts: dict[str, Any]) -> str:
    """A verdict's counts in words: ``on time 101, late 2, dropped 3 (stale 2, overrun 1)``."""
    reasons = ", ".join(f"{r} {n}" for r, n in counts["dropped_by_reason"].items())
    dropped = f"dropped {counts['dropped']}" + (f" ({reasons})" if reasons else "")
    return f"on time {counts['on_time']}, late {counts['late']}, {dropped}"


def pct(rate: float) -> str:
    return f"{100 * rate:.1f} %"


def judge(window: Window, beat: dict[str, Any], max_miss_rate: float) -> SourceVerdict:
    """One source, on the frames of ``window`` (ending at heartbeat ``beat``)."""
    v = SourceVerdict(
        str(beat.get("source", "")),
        False,
        "",
        round(window.fps, 2),
        window.miss_rate,
        str(beat.get("config_hash", "")),
        window.frames,
        window.misses,
        window.span_s,
        window.counts(),
    )
    if not window.published:
        v.reason = no_results(window)
    elif window.miss_rate > max_miss_rate:
        v.reason = f"miss rate {pct(window.miss_rate)} > {pct(max_miss_rate)} ({window.figures()})"
    else:
        v.ok, v.reason = True, f"{window.fps:.1f} fps, miss rate {pct(window.miss_rate)} ({window.figures()})"
    return v


def no_results(window: Window) -> str:
    """Why nothing was published: every frame judged missed, or none ended at all."""
    if window.frames:
        return f"no results published: {window.figures()} missed"
    dropped = window.counts()["dropped_by_reason"]
    why = f" (dropped: {', '.join(f'{r} {n}' for r, n in dropped.items())})" if dropped else ""
    return f"no results published in {window.span_s:.1f} s{why}"


def refused(beat: dict[str, Any], expect_hash: str) -> SourceVerdict | None:
    """What is wrong at once with one heartbeat, before any frame is counted: the agent runs
    another config than expected, or the source failed. None: nothing."""
    source, config = str(beat.get("source", "")), str(beat.get("config_hash", ""))
    error = (beat.get("source_state") or {}).get("error")
    if expect_hash and config != expect_hash:
        why = f"runs config {config or '?'}, not {expect_hash} (not reloaded yet?)"
        return SourceVerdict(source, False, why, config_hash=config)
    if error:
        return SourceVerdict(source, False, f"source failed: {error}", config_hash=config)
    return None


def restarted(first: dict[str, Any], beat: dict[str, Any]) -> bool:
    """The counts started again (another agent process): a window across it means nothing."""

    def captured(b: dict[str, Any]) -> int:
        return int(b.get("counts", {}).get("captured", 0))

    earlier = float(beat.get("uptime_s", 0.0)) < float(first.get("uptime_s", 0.0))
    return earlier or captured(beat) < captured(first)


@dataclass
class _Source:
    """One source as heard so far: where its window starts (None: at its next good
    heartbeat), its last heartbeat, and its last verdict."""

    start: dict[str, Any] | None
    last: dict[str, Any]
    beats: int = 1
    verdict: SourceVerdict | None = None


@dataclass
class Judge:
    """The verdict on every source of one agent, heartbeat by heartbeat. Without ``wait``
    a source's first verdict is final; with it, a source not healthy is judged again on
    the frames after that verdict (an agent still loading or reloading), until every
    source is healthy."""

    max_miss_rate: float
    expect_hash: str = ""
    min_frames: int = DEFAULT_MIN_FRAMES
    wait: bool = False
    more_frames: str = "a longer --timeout"  # how to give a check more frames
    sources: dict[str, _Source] = field(default_factory=dict)

    def add(self, beat: dict[str, Any]) -> None:
        """One heartbeat of one source: its window grows, and is judged once it holds
        ``min_frames`` frames."""
        name = str(beat.get("source", ""))
        s = self.sources.get(name)
        if s is None:
            s = self.sources[name] = _Source(beat, beat)
        else:
            s.beats += 1
            s.last = beat
        if s.verdict is not None and (s.verdict.ok or not self.wait):
            return  # final
        bad = refused(beat, self.expect_hash)
        if bad is not None:
            s.verdict, s.start = bad, None  # counting starts on the first good heartbeat
            return
        if s.start is None or restarted(s.start, beat):
            s.start = beat
        window = Window.between(s.start, beat)
        if window.frames >= self.min_frames:
            s.verdict = judge(window, beat, self.max_miss_rate)
            if not s.verdict.ok:
                s.start = beat  # with wait: judged again on the frames from here

    def done(self) -> bool:
        """Every source has its verdict (healthy ones, with ``wait``). Sources beat one after
        the other once a period: when one has beaten twice, every source has beaten."""
        if not any(s.beats > 1 for s in self.sources.values()):
            return False
        verdicts = [s.verdict for s in self.sources.values()]
        return all(v is not None and (v.ok or not self.wait) for v in verdicts)

    def verdict(self) -> Verdict:
        """The verdict now: a source not judged yet is said to have too few frames."""
        verdicts = [s.verdict or self._unjudged(s) for s in self.sources.values()]
        bad = [v for v in verdicts if not v.ok]
        reason = "; ".join(f"{v.source}: {v.reason}" for v in bad) if bad else "every source healthy"
        return Verdict(not bad, reason, sorted(verdicts, key=lambda v: v.source))

    def _unjudged(self, s: _Source) -> SourceVerdict:
        """A source whose frames were too few to judge (or none published)."""
        beat = s.last
        window = Window.between(s.start or beat, beat)
        if window.span_s <= 0:
            why = "only one heartbeat: cannot tell whether frames flow"
            return SourceVerdict(
                str(beat.get("source", "")), False, why, config_hash=str(beat.get("config_hash", ""))
            )
        v = judge(window, beat, self.max_miss_rate)
        if window.published:
            v.ok, v.reason = False, self._too_few(window)
        return v

    def _too_few(self, window: Window) -> str:
        return (
            f"too few frames to judge: {window.frames} ended in {window.span_s:.1f} s, at least"
            f" {self.min_frames} needed ({self.more_frames}); miss rate so far"
            f" {pct(window.miss_rate)} ({window.figures()})"
        )


def check(
    endpoint: str,
    timeout_s: float,
    max_miss_rate: float = 0.05,
    expect_hash: str = "",
    wait: bool = False,
    server_key: str | None = None,
    client_cert: str | None = None,
    min_frames: int = DEFAULT_MIN_FRAMES,
    more_frames: str = "a longer --timeout",
) -> Verdict:
    """Listen for heartbeats for up to ``timeout_s`` (finite) and judge every source as
    ``Judge`` does, on at least ``min_frames`` frames each (``more_frames``: how the caller
    gets more of them, for a verdict that had too few). An address that cannot be
    connected to (``endpoint_error``), or CURVE keys that cannot be used, raise ValueError."""
    problem = endpoint_error(endpoint)
    if problem:
        raise ValueError(problem)
    try:
        sock = client.connect(client.stream_endpoint(endpoint), ("health",), server_key, client_cert)
    except zmq.ZMQError as e:  # an address that passed the check above, refused all the same
        raise ValueError(
            f"{printable(endpoint)}: ZeroMQ cannot connect to it ({zmq.strerror(e.errno)})"
        ) from None
    end = time.monotonic() + timeout_s
    judge_ = Judge(max_miss_rate, expect_hash, min_frames, wait, more_frames)
    try:
        while (left_s := end - time.monotonic()) > 0:
            if not sock.poll(max(1, int(left_s * 1000))):
                break
            try:
                _, beat = stream_frames.decode(sock.recv())
            except stream_frames.MessageError:
                continue  # not the agent's: anyone may publish on the endpoint
            if not isinstance(beat, dict):
                continue
            if beat.get("final"):
                return Verdict(False, "the agent is stopping", judge_.verdict().sources)
            judge_.add(beat)
            if judge_.done():
                return judge_.verdict()
    except zmq.ZMQError as e:
        return Verdict(False, f"stream error: {e}", judge_.verdict().sources)
    finally:
        sock.close(linger=0)
    if not judge_.sources:
        return Verdict(False, f"no heartbeat from {endpoint} within {timeout_s:g} s (is the agent running?)")
    return judge_.verdict()
