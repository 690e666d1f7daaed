"""Ultralytics RT-DETR exports: normalised centre boxes, no NMS (its queries do not overlap
by construction), the frame stretched to the input rather than letterboxed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams, Decoder, Shape, need, unbatched
from edge_agent.models.decoders.nms import ranked
from edge_agent.models.decoders.recognition import BY_METADATA, Guess, Seen


@dataclass(frozen=True)
class RtDetr(Decoder):
    """Boxes cx, cy, w, h normalised to 0..1, then either C class scores (after a sigmoid),
    ``(K, 4 + C)``, or, with ``topk``, the top-k already taken in the graph, ``(K, 6)`` =
    box, score, class id (Ultralytics 8.4); each with or without its batch axis of 1.
    ``DecodeParams.input_w/h`` scale the boxes to input pixels."""

    name: ClassVar[str] = "rtdetr"
    layout: ClassVar[str] = "[B, K, 4+C] or [B, K, 6]"
    nms_in_model: ClassVar[bool] = True
    resize: ClassVar[str] = "stretch"
    resize_why: ClassVar[str] = "Ultralytics trains and runs RT-DETR on stretched frames"

    topk: bool = False  # rows of (box, score, class id): top-k already in the graph

    def fit(self, shapes: Sequence[Shape], n_labels: int) -> RtDetr:
        (shape,) = shapes
        need(len(shape) == 3, "3 axes")
        n = n_labels
        need(shape[2] in (6, 4 + n), f"{4 + n} on axis 2 (box, class scores) or 6 (box, score, class id)")
        # Ultralytics 8.4 exports the top-k rows; older ones per-class scores. With two
        # labels both are 6 wide: the current export is meant.
        return RtDetr(topk=shape[2] == 6)

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        if seen.meta("head") != "RTDETRDecoder":
            return
        out, n = seen.outputs[0], seen.n_labels
        last = out.shape[2] if len(out.shape) == 3 else -1
        fits = last is None or last == 6 or (n > 0 and last == 4 + n) or (n == 0 and last > 4)
        yield Guess(BY_METADATA, "metadata head=RTDETRDecoder (RT-DETR)", (out.name,), fits)

    def class_count(self, shape: Shape) -> int:
        return int(shape[2]) - 4 if shape[2] not in (None, 6) else 0  # the older per-class layout

    def describe(self) -> str:
        return "top-k rows (box, score, class id)" if self.topk else "box + per-class scores"

    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        out = unbatched(outputs[0])
        if self.topk:
            scores, class_ids = out[:, 4], out[:, 5]
        else:
            class_ids = out[:, 4:].argmax(axis=1)
            scores = out[np.arange(len(out)), 4 + class_ids]
        keep = np.flatnonzero(scores > p.score_threshold)
        box = out[keep, :4] * np.array([p.input_w, p.input_h, p.input_w, p.input_h], np.float32)
        half = box[:, 2:] * 0.5
        xyxy = np.empty_like(box)
        xyxy[:, :2] = box[:, :2] - half
        xyxy[:, 2:] = box[:, :2] + half
        return ranked(xyxy, scores[keep], class_ids[keep], p)


DECODER = RtDetr()  # the registry collects it by this name
