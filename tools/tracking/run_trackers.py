"""Run a venv group's candidates over every sequence and stride; keep their outputs.

    /tmp/trackvenv/bin/python run_trackers.py --group np2
    /tmp/trackvenv-np1/bin/python run_trackers.py --group np1
    /tmp/trackvenv-ul/bin/python run_trackers.py --group ul
    /tmp/trackvenv/bin/python run_trackers.py --group np2 --only trackers-bytetrack --scenes occlude turns

Writes $TRACKING_WORK/outputs/<candidate>/<sequence>-k<stride>.npz: ``rows`` (frame, id,
x1, y1, x2, y2) and ``step_ns`` (each update's time). The ``ours-lap@...`` twins exist for
the cost benchmark and are skipped here.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from adapters import GROUPS, make
from common import OUT_DIR, STRIDES, frames_of, list_sequences, load_sequence


def run_one(name: str, dets: np.ndarray, frames: int, stride: int):
    tracker = make(name, stride)
    rows, times = [], []
    for t, d in frames_of(dets, frames, stride):
        d6 = d[:, 1:7]
        t0 = time.perf_counter_ns()
        boxes, ids = tracker.step(d6, t)
        times.append(time.perf_counter_ns() - t0)
        if len(ids):
            rows.append(np.column_stack([np.full(len(ids), t), ids, boxes]))
    out = np.concatenate(rows) if rows else np.zeros((0, 6))
    return out, np.array(times, np.int64)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--group", choices=sorted(GROUPS), required=True)
    p.add_argument("--only", nargs="*", help="candidates (default: the group's)")
    p.add_argument("--scenes", nargs="+", help="only the sequences of these scenes (default: all)")
    a = p.parse_args()
    names = a.only or [n for n in GROUPS[a.group] if "@" not in n]
    # sequence names: <source>-<scene>-s<seed>
    seqs = [s for s in list_sequences() if not a.scenes or s.stem.split("-")[1] in a.scenes]
    for name in names:
        t0 = time.perf_counter()
        (OUT_DIR / name).mkdir(parents=True, exist_ok=True)
        for path in seqs:
            _, dets, meta = load_sequence(path)
            for stride in STRIDES:
                rows, times = run_one(name, dets, meta["frames"], stride)
                np.savez_compressed(OUT_DIR / name / f"{path.stem}-k{stride}.npz", rows=rows, step_ns=times)
        print(
            f"{name}: {len(seqs)} sequences x {len(STRIDES)} strides in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
