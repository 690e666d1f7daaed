"""Pose exports: each detection's keypoints, K of them with D values each (x, y in input
pixels, and a confidence when D is 3), after the box, score and class.

``yolov8_pose``: YOLOv8/YOLO11 ``-pose``, ``[B, 4 + C + K*D, A]``, NMS here.
``end2end_pose``: YOLO26 ``-pose`` (and ``nms=True`` exports), ``[B, N, 6 + K*D]``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams, OutputMismatch, Shape
from edge_agent.models.decoders.heads import TaskHead, classic_with_values, end_to_end_with_values, single
from edge_agent.models.decoders.recognition import Seen


def kpt_shape_of(value: Any) -> tuple[int, int] | None:
    """Ultralytics' metadata ``kpt_shape`` (keypoints, values per keypoint) when it is two
    integers; None otherwise (absent, or not what Ultralytics writes)."""
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(type(v) is int for v in value):
        return value[0], value[1]
    return None


@dataclass(frozen=True)
class _Pose(TaskHead):
    task: ClassVar[str] = "pose"
    what: ClassVar[str] = "keypoint values"
    keypoints: int = 0
    dims: int = 3  # values per keypoint: x, y(, confidence)

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> _Pose:
        classes, extra = self.fit_head(single(shapes), n_labels)
        # Without the manifest's kpt_shape: 3 values per keypoint (x, y, visibility: every
        # Ultralytics pose dataset but the 2-value ones) when they divide, else 2.
        dims = 3 if extra % 3 == 0 else 2
        if extra % dims:
            raise OutputMismatch(f"a whole number of keypoints (x, y[, conf]) after the {n_labels} labels")
        return dataclasses.replace(self, classes=classes, extra=extra, keypoints=extra // dims, dims=dims)

    def refine(self, output: Any) -> _Pose:
        shape = tuple(getattr(output, "kpt_shape", ()) or ())
        if not shape:
            return self
        k, d = shape
        if k * d != self.extra:
            raise OutputMismatch(f"kpt_shape {list(shape)}: {k * d} keypoint values, not {self.extra}")
        return dataclasses.replace(self, keypoints=k, dims=d)

    def expected_extra(self, seen: Seen) -> int | None:
        shape = kpt_shape_of(seen.meta("kpt_shape"))
        return shape[0] * shape[1] if shape else None

    def describe(self) -> str:
        return f"{self.keypoints} keypoints x {self.dims} values"


@dataclass(frozen=True)
class YoloV8Pose(_Pose):
    """Rows cx, cy, w, h, C class scores, K*D keypoint values; one column per anchor."""

    name: ClassVar[str] = "yolov8_pose"
    layout: ClassVar[str] = "[B, 4+C+K*D, N]"
    nms_in_model: ClassVar[bool] = False

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        return classic_with_values(outputs[0], self.classes, p)


@dataclass(frozen=True)
class End2EndPose(_Pose):
    """Rows x1, y1, x2, y2, score, class id, K*D keypoint values."""

    name: ClassVar[str] = "end2end_pose"
    layout: ClassVar[str] = "[B, N, 6+K*D]"
    nms_in_model: ClassVar[bool] = True
    end_to_end: ClassVar[bool] = True

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        return end_to_end_with_values(outputs[0], p)


DECODERS = (YoloV8Pose(), End2EndPose())  # the registry collects them by their names
