"""The synthetic camera: moving, occluding shapes on a textured, noisy background, with
their ground truth, paced like a camera (``SyntheticSource``, source type ``synthetic``).

The scene is a pure function of (seed, frame index): any frame can be rendered again
later, out of order, and gives the same pixels and the same ground truth. Tests and the
evaluation command rely on this to check published detections against the truth, and the
bundled detector is trained on scenes from other seeds than those it is scored on.

With margins (``SceneSpec.margin_x``, ``margin_y``) the objects move in a world larger
than the camera's view, which is its middle: objects enter and leave the frame, as a
tracker's ground truth needs (tools/tracking). Without them the view is the world.

Static occluders (``SceneSpec.occluders``: rectangles in world pixels) stand in front of
every object: their pixels hide whatever passes behind them, and an object's visible
fraction (the truth's ``visibility``) drops while it is behind one (0 wholly behind; its
box stays in the truth). They are drawn once, at construction, as panels of the
background's own tones, desaturated and blurred, with soft slats and grain, so that they
read as part of the scene (a post, a fence) and the detector does not take them for a shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.pipelines.sources.base import PacedSource, SourceError, SourceFrame

CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "cross")

#: Columns of a ground-truth row: class id, x1, y1, x2, y2 (source pixels), visible fraction.
GT_COLUMNS = ("class_id", "x1", "y1", "x2", "y2", "visibility")

_NOISE_BANK = 4


@dataclass(frozen=True)
class SceneSpec:
    width: int = 640
    height: int = 480
    seed: int = 0
    num_objects: int = 6
    min_size_frac: float = 0.05  # object side as a fraction of min(width, height)
    max_size_frac: float = 0.20
    max_speed_px: float = 6.0  # per frame
    noise_sigma: float = 6.0
    margin_x: int = 0  # the world extends this far beyond each side of the view
    margin_y: int = 0
    #: static occluders in front of every object: (x, y, w, h) in world pixels
    occluders: tuple[tuple[int, int, int, int], ...] = ()

    @property
    def world_wh(self) -> tuple[int, int]:
        return self.width + 2 * self.margin_x, self.height + 2 * self.margin_y


def _reflect(x: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Fold positions into [0, hi] as if they bounced off the walls."""
    period = 2.0 * hi
    m = np.mod(x, period)
    return np.where(m <= hi, m, period - m)


class SyntheticScene:
    """Renders frames of one seeded scene into caller-owned buffers."""

    def __init__(self, spec: SceneSpec) -> None:
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        (w, h), n = spec.world_wh, spec.num_objects
        short = min(w, h)
        self.sizes = np.round(rng.uniform(spec.min_size_frac, spec.max_size_frac, n) * short).astype(np.int32)
        self.classes = rng.integers(0, len(CLASSES), n).astype(np.int32)
        self.start = rng.uniform(0, 1, (n, 2)) * np.stack([w - self.sizes, h - self.sizes], 1)
        angle = rng.uniform(0, 2 * np.pi, n)
        speed = rng.uniform(0.3, 1.0, n) * spec.max_speed_px
        self.velocity = np.stack([np.cos(angle), np.sin(angle)], 1) * speed[:, None]
        hsv = np.stack(
            [rng.integers(0, 180, n), rng.integers(140, 256, n), rng.integers(120, 256, n)], 1
        ).astype(np.uint8)
        # (no objects: OpenCV refuses an empty image)
        bgr = cv2.cvtColor(hsv[None], cv2.COLOR_HSV2BGR)[0] if n else hsv
        self.colors = [tuple(int(c) for c in row) for row in bgr]
        self.background = self._background(rng, w, h)
        noise = rng.normal(0.0, spec.noise_sigma, (_NOISE_BANK, h, w, 3))
        # Noise as two saturating uint8 layers (add, then subtract) keeps rendering in-place.
        self._noise_pos = np.clip(noise, 0, 255).astype(np.uint8)
        self._noise_neg = np.clip(-noise, 0, 255).astype(np.uint8)
        self._ids = np.zeros((h, w), np.uint8)
        self._area = np.array(
            [self._mask_area(int(c), int(s)) for c, s in zip(self.classes, self.sizes)], np.float64
        )
        # With margins: the world is drawn here and the view copied out of it.
        self._world = np.empty((h, w, 3), np.uint8) if (spec.margin_x or spec.margin_y) else None
        # Occluders: drawn once; each frame copies their pixels over the objects and clears
        # their pixels from the ids image (rectangles: slice copies, nothing allocated).
        self._occluders = _clip_rects(spec.occluders, w, h)
        self._occluder_layer = (
            _occluder_layer(spec, self._occluders, self.background) if self._occluders else None
        )

    @staticmethod
    def _background(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
        coarse = rng.uniform(70, 170, (6, 8, 3)).astype(np.float32)
        bg = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
        texture = cv2.GaussianBlur(rng.normal(0, 18, (h, w, 3)).astype(np.float32), (0, 0), 2.0)
        bg = bg + texture
        # Low-contrast clutter: lines and boxes that are not objects.
        canvas = np.clip(bg, 0, 255).astype(np.uint8)
        for _ in range(12):
            p1 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            p2 = (int(rng.integers(0, w)), int(rng.integers(0, h)))
            shade = tuple(int(v) for v in rng.integers(60, 190, 3))
            if rng.random() < 0.5:
                cv2.line(canvas, p1, p2, shade, int(rng.integers(1, 4)))
            else:
                cv2.rectangle(canvas, p1, p2, shade, 1)
        return canvas

    def _mask_area(self, cls: int, size: int) -> float:
        scratch = np.zeros((size + 2, size + 2), np.uint8)
        _draw(scratch, cls, 0, 0, size, 1)
        return max(float(np.count_nonzero(scratch)), 1.0)

    def boxes(self, index: int) -> np.ndarray:
        """Integer top-left corners of every object at frame ``index``, shape (n, 2)."""
        w, h = self.spec.world_wh
        hi = np.stack([w - self.sizes, h - self.sizes], 1)
        pos = _reflect(self.start + self.velocity * index, hi.astype(np.float64))
        return np.round(pos).astype(np.int32)

    def render(self, index: int, out: np.ndarray, gt: np.ndarray) -> None:
        """Draw frame ``index`` into ``out`` (H, W, 3 uint8) and its truth into ``gt``.

        ``gt`` has shape (num_objects, 6) float32, columns as ``GT_COLUMNS``; objects are
        listed back to front. With margins, boxes are in view pixels, clipped to the view,
        and the visible fraction counts only what is inside the view (0 for an object
        outside it, whose box is then empty).
        """
        spec = self.spec
        world = out if self._world is None else self._world
        np.copyto(world, self.background)
        ids = self._ids
        ids.fill(0)
        corners = self.boxes(index)
        for i in range(self.spec.num_objects):
            x, y = int(corners[i, 0]), int(corners[i, 1])
            s, c = int(self.sizes[i]), int(self.classes[i])
            _draw(world, c, x, y, s, self.colors[i])
            _draw(ids, c, x, y, s, i + 1)
            gt[i, 0] = c
            gt[i, 1:5] = (x, y, x + s, y + s)
        layer = self._occluder_layer
        for x1, y1, x2, y2 in self._occluders:
            world[y1:y2, x1:x2] = layer[y1:y2, x1:x2]
            ids[y1:y2, x1:x2] = 0
        for i in range(self.spec.num_objects):
            x1, y1, x2, y2 = (int(v) for v in gt[i, 1:5])
            visible = np.count_nonzero(ids[y1 : y2 + 1, x1 : x2 + 1] == i + 1)
            gt[i, 5] = min(visible / self._area[i], 1.0)
        k = index % _NOISE_BANK
        cv2.add(world, self._noise_pos[k], dst=world)
        cv2.subtract(world, self._noise_neg[k], dst=world)
        if self._world is not None:
            mx, my = spec.margin_x, spec.margin_y
            np.copyto(out, world[my : my + spec.height, mx : mx + spec.width])
            self._to_view(gt)

    def _to_view(self, gt: np.ndarray) -> None:
        """World truth to view truth: boxes moved and clipped, visibility times the box's
        fraction inside the view."""
        spec = self.spec
        area = np.maximum((gt[:, 3] - gt[:, 1]) * (gt[:, 4] - gt[:, 2]), 1.0)
        gt[:, 1:5] -= (spec.margin_x, spec.margin_y, spec.margin_x, spec.margin_y)
        np.clip(gt[:, 1:5], 0, (spec.width, spec.height, spec.width, spec.height), out=gt[:, 1:5])
        gt[:, 5] *= (gt[:, 3] - gt[:, 1]) * (gt[:, 4] - gt[:, 2]) / area


def _clip_rects(rects, w: int, h: int) -> tuple[tuple[int, int, int, int], ...]:
    """(x, y, w, h) rectangles to (x1, y1, x2, y2) slices inside a w x h image; empty ones dropped."""
    out = []
    for x, y, rw, rh in rects:
        x1, y1 = max(int(x), 0), max(int(y), 0)
        x2, y2 = min(int(x) + int(rw), w), min(int(y) + int(rh), h)
        if x2 > x1 and y2 > y1:
            out.append((x1, y1, x2, y2))
    return tuple(out)


def _occluder_layer(spec: SceneSpec, rects, background: np.ndarray) -> np.ndarray:
    """The occluders' pixels (elsewhere zero): each a panel of the background's own tones
    where it stands, half desaturated and blurred, with soft slats along its long side (a
    fence, a post) and grain. No flat saturated colour and no hard rim: the detector, which
    learnt flat saturated shapes, does not take an occluder for one. Its own random stream:
    a scene without occluders draws exactly what it drew before."""
    h, w = background.shape[:2]
    rng = np.random.default_rng([spec.seed, 0x0CC1])
    layer = np.zeros((h, w, 3), np.uint8)
    for x1, y1, x2, y2 in rects:
        rw, rh = x2 - x1, y2 - y1
        vertical = rw <= rh
        across = np.arange(rw if vertical else rh, dtype=np.float32)
        slats = 12.0 * np.sin(2 * np.pi * across / rng.uniform(9, 16) + rng.uniform(0, 2 * np.pi))
        slats = slats[None, :] if vertical else slats[:, None]
        grain = cv2.GaussianBlur(rng.normal(0, 14, (rh, rw)).astype(np.float32), (0, 0), 1.5)
        shade = np.linspace(-10, 10, max(rw, rh), dtype=np.float32)  # light along the long side
        shade = shade[:, None] if vertical else shade[None, :]
        under = background[y1:y2, x1:x2].astype(np.float32)
        grey = under.mean(axis=2, keepdims=True)
        base = cv2.GaussianBlur(grey + 0.5 * (under - grey), (0, 0), 6.0)
        if base.ndim == 2:  # (a 1-pixel-wide panel loses its channel axis in OpenCV)
            base = base[:, :, None]
        panel = base + (slats + grain + shade)[:, :, None]
        layer[y1:y2, x1:x2] = np.clip(panel, 0, 255).astype(np.uint8)
    return layer


def _draw(img: np.ndarray, cls: int, x: int, y: int, s: int, color) -> None:
    """Draw one filled shape whose bounding box is (x, y, x + s, y + s)."""
    name = CLASSES[cls]
    if name == "circle":
        r = s // 2
        cv2.circle(img, (x + r, y + r), r, color, -1)
    elif name == "square":
        cv2.rectangle(img, (x, y), (x + s, y + s), color, -1)
    elif name == "triangle":
        pts = np.array([[x + s // 2, y], [x, y + s], [x + s, y + s]], np.int32)
        cv2.fillConvexPoly(img, pts, color)
    else:  # cross
        a, b = x + (s * 35) // 100, x + (s * 65) // 100
        cv2.rectangle(img, (a, y), (b, y + s), color, -1)
        a, b = y + (s * 35) // 100, y + (s * 65) // 100
        cv2.rectangle(img, (x, a), (x + s, b), color, -1)


class SyntheticSource(PacedSource):
    """The synthetic scene, paced like a camera at ``fps`` (or unpaced when fps is 0).

    Paced, it behaves like a live camera (``Pacer``): frame k exists at t0 + k/fps whether
    or not the pipeline asks for it, so a busy pipeline gets the newest frame and the ones
    in between are skipped. Its capture time is when frame k was due.
    """

    def __init__(self, config: SyntheticSourceConfig) -> None:
        super().__init__(config.name, config.fps)
        self.config = config
        self.scene: SyntheticScene | None = None

    @property
    def _next(self) -> int:
        """The next frame's index."""
        return self._pacer.next_index

    def open(self) -> None:
        c = self.config
        self.scene = SyntheticScene(
            SceneSpec(
                width=c.width,
                height=c.height,
                seed=c.seed,
                num_objects=c.num_objects,
                noise_sigma=c.noise_sigma,
                max_speed_px=c.max_speed_px,
                margin_x=round(c.width * c.world_margin),
                margin_y=round(c.height * c.world_margin),
            )
        )
        self._frame.image = np.empty((c.height, c.width, 3), np.uint8)
        self._frame.gt = np.zeros((c.num_objects, 6), np.float32)
        self._pacer.reset()

    def read(self, timeout_s: float) -> SourceFrame | None:
        if self.scene is None:
            raise SourceError(f"source {self.name!r} read before open")
        return super().read(timeout_s)

    def _fill(self, index: int, frame: SourceFrame) -> None:
        assert self.scene is not None
        self.scene.render(index, frame.image, frame.gt)

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {**super().describe(), "size_wh": [c.width, c.height], "fps": c.fps, "seed": c.seed}


SOURCES = {"synthetic": SyntheticSource}  # source types built here (the registry collects them)
