"""Oriented-box exports: each detection's box is a centre, a size and an angle (radians).

``yolov8_obb``: YOLOv8/YOLO11 ``-obb``, ``[B, 4 + C + 1, A]`` (cx, cy, w, h, C class
scores, the angle), rotated NMS here by Ultralytics' rule (``rotated.rotated_nms``).
``end2end_obb``: YOLO26 ``-obb``, ``[B, N, 7]``: cx, cy, w, h, score, class id, angle.

The decoded ``xyxy`` are the axis-aligned bounds of the rotated boxes (what a consumer of
plain boxes, the tracker and the zones read); ``extra`` holds cx, cy, w, h, angle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams, Shape, unbatched
from edge_agent.models.decoders.heads import TaskHead, check_extra, classic_candidates, single
from edge_agent.models.decoders.nms import top_rows
from edge_agent.models.decoders.recognition import Seen
from edge_agent.models.decoders.rotated import bounds, keep_best_rotated

#: An end-to-end row's rotated box: centre, size, then the angle (after score and class).
_XYWHR = [0, 1, 2, 3, 6]


@dataclass(frozen=True)
class _Obb(TaskHead):
    task: ClassVar[str] = "obb"
    what: ClassVar[str] = "angle"

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> _Obb:
        classes, extra = self.fit_head(single(shapes), n_labels)
        where = "after score and class" if self.end_to_end else "after the class scores"
        check_extra(extra, 1, f"angle value {where}")
        return dataclasses.replace(self, classes=classes, extra=5)

    def expected_extra(self, seen: Seen) -> int | None:
        return 1


@dataclass(frozen=True)
class YoloV8Obb(_Obb):
    """Rows cx, cy, w, h, C class scores, angle; one column per anchor."""

    name: ClassVar[str] = "yolov8_obb"
    layout: ClassVar[str] = "[B, 4+C+1, N]"
    nms_in_model: ClassVar[bool] = False

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        cand, best, cls = classic_candidates(unbatched(outputs[0]), self.classes, p.score_threshold)
        xywhr = np.concatenate((cand[:, :4], cand[:, -1:]), axis=1)
        return keep_best_rotated(xywhr, best, cls, p)


@dataclass(frozen=True)
class End2EndObb(_Obb):
    """Rows cx, cy, w, h, score, class id, angle."""

    name: ClassVar[str] = "end2end_obb"
    layout: ClassVar[str] = "[B, N, 7]"
    nms_in_model: ClassVar[bool] = True
    end_to_end: ClassVar[bool] = True

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        out = unbatched(outputs[0])
        idx = top_rows(out[:, 4], p)
        xywhr = np.ascontiguousarray(out[idx][:, _XYWHR], np.float32)
        return Decoded(bounds(xywhr), out[idx, 4].astype(np.float32), out[idx, 5].astype(np.int32), xywhr)


DECODERS = (YoloV8Obb(), End2EndObb())  # the registry collects them by their names
