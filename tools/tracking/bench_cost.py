"""Cost per frame of each candidate at 10 and 72 boxes per frame, interleaved.

    /tmp/trackvenv/bin/python bench_cost.py --group np2 --rounds 1 --out costs.jsonl

A stream of exactly N detections per frame (N = 10, 72): the synthetic scene's objects
(``SyntheticScene.boxes``: its motion, no rendering) with 1.5 px box jitter, 85 % of the
boxes scored 0.6-0.95 and 15 % 0.15-0.45 (the low-score stage has work). Each round runs
every candidate of the group over both streams in a rotating order, a fresh tracker each
time; the first ``WARMUP`` frames of each run are not recorded. The time is one call of the
adapter's ``step``: the library's update and the conversion of a numpy array into the
library's input type (what using it costs). Every group has ``ours-lap`` in it, so runs in
different venvs (processes) can be compared through it.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from adapters import GROUPS, make

FRAMES = 600
WARMUP = 100
BOX_COUNTS = (10, 72)


class _Motion:
    """The synthetic scene's objects (pipelines/sources/synthetic.py: the same random draws,
    the same positions) without its rendering, so that every side venv can make the streams."""

    def __init__(self, seed: int, n: int, frac: tuple[float, float], w: int = 640, h: int = 480) -> None:
        rng = np.random.default_rng(seed)
        self.sizes = np.round(rng.uniform(frac[0], frac[1], n) * min(w, h)).astype(np.int32)
        self.classes = rng.integers(0, 4, n).astype(np.int32)
        self.start = rng.uniform(0, 1, (n, 2)) * np.stack([w - self.sizes, h - self.sizes], 1)
        angle = rng.uniform(0, 2 * np.pi, n)
        speed = rng.uniform(0.3, 1.0, n) * 6.0
        self.velocity = np.stack([np.cos(angle), np.sin(angle)], 1) * speed[:, None]
        self.hi = np.stack([w - self.sizes, h - self.sizes], 1).astype(np.float64)

    def boxes(self, t: int) -> np.ndarray:
        period = 2.0 * self.hi
        m = np.mod(self.start + self.velocity * t, period)
        return np.round(np.where(m <= self.hi, m, period - m)).astype(np.int32)


def stream(n: int, frames: int = FRAMES, seed: int = 11) -> list[np.ndarray]:
    # small objects so 72 fit a 640x480 view as a crowd does
    scene = _Motion(seed, n, (0.05, 0.15) if n <= 20 else (0.03, 0.08))
    rng = np.random.default_rng(seed)
    low = rng.random(n) < 0.15
    out = []
    for t in range(frames):
        c = scene.boxes(t).astype(np.float64)
        s = scene.sizes[:, None].astype(np.float64)
        xyxy = np.concatenate([c, c + s], 1) + rng.normal(0, 1.5, (n, 4))
        score = np.where(low, rng.uniform(0.15, 0.45, n), rng.uniform(0.6, 0.95, n))
        out.append(np.column_stack([xyxy, score, scene.classes]).astype(np.float64))
    return out


def run(name: str, frames: list[np.ndarray]) -> np.ndarray:
    tracker = make(name, 1)
    times = np.empty(len(frames), np.int64)
    for t, d in enumerate(frames):
        t0 = time.perf_counter_ns()
        tracker.step(d, t)
        times[t] = time.perf_counter_ns() - t0
    return times[WARMUP:]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", choices=sorted(GROUPS), required=True)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--round-offset", type=int, default=0, help="rotation of the order (vary it across calls)")
    p.add_argument("--out", required=True, help="jsonl to append the per-run percentiles to")
    a = p.parse_args()
    names = GROUPS[a.group]
    streams = {n: stream(n) for n in BOX_COUNTS}
    with open(a.out, "a") as f:
        for r in range(a.rounds):
            k = (r + a.round_offset) % len(names)
            for name in names[k:] + names[:k]:
                for n in BOX_COUNTS:
                    us = run(name, streams[n]) / 1e3
                    rec = {
                        "group": a.group,
                        "round": r + a.round_offset,
                        "candidate": name,
                        "boxes": n,
                        "p50_us": float(np.percentile(us, 50)),
                        "p99_us": float(np.percentile(us, 99)),
                        "mean_us": float(us.mean()),
                        "frames": len(us),
                    }
                    f.write(json.dumps(rec) + "\n")
                    print(
                        f"{a.group} r{rec['round']} {name:20} {n:3} boxes  p50 {rec['p50_us']:8.0f} us"
                        f"  p99 {rec['p99_us']:8.0f} us",
                        flush=True,
                    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
