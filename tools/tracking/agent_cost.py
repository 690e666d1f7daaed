"""The agent's tracker alone: its ``update`` per frame at 10 and 72 boxes, on the same box
streams as bench_cost.py (the synthetic scene's motion, jitter, 15 % low-scored boxes).

    .venv/bin/python tools/tracking/agent_cost.py --rounds 3

Prints p50 and p99 (us) per round; the first 100 frames of each run are warm-up. Inside
the agent the same work is timed per frame and reported by ``edge-agent bench`` (``of
which tracker``) and in each heartbeat (``tracking.cost_ms``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from bench_cost import BOX_COUNTS, WARMUP, stream

from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.tracking.bytetrack import ByteTracker


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    streams = {}
    for n in BOX_COUNTS:
        streams[n] = [
            (np.ascontiguousarray(d[:, :4], np.float32), d[:, 4].astype(np.float32), d[:, 5].astype(np.int32))
            for d in stream(n)
        ]
    ids = np.zeros(1024, np.int64)
    age = np.zeros(1024, np.int32)
    for r in range(a.rounds):
        for n, frames in streams.items():
            tracker = ByteTracker(TrackerConfig())
            us = np.empty(len(frames))
            for i, (xyxy, scores, classes) in enumerate(frames):
                t0 = time.perf_counter_ns()
                tracker.update(xyxy, scores, classes, 1.0, ids, age)
                us[i] = (time.perf_counter_ns() - t0) / 1e3
            us = us[WARMUP:]
            print(
                f"round {r}: {n:3d} boxes/frame: p50 {np.percentile(us, 50):6.1f} us"
                f"  p99 {np.percentile(us, 99):6.1f} us  ({len(us)} frames, {tracker.live} tracks at the end)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
