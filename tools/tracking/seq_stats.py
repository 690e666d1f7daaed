"""What the sequences hold, per detection source and scene (mean over the seeds):

- objects in the scene, truth ids (one per pass through the view), truth boxes per frame
  (mean, max), entries through each edge of the view (left, right, top, bottom);
- occlusion: truth rows under 50 % visible; the longest run of one object under 10 %
  visible (frames, max over seeds);
- hidden behind an occluder: runs of frames in which one truth id is under 20 % visible
  while its box lies mostly (half or more, in most of the run's frames) on a static
  occluder: how many, and their length in seconds (10th, 50th, 90th percentile, max, and
  the share within 0.5-2 s, the scenes' goal);
- same-class crossings: pairs of truth ids of one class whose boxes overlap (IoU >= 0.3) in
  some frame, per minute;
- detections per frame, the share scored under 0.5, and false detections on occluders:
  boxes lying mostly on an occluder with no truth box (hidden or not) under a fifth of
  them or more, per 1,000 frames, and those scored 0.25 or more (for the bundled detector:
  does it take an occluder for a shape? The noisy source's random false positives and
  clutter spots land there too).

    python seq_stats.py                  # every sequence in $TRACKING_WORK/seqs
    python seq_stats.py --scenes occlude turns
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import numpy as np
from common import FPS, SCENES, VIEW_H, VIEW_W, list_sequences, load_sequence, occluders_in_view

HIDDEN = 0.2  # visibility under this: hidden
ON_OCCLUDER = 0.5  # fraction of a box on an occluder for it to count as behind one


def longest_hidden(truth: np.ndarray, below: float = 0.1) -> int:
    best = 0
    for i in np.unique(truth[:, 1]):
        v = truth[truth[:, 1] == i]
        run = 0
        prev = None
        for f, vis in zip(v[:, 0], v[:, 6]):
            run = run + 1 if vis < below and (prev is None or f == prev + 1) else (1 if vis < below else 0)
            prev = f
            best = max(best, run)
    return best


def on_occluders(boxes: np.ndarray, occ: list[tuple[int, int, int, int]]) -> np.ndarray:
    """Fraction of each x1, y1, x2, y2 box lying on the occluders (they do not overlap)."""
    area = np.maximum((boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1]), 1e-9)
    cover = np.zeros(len(boxes))
    for x1, y1, x2, y2 in occ:
        iw = np.clip(np.minimum(boxes[:, 2], x2) - np.maximum(boxes[:, 0], x1), 0, None)
        ih = np.clip(np.minimum(boxes[:, 3], y2) - np.maximum(boxes[:, 1], y1), 0, None)
        cover += iw * ih
    return cover / area


def hidden_runs(truth: np.ndarray, occ: list) -> list[int]:
    """Lengths (frames) of the runs of one id under HIDDEN visibility, mostly on an occluder."""
    if not occ:
        return []
    onocc = on_occluders(truth[:, 2:6], occ) >= ON_OCCLUDER
    out = []
    order = np.lexsort((truth[:, 0], truth[:, 1]))
    t, ids, hid, oc = truth[order, 0], truth[order, 1], truth[order, 6] < HIDDEN, onocc[order]
    start = None
    for k in range(len(t) + 1):
        cont = k < len(t) and hid[k] and start is not None and ids[k] == ids[k - 1] and t[k] == t[k - 1] + 1
        if cont:
            continue
        if start is not None:  # the run start..k-1 ends
            if oc[start:k].mean() >= 0.5:
                out.append(k - start)
            start = None
        if k < len(t) and hid[k]:
            start = k
    return out


def intersection(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) areas of the intersections of x1, y1, x2, y2 boxes."""
    iw = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    ih = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    return iw * ih


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    inter = intersection(a, b)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def by_frame(rows: np.ndarray, frames: int) -> list[np.ndarray]:
    idx = np.searchsorted(rows[:, 0], np.arange(frames + 1), side="left")
    return [rows[idx[t] : idx[t + 1]] for t in range(frames)]


def same_class_crossings(truth: np.ndarray, frames: int) -> int:
    pairs = set()
    for g in by_frame(truth, frames):
        if len(g) < 2:
            continue
        m = iou_matrix(g[:, 2:6], g[:, 2:6])
        same = g[:, None, 7] == g[None, :, 7]
        a, b = np.nonzero(np.triu((m >= 0.3) & same, 1))
        pairs.update((int(g[i, 1]), int(g[j, 1])) for i, j in zip(a, b))
    return len(pairs)


def edge_entries(truth: np.ndarray) -> list[int]:
    """Per edge (left, right, top, bottom): truth ids whose first box touches it."""
    _, first = np.unique(truth[:, 1], return_index=True)
    b = truth[first, 2:6]
    return [
        int(np.sum(b[:, 0] <= 0.5)),
        int(np.sum(b[:, 2] >= VIEW_W - 0.5)),
        int(np.sum(b[:, 1] <= 0.5)),
        int(np.sum(b[:, 3] >= VIEW_H - 0.5)),
    ]


def under_objects(dets: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per box: does a truth box (hidden or not) cover at least 20 % of it? (A partly hidden
    object's visible sliver at an occluder's edge is often boxed there, half on the occluder.)"""
    area = np.maximum((dets[:, 2] - dets[:, 0]) * (dets[:, 3] - dets[:, 1]), 1e-9)
    return (intersection(dets, truth) / area[:, None]).max(1) >= 0.2


def false_on_occluders(truth: np.ndarray, dets: np.ndarray, frames: int, occ: list) -> tuple[int, int]:
    """(all, scored >= 0.25)"""
    if not occ or not len(dets):
        return 0, 0
    n = high = 0
    tf, df = by_frame(truth, frames), by_frame(dets, frames)
    for g, d in zip(tf, df):
        if not len(d):
            continue
        mostly = on_occluders(d[:, 1:5], occ) >= ON_OCCLUDER
        if not mostly.any():
            continue
        match = under_objects(d[mostly, 1:5], g[:, 2:6]) if len(g) else np.zeros(mostly.sum(), bool)
        n += int(np.sum(~match))
        high += int(np.sum(~match & (d[mostly, 5] >= 0.25)))
    return n, high


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenes", nargs="+", choices=list(SCENES), help="only these scenes")
    a = p.parse_args()
    by = defaultdict(list)
    for path in list_sequences():
        truth, dets, meta = load_sequence(path)
        if a.scenes and meta["scene"] not in a.scenes:
            continue
        n = meta["frames"]
        scene = SCENES[meta["scene"]]
        occ = occluders_in_view(scene)
        per_frame = np.bincount(truth[:, 0].astype(int), minlength=n)
        by[(meta["source"], meta["scene"])].append(
            {
                "objects": scene.num_objects,
                "frames": n,
                "ids": len(np.unique(truth[:, 1])),
                "truth/frame": len(truth) / n,
                "truth max": int(per_frame.max()),
                "entries": edge_entries(truth),
                "vis<0.5 %": 100 * np.mean(truth[:, 6] < 0.5),
                "longest": longest_hidden(truth),
                "hidden": hidden_runs(truth, occ),
                "crossings": same_class_crossings(truth, n),
                "dets/frame": len(dets) / n,
                "low": 100 * np.mean(dets[:, 5] < 0.5) if len(dets) else 0.0,
                "on occluders": false_on_occluders(truth, dets, n, occ),
            }
        )
    head = (
        "| source | scene | seqs | objects | frames | truth ids | truth/frame (max) | entries L/R/T/B "
        "| vis<0.5 % | longest <10% visible (frames) | hidden behind occluders: runs/seq "
        "| hidden s: p10 / p50 / p90 (max) | hidden 0.5-2 s % | same-class crossings/min "
        "| dets/frame | dets <0.5 score % | false dets on occluders /1000 frames (score >= 0.25) |"
    )
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for (src, scene), g in sorted(by.items(), key=lambda kv: (kv[0][0], list(SCENES).index(kv[0][1]))):

        def mean(k: str, g: list = g) -> float:
            return float(np.mean([x[k] for x in g]))

        runs = np.concatenate([np.array(x["hidden"], float) for x in g]) / FPS
        if len(runs):
            q = np.percentile(runs, [10, 50, 90])
            hid = f"{q[0]:.2f} / {q[1]:.2f} / {q[2]:.2f} ({runs.max():.1f})"
            goal = f"{100 * np.mean((runs >= 0.5) & (runs <= 2.0)):.0f}"
        else:
            hid, goal = "", ""
        entries = "/".join(f"{v:.0f}" for v in np.mean([x["entries"] for x in g], axis=0))
        minutes = np.mean([x["frames"] for x in g]) / FPS / 60
        print(
            f"| {src} | {scene} | {len(g)} | {g[0]['objects']} | {g[0]['frames']} | {mean('ids'):.0f} "
            f"| {mean('truth/frame'):.1f} ({max(x['truth max'] for x in g)}) | {entries} "
            f"| {mean('vis<0.5 %'):.1f} | {max(x['longest'] for x in g)} "
            f"| {len(runs) / len(g):.1f} | {hid} | {goal} | {mean('crossings') / minutes:.1f} "
            f"| {mean('dets/frame'):.1f} | {mean('low'):.1f} "
            f"| {1000 * sum(x['on occluders'][0] for x in g) / sum(x['frames'] for x in g):.1f} "
            f"({1000 * sum(x['on occluders'][1] for x in g) / sum(x['frames'] for x in g):.1f}) |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
