"""The analytics' cost per frame alone (``Counter.update``): 72 tracked boxes moving through
8 zones (and ``--lines`` lines), 600 frames after 100 of warm-up, on the numpy path and the
compiled one (``--paths``), each round both in turn, in one process.

    .venv/bin/python tools/analytics/cost.py --lines 0 --evict-mb 0
    .venv/bin/python tools/analytics/cost.py --lines 4 --evict-mb 64 --paths numpy,numba

``--evict-mb``: an array that size written between frames, as an inference does to the
caches (inside the agent every frame's analytics starts cold). Inside the agent the same
work is timed per frame and reported in the heartbeat (``analytics.cost_ms``). The boxes
have a frame slot's dtypes (float32 boxes, int32 classes, int64 ids).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.pipelines import jit
from edge_agent.pipelines.analytics.counter import Counter


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--boxes", type=int, default=72)
    p.add_argument("--zones", type=int, default=8)
    p.add_argument("--lines", type=int, default=0)
    p.add_argument("--evict-mb", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--paths", default="numpy,numba", help="numpy, numba, or both (in turn each round)")
    a = p.parse_args()
    zones = tuple(
        ZoneConfig(
            name=f"z{i}",
            points=((0.1 * i, 0.1), (0.1 * i + 0.15, 0.1), (0.1 * i + 0.15, 0.9), (0.1 * i, 0.9)),
        )
        for i in range(a.zones)
    )
    lines = tuple(
        LineConfig(name=f"l{i}", points=((0.05, 0.1 * i + 0.1), (0.95, 0.1 * i + 0.15)))
        for i in range(a.lines)
    )
    cfg = AnalyticsConfig(zones=zones, lines=lines)
    labels = ("a", "b", "c", "d")
    t0 = time.perf_counter()
    Counter(cfg, labels, 30, 512)  # the kernel compiled, or loaded from its disk cache
    print(f"kernels: {jit.state()} (first counter built in {(time.perf_counter() - t0) * 1e3:.0f} ms)")
    rng = np.random.default_rng(0)
    n = a.boxes
    start, vel = rng.uniform(0, 600, (n, 2)), rng.uniform(-3, 3, (n, 2))
    ids = np.arange(1, n + 1, dtype=np.int64)
    cls = rng.integers(0, 4, n).astype(np.int32)
    xyxy = np.zeros((n, 4), np.float32)
    evict = np.ones(a.evict_mb << 17) if a.evict_mb else None
    for r in range(a.rounds):
        for path in a.paths.split(","):
            counter = Counter(cfg, labels, 30, 512, compiled=path == "numba")
            if path == "numba" and not counter.compiled:
                print(f"round {r}: numba: not loaded ({jit.state().get('fallback')})")
                continue
            events: list[dict] = []
            us = []
            pos = start.copy()
            for f in range(700):
                pos += vel
                np.clip(pos, 0, 600, out=pos)
                xyxy[:, :2] = pos
                xyxy[:, 2:] = pos + 30
                if evict is not None:
                    evict += 1.0
                t0 = time.perf_counter_ns()
                counter.update(xyxy, cls, ids, ids, f, f / 30, 640, 480, events)
                us.append((time.perf_counter_ns() - t0) / 1e3)
                events.clear()
            v = np.array(us[100:])
            print(
                f"round {r}: {path:5} {n} boxes, {a.zones} zones, {a.lines} lines:"
                f" p50 {np.percentile(v, 50):.1f} us  p99 {np.percentile(v, 99):.1f} us"
                f"  ({counter.events} events)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
