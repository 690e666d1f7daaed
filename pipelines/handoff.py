"""Frame slots and the hand-offs that move them between stage threads.

Every frame in flight occupies one preallocated ``FrameSlot`` (model input and output
buffers, detections, stamps), taken from a ``SlotPool`` and given back after publishing.
Between two stages sits a ``Handoff`` of capacity one: the producer fills one slot while
the consumer works on the previous one, which is the double buffer of each boundary.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.preprocess import Letterbox

# Stage boundaries stamped on every frame (time.monotonic_ns()).
CAPTURED, PRE_START, PRE_END, INFER_START, INFER_END, POST_START, POST_END, PUBLISH = range(8)
N_STAMPS = 8
#: Stage i lasts from stamp i to stamp i + 1; together they add up to the end-to-end time.
STAGES = ("capture", "preprocess", "wait_infer", "infer", "wait_post", "postprocess", "publish")


class FrameSlot:
    """All per-frame state, allocated once and reused for the agent's lifetime."""

    __slots__ = (
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


class Handoff:
    """Capacity-one channel between two stage threads.

    ``newest_wins``: a put while a frame is still waiting replaces it, and the replaced
    frame goes to ``on_replace`` (live sources: a queue never builds up). Otherwise the
    producer waits for the consumer (files: nothing is dropped).
    """

    def __init__(self, name: str, newest_wins: bool, on_replace: Callable[[FrameSlot], None]) -> None:
        self.name = name
        self.newest_wins = newest_wins
        self._on_replace = on_replace
        self._item: FrameSlot | None = None
        self._closed = False
        self._cond = threading.Condition()

    def put(self, slot: FrameSlot, stop: threading.Event) -> bool:
        """Hand ``slot`` over; False (slot not taken) if ``stop`` was set while waiting."""
        replaced = None
        with self._cond:
            if self._item is not None and self.newest_wins:
                replaced = self._item
            else:
                while self._item is not None:
                    if stop.is_set():
                        return False
                    self._cond.wait(0.05)
            self._item = slot
            self._cond.notify_all()
        if replaced is not None:
            self._on_replace(replaced)
        return True

    def wait_room(self, timeout_s: float) -> bool:
        """Wait until nothing is waiting in the hand-off; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: self._item is None, timeout_s)

    def get(self, timeout_s: float) -> FrameSlot | None:
        """The waiting slot, or None after ``timeout_s``. Raises Closed when drained."""
        with self._cond:
            if self._item is None:
                if self._closed:
                    raise Closed(self.name)
                self._cond.wait(timeout_s)
                if self._item is None:
                    if self._closed:
                        raise Closed(self.name)
                    return None
            slot, self._item = self._item, None
            self._cond.notify_all()
            return slot

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
