"""`edge-agent health`: is the agent on this device doing its job? For a rollout to wait
on (the Ansible role does) and for a person to ask.

It listens to the agent's own heartbeats on the stream and judges each source on two
consecutive ones: frames flow (results published between them), the miss rate is at most
``max_miss_rate``, and, with ``expect_hash``, the agent runs that config (its heartbeat's
``config_hash``), so a check right after a reload judges the new config, not the old one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import zmq

from edge_agent import client


@dataclass
class SourceVerdict:
    source: str
    ok: bool
    reason: str
    fps: float = 0.0
    miss_rate: float = 0.0
    config_hash: str = ""


@dataclass
class Verdict:
    healthy: bool
    reason: str
    sources: list[SourceVerdict] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "reason": self.reason,
            "sources": [vars(s) for s in self.sources],
        }


def judge(
    previous: dict[str, Any], beat: dict[str, Any], max_miss_rate: float, expect_hash: str
) -> SourceVerdict:
    """One source, from two consecutive heartbeats of it."""
    source = str(beat.get("source", ""))
    counts, before = beat.get("counts", {}), previous.get("counts", {})
    published = counts.get("on_time", 0) + counts.get("late", 0)
    published_before = before.get("on_time", 0) + before.get("late", 0)
    miss_rate = float(beat.get("miss_rate", 0.0))
    v = SourceVerdict(
        source, False, "", float(beat.get("fps", 0.0)), miss_rate, str(beat.get("config_hash", ""))
    )
    error = (beat.get("source_state") or {}).get("error")
    if expect_hash and v.config_hash != expect_hash:
        v.reason = f"runs config {v.config_hash or '?'}, not {expect_hash} (not reloaded yet?)"
    elif error:
        v.reason = f"source failed: {error}"
    elif published <= published_before:
        v.reason = "no results published between two heartbeats"
    elif miss_rate > max_miss_rate:
        v.reason = f"miss rate {miss_rate:.1%} > {max_miss_rate:.1%}"
    else:
        v.ok, v.reason = True, f"{v.fps:.1f} fps, miss rate {miss_rate:.1%}"
    return v


def check(
    endpoint: str,
    timeout_s: float,
    max_miss_rate: float = 0.05,
    expect_hash: str = "",
    wait: bool = False,
    server_key: str | None = None,
    client_cert: str | None = None,
) -> Verdict:
    """Listen for heartbeats for up to ``timeout_s``. Without ``wait`` the first verdict on
    every source is final; with it, checking goes on until every source is healthy (an
    agent still loading, or reloading) or the time is up."""
    sock = client.connect(client.stream_endpoint(endpoint), ("health",), server_key, client_cert)
    end = time.monotonic() + timeout_s
    last: dict[str, dict[str, Any]] = {}
    verdicts: dict[str, SourceVerdict] = {}
    try:
        while time.monotonic() < end:
            if not sock.poll(max(1, int((end - time.monotonic()) * 1000))):
                break
            _, beat = client.decode(sock.recv())
            if beat.get("final"):
                return Verdict(False, "the agent is stopping", list(verdicts.values()))
            source = str(beat.get("source", ""))
            if source in last:
                verdicts[source] = judge(last[source], beat, max_miss_rate, expect_hash)
            last[source] = beat
            # Every source beats once a period, one after the other: when each one seen has
            # beaten twice, every source of the agent has a verdict.
            complete = bool(verdicts) and set(verdicts) == set(last)
            if complete and (not wait or all(v.ok for v in verdicts.values())):
                return _verdict(verdicts)
    except zmq.ZMQError as e:
        return Verdict(False, f"stream error: {e}", list(verdicts.values()))
    finally:
        sock.close(linger=0)
    if not last:
        return Verdict(False, f"no heartbeat from {endpoint} within {timeout_s:g} s (is the agent running?)")
    return (
        _verdict(verdicts)
        if verdicts
        else Verdict(False, "only one heartbeat: cannot tell whether frames flow")
    )


def _verdict(verdicts: dict[str, SourceVerdict]) -> Verdict:
    bad = [v for v in verdicts.values() if not v.ok]
    reason = "; ".join(f"{v.source}: {v.reason}" for v in bad) if bad else "every source healthy"
    return Verdict(not bad, reason, sorted(verdicts.values(), key=lambda v: v.source))
