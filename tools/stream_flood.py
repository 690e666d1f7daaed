"""A subscription flood against a running agent's result stream (issue 30, item 1).

    .venv/bin/python tools/stream_flood.py [--topics 1000000] [--flood-s 10] [--repeat 1]

Runs the real agent (``edge-agent run``: the embedded default, one synthetic camera at 30
fps, metrics off, its own free loopback endpoint) three times a round: quiet; with a
process spinning on one core for ``--flood-s`` (the control: the flood's CPU share); with
a flood: one SUB socket subscribes to ``--topics`` distinct topics, then subscribes and
unsubscribes for the rest of ``--flood-s``, then closes (the agent disconnects it past its
allowance; it connects again and sends its subscriptions again, as a ZeroMQ client does).
A second SUB (the observer) takes every heartbeat and result meanwhile. For each run it
prints the largest gap between heartbeats (against the interval), frames dropped (the
agent's own count and gaps in seq), the end-to-end latency (capture to receipt, one
monotonic clock) p50/p99, and the agent's RSS before, during (peak) and after the flood
(from /proc/PID/status). Each run is bounded: the agent is started with ``--duration`` and
killed (its whole session) on every way out.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_process import stop_group  # tools/, beside this script

from edge_agent.client import Subscriber
from edge_agent.core.stream_frames import decode

WARMUP_S = 4.0  # the agent's first frames (model load, first inferences) are not measured
SETTLE_S = 12.0  # after the flood: the RSS is read at the end of this (the drain catches up)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Observed:
    """What the observer saw in the measured window."""

    beats: list[int] = field(default_factory=list)  # monotonic ns of each heartbeat
    e2e_ms: list[float] = field(default_factory=list)
    seq_gaps: int = 0
    dropped: list[int] = field(default_factory=list)  # the agent's dropped count, per heartbeat
    interval_s: float = 1.0


def observe(endpoint: str, stop: threading.Event, measuring: threading.Event, out: Observed) -> None:
    last_seq: int | None = None
    with Subscriber(endpoint, ("health", "det."), timeout_s=0.1) as sub:
        while not stop.is_set():
            frame = sub.recv_frame()
            if frame is None:
                continue
            now = time.monotonic_ns()  # the receipt, before the decoding's own time
            topic, data = decode(frame)
            if topic == "health":
                if measuring.is_set():
                    out.beats.append(now)
                    out.dropped.append(int(data["counts"]["dropped"]))
                continue
            seq = int(data["seq"])
            if measuring.is_set():
                out.e2e_ms.append((now - int(data["capture_mono_ns"])) / 1e6)
                if last_seq is not None and seq > last_seq + 1:
                    out.seq_gaps += seq - last_seq - 1
            last_seq = seq


def flood(endpoint: str, topics: int, seconds: float, sent: Any) -> None:
    """Subscribe to ``topics`` distinct topics, then subscribe/unsubscribe until ``seconds``
    have passed since the start; ``sent``: the subscription messages sent. Runs in a process
    of its own, so that the observer's receipt times are not the flood's GIL waits."""
    # sndhwm 0, no limit: with the default 1000, libzmq drops the flood's excess itself.
    # Closed at the end: the agent sees the disconnect, and every subscription of it goes.
    with Subscriber(endpoint, (), sndhwm=0) as sub:
        deadline = time.monotonic() + seconds
        for i in range(topics):
            sub.subscribe(b"flood.%08d" % i)
            sent.value += 1
            if i % 4096 == 0 and time.monotonic() >= deadline:
                break
        i = 0
        while time.monotonic() < deadline:
            for _ in range(1024):
                topic = b"churn.%08d" % i
                sub.subscribe(topic)
                sub.unsubscribe(topic)
                i += 1
            sent.value += 2048


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def busy(seconds: float, sent: Any) -> None:
    """The control: one process spinning on a core for as long as the flood, sending nothing,
    so that what the flood costs beyond its CPU share shows."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(10_000))


def run_once(args: argparse.Namespace, load: str) -> dict[str, float]:
    """One run of the agent; ``load``: "quiet", "flood" or "busy" (the control)."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    env = {
        **os.environ,
        "EDGE_AGENT__PUBLISH__ENDPOINT": endpoint,
        "EDGE_AGENT__METRICS__ENABLED": "false",
    }
    exe = shutil.which("edge-agent", path=str(Path(sys.executable).parent)) or "edge-agent"
    total_s = WARMUP_S + args.flood_s + SETTLE_S + 3
    agent = subprocess.Popen(
        [exe, "run", "--duration", str(total_s), "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    stop, measuring = threading.Event(), threading.Event()
    seen = Observed()
    observer = threading.Thread(target=observe, args=(endpoint, stop, measuring, seen), daemon=True)
    observer.start()
    result: dict[str, float] = {}
    flooder = None
    try:
        time.sleep(WARMUP_S)
        if agent.poll() is not None:
            raise SystemExit(f"the agent exited early: {agent.stderr.read().decode()[-2000:]}")
        result["rss_before_mb"] = rss_mb(agent.pid)
        measuring.set()
        peak = result["rss_before_mb"]
        flooder = None
        spawn = multiprocessing.get_context("spawn")
        sent = spawn.Value("q", 0, lock=False)
        if load == "flood":
            flooder = spawn.Process(target=flood, args=(endpoint, args.topics, args.flood_s, sent))
        elif load == "busy":
            flooder = spawn.Process(target=busy, args=(args.flood_s, sent))
        if flooder is not None:
            flooder.start()
        end = time.monotonic() + args.flood_s
        while time.monotonic() < end or (flooder is not None and flooder.is_alive()):
            peak = max(peak, rss_mb(agent.pid))
            time.sleep(0.2)
            if time.monotonic() > end + 10:
                break
        result["rss_during_peak_mb"] = peak
        time.sleep(SETTLE_S)
        measuring.clear()
        result["rss_after_mb"] = rss_mb(agent.pid)
        result["subscription_messages"] = sent.value
    finally:
        stop.set()
        if flooder is not None and flooder.is_alive():
            flooder.kill()
            flooder.join(5)
        observer.join(2)
        stop_group(agent)
    gaps = [(b - a) / 1e9 for a, b in zip(seen.beats, seen.beats[1:])]
    result["heartbeats"] = len(seen.beats)
    result["heartbeat_gap_max_s"] = max(gaps) if gaps else float("nan")
    result["frames_dropped"] = (seen.dropped[-1] - seen.dropped[0]) if seen.dropped else float("nan")
    result["seq_gaps"] = seen.seq_gaps
    result["results"] = len(seen.e2e_ms)
    result["e2e_p50_ms"] = percentile(seen.e2e_ms, 0.50)
    result["e2e_p99_ms"] = percentile(seen.e2e_ms, 0.99)
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topics", type=int, default=1_000_000, help="distinct topics subscribed first")
    p.add_argument("--flood-s", type=float, default=10.0, help="the flood's length, seconds")
    p.add_argument("--repeat", type=int, default=1, help="rounds of runs (quiet, busy, flood), in turn")
    args = p.parse_args()
    args.flood_s = min(max(args.flood_s, 1.0), 15.0)  # bounded: each run stays under 30 s
    interval = 1.0  # publish.health_interval_s, the default
    # Runs in turn (quiet, busy, flood, quiet, ...): a machine whose speed changes over the
    # minutes weighs on every kind alike. "busy" spins a core as long as the flood: on a
    # machine with few cores the flood's own process takes that share from the agent.
    for n in range(1, args.repeat + 1):
        quiet = run_once(args, "quiet")
        control = run_once(args, "busy")
        flooded = run_once(args, "flood")
        print(f"round {n} of {args.repeat}")
        print(f"{'':26}{'no flood':>12}{'busy core':>12}{'flood':>12}")
        for key in quiet:
            print(f"{key:26}{quiet[key]:12.1f}{control[key]:12.1f}{flooded[key]:12.1f}")
        print()
        gap = flooded["heartbeat_gap_max_s"]
        print(f"heartbeat gap max: {gap:.2f} s (interval {interval} s, target <= 2x)")
        ratio = flooded["e2e_p99_ms"] / quiet["e2e_p99_ms"]
        print(f"e2e p99 with/without the flood: {ratio:.2f}x (target <= 1.5x)")
        share = flooded["e2e_p99_ms"] / control["e2e_p99_ms"]
        print(f"e2e p99 flood / a busy core (the flood's CPU share): {share:.2f}x")
        back = flooded["rss_after_mb"] - flooded["rss_before_mb"]
        print(f"RSS after - before the flood: {back:+.1f} MB (target within 10 MB)", flush=True)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
