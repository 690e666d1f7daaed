"""Oriented boxes: each detection's centre, size and angle (radians) in source pixels,
and its four corners; its ``box_xyxy`` stays the axis-aligned bounds (clipped to the
frame), so a consumer of plain boxes, the tracker and the zones read it unchanged.

Mapped as Ultralytics maps them (``scale_boxes`` with ``xywh=True``): the letterbox
offset taken off the centre, centre and size divided by the scale, the angle kept, not
clipped.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from edge_agent.models.decoders.rotated import corners
from edge_agent.pipelines.tasks.base import Task

_FORMAT = (
    ',"obb":{"center":[%.1f,%.1f],"size":[%.1f,%.1f],"angle":%.4f,'
    '"corners":[[%.1f,%.1f],[%.1f,%.1f],[%.1f,%.1f],[%.1f,%.1f]]}'
)


class ObbTask(Task):
    name: ClassVar[str] = "obb"

    width = 13  # cx, cy, w, h, angle, then the corners' 8 coordinates
    json_format = _FORMAT

    def to_source(self, slot: Any, n: int) -> int:
        geo, e = slot.geo, slot.det_extra
        # A huge value can overflow here: the slot drops what is not finite afterwards.
        with np.errstate(over="ignore", invalid="ignore"):
            e[:n, 0] -= geo.pad_x
            e[:n, 1] -= geo.pad_y
            e[:n, 0:4:2] /= geo.scale_x
            e[:n, 1:4:2] /= geo.scale_y
            corners(e[:n, :5], out=e[:n, 5:13].reshape(n, 4, 2))
        return n

    def json_rows(self, slot: Any, n: int) -> list[list[Any]]:
        return slot.det_extra[:n, :13].tolist()

    def fields(self, slot: Any, i: int) -> dict[str, Any]:
        v = slot.det_extra[i, :13].tolist()
        return {
            "obb": {
                "center": [round(v[0], 1), round(v[1], 1)],
                "size": [round(v[2], 1), round(v[3], 1)],
                "angle": round(v[4], 4),
                "corners": [[round(v[j], 1), round(v[j + 1], 1)] for j in range(5, 13, 2)],
            }
        }


TASK = ObbTask  # (``registry``)
