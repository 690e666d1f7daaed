"""Instance segmentation: each published detection's mask, as polygons (default) or COCO
RLE in source pixels (``model.masks``), never a full bitmap.

The masks are made in the post stage for the detections that will be published (after
NMS and ``max_detections``), one box at a time (``masks``). As Ultralytics' predict does, a
detection whose mask is empty is dropped. With ``model.masks: none`` no mask is made and
every detection is kept, published as a box.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar

import numpy as np

from edge_agent.models.decoders.base import BoundDecoder, DecodeParams
from edge_agent.pipelines.tasks import masks as m
from edge_agent.pipelines.tasks.base import Task, compact

#: The most runs a mask's RLE may have (a smooth mask across a 4K frame has about 8,000);
#: a mask of more is published as polygons.
MAX_RLE_RUNS = 20_000


class SegmentTask(Task):
    name: ClassVar[str] = "segment"

    @classmethod
    def build(cls, decoder: BoundDecoder, params: DecodeParams, masks: str, mask_points: int) -> Task:
        return cls(decoder, params, masks, mask_points)

    def __init__(self, decoder: BoundDecoder, params: DecodeParams, form: str, max_points: int) -> None:
        self.form = form  # polygon | rle | none
        self.max_points = max_points
        self.protos_output = decoder.outputs[1]  # where the prototypes are in the model's outputs
        self.input_hw = (params.input_h, params.input_w)
        self.width = decoder.decoder.extra_width()  # the mask coefficients
        self.masks = form != "none"
        self.json_format = ',"mask":%s' if self.masks else ""

    def to_source(self, slot: Any, n: int) -> int:
        """Each detection's mask, and its published form (polygons or RLE, as objects and as
        JSON) made here, in the post stage's time, so the message's latencies count it."""
        if self.form == "none":
            return n
        protos = slot.io.outputs[self.protos_output][0]
        keep = []
        for i in range(n):
            found = m.input_mask(slot.det_extra[i, : self.width], protos, slot.det_xyxy[i], self.input_hw)
            if found is not None:
                # RLE needs the frame-sized mask; polygons are outlined at the input's
                # resolution and their points mapped, as Ultralytics' masks.xy are.
                mask = (
                    m.source_mask(found, slot.geo) if self.form == "rle" else m.input_space(found, slot.geo)
                )
                shape = self._published(mask, slot.geo.src_h, slot.geo.src_w)
                slot.det_masks[len(keep)] = replace(
                    mask, shape=shape, text=json.dumps(shape, separators=(",", ":"))
                )
                keep.append(i)
        return compact(slot, np.asarray(keep, np.int64), n)

    def _published(self, mask: m.Mask, h: int, w: int) -> dict[str, Any]:
        if self.form == "rle":
            counts = m.rle(mask, h, w)
            # A smooth mask has about two runs per column it spans; a hostile model's
            # checkerboard would have one per pixel, megabytes per message: outlined instead.
            if len(counts) <= MAX_RLE_RUNS:
                return {"rle": {"size": [h, w], "counts": counts.tolist()}}
        outlines = m.polygons(mask, self.max_points, (w, h))
        return {
            "polygons": [np.round(p, 1).tolist() if p.dtype.kind == "f" else p.tolist() for p in outlines]
        }

    def json_rows(self, slot: Any, n: int) -> list[list[Any]]:
        return [
            [mask.text or json.dumps(self._shape(slot, mask), separators=(",", ":"))]
            for mask in slot.det_masks[:n]
        ]

    def fields(self, slot: Any, i: int) -> dict[str, Any]:
        return {} if self.form == "none" else {"mask": self._shape(slot, slot.det_masks[i])}

    def _shape(self, slot: Any, mask: m.Mask) -> dict[str, Any]:
        """Its published form: made by ``to_source``; made now for a mask put in the slot
        otherwise (tools, tests)."""
        return mask.shape if mask.shape is not None else self._published(mask, slot.geo.src_h, slot.geo.src_w)


TASK = SegmentTask  # (``registry``)
