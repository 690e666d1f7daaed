"""Sequences for the tracker measurement: ground truth from the agent's synthetic scene,
detections from it (noisy truth, or the bundled detector), and where things are kept.

A scene is a SyntheticScene rendered on a world larger than the camera: the camera sees
the middle 640x480 of it, so objects enter and leave the view through every edge, cross
each other (same class included: four classes) and hide behind each other. Scenes (SCENES):
``cross``, ``crowd``, ``fast`` (straight motion, the first measurement's); ``occlude``
(three static occluders); ``turns`` (turning, stopping, speeding up and slowing down; one
occluder); ``crowd60`` (60 small objects, 450 frames; one occluder); ``pairs`` (same-class
pairs whose paths cross in the view; one occluder). Everything is a pure function of
(scene, seed, frame index).

Ground truth ids: one id per pass of an object through the view; an object that leaves
the view and comes back (it bounced off the world's edge, out of sight) comes back with a
new id: a motion-only tracker cannot know it is the same one, and should not pretend to.
An object behind an occluder inside the view keeps its id (it is in the view: only its
visibility drops, to 0 when wholly hidden): a tracker should carry it through.
Rows: frame, id, x1, y1, x2, y2, visibility, class (view pixels;
visibility = visible fraction of the object's shape x fraction of its box inside the view).

Rendering (``render_sequence``) needs the agent's venv (the scene is the agent's synthetic
source's, ``pipelines/sources/synthetic.py``); the rest needs numpy only, so each side venv
can read the sequences (and ``SCENES``, ``occluders_in_view``).
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
    #: static occluders in front of every object, (x, y, w, h) in VIEW pixels (the scene's
    #: spec gets them in world pixels: ``scene_spec``); ``occluders_in_view`` gives x1, y1, x2, y2
    occluders: tuple[tuple[int, int, int, int], ...] = ()
    #: "linear": straight at constant speed, bouncing off the world's walls (the synthetic
    #: camera's own motion); "turns": legs of 20-90 frames that turn, stop or change speed
    motion: str = "linear"
    #: objects in same-class pairs whose paths meet in the view (``MotionScene``)
    pairs: bool = False
    frames: int = FRAMES


# (x, y, w, h) in view pixels: panels in the view (posts, fences), elongated (aspect 2.5-4.5)
# and wide enough across that an object passing behind one is hidden (visibility < 0.2) for
# 0.5-2 s at these speeds (seq_stats.py measures it)
SCENES = {
    # crossings and occlusions at the synthetic camera's own speed
    "cross": Scene("cross", 12, 6.0, 0.06, 0.16),
    # many objects, long occlusions
    "crowd": Scene("crowd", 20, 5.0, 0.06, 0.14),
    # twice the speed: with a stride of 3 an object moves up to 36 px between updates
    "fast": Scene("fast", 10, 12.0, 0.06, 0.16),
    # static occluders: objects pass behind them and come out again (same truth id)
    "occlude": Scene(
        "occlude",
        24,
        5.0,
        0.05,
        0.11,
        occluders=((140, 70, 110, 330), (380, 290, 250, 95), (450, 20, 95, 220)),
    ),
    # non-linear motion: turns of up to 120 degrees, stops, speed changes
    "turns": Scene("turns", 24, 5.0, 0.05, 0.11, occluders=((300, 110, 105, 300),), motion="turns"),
    # crowded: 60 small objects
    "crowd60": Scene("crowd60", 60, 5.0, 0.035, 0.075, occluders=((200, 300, 260, 80),), frames=450),
    # same-class pairs whose paths cross in the view
    "pairs": Scene("pairs", 24, 5.0, 0.05, 0.11, occluders=((470, 60, 100, 300),), pairs=True),
}
# The detections' random stream for a scene is seeded with its place here (the first three
# in the order they always had), so adding a scene changes no other scene's sequences.


def occluders_in_view(scene: Scene) -> list[tuple[int, int, int, int]]:
    """The scene's occluders as (x1, y1, x2, y2) in view pixels, clipped to the view."""
    out = []
    for x, y, w, h in scene.occluders:
        x1, y1, x2, y2 = max(x, 0), max(y, 0), min(x + w, VIEW_W), min(y + h, VIEW_H)
        if x2 > x1 and y2 > y1:
            out.append((x1, y1, x2, y2))
    return out


def scene_spec(scene: Scene, seed: int):
    """The agent's synthetic scene with margins: the view is the middle of the world."""
    from edge_agent.pipelines.sources.synthetic import SceneSpec

    extra = {}
    if scene.occluders:  # (the field is left out otherwise: the spec the first scenes always had)
        extra["occluders"] = tuple((x + MARGIN_X, y + MARGIN_Y, w, h) for x, y, w, h in scene.occluders)
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
        **extra,
    )


def make_world(scene: Scene, seed: int, frames: int | None = None):
    """The scene's renderer: the agent's SyntheticScene for straight motion and no pairs,
    else ``MotionScene`` (trajectories for ``frames``, default the scene's)."""
    from edge_agent.pipelines.sources.synthetic import SyntheticScene

    spec = scene_spec(scene, seed)
    if scene.motion == "linear" and not scene.pairs:
        return SyntheticScene(spec)
    return _motion_scene_class()(spec, scene, seed, frames or scene.frames)


_MOTION_SCENE = None


def _motion_scene_class():
    """``MotionScene`` (defined on first use: it subclasses the agent's SyntheticScene, which
    only the agent's venv can import)."""
    global _MOTION_SCENE
    if _MOTION_SCENE is not None:
        return _MOTION_SCENE
    from edge_agent.pipelines.sources.synthetic import SyntheticScene

    class MotionScene(SyntheticScene):
        """The synthetic scene (same seed: same sizes, classes, colours, background, noise,
        start positions and velocities) with other motion, drawn from a second stream of
        the seed: same-class pairs that meet in the view, and/or turning, stopping and
        speeding legs. ``boxes(index)`` is a pure function of (seed, index) for index <
        frames (trajectories are computed at construction)."""

        def __init__(self, spec, scene: Scene, seed: int, frames: int) -> None:
            super().__init__(spec)
            self.frames = frames
            rng = np.random.default_rng([seed, list(SCENES).index(scene.name), 11])
            self.meetings = np.zeros((0, 3))  # per pair: frame, x, y (view pixels, centre)
            if scene.pairs:
                self._pair_up(scene, rng)
            self._track = self._turns(rng, frames) if scene.motion == "turns" else None

        def _pair_up(self, scene: Scene, rng: np.random.Generator) -> None:
            """Objects 2k and 2k+1: same class, sizes within 15 %, centres at one point of
            the view (outside the occluders) at one frame, coming from directions 60-180
            degrees apart (180: head on), at similar speeds."""
            spec = self.spec
            n = spec.num_objects - spec.num_objects % 2
            short = min(spec.world_wh)
            lo, hi = spec.min_size_frac * short, spec.max_size_frac * short
            occ = [(x1 - 40, y1 - 40, x2 + 40, y2 + 40) for x1, y1, x2, y2 in occluders_in_view(scene)]
            meetings = []
            for a in range(0, n, 2):
                b = a + 1
                self.classes[b] = self.classes[a]
                self.sizes[b] = int(np.clip(round(self.sizes[a] * rng.uniform(0.85, 1.15)), lo, hi))
                while True:
                    px, py = rng.uniform(60, VIEW_W - 60), rng.uniform(60, VIEW_H - 60)
                    if not any(x1 <= px <= x2 and y1 <= py <= y2 for x1, y1, x2, y2 in occ):
                        break
                tm = rng.uniform(45, self.frames - 45)
                speed = np.linalg.norm(self.velocity[a])
                heading = np.arctan2(self.velocity[a, 1], self.velocity[a, 0])
                heading_b = heading + rng.choice([-1, 1]) * rng.uniform(np.pi / 3, np.pi)
                self.velocity[b] = (
                    speed * rng.uniform(0.85, 1.15) * np.array([np.cos(heading_b), np.sin(heading_b)])
                )
                for i in (a, b):
                    corner = np.array([px + spec.margin_x, py + spec.margin_y]) - self.sizes[i] / 2
                    self.start[i] = corner - self.velocity[i] * tm  # unfolded: boxes() folds it
                meetings.append((tm, px, py))
            self.meetings = np.array(meetings).reshape(-1, 3)
            # the visible fraction's denominators follow the new classes and sizes
            self._area = np.array(
                [self._mask_area(int(c), int(s)) for c, s in zip(self.classes, self.sizes)], np.float64
            )

        def _turns(self, rng: np.random.Generator, frames: int) -> np.ndarray:
            """(frames, n, 2) integer corners. Each object: legs of 20-90 frames, each a
            turn (heading changes smoothly by up to +-120 degrees), a speed change (x0.4 to
            x1.8 of its own speed, eased over the leg), or straight on; or a stop (4 frames
            slowing down, then still for 10-60 frames; the next leg starts it again).
            Walls reflect it, as in the straight scenes."""
            spec = self.spec
            n = spec.num_objects
            w, h = spec.world_wh
            turn = np.zeros((frames, n))
            mult = np.ones((frames, n))
            for i in range(n):
                t, m = 0, 1.0
                while t < frames:
                    kind = rng.choice(4, p=[0.4, 0.2, 0.3, 0.1])  # turn, stop, speed, straight
                    if kind == 1:
                        length = 4 + int(rng.integers(10, 61))
                        seg = np.zeros(length)
                        seg[:4] = m * np.linspace(0.8, 0.2, 4)
                    else:
                        length = int(rng.integers(20, 91))
                        target = (
                            rng.uniform(0.4, 1.8) if kind == 2 else (m if m > 0 else rng.uniform(0.7, 1.3))
                        )
                        ease = min(length, 12) if kind != 2 else length  # a restart: quick
                        k = np.arange(length)
                        f = np.where(k < ease, 0.5 - 0.5 * np.cos(np.pi * (k + 1) / ease), 1.0)
                        seg = m + (target - m) * f
                        if kind == 0:
                            delta = rng.uniform(-2 * np.pi / 3, 2 * np.pi / 3)
                            rate = 1.0 - np.cos(2 * np.pi * (k + 0.5) / length)  # a smooth bump
                            turn[t : t + length, i] = (delta * rate / rate.sum())[: frames - t]
                    mult[t : t + length, i] = seg[: frames - t]
                    m = float(seg[-1])
                    t += length
            hi = np.stack([w - self.sizes, h - self.sizes], 1).astype(np.float64)
            speed = np.linalg.norm(self.velocity, axis=1)
            heading = np.arctan2(self.velocity[:, 1], self.velocity[:, 0])
            pos = self.start.astype(np.float64).copy()
            track = np.empty((frames, n, 2), np.int32)
            for t in range(frames):
                track[t] = np.round(pos)
                heading = heading + turn[t]
                pos += (speed * mult[t])[:, None] * np.column_stack([np.cos(heading), np.sin(heading)])
                for axis in (0, 1):
                    low, high = pos[:, axis] < 0, pos[:, axis] > hi[:, axis]
                    pos[low, axis] = -pos[low, axis]
                    pos[high, axis] = 2 * hi[high, axis] - pos[high, axis]
                    flip = low | high
                    # mirror the heading across the wall
                    heading[flip] = (np.pi - heading[flip]) if axis == 0 else -heading[flip]
            return track

        def boxes(self, index: int) -> np.ndarray:
            if self._track is None:
                return super().boxes(index)
            return self._track[index]

    _MOTION_SCENE = MotionScene
    return MotionScene


class TruthBuilder:
    """Turns the scene's per-frame truth (view pixels) into truth rows with pass ids.

    Whether an object is in the truth depends on its box only (a fifth of it or more inside
    the view, at least 4 px each way), never on its visibility: hidden behind an occluder or
    another object, it stays, with its id."""

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


def render_sequence(scene: Scene, seed: int, frames: int | None = None, with_images: bool = False):
    """Yield (frame index, truth rows, view image or None) for one scene and seed, for
    ``frames`` frames (default: the scene's)."""
    frames = frames or scene.frames
    world = make_world(scene, seed, frames)
    spec = world.spec
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
    "Scene",
    "frames_of",
    "list_sequences",
    "load_sequence",
    "make_world",
    "noisy_detections",
    "occluders_in_view",
    "render_sequence",
    "save_sequence",
    "seq_name",
    "write_mot",
]
