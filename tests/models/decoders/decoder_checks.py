"""What the decoder tests share: the parameters, output builders and the checks every
decoder's result must pass."""

from __future__ import annotations

import numpy as np

from edge_agent.models.decoders import registry
from edge_agent.models.decoders.base import Decoded, DecodeParams

P = DecodeParams(score_threshold=0.25, iou_threshold=0.45, max_detections=100)


def decode(name: str, *outputs: np.ndarray, p: DecodeParams = P) -> Decoded:
    """The registered decoder ``name`` on one image's outputs."""
    return registry.get(name).decode(outputs, p)


def v8_tensor(rows: list[tuple], num_classes: int, anchors: int = 50) -> np.ndarray:
    """[1, 4 + C, N]: each row (cx, cy, w, h, {class: score}) fills one anchor, the rest zeros."""
    out = np.zeros((1, 4 + num_classes, anchors), np.float32)
    for i, (cx, cy, w, h, cls) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        for c, s in cls.items():
            out[0, 4 + c, i] = s
    return out


def v5_tensor(rows: list[tuple], num_classes: int, anchors: int = 50) -> np.ndarray:
    """[1, N, 5 + C]: each row (cx, cy, w, h, objectness, {class: prob})."""
    out = np.zeros((1, anchors, 5 + num_classes), np.float32)
    for i, (cx, cy, w, h, obj, cls) in enumerate(rows):
        out[0, i, :5] = (cx, cy, w, h, obj)
        for c, p in cls.items():
            out[0, i, 5 + c] = p
    return out


def e2e_tensor(rows: list[tuple], extra: int, n: int = 300) -> np.ndarray:
    """[1, N, 6 + E]: rows (x1, y1, x2, y2, score, class, the E task values), the rest zeros."""
    out = np.zeros((1, n, 6 + extra), np.float32)
    for i, (*head, values) in enumerate(rows):
        out[0, i, :6] = head
        out[0, i, 6:] = values
    return out


def check_types(decoded: Decoded, k: int | None = None) -> None:
    xyxy, scores, class_ids, _ = decoded
    assert xyxy.dtype == np.float32 and xyxy.ndim == 2 and xyxy.shape[1] == 4, xyxy.shape
    assert scores.dtype == np.float32 and scores.shape == (len(xyxy),)
    assert class_ids.dtype == np.int32 and class_ids.shape == (len(xyxy),)
    if k is not None:
        assert len(xyxy) == k, f"expected {k} detections, got {len(xyxy)}"
    assert np.all(np.diff(scores) <= 0), "detections must be best score first"
