"""Frame slots: every frame in flight occupies one preallocated ``FrameSlot`` (model input
and output buffers, detections, stamps), taken from a ``SlotPool`` (one per source and
profile, ``profile.py``) and given back once the frame has ended. In front of inference
each source has a cell of capacity one in the batch scheduler (``scheduler.py``): the
capture thread fills one slot while inference works on the previous one, which is the
double buffer of that boundary.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Protocol

import numpy as np

from edge_agent.core.stamps import CAPTURED, N_STAMPS
from edge_agent.models.decoders.base import Decoded
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.preprocess import Letterbox, boxes_to_source
from edge_agent.pipelines.sources.base import SourceFrame
from edge_agent.pipelines.tasks.base import DETECT, Task, compact
from edge_agent.pipelines.tasks.masks import Mask

log = logging.getLogger(__name__)


class SlotProfile(Protocol):
    """What a slot knows of the profile it belongs to (``profile.Profile``)."""

    name: str
    model: LoadedModel


class FrameSlot:
    """All per-frame state, allocated once and reused for the agent's lifetime."""

    __slots__ = (
        "batch",
        "det_class",
        "det_count",
        "det_extra",
        "det_journey",
        "det_masks",
        "det_score",
        "det_track",
        "det_track_age",
        "det_xyxy",
        "expected_ns",
        "frame",
        "frame_id",
        "geo",
        "index",
        "io",
        "lane_index",
        "pixels",
        "pool",
        "profile",
        "source",
        "stamps",
        "task",
        "tensor",
    )

    def __init__(
        self,
        index: int,
        io: IOSet,
        input_name: str,
        max_det: int,
        profile: SlotProfile | None = None,
        task: Task | None = None,
    ) -> None:
        self.index = index
        self.profile = profile  # the profile whose buffers these are (``profile.py``)
        # its model's task (plain detection, or the values each detection carries beyond its box)
        self.task = task or DETECT
        self.pool: SlotPool | None = None  # where the slot goes back after publishing
        self.lane_index = 0  # the pipeline lane (source) whose frame it holds
        self.batch = 1  # frames in the batch it was inferred in
        self.io = io
        self.tensor = io.inputs[input_name]
        self.geo = Letterbox()
        self.stamps = np.zeros(N_STAMPS, np.int64)
        self.source = ""
        self.frame: SourceFrame | None = None  # the source's frame read into it, until its next read
        # a copy of the frame's image that outlives the source's next read (kept only for a
        # source whose events save snapshots: ``keep_pixels``)
        self.pixels: np.ndarray | None = None
        self.frame_id = -1
        # The inference time expected for the batch it runs in (the scheduler's estimate
        # when it formed the batch; 0: none), which admission judges it by.
        self.expected_ns = 0.0
        self.det_xyxy = np.zeros((max_det, 4), np.float32)
        self.det_score = np.zeros(max_det, np.float32)
        self.det_class = np.zeros(max_det, np.int32)
        self.det_count = 0
        # The model's task values per detection beyond the box (keypoints, an oriented box,
        # mask coefficients: ``pipelines.tasks``), in source pixels once mapped; and, for a
        # segmentation model, each detection's mask (made per frame: its size varies).
        self.det_extra = np.zeros((max_det, self.task.width), np.float32)
        self.det_masks: list[Mask | None] = [None] * max_det if self.task.masks else []
        # Written by the source's tracker, when it has one: each detection's track id (0:
        # none), the track's age in frames and the journey it continues (0: none).
        self.det_track = np.zeros(max_det, np.int64)
        self.det_track_age = np.zeros(max_det, np.int32)
        self.det_journey = np.zeros(max_det, np.int64)

    def fill(self, found: Decoded) -> None:
        """Take a frame's decoded detections (model-input pixels) into the slot, in source
        pixels: the task's values mapped (it may drop some), then the boxes."""
        task = self.task
        n = min(len(found.scores), len(self.det_score))
        self.det_xyxy[:n] = found.xyxy[:n]
        self.det_score[:n] = found.scores[:n]
        self.det_class[:n] = found.classes[:n]
        cols = 0
        if task.width:
            extra = found.extra
            cols = extra.shape[1]  # type: ignore[union-attr]
            self.det_extra[:n, :cols] = extra[:n]  # type: ignore[index]
        # A model that outputs NaN or infinity (a broken export, a bad engine) would make
        # the message invalid JSON: such detections are dropped, whatever the task; again
        # after the task's mapping, which a huge value can overflow.
        n = self._finite(n, cols)
        if task.width:
            n = self._finite(task.to_source(self, n), task.width, masks=True)
        self.det_count = n
        boxes_to_source(self.det_xyxy[:n], self.geo)

    def _finite(self, n: int, cols: int, masks: bool = False) -> int:
        """Keep the first ``n`` detections whose box, score and first ``cols`` task values
        are all finite (in order; ``masks``: their masks with them); returns their count."""
        # One sum each first (a scalar, no array made per frame): NaN or inf in any value
        # makes it so; only then (or a sum that overflowed) are the detections looked at.
        sums = float(self.det_xyxy[:n].sum()) + float(self.det_score[:n].sum())
        if cols:
            sums += float(self.det_extra[:n, :cols].sum())
        if math.isfinite(sums):
            return n
        finite = np.isfinite(self.det_xyxy[:n]).all(axis=1) & np.isfinite(self.det_score[:n])
        if cols:
            finite &= np.isfinite(self.det_extra[:n, :cols]).all(axis=1)
        return n if finite.all() else compact(self, np.flatnonzero(finite), n, masks)

    def keep_pixels(self, image: np.ndarray) -> None:
        """Copy ``image`` into ``pixels`` (allocated once per frame size)."""
        if self.pixels is None or self.pixels.shape != image.shape:
            self.pixels = np.empty_like(image)
        np.copyto(self.pixels, image)


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

    def take(
        self, frame: SourceFrame, lane_index: int, source: str, stop: threading.Event, wait_s: float
    ) -> FrameSlot | None:
        """A free slot holding ``frame``, stamped and labelled; None when ``stop`` came while
        none was free. Waits ``wait_s`` at a time for one, and tries at least once: a frame
        read just before the stop is still processed."""
        slot = self.acquire(wait_s)
        while slot is None and not stop.is_set():
            slot = self.acquire(wait_s)
        if slot is None:
            return None
        slot.stamps[CAPTURED] = frame.capture_ns
        slot.frame = frame
        slot.lane_index = lane_index
        slot.source = source
        slot.frame_id = frame.frame_id
        slot.expected_ns = 0.0
        return slot


class Closed(Exception):
    """The producer side closed the hand-off and nothing is left in it."""
