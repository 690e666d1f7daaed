"""Memory over a long run: one candidate, one process, objects coming and going.

    /tmp/trackvenv/bin/python soak.py --candidate ours-lap --frames 100000 --out soak.jsonl

The stream: objects are born at random (three a second on average), move at constant
velocity, and leave after at most 1-20 s (they vanish, or walk out of the view first); about
11 are present at once, and over 100,000 frames (55 minutes at 30 fps) some 10,000 pass. Detections:
each present object with 1.5 px jitter, 5 % missed, 15 % scored low; 0.3 random false
positives per frame. Every ``--every`` frames the script records the number of track objects
the tracker holds (``stored()``: live, lost and any kept history), the process's RSS and
the mean per-frame time of the window.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

import numpy as np
from adapters import make

W, H = 640, 480


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Stream:
    def __init__(self, seed: int = 5) -> None:
        self.rng = np.random.default_rng(seed)
        self.obj = np.zeros((0, 7))  # x, y, vx, vy, size, death frame, class

    def frame(self, t: int) -> np.ndarray:
        rng = self.rng
        born = rng.poisson(1 / 10)
        if born:
            new = np.column_stack(
                [
                    rng.uniform(0, W - 60, born),
                    rng.uniform(0, H - 60, born),
                    rng.normal(0, 2.5, born),
                    rng.normal(0, 2.5, born),
                    rng.uniform(25, 80, born),
                    t + rng.integers(30, 600, born),
                    rng.integers(0, 4, born),
                ]
            )
            self.obj = np.concatenate([self.obj, new])
        o = self.obj
        o[:, 0:2] += o[:, 2:4]
        inside = (
            (o[:, 0] > -o[:, 4] * 0.5)
            & (o[:, 1] > -o[:, 4] * 0.5)
            & (o[:, 0] < W - o[:, 4] * 0.5)
            & (o[:, 1] < H - o[:, 4] * 0.5)
        )
        self.obj = o = o[inside & (o[:, 5] > t)]
        n = len(o)
        seen = rng.random(n) >= 0.05
        xyxy = np.column_stack([o[:, 0], o[:, 1], o[:, 0] + o[:, 4], o[:, 1] + o[:, 4]]) + rng.normal(
            0, 1.5, (n, 4)
        )
        score = np.where(rng.random(n) < 0.15, rng.uniform(0.15, 0.45, n), rng.uniform(0.6, 0.95, n))
        d = np.column_stack([xyxy, score, o[:, 6]])[seen]
        fp = rng.poisson(0.3)
        if fp:
            s = rng.uniform(25, 80, fp)
            x, y = rng.uniform(0, W - 80, fp), rng.uniform(0, H - 80, fp)
            d = np.concatenate(
                [d, np.column_stack([x, y, x + s, y + s, rng.uniform(0.1, 0.7, fp), np.zeros(fp)])]
            )
        d[:, 0:4] = np.clip(d[:, 0:4], 0, [W, H, W, H])
        return d[(d[:, 2] - d[:, 0] > 2) & (d[:, 3] - d[:, 1] > 2)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--candidate", required=True)
    p.add_argument("--frames", type=int, default=100_000)
    p.add_argument("--every", type=int, default=5_000)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    tracker = make(a.candidate, 1)
    stream = Stream()
    max_id = 0
    win_ns, win_n, present = 0, 0, 0
    with open(a.out, "a") as f:
        for t in range(a.frames):
            d = stream.frame(t)
            present += len(stream.obj)
            t0 = time.perf_counter_ns()
            _, ids = tracker.step(d, t)
            win_ns += time.perf_counter_ns() - t0
            win_n += 1
            if len(ids):
                max_id = max(max_id, int(ids.max()))
            if (t + 1) % a.every == 0:
                gc.collect()
                rec = {
                    "candidate": a.candidate,
                    "frame": t + 1,
                    "stored_tracks": tracker.stored(),
                    "rss_mib": round(rss_mib(), 1),
                    "mean_us": round(win_ns / win_n / 1e3, 1),
                    "objects_present_mean": round(present / win_n, 2),
                    "max_track_id": max_id,
                }
                f.write(json.dumps(rec) + "\n")
                f.flush()
                print(json.dumps(rec), flush=True)
                win_ns = win_n = present = 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
