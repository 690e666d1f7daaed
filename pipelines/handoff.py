"""Frame slots: every frame in flight occupies one preallocated ``FrameSlot`` (model input
and output buffers, detections, stamps), taken from its lane's ``SlotPool`` and given
back once the frame has ended.

In front of inference each source has a cell of capacity one in the batch scheduler
(``scheduler.py``): the capture thread fills one slot while inference works on the
previous one, which is the double buffer of that boundary. A batch's frames go on to
postprocessing through the post stage's inbox (``post_stage.FrameQueue``).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from edge_agent.core.stages import N_STAMPS
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.preprocess import Letterbox
from edge_agent.pipelines.source_base import SourceFrame


class FrameSlot:
    """All per-frame state, allocated once and reused for the agent's lifetime."""

    __slots__ = (
        "batch",
        "det_class",
        "det_count",
        "det_score",
        "det_xyxy",
        "expected_ns",
        "frame",
        "frame_id",
        "geo",
        "gt",
        "gt_count",
        "index",
        "io",
        "lane",
        "pool",
        "profile",
        "source",
        "stamps",
        "tensor",
    )

    def __init__(
        self, index: int, io: IOSet, input_name: str, max_det: int, max_gt: int, profile: Any = None
    ) -> None:
        self.index = index
        self.profile = profile  # the model profile whose buffers these are
        self.pool: SlotPool | None = None  # where the slot goes back after publishing
        self.lane = 0  # index of the source (pipeline lane) whose frame it holds
        self.batch = 1  # frames in the batch it was inferred in
        self.io = io
        self.tensor = io.inputs[input_name]
        self.geo = Letterbox()
        self.stamps = np.zeros(N_STAMPS, np.int64)
        self.source = ""
        self.frame: SourceFrame | None = None  # the source's frame read into it, until its next read
        self.frame_id = -1
        # The inference time expected for the batch it runs in (the scheduler's estimate
        # when it formed the batch; 0: none), which admission judges it by.
        self.expected_ns = 0.0
        self.gt = np.zeros((max_gt, 6), np.float32)
        self.gt_count = 0
        self.det_xyxy = np.zeros((max_det, 4), np.float32)
        self.det_score = np.zeros(max_det, np.float32)
        self.det_class = np.zeros(max_det, np.int32)
        self.det_count = 0


class SlotPool:
    """Free slots; ``acquire`` waits until one is given back."""

    def __init__(self, slots: list[FrameSlot]) -> None:
        self.slots = slots
        for s in slots:
            s.pool = self
        self._free = list(slots)
        self._cond = threading.Condition()

    def acquire(self, timeout_s: float) -> FrameSlot | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._free, timeout_s):
                return None
            return self._free.pop()

    def release(self, slot: FrameSlot) -> None:
        with self._cond:
            self._free.append(slot)
            self._cond.notify()

    def free_count(self) -> int:
        with self._cond:
            return len(self._free)


class Closed(Exception):
    """The producer side closed the hand-off and nothing is left in it."""
