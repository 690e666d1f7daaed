"""The interface every task implements, and the task of a loaded model.

A task takes over where the decoder stops: each detection's task values (``Decoded.extra``,
model-input pixels) are copied into the frame slot's ``det_extra``; ``to_source`` maps them
to source pixels (and may drop detections, as segmentation drops those whose mask is
empty); the message builder writes them with ``json_format``/``json_rows`` (one ``%``
operation per message, as the boxes) or ``fields`` (msgpack, tools). ``registry.task_for``
gives a loaded model's task. This module declares plain detection as its ``TASK``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

if TYPE_CHECKING:
    from edge_agent.models.decoders.base import BoundDecoder, DecodeParams


class Task:
    """Plain detection: nothing beyond the box. The other tasks subclass it."""

    #: The decoders' ``Decoder.task`` it serves (the registry's name for it).
    name: ClassVar[str] = "detect"

    #: Values per detection kept in the slot (``FrameSlot.det_extra``).
    width: int = 0
    #: Whether its detections carry masks (``FrameSlot.det_masks``).
    masks: bool = False
    #: The ``%`` format of one detection's task values, appended inside its JSON object
    #: ("" for none); ``json_rows`` gives its values. Plain attributes, not methods: the
    #: message builder reads them for every frame.
    json_format: str = ""

    @classmethod
    def build(cls, decoder: BoundDecoder, params: DecodeParams, masks: str, mask_points: int) -> Task:
        """The task of a model whose outputs ``decoder`` reads, decoded with ``params``;
        ``masks`` and ``mask_points`` (``model.masks``, ``model.mask_points``): how a
        segmentation model's masks are published. A task that needs none of these takes
        no argument."""
        return cls()

    def to_source(self, slot: Any, n: int) -> int:
        """Map the slot's first ``n`` detections' task values to source pixels, in place;
        called while ``det_xyxy`` is still in model-input pixels. Returns how many
        detections are kept (at the front of the slot's arrays)."""
        return n

    def json_rows(self, slot: Any, n: int) -> list[list[Any]]:
        """The values ``json_format`` takes, for each of the slot's first ``n`` detections
        (made once per message)."""
        return []

    def fields(self, slot: Any, i: int) -> dict[str, Any]:
        """Detection ``i``'s task values as objects (msgpack, tools)."""
        return {}


DETECT = Task()

TASK = Task  # plain detection (``registry``)


def task_of(slot: Any) -> Task:
    """The task of the model the slot's frame ran on: its profile's (plain detection for a
    slot of none, as tools and tests make them)."""
    task = getattr(getattr(getattr(slot, "profile", None), "model", None), "task", None)
    return task if task is not None else DETECT


def compact(slot: Any, keep: np.ndarray, n: int, masks: bool = False) -> int:
    """Move the detections ``keep`` (ascending indices below ``n``) to the front of the
    slot's arrays (``masks``: its masks too); returns their count."""
    k = len(keep)
    if k == n:
        return n
    for arr in (slot.det_xyxy, slot.det_score, slot.det_class, slot.det_extra):
        arr[:k] = arr[keep]
    if masks and slot.det_masks:
        slot.det_masks[:k] = [slot.det_masks[i] for i in keep.tolist()]
    return k
