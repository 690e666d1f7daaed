"""Compare two per-frame dumps of a pose, oriented-box or segmentation model: how many of the
reference's detections the candidate reproduces, and how closely.

    .venv/bin/python tools/compare_tasks.py REFERENCE.npz CANDIDATE.npz [--iou 0.99]
        [--mask-iou 0.95] [--kpt-px 0.5] [--size 640x480] [--name LABEL] [--json OUT]

e.g. Ultralytics' own predict (``tools/exports/ultralytics_predict.py``) as the reference,
the agent (``tools/dump_detections.py``) as the candidate. Both hold per frame ``arr_i``
(n, 6) x1 y1 x2 y2 score class in source pixels, and the task's arrays: ``kpt_i`` (n, K, D)
keypoints; ``obb_i`` (n, 5) cx, cy, w, h, angle (radians); ``rle_i``/``rlen_i`` each mask's
COCO RLE counts (column-major over the frame, starting with zeros), concatenated, and
their lengths. The task is read from which arrays are there.

Matching, per frame, every reference detection in turn (the file's order) to the unmatched
candidate detection of the same class that overlaps it most: box IoU (pose, segmentation)
or the rotated boxes' polygon IoU (oriented boxes), a match when it is at least ``--iou``.
A reference box with a side under 0.5 px, or inverted, has no meaningful IoU (random-weight
heads make them): it is matched by coordinates instead (within 0.5 px). For the matched
pairs it reports the largest box and score differences, and per task: the keypoints within
``--kpt-px`` and the largest keypoint and confidence differences; the largest centre, size
and angle differences; each mask's IoU, and how many are at least ``--mask-iou``. A
measuring tool: it exits 0 whatever the figures. Needs numpy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from compare_detections import parse_size  # tools/ is the script's folder: on sys.path

COORD_TOL = 0.5  # px: a degenerate box's largest coordinate difference for a match
MIN_SIDE = 0.5


def load(path: str) -> dict[str, np.ndarray]:
    with np.load(path) as data:
        return {k: np.asarray(data[k]) for k in data.files}


def frames(d: dict[str, np.ndarray]) -> int:
    return sum(1 for k in d if k.startswith("arr_"))


def task_of(d: dict[str, np.ndarray]) -> str:
    if "kpt_0" in d:
        return "pose"
    if "obb_0" in d:
        return "obb"
    if "rle_0" in d:
        return "segment"
    return "detect"


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    lt = np.maximum(a[:2], b[:, :2])
    rb = np.minimum(a[2:4], b[:, 2:4])
    inter = np.prod(np.clip(rb - lt, 0, None), 1)
    area = np.prod(np.clip(a[2:4] - a[:2], 0, None))
    areas = np.prod(np.clip(b[:, 2:4] - b[:, :2], 0, None), 1)
    return inter / (area + areas - inter + 1e-9)


def corners(r: np.ndarray) -> np.ndarray:
    cx, cy, w, h, t = (float(v) for v in r)
    c, s = np.cos(t), np.sin(t)
    v1, v2 = np.array([w / 2 * c, w / 2 * s]), np.array([-h / 2 * s, h / 2 * c])
    ctr = np.array([cx, cy])
    return np.array([ctr + v1 + v2, ctr + v1 - v2, ctr - v1 - v2, ctr - v1 + v2], np.float32)


def _area(poly: list) -> float:
    return 0.5 * abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in zip(poly, poly[1:] + poly[:1])))


def _clip(subject: list, clip: np.ndarray) -> list:
    """Sutherland-Hodgman: ``subject`` cut by the convex polygon ``clip`` (in float64; OpenCV's
    intersectConvexConvex misses area when two edges nearly coincide, as near-equal boxes do)."""
    ccw = sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1) in zip(clip, np.roll(clip, -1, 0))) > 0
    out = subject
    for (ax, ay), (bx, by) in zip(clip, np.roll(clip, -1, 0)):
        if not out:
            break

        def side(p, ax=ax, ay=ay, bx=bx, by=by) -> float:
            v = (bx - ax) * (p[1] - ay) - (by - ay) * (p[0] - ax)
            return v if ccw else -v

        pts, out = out, []
        for p, q in zip(pts, pts[1:] + pts[:1]):
            sp, sq = side(p), side(q)
            if sp >= 0:
                out.append(p)
            if (sp >= 0) != (sq >= 0):
                t = sp / (sp - sq)
                out.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
    return out


def rotated_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    pa = corners(a)
    out = np.zeros(len(b))
    for j, r in enumerate(b):
        if r[2] < MIN_SIDE or r[3] < MIN_SIDE:  # degenerate or a negative size: no meaningful IoU
            continue
        pb = corners(r).astype(np.float64)
        inter = _area(_clip([tuple(p) for p in pa.astype(np.float64)], pb))
        union = a[2] * a[3] + r[2] * r[3] - inter
        out[j] = inter / union if union > 0 else 0.0
    return out


def rle_masks(d: dict[str, np.ndarray], i: int, hw: tuple[int, int]) -> list[np.ndarray]:
    counts, lengths = d[f"rle_{i}"], d[f"rlen_{i}"]
    out, at = [], 0
    h, w = hw
    for n in lengths.tolist():
        runs = counts[at : at + n]
        at += n
        values = np.zeros(len(runs), bool)
        values[1::2] = True
        flat = np.repeat(values, runs)
        if flat.size != h * w:
            raise SystemExit(f"an RLE of frame {i} covers {flat.size} pixels, not {h}x{w}: pass --size WxH")
        out.append(flat.reshape(w, h).T)
    return out


def compare(ref: dict, cand: dict, a: argparse.Namespace) -> dict:
    task = task_of(ref)
    n_frames = frames(ref)
    hw = (a.size[1], a.size[0])
    s: dict = {
        "task": task,
        "reference": 0,
        "candidate": 0,
        "matched": 0,
        "degenerate": 0,
        "matched_degenerate": 0,
    }
    dbox = dscore = 0.0
    kpt_total = kpt_close = 0
    dkpt = dconf = dcentre = dsize = dangle = 0.0
    min_riou = 1.0
    mask_ious: list[float] = []
    for i in range(n_frames):
        r, c = ref[f"arr_{i}"].reshape(-1, 6), cand[f"arr_{i}"].reshape(-1, 6)
        s["reference"] += len(r)
        s["candidate"] += len(c)
        rm = cm = None
        if task == "segment":
            rm, cm = rle_masks(ref, i, hw), rle_masks(cand, i, hw)
        free = np.ones(len(c), bool)
        for k, row in enumerate(r):
            same = np.flatnonzero(free & (c[:, 5] == row[5]))
            if not len(same):
                if not (row[2] - row[0] >= MIN_SIDE and row[3] - row[1] >= MIN_SIDE):
                    s["degenerate"] += 1
                continue
            if task == "obb":
                ro, co = ref[f"obb_{i}"][k], cand[f"obb_{i}"][same]
                proper = ro[2] >= MIN_SIDE and ro[3] >= MIN_SIDE
                overlap = rotated_iou(ro, co) if proper else None
                coord = np.abs(co[:, :4] - ro[:4]).max(1)
            else:
                proper = row[2] - row[0] >= MIN_SIDE and row[3] - row[1] >= MIN_SIDE
                overlap = box_iou(row[:4], c[same, :4]) if proper else None
                coord = np.abs(c[same, :4] - row[:4]).max(1)
            if overlap is not None:
                j = int(np.argmax(overlap))
                if overlap[j] < a.iou:
                    continue
                s["matched"] += 1
                if task == "obb":
                    min_riou = min(min_riou, float(overlap[j]))
            else:
                s["degenerate"] += 1
                j = int(np.argmin(coord))
                if coord[j] > COORD_TOL:
                    continue
                s["matched_degenerate"] += 1
            m = same[j]
            free[m] = False
            if task != "obb":  # Ultralytics' OBB xyxy is unclipped, the agent's clipped: see the rotated box
                dbox = max(dbox, float(np.abs(c[m, :4] - row[:4]).max()))
            dscore = max(dscore, abs(float(c[m, 4] - row[4])))
            if task == "pose":
                rk, ck = ref[f"kpt_{i}"][k], cand[f"kpt_{i}"][m]
                dist = np.abs(rk[:, :2] - ck[:, :2]).max(1)
                kpt_total += len(dist)
                kpt_close += int((dist <= a.kpt_px).sum())
                dkpt = max(dkpt, float(dist.max()))
                if rk.shape[1] > 2:
                    dconf = max(dconf, float(np.abs(rk[:, 2] - ck[:, 2]).max()))
            elif task == "obb":
                ro, co = ref[f"obb_{i}"][k], cand[f"obb_{i}"][m]
                dcentre = max(dcentre, float(np.abs(ro[:2] - co[:2]).max()))
                dsize = max(dsize, float(np.abs(ro[2:4] - co[2:4]).max()))
                dangle = max(dangle, abs(float(ro[4] - co[4])))
            elif task == "segment":
                x, y = rm[k], cm[m]  # type: ignore[index]
                union = np.logical_or(x, y).sum()
                mask_ious.append(float(np.logical_and(x, y).sum() / union) if union else 1.0)
    s.update(max_box_diff=dbox, max_score_diff=dscore)
    if task == "pose":
        s.update(keypoints=kpt_total, keypoints_close=kpt_close, max_kpt_diff=dkpt, max_kpt_conf_diff=dconf)
    elif task == "obb":
        s.update(
            min_rotated_iou=min_riou, max_centre_diff=dcentre, max_size_diff=dsize, max_angle_diff=dangle
        )
    elif task == "segment":
        ious = np.array(mask_ious) if mask_ious else np.ones(1)
        s.update(
            masks=len(mask_ious),
            masks_at_least=int((np.array(mask_ious) >= a.mask_iou).sum()),
            mask_iou_min=float(ious.min()),
            mask_iou_p1=float(np.percentile(ious, 1)),
            mask_iou_median=float(np.median(ious)),
        )
    return s


def line(name: str, s: dict, a: argparse.Namespace) -> str:
    proper = s["reference"] - s["degenerate"]
    out = (
        f"{name} ({s['task']}): reference {s['reference']}, candidate {s['candidate']}; "
        f"matched at IoU>={a.iou:g} {s['matched']} of {proper} ({100 * s['matched'] / max(proper, 1):.2f} %)"
    )
    if s["degenerate"]:
        out += f"; degenerate {s['degenerate']}, matched by coordinates {s['matched_degenerate']}"
    out += f"; max |box| {s['max_box_diff']:.3f} px, |score| {s['max_score_diff']:.1e}"
    if s["task"] == "pose":
        out += (
            f"; keypoints within {a.kpt_px:g} px {s['keypoints_close']} of {s['keypoints']}, "
            f"max {s['max_kpt_diff']:.3f} px, |conf| {s['max_kpt_conf_diff']:.1e}"
        )
    elif s["task"] == "obb":
        out += (
            f"; rotated IoU min {s['min_rotated_iou']:.4f}, max |centre| {s['max_centre_diff']:.3f} px, "
            f"|size| {s['max_size_diff']:.3f} px, |angle| {s['max_angle_diff']:.1e} rad"
        )
    elif s["task"] == "segment":
        out += (
            f"; mask IoU>={a.mask_iou:g} {s['masks_at_least']} of {s['masks']}, "
            f"min {s['mask_iou_min']:.3f}, p1 {s['mask_iou_p1']:.3f}, median {s['mask_iou_median']:.4f}"
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--iou", type=float, default=0.99, help="box (rotated for OBB) IoU for a match")
    ap.add_argument("--mask-iou", type=float, default=0.95)
    ap.add_argument(
        "--kpt-px", type=float, default=0.5, help="a keypoint's largest x/y difference to count as close"
    )
    ap.add_argument(
        "--size", type=parse_size, default=(640, 480), metavar="WxH", help="the frames' size (masks)"
    )
    ap.add_argument("--name", default=None)
    ap.add_argument("--json", default=None, help="append the figures as one JSON line here")
    a = ap.parse_args()
    ref, cand = load(a.reference), load(a.candidate)
    if frames(ref) != frames(cand):
        ap.error(f"{frames(ref)} frames in {a.reference} but {frames(cand)} in {a.candidate}")
    if task_of(ref) != task_of(cand):
        ap.error(f"{a.reference} is a {task_of(ref)} dump, {a.candidate} a {task_of(cand)} one")
    s = compare(ref, cand, a)
    name = a.name or Path(a.reference).name.split(".")[0]
    print(line(name, s, a))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"name": name, **s}) + "\n")


if __name__ == "__main__":
    main()
