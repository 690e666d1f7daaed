"""YOLOv8 and YOLO11 (and v9, v12) exports: ``[B, 4+C, N]``, NMS here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders import kernels
from edge_agent.models.decoders.base import Decoded, DecodeParams, Decoder, Shape, need, unbatched
from edge_agent.models.decoders.nms import keep_best
from edge_agent.models.decoders.recognition import (
    BY_ANCHORS,
    BY_LABELS,
    Guess,
    Seen,
    rows_and_columns,
    shape_rule,
)


@dataclass(frozen=True)
class YoloV8(Decoder):
    """Rows cx, cy, w, h (input pixels) then C class scores (already sigmoid), one column
    per anchor: ``(4 + C, N)`` or ``(1, 4 + C, N)``."""

    name: ClassVar[str] = "yolov8"
    layout: ClassVar[str] = "[B, 4+C, N]"
    nms_in_model: ClassVar[bool] = False

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> YoloV8:
        (shape,) = shapes
        need(len(shape) == 3, "3 axes")
        need(shape[1] in (None, 4 + n_labels), f"{4 + n_labels} on axis 1")
        return self

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        out, n = seen.outputs[0], seen.n_labels
        axes = rows_and_columns(out)
        if axes is None:
            return
        a, b = axes
        if b in seen.anchors() and a is not None and a > 4 and (n == 0 or a == 4 + n):
            why = f"{b} = the anchors of a YOLOv8-style head {seen.at} on axis 2"
            yield Guess(BY_ANCHORS, shape_rule(a, b, why), (out.name,))
        if n and a == 4 + n:
            yield Guess(BY_LABELS, shape_rule(a, b, f"axis 1 = 4 + {n} labels"), (out.name,))

    def class_count(self, shape: Shape) -> int:
        return int(shape[1] or 0) - 4

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        out = unbatched(outputs[0])
        fast = kernels.classic(out, 4, out.shape[0], p)
        if fast is not None:
            return fast[0]
        best = out[4:].max(axis=0)
        idx = np.flatnonzero(best > p.score_threshold)
        cand = out[:, idx].T  # one gather of the few candidates: (K, 4 + C)
        return keep_best(cand[:, :4], best[idx], cand[:, 4:].argmax(axis=1), p)


DECODER = YoloV8()  # the registry collects it by this name
