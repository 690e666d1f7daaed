"""HOTA, IDF1 and CLEAR (MOTA, ID switches) by TrackEval's own code.

TrackEval is not on PyPI under its authors' name: this takes the source of
the public GitHub repository JonathonLuiten/TrackEval (commit 12c8791b303e0a0b50f753af204249e622d0281a, the
last on its master) from $TRACKEVAL_SRC (a folder holding ``trackeval/``), else extracts it
from a local git mirror ($TRACKEVAL_GIT, default /work/.mirror/JonathonLuiten+TrackEval/repo)
into $TRACKING_WORK/trackeval-src.

``evaluate`` builds the per-timestep data TrackEval's MotChallenge2DBox dataset hands its
metrics (ids relabelled 0..n-1, IoU similarity of xywh boxes, all truth classes as one
class, no distractors, so its preprocessing removes nothing) and calls the metric classes.
``python te.py --check`` runs TrackEval's whole Evaluator on MOT-format files of one
sequence and shows that both paths give the same figures.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from common import WORK, write_mot

TRACKEVAL_COMMIT = "12c8791b303e0a0b50f753af204249e622d0281a"


def _import_trackeval():
    src = os.environ.get("TRACKEVAL_SRC")
    if not src:
        dest = WORK / "trackeval-src"
        if not (dest / "trackeval").is_dir():
            git = os.environ.get("TRACKEVAL_GIT", "/work/.mirror/JonathonLuiten+TrackEval/repo")
            dest.mkdir(parents=True, exist_ok=True)
            tar = subprocess.run(
                ["git", "--git-dir", git, "archive", TRACKEVAL_COMMIT, "trackeval"],
                check=True,
                capture_output=True,
            ).stdout
            subprocess.run(["tar", "-x", "-C", str(dest)], input=tar, check=True)
        src = str(dest)
    # TrackEval predates numpy 1.24, which removed these aliases.
    for alias, typ in (("float", float), ("int", int), ("bool", bool)):
        if not hasattr(np, alias):
            setattr(np, alias, typ)
    sys.path.insert(0, src)
    import trackeval

    return trackeval


trackeval = _import_trackeval()
_METRICS = None


def _metrics():
    global _METRICS
    if _METRICS is None:
        cfg = {"PRINT_CONFIG": False}
        _METRICS = [
            trackeval.metrics.HOTA(),
            trackeval.metrics.Identity(cfg),
            trackeval.metrics.CLEAR(cfg),
        ]
    return _METRICS


def _xywh(b: np.ndarray) -> np.ndarray:
    return np.column_stack([b[:, 0], b[:, 1], b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]])


def seq_data(truth: np.ndarray, tracks: np.ndarray, frames: list[int]) -> dict:
    """TrackEval's per-sequence data. ``truth`` rows: frame, id, x1, y1, x2, y2, ...;
    ``tracks`` rows: frame, id, x1, y1, x2, y2; ``frames``: the timesteps evaluated."""
    te_iou = trackeval.datasets._base_dataset._BaseDataset._calculate_box_ious
    gt_u = np.unique(truth[np.isin(truth[:, 0], frames), 1]).astype(int)
    tr_u = np.unique(tracks[np.isin(tracks[:, 0], frames), 1]).astype(int)
    gt_map = {v: i for i, v in enumerate(gt_u)}
    tr_map = {v: i for i, v in enumerate(tr_u)}
    data = {k: [] for k in ("gt_ids", "tracker_ids", "gt_dets", "tracker_dets", "similarity_scores")}
    t_sorted = tracks[np.argsort(tracks[:, 0], kind="stable")]
    for f in frames:
        g = truth[np.searchsorted(truth[:, 0], f, "left") : np.searchsorted(truth[:, 0], f, "right")]
        lo, hi = np.searchsorted(t_sorted[:, 0], f, "left"), np.searchsorted(t_sorted[:, 0], f, "right")
        tr = t_sorted[lo:hi]
        gd, td = _xywh(g[:, 2:6]), _xywh(tr[:, 2:6])
        data["gt_ids"].append(np.array([gt_map[int(v)] for v in g[:, 1]], int))
        data["tracker_ids"].append(np.array([tr_map[int(v)] for v in tr[:, 1]], int))
        data["gt_dets"].append(gd)
        data["tracker_dets"].append(td)
        data["similarity_scores"].append(te_iou(gd, td, box_format="xywh"))
    data.update(
        num_timesteps=len(frames),
        num_gt_ids=len(gt_u),
        num_tracker_ids=len(tr_u),
        num_gt_dets=int(sum(len(x) for x in data["gt_ids"])),
        num_tracker_dets=int(sum(len(x) for x in data["tracker_ids"])),
        seq="seq",
    )
    return data


def evaluate(truth: np.ndarray, tracks: np.ndarray, frames: list[int]) -> dict:
    """HOTA (mean over the 19 alphas, as TrackEval reports it), DetA, AssA, IDF1, MOTA,
    ID switches, fragmentations, and counts, for one sequence."""
    data = seq_data(truth, tracks, frames)
    hota, ident, clear = (m.eval_sequence(data) for m in _metrics())
    return {
        "HOTA": float(np.mean(hota["HOTA"])),
        "DetA": float(np.mean(hota["DetA"])),
        "AssA": float(np.mean(hota["AssA"])),
        "IDF1": float(ident["IDF1"]),
        "MOTA": float(clear["MOTA"]),
        "IDSW": int(clear["IDSW"]),
        "Frag": int(clear["Frag"]),
        "gt_ids": data["num_gt_ids"],
        "tracker_ids": data["num_tracker_ids"],
    }


def check(seq_path: Path, tracks_path: Path) -> int:
    """Both paths on one sequence (stride 1): TrackEval's Evaluator on MOT files, and ours."""
    from common import load_sequence

    truth, _, meta = load_sequence(seq_path)
    tracks = np.load(tracks_path)["rows"]
    # MOT text keeps 3 decimals: round both inputs alike so the paths see the same boxes
    truth = truth.copy()
    tracks = tracks.copy()
    truth[:, 2:6] = np.round(truth[:, 2:6], 3)
    tracks[:, 2:6] = np.round(tracks[:, 2:6], 3)
    n = meta["frames"]
    root = WORK / "te-check"
    gt_dir = root / "gt" / "SYN-train" / "seq"
    tr_dir = root / "trackers" / "SYN-train" / "cand" / "data"
    (gt_dir / "gt").mkdir(parents=True, exist_ok=True)
    tr_dir.mkdir(parents=True, exist_ok=True)
    (root / "gt" / "seqmaps").mkdir(parents=True, exist_ok=True)
    (root / "gt" / "seqmaps" / "SYN-train.txt").write_text("name\nseq\n")
    (gt_dir / "seqinfo.ini").write_text(f"[Sequence]\nname=seq\nseqLength={n}\nimWidth=640\nimHeight=480\n")
    write_mot(gt_dir / "gt" / "gt.txt", truth, True)
    write_mot(tr_dir / "seq.txt", tracks, False)
    ev_cfg = trackeval.Evaluator.get_default_eval_config()
    ev_cfg.update(
        PRINT_RESULTS=False,
        PRINT_CONFIG=False,
        OUTPUT_SUMMARY=False,
        OUTPUT_DETAILED=False,
        PLOT_CURVES=False,
        USE_PARALLEL=False,
        TIME_PROGRESS=False,
        DISPLAY_LESS_PROGRESS=True,
    )
    ds_cfg = trackeval.datasets.MotChallenge2DBox.get_default_dataset_config()
    ds_cfg.update(
        GT_FOLDER=str(root / "gt"),
        TRACKERS_FOLDER=str(root / "trackers"),
        BENCHMARK="SYN",
        SPLIT_TO_EVAL="train",
        TRACKERS_TO_EVAL=["cand"],
        PRINT_CONFIG=False,
        DO_PREPROC=True,
    )
    cfg = {"PRINT_CONFIG": False}
    metrics = [trackeval.metrics.HOTA(), trackeval.metrics.Identity(cfg), trackeval.metrics.CLEAR(cfg)]
    res, _ = trackeval.Evaluator(ev_cfg).evaluate([trackeval.datasets.MotChallenge2DBox(ds_cfg)], metrics)
    r = res["MotChallenge2DBox"]["cand"]["seq"]["pedestrian"]
    full = {
        "HOTA": float(np.mean(r["HOTA"]["HOTA"])),
        "DetA": float(np.mean(r["HOTA"]["DetA"])),
        "AssA": float(np.mean(r["HOTA"]["AssA"])),
        "IDF1": float(r["Identity"]["IDF1"]),
        "MOTA": float(r["CLEAR"]["MOTA"]),
        "IDSW": int(r["CLEAR"]["IDSW"]),
    }
    mine = evaluate(truth, tracks, list(range(n)))
    print(f"{'metric':6} {'TrackEval Evaluator':>20} {'te.evaluate':>12}")
    worst = 0.0
    for k, v in full.items():
        print(f"{k:6} {v:20.6f} {mine[k]:12.6f}")
        worst = max(worst, abs(v - mine[k]))
    print(f"largest difference: {worst:.2e}")
    return 0 if worst < 1e-9 else 1


if __name__ == "__main__":
    import argparse

    p = argparse.ArgumentParser(description="check te.evaluate against TrackEval's full Evaluator")
    p.add_argument("--check", nargs=2, metavar=("SEQ_NPZ", "TRACKS_NPZ"), required=True)
    a = p.parse_args()
    raise SystemExit(check(Path(a.check[0]), Path(a.check[1])))
