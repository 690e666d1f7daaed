"""Oriented boxes: corners, axis-aligned bounds, probabilistic IoU and the rotated NMS of
Ultralytics' OBB models, with the same rules so the same boxes are kept.

Boxes are ``xywhr``: centre, size and the angle in radians (counter-clockwise in image
coordinates, as Ultralytics gives it), in float32 throughout, as Ultralytics computes.
"""

from __future__ import annotations

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams
from edge_agent.models.decoders.nms import MAX_CANDIDATES

#: Ultralytics' class offset for class-aware NMS (``max_wh`` of its ``non_max_suppression``):
#: each class's centres move by class id x this, so boxes of two classes never overlap.
CLASS_OFFSET = 7680.0
_EPS = np.float32(1e-7)


def corners(xywhr: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The four corners (K, 4, 2) of boxes (K, 5), in Ultralytics' order
    (``xywhr2xyxyxyxy``): centre + v1 + v2, + v1 - v2, - v1 - v2, - v1 + v2."""
    c = xywhr[:, :2]
    cos, sin = np.cos(xywhr[:, 4]), np.sin(xywhr[:, 4])
    half_w, half_h = xywhr[:, 2] * 0.5, xywhr[:, 3] * 0.5
    v1 = np.stack((half_w * cos, half_w * sin), axis=1)
    v2 = np.stack((-half_h * sin, half_h * cos), axis=1)
    if out is None:
        out = np.empty((len(xywhr), 4, 2), np.float32)
    out[:, 0] = c + v1 + v2
    out[:, 1] = c + v1 - v2
    out[:, 2] = c - v1 - v2
    out[:, 3] = c - v1 + v2
    return out


def bounds(xywhr: np.ndarray) -> np.ndarray:
    """The axis-aligned boxes (K, 4) xyxy that hold the rotated ones (the corners' extent,
    so ordered even for a negative size, which an untrained head can give)."""
    cos, sin = np.abs(np.cos(xywhr[:, 4])), np.abs(np.sin(xywhr[:, 4]))
    half_w, half_h = np.abs(xywhr[:, 2]) * 0.5, np.abs(xywhr[:, 3]) * 0.5
    dx = half_w * cos + half_h * sin
    dy = half_w * sin + half_h * cos
    x, y = xywhr[:, 0], xywhr[:, 1]
    return np.stack((x - dx, y - dy, x + dx, y + dy), axis=1).astype(np.float32)


def _covariance(b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = b[:, 2] * b[:, 2] / np.float32(12)
    d = b[:, 3] * b[:, 3] / np.float32(12)
    cos, sin = np.cos(b[:, 4]), np.sin(b[:, 4])
    cos2, sin2 = cos * cos, sin * sin
    return a * cos2 + d * sin2, a * sin2 + d * cos2, (a - d) * cos * sin


def probiou(b1: np.ndarray, b2: np.ndarray) -> np.ndarray:
    """Probabilistic IoU (N, M) of boxes ``b1`` (N, 5) and ``b2`` (M, 5): one minus the
    Hellinger distance of the Gaussians the boxes define (Ultralytics' ``batch_probiou``,
    the overlap its OBB NMS uses), float32."""
    b1 = b1.astype(np.float32, copy=False)
    b2 = b2.astype(np.float32, copy=False)
    x1, y1 = b1[:, 0:1], b1[:, 1:2]
    x2, y2 = b2[None, :, 0], b2[None, :, 1]
    a1, bb1, c1 = (v[:, None] for v in _covariance(b1))
    a2, bb2, c2 = (v[None, :] for v in _covariance(b2))
    sa, sb, sc = a1 + a2, bb1 + bb2, c1 + c2
    den = sa * sb - sc * sc
    t1 = (sa * (y1 - y2) ** 2 + sb * (x1 - x2) ** 2) / (den + _EPS) * np.float32(0.25)
    t2 = (sc * (x2 - x1) * (y1 - y2)) / (den + _EPS) * np.float32(0.5)
    det1 = np.maximum(a1 * bb1 - c1 * c1, 0)
    det2 = np.maximum(a2 * bb2 - c2 * c2, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        t3 = np.log(den / (4 * np.sqrt(det1 * det2) + _EPS) + _EPS) * np.float32(0.5)
    bd = np.clip(t1 + t2 + t3, _EPS, np.float32(100.0))
    hd = np.sqrt(np.float32(1.0) - np.exp(-bd) + _EPS)
    return (np.float32(1.0) - hd).astype(np.float32)


def rotated_nms(
    xywhr: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float
) -> np.ndarray:
    """Class-aware NMS of rotated boxes: indices of the kept ones, best score first.

    Ultralytics' rule for OBB models (``TorchNMS.fast_nms`` with ``batch_probiou``), not the
    greedy one: a box is dropped when its probabilistic IoU with any higher-scoring box of
    its class is above the threshold, whether or not that box was itself dropped.
    """
    if len(scores) == 0:
        return np.empty(0, np.int64)
    order = np.argsort(-scores, kind="stable")
    boxes = xywhr[order].astype(np.float32)
    boxes[:, :2] += (class_ids[order].astype(np.float32) * np.float32(CLASS_OFFSET))[:, None]
    iou = np.triu(probiou(boxes, boxes), 1)
    return order[~(iou > iou_threshold).any(axis=0)]


def keep_best_rotated(
    xywhr: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, p: DecodeParams
) -> Decoded:
    """Rotated candidates over the score threshold to detections: the best
    ``MAX_CANDIDATES``, rotated NMS, at most ``p.max_detections``; the boxes are their
    axis-aligned bounds and ``extra`` the rotated boxes."""
    if len(scores) > MAX_CANDIDATES:
        top = np.argpartition(-scores, MAX_CANDIDATES)[:MAX_CANDIDATES]
        xywhr, scores, class_ids = xywhr[top], scores[top], class_ids[top]
    keep = rotated_nms(xywhr, scores, class_ids, p.iou_threshold)[: p.max_detections]
    kept = np.ascontiguousarray(xywhr[keep], np.float32)
    return Decoded(bounds(kept), scores[keep].astype(np.float32), class_ids[keep].astype(np.int32), kept)
