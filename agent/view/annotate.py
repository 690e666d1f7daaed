"""Drawing a frame's detections and figures on it, with OpenCV, in place on the caller's
copy: boxes in one colour per class, label and score, and a corner stamp with the frame
id, the end-to-end latency and whether the deadline was missed."""

from __future__ import annotations

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


def annotate(image: np.ndarray, f: ViewFrame, scale: float = 1.0) -> np.ndarray:
    """Draw ``f``'s detections (source pixels, times ``scale`` for a resized image) and its
    stamp on ``image``; returns it."""
    thick = max(1, round(2 * max(image.shape[:2]) / 960))
    for i in range(f.det_count):
        cls = int(f.det_class[i])
        x1, y1, x2, y2 = (round(float(v) * scale) for v in f.det_xyxy[i])
        c = colour(cls)
        cv2.rectangle(image, (x1, y1), (x2, y2), c, thick)
        label = f.labels[cls] if 0 <= cls < len(f.labels) else str(cls)
        text = f"{label} {f.det_score[i]:.2f}"
        (tw, th), base = cv2.getTextSize(text, _FONT, 0.5, 1)
        top = max(0, y1 - th - base - 2)
        cv2.rectangle(image, (x1, top), (x1 + tw + 4, top + th + base + 2), c, -1)
        cv2.putText(image, text, (x1 + 2, top + th + 1), _FONT, 0.5, (255, 255, 255), 1, cv2.LINE_AA)
    stamp = f"frame {f.frame_id}  e2e {f.e2e_ms:.1f} ms" + ("  MISSED" if f.missed else "")
    (tw, th), base = cv2.getTextSize(stamp, _FONT, 0.55, 1)
    cv2.rectangle(image, (0, 0), (tw + 10, th + base + 8), (0, 0, 0), -1)
    ink = (0, 0, 255) if f.missed else (255, 255, 255)
    cv2.putText(image, stamp, (5, th + 4), _FONT, 0.55, ink, 1, cv2.LINE_AA)
    return image
