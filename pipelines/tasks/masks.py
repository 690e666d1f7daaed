"""Segmentation masks: made from the prototypes for one detection at a time, cut to its
box before any upsampling, and written as polygons or COCO RLE.

A detection's mask is what Ultralytics' predict gives (``ops.process_mask`` with
``upsample=True``, then ``ops.scale_masks`` to the frame), computed only where it can be
non-zero:

1. in model-input pixels, over the box (``crop_mask``: columns ``x1 <= c < x2``): the
   mask logits (coefficients x prototypes) of the prototype cells the box reads,
   upsampled bilinearly as ``F.interpolate(..., mode="bilinear", align_corners=False)``
   does, kept where > 0;
2. in source pixels: that binary mask resized from the letterboxed content to the frame,
   bilinearly again, kept where > 0.5 (``scale_masks``). When the content is the frame's
   size (a 640-wide frame in a 640 input) this step is the identity and is skipped.

Both resizes are separable: each output pixel reads two inputs along a row, then two
along a column (``Taps``, ``resize``), so the cost grows with the box, never the frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

#: Ultralytics' thresholds: the mask logit (sigmoid 0.5), then the resized binary mask.
LOGIT_THRESHOLD = 0.0
RESIZED_THRESHOLD = 0.5


@dataclass(frozen=True)
class Mask:
    """A detection's mask: ``bitmap`` (bool), its top-left corner at ``x0, y0`` in source
    pixels, each of its pixels ``scale`` source pixels wide and high (1 for a mask in source
    pixels; 1 / the letterbox's scale for one in model-input pixels, as polygons are made
    from); and, once the segmentation task has made it, its published form (``shape``:
    polygons or RLE) and that as JSON (``text``)."""

    x0: float
    y0: float
    bitmap: np.ndarray
    scale: tuple[float, float] = (1.0, 1.0)
    shape: dict[str, Any] | None = None
    text: str = ""

    @property
    def extent(self) -> tuple[float, float]:
        """The bottom-right corner (exclusive) in source pixels."""
        h, w = self.bitmap.shape
        return self.x0 + w * self.scale[0], self.y0 + h * self.scale[1]


@dataclass(frozen=True)
class Taps:
    """Where output pixels ``start..stop-1`` of a bilinear resize read an input axis of
    ``size`` pixels (PyTorch's ``align_corners=False``): the input indices ``i0``, ``i1``
    and ``i1``'s weight ``l1`` (``i0``'s is 1 - ``l1``)."""

    i0: np.ndarray
    i1: np.ndarray
    l1: np.ndarray

    @classmethod
    def of(cls, start: int, stop: int, scale: float, size: int) -> Taps:
        """``scale`` = input size / output size."""
        d = np.arange(start, stop, dtype=np.float64)
        src = np.maximum((d + 0.5) * scale - 0.5, 0.0)
        i0 = np.minimum(np.floor(src).astype(np.int64), size - 1)
        return cls(i0, np.minimum(i0 + 1, size - 1), (src - i0).astype(np.float32))

    def shifted(self, by: int, lo: int, hi: int) -> Taps:
        """The same taps on inputs indexed from ``by``, clipped to ``lo..hi``."""
        return Taps(np.clip(self.i0 - by, lo, hi), np.clip(self.i1 - by, lo, hi), self.l1)


def resize(src: np.ndarray, rows: Taps, cols: Taps) -> np.ndarray:
    """``src`` (2-D) resized bilinearly at the given taps: along each row first, then down
    the columns, PyTorch's order, so a value near a threshold rounds as it does there. The
    work is the output's size (two reads per pixel per pass), never the input's."""
    along = src[:, cols.i0] * (1.0 - cols.l1) + src[:, cols.i1] * cols.l1
    return along[rows.i0] * (1.0 - rows.l1)[:, None] + along[rows.i1] * rows.l1[:, None]


def input_mask(
    coeffs: np.ndarray, protos: np.ndarray, box: np.ndarray, input_hw: tuple[int, int]
) -> tuple[int, int, np.ndarray] | None:
    """Step 1: the mask in model-input pixels over the box ``xyxy`` (input pixels):
    (row, column, bitmap), or None when it is empty there."""
    ih, iw = input_hw
    m, mh, mw = protos.shape
    x1, y1, x2, y2 = (float(v) for v in box)
    c0, c1 = max(0, math.ceil(x1)), min(iw, math.ceil(x2))
    r0, r1 = max(0, math.ceil(y1)), min(ih, math.ceil(y2))
    if c0 >= c1 or r0 >= r1:
        return None
    rows, cols = Taps.of(r0, r1, mh / ih, mh), Taps.of(c0, c1, mw / iw, mw)
    py, px = int(rows.i0[0]), int(cols.i0[0])  # the prototype cells the box reads
    ph, pw = int(rows.i1[-1]) - py + 1, int(cols.i1[-1]) - px + 1
    cells = protos[:, py : py + ph, px : px + pw].reshape(m, -1)
    logits = (coeffs.astype(np.float32) @ cells).reshape(ph, pw)
    bitmap = resize(logits, rows.shifted(py, 0, ph - 1), cols.shifted(px, 0, pw - 1)) > LOGIT_THRESHOLD
    if not bitmap.any():
        return None
    return r0, c0, bitmap


def input_space(found: tuple[int, int, np.ndarray], geo: object) -> Mask:
    """The input-space mask ``found`` as it lies on the frame, not resized: what polygons are
    made from (their points then mapped as Ultralytics maps ``masks.xy``: ``scale_coords``)."""
    r0, c0, bitmap = found
    sx, sy = float(geo.scale_x), float(geo.scale_y)  # type: ignore[attr-defined]
    pad_x, pad_y = int(geo.pad_x), int(geo.pad_y)  # type: ignore[attr-defined]
    return Mask((c0 - pad_x) / sx, (r0 - pad_y) / sy, bitmap, (1.0 / sx, 1.0 / sy))


def source_mask(found: tuple[int, int, np.ndarray], geo: object) -> Mask:
    """Step 2: the input-space mask ``found`` resized from the letterboxed content
    (``geo``: ``pad_x``, ``pad_y``, ``new_w``, ``new_h``, ``src_w``, ``src_h``) to the frame."""
    r0, c0, bitmap = found
    h, w = bitmap.shape
    pad_x, pad_y = int(geo.pad_x), int(geo.pad_y)  # type: ignore[attr-defined]
    cw, ch = int(geo.new_w), int(geo.new_h)  # type: ignore[attr-defined]
    sw, sh = int(geo.src_w), int(geo.src_h)  # type: ignore[attr-defined]
    y0, x0 = r0 - pad_y, c0 - pad_x  # the mask's place in the content
    if cw == sw and ch == sh:  # the content is the frame: the resize is the identity
        a, b = max(0, -y0), max(0, -x0)
        part = bitmap[a : max(a, min(h, sh - y0)), b : max(b, min(w, sw - x0))]
        return Mask(x0 + b, y0 + a, part)
    ys, xs = _span(y0, y0 + h, ch, sh), _span(x0, x0 + w, cw, sw)
    if ys[0] >= ys[1] or xs[0] >= xs[1]:  # all in the letterbox's padding: nothing in the frame
        return Mask(min(xs[0], sw), min(ys[0], sh), np.zeros((0, 0), bool))
    # Outside the mask's own pixels the content is 0: read from a copy with a zero border.
    padded = np.zeros((h + 2, w + 2), np.float32)
    padded[1:-1, 1:-1] = bitmap
    rows = Taps.of(ys[0], ys[1], ch / sh, ch).shifted(y0 - 1, 0, h + 1)
    cols = Taps.of(xs[0], xs[1], cw / sw, cw).shifted(x0 - 1, 0, w + 1)
    return Mask(xs[0], ys[0], resize(padded, rows, cols) > RESIZED_THRESHOLD)


def _span(start: int, stop: int, content: int, frame: int) -> tuple[int, int]:
    """The frame pixels whose bilinear sample reads content pixels ``start..stop-1``."""
    ratio = frame / content
    lo = math.floor((start - 1 + 0.5) * ratio - 0.5)
    hi = math.ceil((stop + 0.5) * ratio + 0.5)
    return max(0, lo), min(frame, max(hi, 0))


def rle(mask: Mask, height: int, width: int) -> np.ndarray:
    """COCO's uncompressed RLE of ``mask`` over a ``height`` x ``width`` frame: the pixels
    in column-major order, counts of alternating runs, starting with a run of zeros
    (0 when the first pixel is set)."""
    h, w = mask.bitmap.shape
    cols = np.zeros((w, h + 1), bool)  # each column of the crop, then the rest of the frame's column
    cols[:, :h] = mask.bitmap.T
    flat = cols.ravel()
    change = np.flatnonzero(flat[1:] != flat[:-1]) + 1
    if len(flat) and flat[0]:
        change = np.concatenate(([0], change))
    j, r = np.divmod(change, h + 1)
    pos = (mask.x0 + j) * height + mask.y0 + r
    # A run that ends at a column's bottom and one that starts at the next column's top
    # meet at the same position: they are one run.
    same = np.flatnonzero(pos[1:] == pos[:-1])
    if len(same):
        drop = np.concatenate((same, same + 1))
        pos = np.delete(pos, drop)
    counts = np.diff(np.concatenate(([0], pos, [height * width]))).astype(np.int64)
    # A mask that reaches the frame's last pixel ends on a run of ones (no zero run after).
    return counts[:-1] if len(counts) > 1 and counts[-1] == 0 else counts


def polygons(mask: Mask, max_points: int, frame_wh: tuple[int, int] | None = None) -> list[np.ndarray]:
    """The mask's outlines (outer contours, largest first, at most ``max_points`` / 8 of
    them), simplified (Douglas-Peucker, the tolerance raised from 0.5 px) until they hold
    ``max_points`` points in all, pieces that shrink below 3 points left out; in source
    pixels (a mask of another scale: its points mapped), clipped to ``frame_wh``."""
    found, _ = cv2.findContours(mask.bitmap.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    if not found:
        return []
    # The largest pieces only, about 8 points each at least: a mask's outline is its few
    # large pieces (the speckle around them is what costs: each piece is a call per round).
    found = sorted(found, key=lambda c: -cv2.contourArea(c))[: max(1, max_points // 8)]
    epsilon = 0.5
    if sum(len(c) for c in found) <= max_points:  # fits as it is: no simplification
        epsilon = 0.0
    out: list[np.ndarray] = []
    while True:
        simpler = [cv2.approxPolyDP(c, epsilon, True).reshape(-1, 2) for c in found]
        simpler = [p for p in simpler if len(p) >= 3]  # pieces shrunk to a line are left out
        if not simpler:  # all shrunk to lines (or a sliver of a mask): the round before, cut below
            break
        out = simpler
        total = sum(len(p) for p in out)
        if total <= max_points or epsilon > 1e4:
            break
        # A smooth outline's points go as 1 / sqrt(tolerance): aim at the budget in one step
        # (at least doubling, at most 16 times), not by doubling round after round.
        epsilon = max(0.5, epsilon * min(16.0, max(2.0, (total / max_points) ** 2)))
    kept, total = [], 0
    for p in out:  # still over (many pieces): the largest ones that fit
        if total + len(p) > max_points and kept:
            break
        kept.append(p[:max_points])
        total += len(p)
    if mask.scale == (1.0, 1.0) and float(mask.x0).is_integer() and float(mask.y0).is_integer():
        placed = [p + np.array((int(mask.x0), int(mask.y0)), np.int32) for p in kept]
    else:
        placed = [
            p * np.array(mask.scale, np.float32) + np.array((mask.x0, mask.y0), np.float32) for p in kept
        ]
    if frame_wh is not None:  # a mask reaching into the letterbox's padding: clipped as Ultralytics clips
        for p in placed:
            np.clip(p, 0, frame_wh, out=p)
    return placed
