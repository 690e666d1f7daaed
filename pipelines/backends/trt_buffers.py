"""A frame slot's CUDA state for the TensorRT backend: its stream, events, buffers and
execution contexts, and how its buffers are made, bound, copied and freed.

Every frame slot gets its own CUDA stream and its own page-locked host buffers, mapped into
the GPU's address space on Jetson's integrated GPU (``zero_copy``: the host and the device
read and write the same DRAM, nothing is copied), or device buffers that the slot's stream
copies to and from (``upload`` starts the input copy on the capture thread, so the copy of
frame N+1 overlaps the inference of frame N). An output whose row count depends on the frame
has an output allocator instead of a fixed buffer (``trt_outputs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.pipelines.backends import trt_graphs
from edge_agent.pipelines.backends.base import TensorSpec
from edge_agent.pipelines.backends.trt_outputs import RowOutput, attach
from edge_agent.pipelines.backends.trt_support import bind


@dataclass
class Slot:
    """One frame slot's CUDA state."""

    stream: Any
    host: dict[str, np.ndarray]  # page-locked, one per IO tensor the host touches
    device: dict[str, int]  # device address of every tensor, preprocessing's included
    allocations: dict[str, Any] = field(default_factory=dict)  # DeviceAllocation per tensor
    events: list[Any] = field(default_factory=list)  # start, after preprocessing, end, done (blocking)
    uploaded: bool = False
    batch: int = 1  # frames the buffers hold
    rows: dict[str, RowOutput] = field(default_factory=dict)  # outputs with a row count per frame
    # With CUDA graphs: execution contexts of this slot's own, bound once to its buffers
    # (a graph holds its context's state), and the graphs once captured ("pre", "model").
    context: Any = None
    pre_context: Any = None
    graphs: dict[str, trt_graphs.CudaGraph] | None = None


def add_buffer(
    cuda: Any, slot: Slot, name: str, shape: tuple[int, ...], dtype: np.dtype, host: bool, zero_copy: bool
) -> None:
    """The slot's buffer for tensor ``name``: mapped page-locked memory (``host`` and
    ``zero_copy``), page-locked host memory and its device copy (``host``), or device memory."""
    nbytes = int(np.prod(shape)) * dtype.itemsize
    if host and zero_copy:
        # Jetson's GPU shares DRAM with the CPU: a mapped page-locked buffer is read
        # and written by both, with no copy in between.
        arr = cuda.pagelocked_empty(shape, dtype, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
        slot.host[name] = arr
        slot.device[name] = int(arr.base.get_device_pointer())
        return
    if host:
        slot.host[name] = cuda.pagelocked_empty(shape, dtype)
    mem = cuda.mem_alloc(nbytes)
    slot.allocations[name] = mem  # the copies take the allocation; TensorRT its address
    slot.device[name] = int(mem)


def bind_outputs(context: Any, slot: Slot, outputs: list[TensorSpec]) -> None:
    """Give ``context`` the slot's output buffers (an allocator for a row output)."""
    for spec in outputs:
        rows = slot.rows.get(spec.name)
        if rows is not None:
            attach(context, rows)
        else:
            bind(context, spec.name, slot.device[spec.name])


def copy_in(cuda: Any, slot: Slot, name: str) -> None:
    """Start the input's copy to the device on the slot's stream (device buffers only)."""
    cuda.memcpy_htod_async(slot.allocations[name], slot.host[name], slot.stream)


def copy_out(cuda: Any, slot: Slot, outputs: list[TensorSpec], zero_copy: bool) -> None:
    """Start the outputs' copies to the host on the slot's stream: the fixed ones from device
    buffers, and the rows a row output was given (its allocator's memory is the device's)."""
    for spec in outputs:
        rows = slot.rows.get(spec.name)
        if rows is not None:
            rows.copy_out(slot.stream)
        elif not zero_copy:
            cuda.memcpy_dtoh_async(slot.host[spec.name], slot.allocations[spec.name], slot.stream)


def wait(slot: Slot) -> None:
    """Until everything on the slot's stream is done. A BLOCKING_SYNC event sleeps the thread;
    stream.synchronize() on the primary context (CU_CTX_SCHED_AUTO) would spin a CPU core for
    the whole inference."""
    done = slot.events[3]
    done.record(slot.stream)
    done.synchronize()


def drop_graphs(slot: Slot) -> None:
    for g in (slot.graphs or {}).values():
        g.close()
    slot.graphs = {}


def free(slot: Slot) -> None:
    """Everything the slot holds, with the CUDA context current. An IOSet may still hold the
    slot (``handle``): its stream and events go now, not after the context's release."""
    # The graphs and contexts first: they hold the buffers' addresses.
    drop_graphs(slot)
    slot.context, slot.pre_context = None, None
    for mem in slot.allocations.values():
        mem.free()
    for arr in slot.host.values():
        arr.base.free()
    for rows in slot.rows.values():
        rows.free()
    slot.events, slot.stream = [], None
    for held in (slot.allocations, slot.host, slot.device, slot.rows):
        held.clear()
