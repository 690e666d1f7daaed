"""How often the tracker's journey links join one object's tracks, against the truth.

    TRACKING_WORK=/tmp/tracking .venv-3.12/bin/python tools/analytics/links.py [--only PREFIX...]

Each sequence of tools/tracking runs through the agent's tracker (default settings, the
detections down to 0.1, as ``measure.py`` feeds it). Each published detection is matched to
a true box (optimal assignment on IoU, at least 0.3). A link (a new track continuing a lost
one's journey) is right when the true object last matched by the lost track is the one
first matched by the new track. The matching is itself uncertain where boxes are half
hidden, which is where links happen: read the figures as an estimate.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
from common import frames_of, list_sequences, load_sequence

from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.tracking.boxes import box_iou
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

VIEW = (640.0, 480.0)


def links_of(truth: np.ndarray, dets: np.ndarray, frames: int) -> tuple[int, int]:
    """(right, wrong) links in one sequence."""
    tracker = ByteTracker(TrackerConfig())
    tracker.view = VIEW
    ids = np.zeros(1024, np.int64)
    age = np.zeros(1024, np.int32)
    journeys = np.zeros(1024, np.int64)
    first: dict[int, int] = {}  # track -> the true object it first matched
    last: dict[int, int] = {}  # track -> the true object it last matched
    tracks_of: dict[int, set[int]] = defaultdict(set)  # journey -> its tracks
    for t, d in frames_of(dets, frames, 1):
        xyxy = np.ascontiguousarray(d[:, 1:5])
        tracker.update(xyxy, d[:, 5].astype(np.float32), d[:, 6].astype(np.int32), 1.0, ids, age, journeys)
        g = truth[truth[:, 0] == t]
        if not len(g) or not len(d):
            continue
        iou = box_iou(g[:, 2:6], xyxy)
        rows, cols = linear_sum_assignment(-iou)
        for i, j in zip(rows, cols):
            if iou[i, j] >= 0.3 and ids[j] > 0:
                track, obj = int(ids[j]), int(g[i, 1])
                first.setdefault(track, obj)
                last[track] = obj
                tracks_of[int(journeys[j])].add(track)
    outcome: Counter[bool] = Counter()
    for tracks in tracks_of.values():
        chain = sorted(tracks)
        for old, new in itertools.pairwise(chain):
            outcome[last[old] == first[new]] += 1
    return outcome[True], outcome[False]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="sequence name prefixes")
    a = p.parse_args()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    print("| sequence | links right | wrong |\n|---|---|---|")
    for path in list_sequences():
        if a.only and not any(path.stem.startswith(o) for o in a.only):
            continue
        truth, dets, meta = load_sequence(path)
        right, wrong = links_of(truth, dets, meta["frames"])
        print(f"| {path.stem} | {right} | {wrong} |")
        totals[meta["source"]][0] += right
        totals[meta["source"]][1] += wrong
    for source, (right, wrong) in totals.items():
        share = 100.0 * right / max(right + wrong, 1)
        print(f"| **{source}, all** | {right} | {wrong} ({share:.0f} % right) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
