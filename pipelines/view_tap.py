"""The live view's tap on one lane: the newest frame's pixels and detections, handed from
the frame path to the view's thread, at most ``fps`` times a second, and only while
someone watches.

While nobody watches (``active`` false) the frame path does nothing but read that flag:
no copy, no encoding. While someone does, the capture stage copies a due frame's pixels into a preallocated
buffer (newest wins), and the post stage, when that same frame is published, copies its
detections and latency beside it and swaps it with the ready buffer (two buffers, so
pixels and detections always belong together). The view's thread copies the ready frame
under the lock, then draws and encodes on its own time. A frame dropped after its pixels
were taken is simply never ready: the next due frame replaces it.

A pose or oriented-box model's values per detection (keypoints; centre, size, angle and
corners) are copied beside the boxes into an array kept per frame buffer (made again only
when the model's width changes: a reload); a segmentation model's masks are handed as
references (each frame's masks are new objects, never changed afterwards).

Each of the lane's per-frame steps hands the frame what the view draws of it
(``LaneStep.to_view``): a tracker its track ids (copied); analytics its zones' and lines'
shapes in source pixels (``Shapes``, built once per config and frame size) and its running
counts (the counter's block, a dict replaced, never changed, when a count moves):
references, no copy per frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.core.stamps import CAPTURED, PUBLISH
from edge_agent.pipelines.tasks.base import task_of

if TYPE_CHECKING:
    from edge_agent.pipelines.analytics.geometry import Shapes
    from edge_agent.pipelines.steps.base import LaneStep
    from edge_agent.pipelines.tasks.masks import Mask

#: The tasks whose ``det_extra`` the view draws (a segmentation model's are mask
#: coefficients: its masks are drawn instead).
_DRAWN_EXTRA = ("pose", "obb")
_NO_MASKS: tuple[Mask | None, ...] = ()


class ViewFrame:
    """One annotated-frame-to-be: pixels, detections, labels and the frame's figures."""

    def __init__(self, max_det: int) -> None:
        self.image = np.empty((0, 0, 3), np.uint8)
        self.height = self.width = 0
        self.frame_id = -1
        self.det_xyxy = np.zeros((max_det, 4), np.float32)
        self.det_score = np.zeros(max_det, np.float32)
        self.det_class = np.zeros(max_det, np.int32)
        self.det_track = np.zeros(max_det, np.int64)  # 0: no track (or no tracker)
        self.det_count = 0
        # The model's task ("detect", "pose", "obb", "segment") and what drawing it needs:
        # pose: ``keypoints`` K and ``dims`` D (2 or 3), ``det_extra`` K*D values per
        # detection (x, y[, conf]); obb: ``det_extra`` cx, cy, w, h, angle, then the 4
        # corners' x, y; segment: ``det_masks``, each detection's mask (or None). In
        # source pixels.
        self.task = "detect"
        self.keypoints = self.dims = 0
        self.det_extra = np.zeros((max_det, 0), np.float32)
        self.det_masks: Sequence[Mask | None] = _NO_MASKS  # replaced per frame, never changed
        self.labels: tuple[str, ...] | list[str] = ()
        self.e2e_ms = 0.0
        self.missed = False
        self.caption = ""  # the corner stamp's text instead of the frame's figures (a snapshot's)
        self.shapes: Shapes | None = None  # the source's zones and lines (None: no analytics)
        self.counts: dict | None = None  # their running counts (the counter's block)

    def take_pixels(self, image: np.ndarray) -> None:
        h, w = image.shape[:2]
        if self.image.shape[0] < h or self.image.shape[1] < w or self.image.shape[2:] != image.shape[2:]:
            self.image = np.empty(image.shape, image.dtype)  # a new camera size: once
        self.image[:h, :w] = image
        self.height, self.width = h, w

    def take_task(self, task: str, keypoints: int, dims: int, width: int) -> None:
        """Set the frame's task and make room for ``width`` values per detection (a new
        array only when the width changes: a reload to a model of another task)."""
        self.task, self.keypoints, self.dims = task, keypoints, dims
        if self.det_extra.shape[1] != width:
            self.det_extra = np.zeros((len(self.det_score), width), np.float32)

    def copy_from(self, other: ViewFrame) -> None:
        self.take_pixels(other.image[: other.height, : other.width])
        n = other.det_count
        self.det_xyxy[:n] = other.det_xyxy[:n]
        self.det_score[:n] = other.det_score[:n]
        self.det_class[:n] = other.det_class[:n]
        self.det_track[:n] = other.det_track[:n]
        self.take_task(other.task, other.keypoints, other.dims, other.det_extra.shape[1])
        if self.det_extra.shape[1]:
            self.det_extra[:n] = other.det_extra[:n]
        self.det_masks = other.det_masks
        self.det_count, self.labels = n, other.labels
        self.frame_id, self.e2e_ms, self.missed = other.frame_id, other.e2e_ms, other.missed
        self.caption = other.caption
        self.shapes, self.counts = other.shapes, other.counts  # never changed once handed over


class ViewTap:
    """Written by the lane's capture and post stages, read by the view's thread."""

    def __init__(self, source: str, fps: float, max_det: int, wake: threading.Event) -> None:
        self.source = source
        self.period_ns = int(1e9 / fps)
        self.max_det = max_det
        self.active = False  # someone watches this source: set by the view
        self.captures = 0  # frames whose pixels were taken (0 while nobody watched)
        self.ready_seq = 0  # bumped at each ready frame
        self._filling = ViewFrame(max_det)  # the capture stage's
        self._ready = ViewFrame(max_det)  # the newest whole frame, for the view
        self._pending = -1  # the frame id whose pixels are in the buffer, not yet published
        self._next_ns = 0
        self._lock = threading.Lock()
        self._wake = wake  # the view thread's: a frame is ready on some tap

    # -- the frame path (only while active) -------------------------------------------

    def offer_pixels(self, frame: Any) -> None:
        """Capture stage: take this frame's pixels if one is due."""
        now = time.monotonic_ns()
        if now < self._next_ns:
            return
        # On a grid, so a 30 fps camera gives a 10 fps view 10 frames a second (not one per
        # period plus the wait for the next frame); never a burst after a pause.
        self._next_ns = max(self._next_ns + self.period_ns, now)
        with self._lock:
            self._filling.take_pixels(frame.image)
            self._pending = frame.frame_id
            self.captures += 1

    def offer_result(self, slot: Any, missed: bool, steps: Sequence[LaneStep] = ()) -> None:
        """Post stage: the frame whose pixels were taken is published: its detections, and
        what each of the lane's ``steps`` draws (``LaneStep.to_view``: track ids, zones,
        lines and counts)."""
        if slot.frame_id != self._pending:
            return
        with self._lock:
            if slot.frame_id != self._pending:  # a newer frame's pixels came in between
                return
            f, n = self._filling, min(slot.det_count, self.max_det)  # a reload may raise max_detections
            f.det_xyxy[:n] = slot.det_xyxy[:n]
            f.det_score[:n] = slot.det_score[:n]
            f.det_class[:n] = slot.det_class[:n]
            f.det_track[:n] = 0
            f.det_count = n
            self._take_task(f, slot, n)
            f.labels = slot.profile.model.manifest.labels
            f.frame_id = slot.frame_id
            f.e2e_ms = (int(slot.stamps[PUBLISH]) - int(slot.stamps[CAPTURED])) / 1e6
            f.missed = missed
            f.shapes = f.counts = None
            for step in steps:
                step.to_view(f, slot)
            self._filling, self._ready = self._ready, f
            self._pending = -1
            self.ready_seq += 1
        self._wake.set()

    @staticmethod
    def _take_task(f: ViewFrame, slot: Any, n: int) -> None:
        """The slot's task values that the view draws: copied (pose, obb), or its masks'
        references (segment); no allocation per frame but a segmentation frame's list."""
        task = task_of(slot)
        name = task.name
        width = task.width if name in _DRAWN_EXTRA else 0
        f.take_task(name, getattr(task, "keypoints", 0), getattr(task, "dims", 0), width)
        if width:
            f.det_extra[:n] = slot.det_extra[:n, :width]
        f.det_masks = slot.det_masks[:n] if name == "segment" and task.masks else _NO_MASKS

    # -- the view's thread --------------------------------------------------------------

    def grow(self, max_det: int) -> None:
        """Room for more detections (a reload raised ``model.max_detections``)."""
        with self._lock:
            if max_det > self.max_det:
                self.max_det = max_det
                self._filling, self._ready = ViewFrame(max_det), ViewFrame(max_det)
                self._pending = -1

    def take(self, into: ViewFrame, seen_seq: int) -> int:
        """Copy the ready frame into ``into`` if it is newer than ``seen_seq``; its seq."""
        with self._lock:
            if self.ready_seq == seen_seq:
                return seen_seq
            into.copy_from(self._ready)
            return self.ready_seq
