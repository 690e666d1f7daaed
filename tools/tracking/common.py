"""Sequences for the tracker measurement: ground truth from the agent's synthetic scene,
detections from it (noisy truth, or the bundled detector), and where things are kept.

A scene is a SyntheticScene rendered on a world larger than the camera: the camera sees
the middle 640x480 of it, so objects enter and leave the view, cross each other (same
class included: four classes for 10-20 objects) and hide behind each other. Everything is
a pure function of (scene, seed, frame index).

Ground truth ids: one id per pass of an object through the view; an object that leaves
the view and comes back (it bounced off the world's edge, out of sight) comes back with a
new id: a motion-only tracker cannot know it is the same one, and should not pretend to.
Rows: frame, id, x1, y1, x2, y2, visibility (view pixels;
visibility = visible fraction of the object's shape x fraction of its box inside the view).

Rendering (``render_sequence``) needs the agent's venv (the scene is the agent's synthetic
source's, ``pipelines/sources/synthetic.py``); the rest needs numpy only, so each side venv
can read the sequences.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
WORK = Path(os.environ.get("TRACKING_WORK", "/tmp/tracking"))
SEQ_DIR = WORK / "seqs"
OUT_DIR = WORK / "outputs"
RESULT_DIR = WORK / "results"

VIEW_W, VIEW_H = 640, 480
MARGIN_X, MARGIN_Y = 128, 96
FPS = 30.0
FRAMES = 900  # 30 s at 30 fps
NEW_ID_AFTER = 1  # frames out of view (more than this) before an object counts as a new one
MIN_IN_VIEW = 0.2  # fraction of the box inside the view for the object to be in the truth
STRIDES = (1, 2, 3)


@dataclass(frozen=True)
class Scene:
    name: str
    num_objects: int
    max_speed_px: float
    min_size_frac: float
    max_size_frac: float


SCENES = {
    # crossings and occlusions at the synthetic camera's own speed
    "cross": Scene("cross", 12, 6.0, 0.06, 0.16),
    # many objects, long occlusions
    "crowd": Scene("crowd", 20, 5.0, 0.06, 0.14),
    # twice the speed: with a stride of 3 an object moves up to 36 px between updates
    "fast": Scene("fast", 10, 12.0, 0.06, 0.16),
}


def scene_spec(scene: Scene, seed: int):
    """The agent's synthetic scene with margins: the view is the middle of the world."""
    from edge_agent.pipelines.sources.synthetic import SceneSpec

    return SceneSpec(
        width=VIEW_W,
        height=VIEW_H,
        seed=seed,
        num_objects=scene.num_objects,
        min_size_frac=scene.min_size_frac,
        max_size_frac=scene.max_size_frac,
        max_speed_px=scene.max_speed_px,
        margin_x=MARGIN_X,
        margin_y=MARGIN_Y,
    )


class TruthBuilder:
    """Turns the scene's per-frame truth (view pixels) into truth rows with pass ids."""

    def __init__(self, sizes: np.ndarray) -> None:
        n = len(sizes)
        self.area = np.maximum(sizes.astype(np.float64) ** 2, 1.0)  # each object's whole box
        self.seg_id = np.full(n, -1, np.int64)
        self.last_seen = np.full(n, -(10**9), np.int64)
        self.next_id = 1

    def rows(self, frame: int, gt: np.ndarray) -> np.ndarray:
        """(K, 8): frame, id, x1, y1, x2, y2, visibility, class."""
        x1, y1, x2, y2 = (gt[:, k].astype(np.float64) for k in (1, 2, 3, 4))
        inview = (x2 - x1) * (y2 - y1) / self.area
        present = (inview >= MIN_IN_VIEW) & (x2 - x1 >= 4) & (y2 - y1 >= 4)
        out = []
        for i in np.flatnonzero(present):
            if self.seg_id[i] < 0 or frame - self.last_seen[i] > NEW_ID_AFTER:
                self.seg_id[i] = self.next_id
                self.next_id += 1
            self.last_seen[i] = frame
            out.append((frame, self.seg_id[i], x1[i], y1[i], x2[i], y2[i], float(gt[i, 5]), gt[i, 0]))
        return np.array(out, np.float64).reshape(-1, 8)


def render_sequence(scene: Scene, seed: int, frames: int = FRAMES, with_images: bool = False):
    """Yield (frame index, truth rows, view image or None) for one scene and seed."""
    from edge_agent.pipelines.sources.synthetic import SyntheticScene

    spec = scene_spec(scene, seed)
    world = SyntheticScene(spec)
    img = np.empty((spec.height, spec.width, 3), np.uint8)
    gt = np.zeros((spec.num_objects, 6), np.float32)
    tb = TruthBuilder(world.sizes)
    for t in range(frames):
        world.render(t, img, gt)
        yield t, tb.rows(t, gt), (img if with_images else None)


# -- detections from the truth, with a detector's faults -----------------------------------
#
# What a detector does to a scene like this: boxes jitter, more so when an object is partly
# hidden; a hidden object is missed more often and, when found, scored low (the low-score
# boxes ByteTrack's second stage exists for); a few fully visible objects dip in score for
# a frame; random false positives appear (mostly low-scored) and two clutter spots fire on
# and off in the same place (a stationary false track).


def noisy_detections(truth: np.ndarray, frames: int, rng: np.random.Generator) -> np.ndarray:
    """(M, 7): frame, x1, y1, x2, y2, score, class; scores >= 0.1 (a detector's output floor)."""
    clutter = np.column_stack(
        [rng.uniform(40, VIEW_W - 120, 2), rng.uniform(40, VIEW_H - 120, 2), rng.uniform(35, 80, 2)]
    )
    out = []
    by_frame = np.split(truth, np.flatnonzero(np.diff(truth[:, 0])) + 1) if len(truth) else []
    rows_of = {int(r[0, 0]): r for r in by_frame}
    for t in range(frames):
        rows = rows_of.get(t, np.zeros((0, 8)))
        for r in rows:
            vis = r[6]
            p = 0.97 * np.clip((vis - 0.1) / 0.5, 0.0, 1.0)
            if rng.random() >= p:
                continue
            w, h = r[4] - r[2], r[5] - r[3]
            sigma = (0.015 + 0.05 * (1.0 - min(vis, 1.0))) * np.sqrt(w * h)  # px, per corner coordinate
            box = r[2:6] + rng.normal(0.0, sigma, 4)
            score = np.clip(rng.normal(0.85, 0.07), 0.05, 0.99) * (0.15 + 0.85 * np.clip(vis / 0.8, 0, 1))
            if rng.random() < 0.05:
                score *= rng.uniform(0.3, 0.7)
            out.append((t, *box, score, r[7]))
        for _ in range(rng.poisson(0.4)):
            s = rng.uniform(30, 100)
            x, y = rng.uniform(0, VIEW_W - s), rng.uniform(0, VIEW_H - s)
            score = rng.uniform(0.1, 0.45) if rng.random() < 0.8 else rng.uniform(0.45, 0.75)
            out.append((t, x, y, x + s, y + s * rng.uniform(0.8, 1.2), score, rng.integers(0, 4)))
        for cx, cy, s in clutter:
            if rng.random() < 0.15:
                j = rng.normal(0, 2, 4)
                out.append((t, cx + j[0], cy + j[1], cx + s + j[2], cy + s + j[3], rng.uniform(0.3, 0.65), 3))
    d = np.array(out, np.float64).reshape(-1, 7)
    d[:, 1:5] = np.clip(d[:, 1:5], [0, 0, 0, 0], [VIEW_W, VIEW_H, VIEW_W, VIEW_H])
    keep = (d[:, 3] - d[:, 1] >= 2) & (d[:, 4] - d[:, 2] >= 2) & (d[:, 5] >= 0.1)
    return d[keep]


def write_mot(path: Path, rows: np.ndarray, truth: bool) -> None:
    """MOTChallenge text: frame (1-based), id, left, top, width, height, conf, class, vis."""
    with path.open("w") as f:
        for r in rows:
            w, h = r[4] - r[2], r[5] - r[3]
            if truth:
                f.write(f"{int(r[0]) + 1},{int(r[1])},{r[2]:.3f},{r[3]:.3f},{w:.3f},{h:.3f},1,1,{r[6]:.3f}\n")
            else:
                f.write(f"{int(r[0]) + 1},{int(r[1])},{r[2]:.3f},{r[3]:.3f},{w:.3f},{h:.3f},1,-1,-1,-1\n")


def seq_name(source: str, scene: str, seed: int) -> str:
    return f"{source}-{scene}-s{seed}"


def save_sequence(name: str, truth: np.ndarray, dets: np.ndarray, meta: dict) -> Path:
    SEQ_DIR.mkdir(parents=True, exist_ok=True)
    path = SEQ_DIR / f"{name}.npz"
    np.savez_compressed(path, truth=truth, dets=dets, meta=json.dumps(meta))
    return path


def load_sequence(path: Path) -> tuple[np.ndarray, np.ndarray, dict]:
    z = np.load(path)
    return z["truth"], z["dets"], json.loads(str(z["meta"]))


def list_sequences() -> list[Path]:
    return sorted(SEQ_DIR.glob("*.npz"))


def frames_of(dets: np.ndarray, frames: int, stride: int):
    """Yield (frame, rows) for the frames a lane with ``stride`` processes."""
    idx = np.searchsorted(dets[:, 0], np.arange(frames + 1), side="left")
    for t in range(0, frames, stride):
        yield t, dets[idx[t] : idx[t + 1]]


__all__ = [
    "FPS",
    "FRAMES",
    "OUT_DIR",
    "RESULT_DIR",
    "SCENES",
    "SEQ_DIR",
    "STRIDES",
    "frames_of",
    "list_sequences",
    "load_sequence",
    "noisy_detections",
    "render_sequence",
    "save_sequence",
    "seq_name",
    "write_mot",
]
