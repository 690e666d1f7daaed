"""A profile: a model as the frame path runs it, the loaded model (``model.py``) with its
preallocated buffers: frame slots per source (``slots.py``) and one input/output set per
batch size, allocated and warmed up before the first frame.

The degradation ladder switches among a source's profiles at a frame boundary; each frame
slot belongs to one profile for life, so frames already in flight finish on their model.
A profile is named by its model (the result message's ``model``, the heartbeat's
``by_profile``), and kept with its buffers across reloads that keep the model.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.slots import FrameSlot, SlotPool

#: Per source and model: capture+preprocess, the scheduler's cell, inference, the post
#: queue, postprocess: one slot each.
SLOTS = 5


_UNLIMITED = 1 << 30


@dataclass
class Profile:
    """A loaded model with its preallocated buffers: frame slots per source, and one
    input/output set per batch size for batches of several sources."""

    name: str
    model: LoadedModel
    pools: dict[str, SlotPool] = field(default_factory=dict)  # by source name
    batches: dict[int, IOSet] = field(default_factory=dict)  # by batch size (2 and up)
    warm_ns: dict[int, int] = field(default_factory=dict)  # warm-up median, by batch size

    def pool(self, source: str, slots: int = SLOTS) -> SlotPool:
        """The source's frame slots, allocated (and the backend warmed up) on first use."""
        pool = self.pools.get(source)
        if pool is None:
            m = self.model
            made = [
                FrameSlot(i, m.backend.allocate(), m.input_name, m.params.max_detections, self, m.task)
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
        if backend.infer_slots([s.io for s in slots]):
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


def prepare_profiles(
    lanes: Iterable[tuple[str, Iterable[Profile]]], max_batch: int, warm: bool = True
) -> None:
    """Allocate every source's frame slots in each profile it may use, and each profile's
    batch sets up to the number of sources that use it (and ``max_batch``).

    ``warm``: also warm up batch sets not warmed yet and prepare every set
    (``Profile.prepare_slots``). A reload prepares its buffers while the old pipeline
    still runs, with ``warm`` off for profiles that pipeline is using (one backend must not
    run two inferences at once); the new pipeline warms them after the drain.
    """
    users: dict[int, list[Any]] = {}
    lanes = list(lanes)
    for name, profiles in lanes:
        for p in {id(p): p for p in profiles}.values():
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
