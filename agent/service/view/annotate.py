"""Drawing a frame's detections and figures on it, with OpenCV, in place on the caller's
copy: boxes in one colour per class, label and score (and track id, with a trail of the
track's recent centres), and a corner stamp with the frame id, the end-to-end latency and
whether the deadline was missed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import cv2
import numpy as np

from edge_agent.pipelines.view_tap import ViewFrame

#: BGR, one per class id (cycled): saturated and far apart, readable on most scenes.
PALETTE = (
    (56, 56, 255),
    (151, 157, 255),
    (31, 112, 255),
    (29, 178, 255),
    (49, 210, 207),
    (10, 249, 72),
    (23, 204, 146),
    (134, 219, 61),
    (211, 188, 0),
    (255, 115, 100),
    (236, 24, 0),
    (255, 56, 132),
)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def colour(class_id: int) -> tuple[int, int, int]:
    return PALETTE[class_id % len(PALETTE)]


def annotate(
    image: np.ndarray,
    f: ViewFrame,
    scale: float = 1.0,
    trails: Mapping[int, Sequence[tuple[float, float]]] | None = None,
) -> np.ndarray:
    """Draw ``f``'s detections (source pixels, times ``scale`` for a resized image) and its
    stamp on ``image``; returns it. ``trails``: by track id, its recent centres (source
    pixels), drawn under the boxes. No label sits under the stamp (see ``_label_top``)."""
    thick = max(1, round(2 * max(image.shape[:2]) / 960))
    for i in range(f.det_count if trails else 0):
        points = trails.get(int(f.det_track[i]))
        if points is not None and len(points) > 1:
            line = np.round(np.asarray(points, np.float64) * scale).astype(np.int32)
            cv2.polylines(image, [line], False, colour(int(f.det_class[i])), thick)
    stamp = f"frame {f.frame_id}  e2e {f.e2e_ms:.1f} ms" + ("  MISSED" if f.missed else "")
    (sw, sh), sbase = cv2.getTextSize(stamp, _FONT, 0.55, 1)
    stamp_box = (0, 0, sw + 10, sh + sbase + 8)  # x1, y1, x2, y2 (inclusive, as cv2.rectangle fills)
    for i in range(f.det_count):
        cls = int(f.det_class[i])
        x1, y1, x2, y2 = (round(float(v) * scale) for v in f.det_xyxy[i])
        c = colour(cls)
        cv2.rectangle(image, (x1, y1), (x2, y2), c, thick)
        label = f.labels[cls] if 0 <= cls < len(f.labels) else str(cls)
        track = int(f.det_track[i])
        text = f"{label} #{track} {f.det_score[i]:.2f}" if track > 0 else f"{label} {f.det_score[i]:.2f}"
        (tw, th), base = cv2.getTextSize(text, _FONT, 0.5, 1)
        w, h = tw + 4, th + base + 2
        left = max(0, min(x1, image.shape[1] - w))  # a box at the right edge keeps its label whole
        top = _label_top(left, max(0, y1 - h), w, h, stamp_box)
        cv2.rectangle(image, (left, top), (left + w, top + h), c, -1)
        cv2.putText(image, text, (left + 2, top + th + 1), _FONT, 0.5, (255, 255, 255), 1, cv2.LINE_AA)
    cv2.rectangle(image, stamp_box[:2], (stamp_box[2], stamp_box[3]), (0, 0, 0), -1)
    ink = (0, 0, 255) if f.missed else (255, 255, 255)
    cv2.putText(image, stamp, (5, sh + 4), _FONT, 0.55, ink, 1, cv2.LINE_AA)
    return image


def _label_top(left: int, top: int, w: int, h: int, stamp: tuple[int, int, int, int]) -> int:
    """The label's top edge: above its box as usual, but just below the stamp when it would
    sit under it (a box at the top-left corner), since the stamp is drawn last, over it."""
    sx1, sy1, sx2, sy2 = stamp
    if left <= sx2 and left + w >= sx1 and top <= sy2 and top + h >= sy1:
        return sy2 + 1
    return top
