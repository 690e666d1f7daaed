"""Decoders for YOLO output layouts, and class-aware non-maximum suppression.

Pure functions over numpy arrays; each decoder keeps only the candidates above the score
threshold before touching boxes, so the cost follows the number of objects, not anchors.
All boxes are ``xyxy`` in model-input pixels; the caller maps them to source pixels.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

try:  # OpenCV's class-aware greedy NMS in C++ (4.7+); the numpy one below otherwise
    from cv2.dnn import NMSBoxesBatched as _cv_batched_nms
except (ImportError, AttributeError):  # pragma: no cover - an OpenCV without dnn
    _cv_batched_nms = None

#: More candidates than this after the score threshold are cut to the best-scoring ones,
#: which bounds NMS (quadratic) when a model fires everywhere.
MAX_CANDIDATES = 1024


@dataclass(frozen=True)
class DecodeParams:
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    # Decoders of normalised boxes (RT-DETR) scale them by the model's input size.
    input_w: int = 0
    input_h: int = 0
    rtdetr_topk: bool = False  # an RT-DETR output of (K, 6): top-k already in the graph


Decoded = tuple[np.ndarray, np.ndarray, np.ndarray]  # xyxy (K, 4) f32, scores (K,), class ids (K,)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU between every box of ``a`` (N, 4) and of ``b`` (M, 4), xyxy → (N, M)."""
    ax1, ay1, ax2, ay2 = a.T
    bx1, by1, bx2, by2 = b.T
    w = np.minimum.outer(ax2, bx2)
    w -= np.maximum.outer(ax1, bx1)
    h = np.minimum.outer(ay2, by2)
    h -= np.maximum.outer(ay1, by1)
    np.maximum(w, 0, out=w)
    np.maximum(h, 0, out=h)
    inter = w
    inter *= h
    union = np.add.outer((ax2 - ax1) * (ay2 - ay1), (bx2 - bx1) * (by2 - by1))
    union -= inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def nms(xyxy: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS: indices of kept boxes, best score first.

    A box is suppressed when its IoU with a kept, higher-scoring box is above
    ``iou_threshold`` (the rule of ``cv2.dnn.NMSBoxes``; equal scores keep input order).
    """
    if len(scores) == 0:
        return np.empty(0, np.int64)
    order = np.argsort(-scores, kind="stable")
    boxes = xyxy[order]
    iou = box_iou(boxes, boxes)
    keep = []
    # Visit only survivors: each kept box removes its overlaps from the rest at once.
    rest = np.arange(len(order))
    while rest.size:
        i = rest[0]
        keep.append(i)
        rest = rest[1:]
        rest = rest[iou[i, rest] <= iou_threshold]
    return order[np.asarray(keep, np.int64)]


def batched_nms(
    xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float
) -> np.ndarray:
    """Class-aware NMS: boxes of different classes never suppress each other; indices of
    kept boxes, best score first.

    OpenCV's ``NMSBoxesBatched`` where it exists: the same greedy rule in C++, about three
    times faster than numpy at 100 candidates (it keeps the same boxes: tests compare).
    Otherwise each class's boxes are shifted by a disjoint offset so one greedy numpy pass
    handles all classes at once instead of a Python loop per class.
    """
    if len(scores) == 0:
        return np.empty(0, np.int64)
    if _cv_batched_nms is not None:
        xywh = xyxy.astype(np.float64)
        xywh[:, 2:] -= xywh[:, :2]
        # OpenCV separates the classes by offsets of (largest coordinate + 1), which is too
        # small when boxes reach into negative coordinates (past the left or top edge):
        # moved to non-negative ones first (IoU does not change).
        xywh[:, :2] -= min(float(xywh[:, :2].min()), 0.0)
        keep = np.asarray(
            _cv_batched_nms(xywh, scores, class_ids.astype(np.int32), -np.inf, float(iou_threshold)), np.int64
        ).ravel()
        return keep[np.argsort(-scores[keep], kind="stable")]
    return _numpy_batched_nms(xyxy, scores, class_ids, iou_threshold)


def _numpy_batched_nms(
    xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, iou_threshold: float
) -> np.ndarray:
    span = float(np.max(xyxy)) - float(min(np.min(xyxy), 0.0)) + 1.0
    shifted = xyxy + (class_ids.astype(xyxy.dtype) * span)[:, None]
    return nms(shifted, scores, iou_threshold)


def _finish(cxcywh: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, p: DecodeParams) -> Decoded:
    if len(scores) > MAX_CANDIDATES:
        top = np.argpartition(-scores, MAX_CANDIDATES)[:MAX_CANDIDATES]
        cxcywh, scores, class_ids = cxcywh[top], scores[top], class_ids[top]
    half = cxcywh[:, 2:] * 0.5
    xyxy = np.concatenate((cxcywh[:, :2] - half, cxcywh[:, :2] + half), axis=1, dtype=np.float32)
    keep = batched_nms(xyxy, scores, class_ids, p.iou_threshold)[: p.max_detections]
    return xyxy[keep], scores[keep].astype(np.float32), class_ids[keep].astype(np.int32)


def decode_yolov8(output: np.ndarray, p: DecodeParams) -> Decoded:
    """Decode one image of the YOLOv8/YOLO11 export layout, ``(4 + C, N)`` or ``(1, 4 + C, N)``.

    Rows are cx, cy, w, h (input pixels) then C class scores (already sigmoid).
    """
    out = output[0] if output.ndim == 3 else output
    best = out[4:].max(axis=0)
    idx = np.flatnonzero(best > p.score_threshold)
    cand = out[:, idx].T  # one gather of the few candidates: (K, 4 + C)
    return _finish(cand[:, :4], best[idx], cand[:, 4:].argmax(axis=1), p)


def decode_yolov5(output: np.ndarray, p: DecodeParams) -> Decoded:
    """Decode one image of the YOLOv5 layout, ``(N, 5 + C)`` or ``(1, N, 5 + C)``.

    Columns are cx, cy, w, h, objectness, then C class probabilities; the score of a
    class is objectness × probability, so anchors with objectness below the threshold
    are skipped before any multiplication.
    """
    out = output[0] if output.ndim == 3 else output
    idx = np.flatnonzero(out[:, 4] > p.score_threshold)
    rows = out[idx]
    conf = rows[:, 5:] * rows[:, 4:5]
    class_ids = conf.argmax(axis=1)
    scores = conf[np.arange(len(idx)), class_ids]
    ok = scores > p.score_threshold
    return _finish(rows[ok, :4], scores[ok], class_ids[ok], p)


def _ranked(xyxy: np.ndarray, scores: np.ndarray, class_ids: np.ndarray, p: DecodeParams) -> Decoded:
    """Threshold and rank detections that need no NMS (it ran inside the model)."""
    idx = np.flatnonzero(scores > p.score_threshold)
    idx = idx[np.argsort(-scores[idx], kind="stable")][: p.max_detections]
    return (
        np.ascontiguousarray(xyxy[idx], np.float32),
        scores[idx].astype(np.float32),
        class_ids[idx].astype(np.int32),
    )


def decode_end2end(output: np.ndarray, p: DecodeParams) -> Decoded:
    """Decode one image of an end-to-end export, ``(K, 6)`` or ``(1, K, 6)``: rows x1, y1,
    x2, y2 (input pixels), score, class id. YOLO26's and YOLOv10's one-to-one heads and
    Ultralytics' ``nms=True`` exports give it; NMS is in the model, so none runs here (an
    end-to-end head may list one box under two classes, as Ultralytics shows it too).
    Unused rows score 0."""
    out = output[0] if output.ndim == 3 else output
    return _ranked(out[:, :4], out[:, 4], out[:, 5], p)


def decode_rtdetr(output: np.ndarray, p: DecodeParams) -> Decoded:
    """Decode one image of an Ultralytics RT-DETR export: boxes cx, cy, w, h normalised
    to 0..1, then either C class scores (after a sigmoid), ``(K, 4 + C)``, or the top-k
    already taken in the graph, ``(K, 6)`` = box, score, class id (Ultralytics 8.4). No
    NMS: the decoder's queries do not overlap by construction. ``p.input_w/h`` scale the
    boxes to input pixels."""
    out = output[0] if output.ndim == 3 else output
    if p.rtdetr_topk:
        scores, class_ids = out[:, 4], out[:, 5]
    else:
        class_ids = out[:, 4:].argmax(axis=1)
        scores = out[np.arange(len(out)), 4 + class_ids]
    keep = np.flatnonzero(scores > p.score_threshold)
    box = out[keep, :4] * np.array([p.input_w, p.input_h, p.input_w, p.input_h], np.float32)
    half = box[:, 2:] * 0.5
    xyxy = np.empty_like(box)
    xyxy[:, :2] = box[:, :2] - half
    xyxy[:, 2:] = box[:, :2] + half
    return _ranked(xyxy, scores[keep], class_ids[keep], p)


def decode_efficient_nms(
    num_dets: np.ndarray, boxes: np.ndarray, scores: np.ndarray, classes: np.ndarray, p: DecodeParams
) -> Decoded:
    """Decode one image of TensorRT's ``EfficientNMS_TRT`` outputs: ``num_dets`` (1,) or
    (1, 1) int32, ``det_boxes`` (K, 4) xyxy input pixels, ``det_scores`` (K,), ``det_classes``
    (K,) int32, each with or without its batch axis of 1. Rows past ``num_dets`` are padding."""
    n = int(np.asarray(num_dets).reshape(-1)[0])
    boxes = boxes[0] if boxes.ndim == 3 else boxes
    scores = scores[0] if scores.ndim == 2 else scores
    classes = classes[0] if classes.ndim == 2 else classes
    n = max(0, min(n, len(scores)))
    return _ranked(boxes[:n], scores[:n], classes[:n], p)


#: Every decoder by name (the manifest's ``output.decoder``).
DECODERS: dict[str, Callable[..., Decoded]] = {
    "yolov8": decode_yolov8,
    "yolov5": decode_yolov5,
    "end2end": decode_end2end,
    "rtdetr": decode_rtdetr,
    "efficient_nms": decode_efficient_nms,
}
@dataclass(frozen=True)
class Decoder:
    """A decoder bound to the model outputs it reads (their indices in the backend's list):
    called with one frame's outputs, as the backend wrote them (batch axis of 1)."""

    name: str
    outputs: tuple[int, ...]
    fn: Callable[..., Decoded] = field(init=False, repr=False, compare=False)
    _pick: Callable[[Sequence[np.ndarray]], tuple] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fn", DECODERS[self.name])
        object.__setattr__(self, "_pick", operator.itemgetter(*self.outputs))

    def __call__(self, outputs: Sequence[np.ndarray], p: DecodeParams) -> Decoded:
        if len(self.outputs) == 1:  # itemgetter of one index gives the item, not a tuple
            return self.fn(outputs[self.outputs[0]], p)
        return self.fn(*self._pick(outputs), p)
