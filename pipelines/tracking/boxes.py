"""Box arithmetic of the trackers, in place where it can be."""

from __future__ import annotations

import numpy as np


def xyxy_to_cxcywh(xyxy: np.ndarray, out: np.ndarray) -> None:
    np.subtract(xyxy[:, 2:], xyxy[:, :2], out=out[:, 2:])
    np.multiply(out[:, 2:], 0.5, out=out[:, :2])
    out[:, :2] += xyxy[:, :2]


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4 xyxy) with every box of ``b`` (m, 4 xyxy)."""
    ix = np.minimum(a[:, None, 2], b[None, :, 2])
    ix -= np.maximum(a[:, None, 0], b[None, :, 0])
    np.maximum(ix, 0.0, out=ix)
    iy = np.minimum(a[:, None, 3], b[None, :, 3])
    iy -= np.maximum(a[:, None, 1], b[None, :, 1])
    np.maximum(iy, 0.0, out=iy)
    ix *= iy  # intersection
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :]
    union -= ix
    np.maximum(union, 1e-9, out=union)
    ix /= union
    return ix
