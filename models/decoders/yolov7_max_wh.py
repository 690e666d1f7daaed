"""YOLOv7 exports made with ``export.py --grid --end2end --max-wh N``: ONNX Runtime's own
NMS in the graph, one ``[N, 7]`` output of the rows it kept (without ``--max-wh`` the same
export gives TensorRT's EfficientNMS outputs: ``efficient_nms``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams, Decoder, Shape, need
from edge_agent.models.decoders.nms import ranked
from edge_agent.models.decoders.recognition import BY_ROWS, Guess, Seen


@dataclass(frozen=True)
class YoloV7MaxWh(Decoder):
    """Rows batch id, x1, y1, x2, y2 (input pixels), class id, score: ``(N, 7)``, N the
    detections NMS kept. The export's input has a batch of one, so every row is the
    frame's (batch id 0)."""

    name: ClassVar[str] = "yolov7_max_wh"
    layout: ClassVar[str] = "[N, 7]"
    nms_in_model: ClassVar[bool] = True

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> YoloV7MaxWh:
        (shape,) = shapes
        need(len(shape) == 2, "2 axes, [N, 7]")
        need(shape[1] == 7, "7 on axis 1 (batch id, x1, y1, x2, y2, class id, score)")
        return self

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        out = seen.outputs[0]
        if len(out.shape) == 2 and out.shape[1] == 7:
            n = "N" if out.shape[0] is None else out.shape[0]
            why = "rows of batch id, x1, y1, x2, y2, class id, score (YOLOv7's --end2end --max-wh export)"
            yield Guess(BY_ROWS, f"shape [{n}, 7]: {why}", (out.name,))

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        rows = outputs[0]
        return ranked(rows[:, 1:5], rows[:, 6], rows[:, 5], p)


DECODER = YoloV7MaxWh()  # the registry collects it by this name
