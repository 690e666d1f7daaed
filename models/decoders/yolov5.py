"""YOLOv5 exports (its own repo's ``export.py``): ``[B, N, 5+C]``, NMS here."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

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
class YoloV5(Decoder):
    """Columns cx, cy, w, h (input pixels), objectness, then C class probabilities, one
    row per anchor: ``(N, 5 + C)`` or ``(1, N, 5 + C)``. A class's score is objectness ×
    probability, so anchors with objectness below the threshold are skipped before any
    multiplication."""

    name: ClassVar[str] = "yolov5"
    layout: ClassVar[str] = "[B, N, 5+C]"
    nms_in_model: ClassVar[bool] = False

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> YoloV5:
        (shape,) = shapes
        need(len(shape) == 3, "3 axes")
        need(shape[2] in (None, 5 + n_labels), f"{5 + n_labels} on axis 2")
        return self

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        out, n = seen.outputs[0], seen.n_labels
        axes = rows_and_columns(out)
        if axes is None:
            return
        a, b = axes
        anchors = {3 * c for c in seen.anchors()}  # three anchor boxes per cell
        if a in anchors and b is not None and b > 5 and (n == 0 or b == 5 + n):
            why = f"{a} = the anchors of a YOLOv5 head {seen.at} on axis 1"
            # After the YOLOv8 anchor rule, as the two were always tried.
            yield Guess(BY_ANCHORS + 1, shape_rule(a, b, why), (out.name,))
        if n and b == 5 + n:
            yield Guess(BY_LABELS + 1, shape_rule(a, b, f"axis 2 = 5 + {n} labels"), (out.name,))

    def class_count(self, shape: Shape) -> int:
        return int(shape[2] or 0) - 5

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        out = unbatched(outputs[0])
        idx = np.flatnonzero(out[:, 4] > p.score_threshold)
        rows = out[idx]
        conf = rows[:, 5:] * rows[:, 4:5]
        class_ids = conf.argmax(axis=1)
        scores = conf[np.arange(len(idx)), class_ids]
        ok = scores > p.score_threshold
        return keep_best(rows[ok, :4], scores[ok], class_ids[ok], p)


DECODER = YoloV5()  # the registry collects it by this name
