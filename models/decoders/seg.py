"""Instance-segmentation exports: each detection's mask coefficients after its box, score
and class, and a second output of mask prototypes ``[B, M, H/4, W/4]``; a detection's mask
is its M coefficients times the prototypes (``pipelines.tasks.masks``), cut to its box.

``yolov8_seg``: YOLOv8/YOLO11 ``-seg``, ``[B, 4 + C + M, A]``, NMS here.
``end2end_seg``: YOLO26 ``-seg`` (and ``nms=True`` exports), ``[B, N, 6 + M]``.

Decoding gives the boxes and the coefficients (``extra``); the masks are made later, for the
published detections only, by the segmentation task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams, Shape, need
from edge_agent.models.decoders.heads import (
    TaskHead,
    check_extra,
    classic_with_values,
    end_to_end_with_values,
)
from edge_agent.models.decoders.recognition import Seen, Tensor

#: Ultralytics' name of the prototypes' output, the manifest's default for ``output.protos``.
PROTOS = "output1"


@dataclass(frozen=True)
class _Seg(TaskHead):
    task: ClassVar[str] = "segment"
    what: ClassVar[str] = "mask coefficients"
    roles: ClassVar[tuple[str, ...]] = ("predictions", "protos")

    def output_names(self, name: str, named: Mapping[str, str]) -> tuple[str, ...]:
        return (name, named.get("protos", PROTOS))

    def output_section(self, outputs: tuple[str, ...]) -> tuple[str, dict[str, str]]:
        return outputs[0], {"protos": outputs[1]}

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> _Seg:
        pred, protos = shapes
        classes, extra = self.fit_head(pred, n_labels)
        need(len(protos) == 4, "4 axes (the mask prototypes [B, M, H, W])", 1)
        # The prototypes' size may be dynamic (a dynamic=True export): it is read per frame.
        need(protos[1] is not None, "a fixed prototype count M on axis 1", 1)
        check_extra(extra, int(protos[1]), "mask coefficients (the prototypes' count)")  # type: ignore[arg-type]
        return dataclasses.replace(self, classes=classes, extra=extra)

    def expected_extra(self, seen: Seen) -> int | None:
        protos = self._protos(seen)
        return protos.shape[1] if protos is not None else None

    def read_outputs(self, seen: Seen, pred: Tensor) -> tuple[str, ...]:
        protos = self._protos(seen)
        return (pred.name, protos.name) if protos is not None else ()

    @staticmethod
    def _protos(seen: Seen) -> Tensor | None:
        return next((t for t in seen.outputs if len(t.shape) == 4), None)

    def describe(self) -> str:
        return f"{self.extra} mask coefficients, prototypes from the second output"


@dataclass(frozen=True)
class YoloV8Seg(_Seg):
    """Rows cx, cy, w, h, C class scores, M mask coefficients; one column per anchor."""

    name: ClassVar[str] = "yolov8_seg"
    layout: ClassVar[str] = "[B, 4+C+M, N] + [B, M, H/4, W/4]"
    nms_in_model: ClassVar[bool] = False

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        return classic_with_values(outputs[0], self.classes, p)


@dataclass(frozen=True)
class End2EndSeg(_Seg):
    """Rows x1, y1, x2, y2, score, class id, M mask coefficients."""

    name: ClassVar[str] = "end2end_seg"
    layout: ClassVar[str] = "[B, N, 6+M] + [B, M, H/4, W/4]"
    nms_in_model: ClassVar[bool] = True
    end_to_end: ClassVar[bool] = True

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        return end_to_end_with_values(outputs[0], p)


DECODERS = (YoloV8Seg(), End2EndSeg())  # the registry collects them by their names
