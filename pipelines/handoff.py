"""Frame slots and the hand-offs that move them between stage threads.

Every frame in flight occupies one preallocated ``FrameSlot`` (model input and output
buffers, detections, stamps), taken from a ``SlotPool`` and given back after publishing.
In front of inference each source has a cell of capacity one in the batch scheduler
(``scheduler.py``): the capture thread fills one slot while inference works on the
previous one, which is the double buffer of that boundary. A batch's frames go on to
postprocessing through a ``FrameQueue``.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from edge_agent.core.stages import N_STAMPS
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.preprocess import Letterbox


class FrameSlot:
    """All per-frame state, allocated once and reused for the agent's lifetime."""

    __slots__ = (
        "batch",
        "det_class",
        "det_count",
        "det_score",
        "det_xyxy",
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
        self.frame_id = -1
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


class FrameQueue:
    """First in, first out, for the frames of a batch on their way to postprocessing.

    Unbounded by design: every frame in it holds a slot, so the slot pools bound it.

    The producer may instead handle an item itself (``claim``) while the queue is empty
    and the consumer is not working on an item it took: the consumer's wake-up is then
    saved, and the order of the items is kept (nothing is queued or in the consumer's
    hands that came before).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._items: deque[FrameSlot] = deque()
        self._closed = False
        self._busy = False  # the consumer works on an item it took (until it asks again)
        self._claimed = False  # the producer handles an item itself
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def put(self, slot: FrameSlot) -> bool:
        """Hand ``slot`` on; False (not taken) once the queue was closed."""
        with self._cond:
            if self._closed:
                return False
            self._items.append(slot)
            self._cond.notify()
            return True

    def get(self, timeout_s: float) -> FrameSlot | None:
        """The oldest slot, or None after ``timeout_s``. Raises Closed when drained.

        Calling it again tells the queue the previous slot is done with."""
        with self._cond:
            self._busy = False
            if not self._items or self._claimed:
                if self._closed and not self._items:
                    raise Closed(self.name)
                self._cond.wait(timeout_s)
                if not self._items or self._claimed:
                    if self._closed and not self._items:
                        raise Closed(self.name)
                    return None
            self._busy = True
            return self._items.popleft()

    def claim(self) -> bool:
        """Producer: True if it may handle its next item itself (nothing queued, the
        consumer idle): the consumer then gets nothing until ``unclaim``."""
        with self._lock:
            if self._items or self._busy or self._claimed or self._closed:
                return False
            self._claimed = True
            return True

    def unclaim(self) -> None:
        with self._lock:
            self._claimed = False
            if self._items:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
