"""Compare two per-frame detection dumps: how many reference detections the candidate reproduces.

    .venv/bin/python tools/compare_detections.py REFERENCE.npz CANDIDATE.npz \\
        [--iou 0.99] [--clip WxH] [--min-side 0.5] [--name LABEL]

e.g. Ultralytics' own predict (``tools/exports/ultralytics_predict.py``) as the reference,
the agent (``tools/dump_detections.py``) as the candidate::

    .venv/bin/python tools/compare_detections.py /tmp/e2e-models/yolo26n-busy-640.ultra.npz \\
        /tmp/e2e-models/agent/yolo26n-busy-640.npz

Both files hold one array per frame, ``arr_0`` .. ``arr_{N-1}`` (``np.savez``'s names), rows
``x1 y1 x2 y2 score class`` in source-frame pixels; frame ``arr_i`` of one is compared with
``arr_i`` of the other. In each frame, every reference detection in turn (in the file's
order) is matched greedily to the unmatched candidate detection of the same class with the
highest IoU, and counts as matched when that IoU is at least ``--iou``. A reference box
with a side under ``--min-side`` px, or inverted (x2 < x1 or y2 < y1: heads with random
weights make them, and Ultralytics keeps them), has no meaningful IoU: it is counted apart
as degenerate and matched instead to the unmatched same-class candidate with the smallest
largest coordinate difference, when that difference is at most 0.5 px.

``--clip WxH`` first clips the reference boxes to a W x H frame: Ultralytics does not clip
RT-DETR's boxes, the agent does.

Prints one line: the reference and candidate counts, the reference detections matched at
the IoU threshold out of the non-degenerate ones, the degenerate ones and how many of them
matched by coordinates, and the largest box coordinate (px) and score differences over all
matched pairs. A measuring tool, not a test: it exits 0 whatever the figures (non-zero
only when the files cannot be compared). Needs only numpy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

COORD_TOL = 0.5  # px: largest coordinate difference for a degenerate box to match


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4+) with every box of ``b`` (m, 4+), x1 y1 x2 y2 -> (n, m)."""
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:4], b[None, :, 2:4])
    inter = np.prod(np.clip(rb - lt, 0, None), 2)

    def area(x: np.ndarray) -> np.ndarray:
        return np.prod(np.clip(x[:, 2:4] - x[:, :2], 0, None), 1)

    return inter / (area(a)[:, None] + area(b)[None] - inter + 1e-9)


def frames_of(path: str) -> list[np.ndarray]:
    """The per-frame (n, 6) arrays of a dump, in frame order (arr_0, arr_1, ...)."""
    with np.load(path) as data:
        # A pose, oriented-box or segmentation dump has the task's arrays beside (kpt_i, ...).
        names = [k for k in data.files if k.startswith("arr_")]
        want = [f"arr_{i}" for i in range(len(names))]
        if not names or sorted(names) != sorted(want):
            raise SystemExit(f"{path}: expected arrays arr_0 .. arr_N, got {data.files[:5]} ...")
        frames = []
        for k in want:
            a = np.asarray(data[k])  # the stored dtype, as written: the figures are float32's
            if a.size == 0:
                a = a.reshape(0, 6)
            if a.ndim != 2 or a.shape[1] != 6:
                raise SystemExit(f"{path}: {k} has shape {a.shape}, expected (n, 6)")
            frames.append(a)
    return frames


def parse_size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected WxH, e.g. 640x480") from None
    return w, h


def compare(
    reference: list[np.ndarray],
    candidate: list[np.ndarray],
    min_iou: float,
    min_side: float,
    clip: tuple[int, int] | None,
) -> dict:
    """Counts and largest differences over all frames (see the module docstring)."""
    n_ref = n_cand = matched = degenerate = matched_degenerate = 0
    dbox = dscore = 0.0
    for ref, cand in zip(reference, candidate):
        ref = ref.copy()
        if clip:
            ref[:, [0, 2]] = ref[:, [0, 2]].clip(0, clip[0])
            ref[:, [1, 3]] = ref[:, [1, 3]].clip(0, clip[1])
        n_ref += len(ref)
        n_cand += len(cand)
        free = np.ones(len(cand), bool)
        for row in ref:
            same = np.flatnonzero(free & (cand[:, 5] == row[5]))
            if row[2] - row[0] >= min_side and row[3] - row[1] >= min_side:
                if not len(same):
                    continue
                ious = iou(row[None, :4], cand[same, :4])[0]
                j = int(np.argmax(ious))
                if ious[j] < min_iou:
                    continue
                i = same[j]
                matched += 1
                diff = float(np.abs(cand[i, :4] - row[:4]).max())
            else:  # degenerate: no meaningful IoU, match by coordinates
                degenerate += 1
                if not len(same):
                    continue
                d = np.abs(cand[same, :4] - row[:4]).max(1)
                j = int(np.argmin(d))
                if d[j] > COORD_TOL:
                    continue
                i = same[j]
                matched_degenerate += 1
                diff = float(d[j])
            free[i] = False
            dbox = max(dbox, diff)
            dscore = max(dscore, abs(float(cand[i, 4] - row[4])))
    return {
        "reference": n_ref,
        "candidate": n_cand,
        "matched": matched,
        "degenerate": degenerate,
        "matched_degenerate": matched_degenerate,
        "max_box_diff": dbox,
        "max_score_diff": dscore,
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Match a candidate's per-frame detections against a reference's (same class, IoU).",
    )
    ap.add_argument("reference", help=".npz of per-frame (n, 6) arrays x1 y1 x2 y2 score class")
    ap.add_argument("candidate", help=".npz in the same layout, same frames")
    ap.add_argument("--iou", type=float, default=0.99, help="IoU for a match (default 0.99)")
    ap.add_argument(
        "--clip",
        type=parse_size,
        default=None,
        metavar="WxH",
        help="clip the reference boxes to a W x H frame first (Ultralytics does not clip RT-DETR boxes)",
    )
    ap.add_argument(
        "--min-side",
        type=float,
        default=0.5,
        help="reference boxes with a side under this (px), or inverted, are matched by coordinates "
        "(default 0.5)",
    )
    ap.add_argument(
        "--name",
        default=None,
        help="label of the line (default: the reference's file name up to its first dot)",
    )
    a = ap.parse_args()
    reference, candidate = frames_of(a.reference), frames_of(a.candidate)
    if len(reference) != len(candidate):
        ap.error(f"{len(reference)} frames in {a.reference} but {len(candidate)} in {a.candidate}")
    r = compare(reference, candidate, a.iou, a.min_side, a.clip)
    name = a.name or Path(a.reference).name.split(".")[0]
    scored = r["reference"] - r["degenerate"]
    pct = 100 * r["matched"] / max(scored, 1)
    print(
        f"{name}: reference {r['reference']}, candidate {r['candidate']}; "
        f"matched at IoU>={a.iou:g} {r['matched']} of {scored} ({pct:.2f} %); "
        f"degenerate (side < {a.min_side:g} px or inverted) {r['degenerate']}, "
        f"matched by coordinates {r['matched_degenerate']}; "
        f"max |box| diff {r['max_box_diff']:.3f} px, max |score| diff {r['max_score_diff']:.1e}"
    )


if __name__ == "__main__":
    main()
