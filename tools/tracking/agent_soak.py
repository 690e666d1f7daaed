"""The agent with tracking on, for an hour: is its memory and its tracker's cost flat?

    .venv/bin/python tools/tracking/agent_soak.py --minutes 60 --out /tmp/track-soak.jsonl

Runs ``edge-agent run`` (a subprocess) on four synthetic cameras whose objects enter and
leave the view (``world_margin``), each with its tracker, and reads every heartbeat: the
process's RSS, each source's live tracks, ids issued, refused tracks and the tracker's
per-frame cost since the previous beat. Prints the first and the last ``--window``
minutes side by side; every heartbeat's figures go to ``--out`` (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(port: int, sources: int) -> str:
    lines = [
        "device_id: track-soak",
        f"publish: {{endpoint: 'tcp://127.0.0.1:{port}'}}",
        "sources:",
    ]
    for i in range(sources):
        lines.append(f"  - {{name: cam{i}, type: synthetic, seed: {i + 1}, num_objects: 12,")
        lines.append("      world_margin: 0.2, fps: 30}")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=60.0)
    p.add_argument("--window", type=float, default=5.0, help="minutes compared at each end")
    p.add_argument("--sources", type=int, default=4)
    p.add_argument("--out", default="track-soak.jsonl")
    a = p.parse_args()
    port = free_port()
    work = Path(tempfile.mkdtemp(prefix="track-soak-"))
    cfg = work / "soak.yaml"
    cfg.write_text(config(port, a.sources))
    duration = a.minutes * 60
    cmd = [
        sys.executable,
        "-m",
        "edge_agent",
        "run",
        "--config",
        str(cfg),
        "--duration",
        str(duration),
        "--quiet",
    ]
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{port}")
    sub.setsockopt(zmq.SUBSCRIBE, b"health")
    rows = []
    with open(work / "agent.log", "w") as log, open(a.out, "w") as out:
        agent = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        try:
            t0 = time.monotonic()
            while agent.poll() is None and time.monotonic() - t0 < duration + 60:
                if not sub.poll(1000):
                    continue
                _, body = sub.recv().split(b" ", 1)
                hb = json.loads(body)
                tr = hb.get("tracking")
                if tr is None:
                    continue
                row = {
                    "t_s": round(time.monotonic() - t0, 1),
                    "source": hb["source"],
                    "rss_mb": round(hb["process"]["rss_bytes"] / 2**20, 2),
                    "live": tr["live"],
                    "ids_issued": tr["ids_issued"],
                    "overflow": tr["overflow"],
                    "frames": tr["cost_ms"]["window"]["count"],
                    "cost_p50_ms": tr["cost_ms"]["window"]["p50"],
                    "cost_p99_ms": tr["cost_ms"]["window"]["p99"],
                    "published": hb["counts"]["on_time"] + hb["counts"]["late"],
                }
                rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
        finally:
            if agent.poll() is None:
                agent.terminate()
                try:
                    agent.wait(10)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
            sub.close()
            ctx.term()
    if not rows:
        print(f"no heartbeats (see {work / 'agent.log'})")
        return 1
    end = max(r["t_s"] for r in rows)
    w = a.window * 60
    first = [r for r in rows if r["t_s"] <= w]
    last = [r for r in rows if r["t_s"] >= end - w]

    def figures(part):
        with_frames = [r for r in part if r["frames"]]
        return {
            "RSS MiB (median)": np.median([r["rss_mb"] for r in part]),
            "RSS MiB (max)": max(r["rss_mb"] for r in part),
            "tracker p50 ms (median of beats)": np.median([r["cost_p50_ms"] for r in with_frames]),
            "tracker p99 ms (median of beats)": np.median([r["cost_p99_ms"] for r in with_frames]),
            "live tracks per source (max)": max(r["live"] for r in part),
            "frames per beat per source (mean)": np.mean([r["frames"] for r in part]),
        }

    f, l_ = figures(first), figures(last)
    print(f"{a.sources} sources, {end / 60:.1f} min; first and last {a.window:g} min")
    print(f"| figure | first {a.window:g} min | last {a.window:g} min |\n|---|---|---|")
    for k in f:
        print(f"| {k} | {f[k]:.3f} | {l_[k]:.3f} |")
    final = {r["source"]: r for r in rows}
    print("ids issued per source:", {s: r["ids_issued"] for s, r in sorted(final.items())})
    print("tracks refused (overflow):", sum(r["overflow"] for r in final.values()))
    print("agent exit status:", agent.returncode, "| log:", work / "agent.log")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
