"""TensorRT's ``EfficientNMS_TRT`` plugin's four outputs (the usual Jetson export), NMS in
the model; the same four computed by ordinary ONNX operators run anywhere."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams, Decoder, Shape, need
from edge_agent.models.decoders.nms import ranked
from edge_agent.models.decoders.recognition import BY_NAME, BY_OUTPUTS, Guess, Seen, Tensor

#: The plugin's outputs, as its documentation names them (the manifest's defaults).
NMS_OUTPUTS = ("num_dets", "det_boxes", "det_scores", "det_classes")


@dataclass(frozen=True)
class EfficientNms(Decoder):
    """``num_dets`` (1,) or (1, 1) int32, ``det_boxes`` (K, 4) xyxy input pixels,
    ``det_scores`` (K,), ``det_classes`` (K,) int32, each with or without its batch axis
    of 1. Rows past ``num_dets`` are padding."""

    name: ClassVar[str] = "efficient_nms"
    layout: ClassVar[str] = "(num_dets [B, 1], det_boxes [B, K, 4], det_scores [B, K], det_classes [B, K])"
    nms_in_model: ClassVar[bool] = True
    roles: ClassVar[tuple[str, ...]] = ("num_dets", "boxes", "scores", "classes")

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> EfficientNms:
        num, boxes, scores, classes = shapes
        need(len(num) in (1, 2) and num[-1] in (1, None), "[B, 1]", 0)
        need(len(boxes) == 3 and boxes[2] == 4, "[B, K, 4]", 1)
        need(len(scores) == 2 and scores[1] == boxes[1], f"[B, {boxes[1]}] (K of det_boxes)", 2)
        need(len(classes) == 2 and classes[1] == boxes[1], f"[B, {boxes[1]}] (K of det_boxes)", 3)
        return self

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        if set(NMS_OUTPUTS) <= {t.name for t in seen.outputs}:
            yield Guess(BY_NAME, "outputs named like TensorRT's EfficientNMS", NMS_OUTPUTS)
        shaped = _nms_shaped(seen.outputs)
        if shaped:
            yield Guess(BY_OUTPUTS, "four outputs shaped like TensorRT's EfficientNMS", shaped)

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        num_dets, boxes, scores, classes = outputs
        n = int(np.asarray(num_dets).reshape(-1)[0])
        boxes = boxes[0] if boxes.ndim == 3 else boxes
        scores = scores[0] if scores.ndim == 2 else scores
        classes = classes[0] if classes.ndim == 2 else classes
        n = max(0, min(n, len(scores)))
        return ranked(boxes[:n], scores[:n], classes[:n], p)


def _nms_shaped(outs: tuple[Tensor, ...]) -> tuple[str, ...]:
    """The four outputs in EfficientNMS order when their ranks and types fit it, else ()."""
    ints = [t for t in outs if t.dtype in ("int32", "int64")]
    floats = [t for t in outs if t.dtype.startswith("float")]
    num = [t for t in ints if len(t.shape) in (1, 2) and t.shape[-1] in (1, None)]
    cls = [t for t in ints if len(t.shape) == 2 and t not in num[:1]]
    boxes = [t for t in floats if len(t.shape) == 3 and t.shape[-1] == 4]
    scores = [t for t in floats if len(t.shape) == 2]
    if len(outs) != 4 or not (num and cls and len(boxes) == 1 and len(scores) == 1):
        return ()
    return (num[0].name, boxes[0].name, scores[0].name, cls[0].name)


DECODER = EfficientNms()  # the registry collects it by this name
