"""Frame slots and the model buffers they belong to.

Every frame in flight occupies one preallocated ``FrameSlot`` (model input and output
buffers, detections, stamps), taken from a ``SlotPool`` (one per source and model) and
given back once the frame has ended. In front of inference each source has a cell of
capacity one in the batch scheduler (``scheduler.py``): the capture thread fills one slot
while inference works on the previous one, which is the double buffer of that boundary.

``ModelBuffers`` is a loaded model with those buffers: frame slots per source and one
input/output set per batch size, allocated and warmed up before the first frame.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.core.stamps import CAPTURED, N_STAMPS
from edge_agent.models.decoders.base import Decoded
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.preprocess import Letterbox, boxes_to_source
from edge_agent.pipelines.sources.base import SourceFrame
from edge_agent.pipelines.tasks.base import Task, compact
from edge_agent.pipelines.tasks.masks import Mask

log = logging.getLogger(__name__)


class FrameSlot:
    """All per-frame state, allocated once and reused for the agent's lifetime."""

    __slots__ = (
        "batch",
        "det_class",
        "det_count",
        "det_extra",
        "det_masks",
        "det_score",
        "det_track",
        "det_track_age",
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
        "pixels",
        "pool",
        "profile",
        "source",
        "stamps",
        "tensor",
    )

    def __init__(
        self,
        index: int,
        io: IOSet,
        input_name: str,
        max_det: int,
        max_gt: int,
        profile: Any = None,
        task: Task | None = None,
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
        # a copy of the frame's image that outlives the source's next read (kept only for a
        # source whose events save snapshots: ``keep_pixels``)
        self.pixels: np.ndarray | None = None
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
        # The model's task values per detection beyond the box (keypoints, an oriented box,
        # mask coefficients: ``pipelines.tasks``), in source pixels once mapped; and, for a
        # segmentation model, each detection's mask (made per frame: its size varies).
        task = task or Task()
        self.det_extra = np.zeros((max_det, task.width), np.float32)
        self.det_masks: list[Mask | None] = [None] * max_det if task.masks else []
        # Written by the source's tracker, when it has one: each detection's track id (0:
        # none) and the track's age in frames.
        self.det_track = np.zeros(max_det, np.int64)
        self.det_track_age = np.zeros(max_det, np.int32)

    def fill(self, found: Decoded, task: Task) -> None:
        """Take a frame's decoded detections (model-input pixels) into the slot, in source
        pixels: the task's values mapped (it may drop some), then the boxes."""
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


class Closed(Exception):
    """The producer side closed the hand-off and nothing is left in it."""


#: Per source and model: capture+preprocess, the scheduler's cell, inference, the post
#: queue, postprocess: one slot each.
SLOTS = 5


_UNLIMITED = 1 << 30


@dataclass
class ModelBuffers:
    """A loaded model with its preallocated buffers: frame slots per source, and one
    input/output set per batch size for batches of several sources.

    The degradation ladder may switch models at a frame boundary; each frame carries the
    profile it was preprocessed for, so frames already in flight finish on their model.
    Buffers are kept across reloads that keep the model.
    """

    name: str
    model: LoadedModel
    pools: dict[str, SlotPool] = field(default_factory=dict)  # by source name
    batches: dict[int, IOSet] = field(default_factory=dict)  # by batch size (2 and up)
    warm_ns: dict[int, int] = field(default_factory=dict)  # warm-up median, by batch size

    def pool(self, source: str, slots: int = SLOTS, max_gt: int = 64) -> SlotPool:
        """The source's frame slots, allocated (and the backend warmed up) on first use."""
        pool = self.pools.get(source)
        if pool is None:
            m = self.model
            made = [
                FrameSlot(
                    i, m.backend.allocate(), m.input_name, m.params.max_detections, max_gt, self, m.task
                )
                for i in range(slots)
            ]
            if not self.pools:
                self.warm_ns[1] = _warm(m.backend, made[0].io)
            pool = self.pools[source] = SlotPool(made)
        return pool

    def prepare_slots(self) -> None:
        """The backend's per-set work (``InferenceBackend.prepare``) on every frame slot and
        batch set: it runs inferences, so only while no pipeline runs this model."""
        backend = self.model.backend
        for pool in self.pools.values():
            for s in pool.slots:
                backend.prepare(s.io)
        for io in self.batches.values():
            backend.prepare(io)

    def batch_limit(self) -> int:
        """The largest batch the model runs (its fixed batch, or unlimited)."""
        n, _ = self.model.backend.batch_axis()
        return n or _UNLIMITED

    def prepare_batches(self, largest: int, warm: bool = True) -> None:
        """Allocate the sets for batches of 2..``largest`` frames (a model with a fixed batch
        axis gets one set of its size, which smaller batches pad) and, with ``warm``, warm
        up those not warmed yet; their times seed the scheduler's estimates."""
        backend = self.model.backend
        _, fixed = backend.batch_axis()
        for size in range(2, min(largest, self.batch_limit()) + 1):
            if size not in self.batches:
                shared = fixed and self.batches
                self.batches[size] = next(iter(self.batches.values())) if shared else backend.allocate(size)
            if warm and size not in self.warm_ns:
                io = self.batches[size]
                same = [ns for s, ns in self.warm_ns.items() if s > 1 and self.batches[s] is io]
                self.warm_ns[size] = same[0] if same else _warm(backend, io)

    def slot_for(
        self, frame: SourceFrame, lane: int, source: str, stop: threading.Event, wait_s: float
    ) -> FrameSlot | None:
        """A free slot of ``source``'s pool holding ``frame``, stamped and labelled; None when
        ``stop`` came while none was free. Waits ``wait_s`` at a time for one, and tries at
        least once: a frame read just before the stop is still processed."""
        pool = self.pools[source]
        slot = pool.acquire(wait_s)
        while slot is None and not stop.is_set():
            slot = pool.acquire(wait_s)
        if slot is None:
            return None
        slot.stamps[CAPTURED] = frame.capture_ns
        slot.frame = frame
        slot.lane = lane
        slot.source = source
        slot.frame_id = frame.frame_id
        slot.expected_ns = 0.0
        slot.gt_count = 0
        if frame.gt is not None:
            n = min(len(frame.gt), len(slot.gt))
            slot.gt[:n] = frame.gt[:n]
            slot.gt_count = n
        return slot

    def preprocess(self, slot: FrameSlot) -> None:
        """Preprocess the slot's source frame into its input and start moving that to the
        device: on the capture thread, so the copy of frame N+1 overlaps the inference of
        frame N. Raises what the preprocessor or the backend raises."""
        m = self.model
        m.preprocessor(slot.frame.image, slot.tensor, slot.geo)  # type: ignore[union-attr]
        m.backend.upload(slot.io)

    def infer(self, slots: list[FrameSlot]) -> None:
        """Run one batch: a single frame on its own buffers, several through the batch set
        (inputs copied in, outputs and the backend's timings copied back to each frame)."""
        backend = self.model.backend
        if len(slots) == 1:
            backend.infer(slots[0].io)
            return
        io = self.batches[len(slots)]
        batch_in = io.inputs[self.model.input_name]
        for k, s in enumerate(slots):
            batch_in[k] = s.tensor[0]
        backend.infer(io)
        for o, out in enumerate(io.outputs):
            for k, s in enumerate(slots):
                s.io.outputs[o][0] = out[k]
        if io.extra:
            for s in slots:
                s.io.extra.update(io.extra)


def prepare_buffers(
    lanes: list[tuple[str, dict[str, ModelBuffers]]], max_batch: int, warm: bool = True
) -> None:
    """Allocate every source's frame slots in each profile it may use, and each profile's
    batch sets up to the number of sources that use it (and ``max_batch``).

    ``warm``: also warm up batch sets not warmed yet and prepare every set
    (``ModelBuffers.prepare_slots``). A reload prepares its buffers while the old pipeline
    still runs, with ``warm`` off for profiles that pipeline is using (one backend must not
    run two inferences at once); the new pipeline warms them after the drain.
    """
    users: dict[int, list[Any]] = {}
    for name, profiles in lanes:
        for p in {id(p): p for p in profiles.values()}.values():
            p.pool(name)
            users.setdefault(id(p), [p, 0])[1] += 1
    cap = min(max_batch or len(lanes), len(lanes))
    for p, n in users.values():
        p.prepare_batches(min(cap, n), warm)
        if warm:
            p.prepare_slots()


def _warm(backend: Any, io: IOSet, timed: int = 3) -> int:
    """Warm ``io`` up; returns the median ns of ``timed`` runs after two untimed ones: a first
    estimate for the scheduler, and what the start-up budget check judges (one run alone
    can be an outlier on a busy host)."""
    backend.warmup(io, runs=2)
    times = []
    for _ in range(timed):
        t = time.monotonic_ns()
        backend.warmup(io, runs=1)
        times.append(time.monotonic_ns() - t)
    return sorted(times)[len(times) // 2]
