"""A loaded model's task, from the task its decoder reads (``Decoder.task``): each task
listed here explicitly, built with what it needs."""

from __future__ import annotations

from edge_agent.models.decoders.base import BoundDecoder, DecodeParams
from edge_agent.pipelines.tasks.base import Task
from edge_agent.pipelines.tasks.obb import ObbTask
from edge_agent.pipelines.tasks.pose import PoseTask
from edge_agent.pipelines.tasks.segment import SegmentTask


def task_for(
    decoder: BoundDecoder, params: DecodeParams, masks: str = "polygon", mask_points: int = 64
) -> Task:
    """The task of a model whose outputs ``decoder`` reads. ``masks`` and ``mask_points``
    (``model.masks``, ``model.mask_points``): how segmentation masks are published."""
    kind = decoder.decoder.task
    if kind == "pose":
        return PoseTask(decoder.decoder)
    if kind == "obb":
        return ObbTask()
    if kind == "segment":
        return SegmentTask(decoder, params, masks, mask_points)
    return Task()
