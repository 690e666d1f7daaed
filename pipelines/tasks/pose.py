"""Pose: each detection's keypoints, ``[x, y, conf]`` in source pixels (``[x, y]`` for a
model without keypoint confidences), as Ultralytics maps them (``scale_coords``: the
letterbox undone, then clipped to the frame)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from edge_agent.pipelines.tasks.base import Task

if TYPE_CHECKING:
    from edge_agent.models.decoders.base import BoundDecoder, DecodeParams


class PoseTask(Task):
    name: ClassVar[str] = "pose"

    @classmethod
    def build(cls, decoder: BoundDecoder, params: DecodeParams, masks: str, mask_points: int) -> Task:
        return cls(decoder.decoder)

    def __init__(self, decoder: Any) -> None:
        """``decoder``: the pose decoder, for the keypoints per detection and their values
        (2: x, y; 3: with their confidence)."""
        self.keypoints = decoder.keypoints
        self.dims = decoder.dims
        self.width = self.keypoints * self.dims
        one = "[%.1f,%.1f,%.3f]" if self.dims == 3 else "[%.1f,%.1f]"
        self.json_format = ',"keypoints":[' + ",".join([one] * self.keypoints) + "]"

    def to_source(self, slot: Any, n: int) -> int:
        geo = slot.geo
        k = slot.det_extra[:n].reshape(n, self.keypoints, self.dims)
        x, y = k[..., 0], k[..., 1]
        x -= geo.pad_x
        x /= geo.scale_x
        y -= geo.pad_y
        y /= geo.scale_y
        np.clip(x, 0, geo.src_w, out=x)
        np.clip(y, 0, geo.src_h, out=y)
        return n

    def json_rows(self, slot: Any, n: int) -> list[list[Any]]:
        return slot.det_extra[:n, : self.width].tolist()

    def fields(self, slot: Any, i: int) -> dict[str, Any]:
        k = slot.det_extra[i, : self.width].reshape(self.keypoints, self.dims)
        rounding = (1, 1, 3)[: self.dims]
        return {"keypoints": [[round(float(v), r) for v, r in zip(p, rounding)] for p in k.tolist()]}


TASK = PoseTask  # (``registry``)
