"""End-to-end exports, NMS in the model: ``[B, K, 6]`` rows x1, y1, x2, y2, score, class id.

YOLO26's and YOLOv10's one-to-one heads and Ultralytics' ``nms=True`` exports give it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders import kernels
from edge_agent.models.decoders.base import Decoded, DecodeParams, Decoder, Shape, need, unbatched
from edge_agent.models.decoders.nms import ranked
from edge_agent.models.decoders.recognition import (
    BY_METADATA,
    BY_ROWS,
    Guess,
    Seen,
    is_true,
    rows_and_columns,
    shape_rule,
)


@dataclass(frozen=True)
class End2End(Decoder):
    """Rows x1, y1, x2, y2 (input pixels), score, class id: ``(K, 6)`` or ``(1, K, 6)``.
    NMS ran in the model, so none runs here (an end-to-end head may list one box under two
    classes, as Ultralytics shows it too). Unused rows score 0."""

    name: ClassVar[str] = "end2end"
    layout: ClassVar[str] = "[B, K, 6]"
    nms_in_model: ClassVar[bool] = True

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> End2End:
        (shape,) = shapes
        need(len(shape) == 3, "3 axes")
        need(shape[2] == 6, "6 on axis 2 (x1, y1, x2, y2, score, class id)")
        return self

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        out, n = seen.outputs[0], seen.n_labels
        fits = len(out.shape) == 3 and out.shape[2] in (None, 6)
        args = seen.meta("args")
        # After RT-DETR's metadata rule (an RT-DETR head is end-to-end too).
        if is_true(seen.meta("end2end")):
            yield Guess(BY_METADATA + 1, "metadata end2end=True (an end-to-end head)", (out.name,), fits)
        elif isinstance(args, dict) and is_true(args.get("nms")):
            yield Guess(BY_METADATA + 1, "metadata args nms=True (NMS in the graph)", (out.name,), fits)
        axes = rows_and_columns(out)
        if axes is None:
            return
        a, b = axes
        anchors = seen.anchors()
        anchors |= {3 * c for c in anchors}
        if b == 6 and a not in anchors and not (a is None and n == 1):  # [?, 6]: a 1-class YOLOv5 too
            k = "K" if a is None else a
            why = f"{k} rows of 6 (x1, y1, x2, y2, score, class), not an anchor count {seen.at}"
            yield Guess(BY_ROWS, shape_rule(a, b, why), (out.name,))

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        out = unbatched(outputs[0])
        fast = kernels.ranked(out, p)
        if fast is not None:
            return fast[0]
        return ranked(out[:, :4], out[:, 4], out[:, 5], p)


DECODER = End2End()  # the registry collects it by this name
