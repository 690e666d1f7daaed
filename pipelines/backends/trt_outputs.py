"""Outputs whose row count depends on the frame, on TensorRT: an output allocator per slot.

An end-to-end export with NMS inside gives one row per kept box (YOLOv7's ``--max-wh``:
``[N, 7]``); its first axis is still -1 once the input shapes are set, so no buffer can be
sized for it before a run. TensorRT 10 asks the application for such an output's memory
during the enqueue, through an ``IOutputAllocator`` set with
``IExecutionContext.set_output_allocator(name, allocator) -> bool`` ("If getTensorShape(name)
reports a -1 for any dimension of an output after all input shapes have been set, then to
find out the dimensions, use setOutputAllocator()": TensorRT v10.3.0
``include/NvInferRuntime.h``, ``setTensorAddress``). The Python class subclasses
``trt.IOutputAllocator``, calls its ``__init__``, and overrides (the Python API docs,
``infer/Core/ExecutionContext.html``; the binding, ``python/src/infer/pyCore.cpp``
``PyOutputAllocator``):

- ``reallocate_output_async(tensor_name, memory, size, alignment, stream) -> int``: the
  address of at least ``size`` bytes ("number of bytes required. Always positive, even for
  an empty tensor"); ``memory`` is the address set before, as an int. ``None`` when it cannot
  be given ("If an allocation request cannot be satisfied, None should be returned"): the
  enqueue then fails ("have reallocateOutputAsync return nullptr if that memory is not big
  enough"). TensorRT 10 calls this one; ``reallocate_output`` is the deprecated 9.x name,
  which the binding calls only where the async one is not overridden.
- ``notify_shape(tensor_name, shape)``: the output's shape, "Called by TensorRT sometime
  between when it calls reallocateOutput and enqueueV3 returns".

The binding prints an exception raised in a callback and reads it as nullptr, so the
callbacks here never raise: a failure is kept and said by the backend after the enqueue.

**Here** each frame slot has one ``RowOutput`` per such output: device memory that grows
geometrically (doubling, from ``FIRST_ROWS`` rows) up to ``MAX_ROWS`` rows and is then
reused frame after frame (nothing is allocated in steady state), and a page-locked host
buffer of ``MAX_ROWS`` rows made with the slot. After the enqueue, the rows ``notify_shape``
reported are copied into the host buffer on the slot's stream, and the output the decoder
reads is the view of those rows. A frame with more rows than ``MAX_ROWS`` cannot keep some
of them (TensorRT writes the whole tensor into what it is given): the allocator refuses it,
the enqueue fails, and the frame's rows are dropped and counted (``rows_dropped``: the
rows ``notify_shape`` reported, or, when it was not called, the rows ``size`` holds).
Such an output cannot run from a CUDA graph (its allocator allocates in the enqueue), and
its rows carry no batch axis: the model runs one frame at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.models.decoders.base import oversized
from edge_agent.models.manifest import ModelError
from edge_agent.pipelines.backends.base import MAX_ROWS, BackendError, IOSet, TensorSpec

FIRST_ROWS = 64  # rows of a slot's first device allocation (or the first frame's, if more)


class RowOutput:
    """One slot's memory for one output with a row count per frame, and what the last
    enqueue reported. ``host`` (page-locked, ``MAX_ROWS`` rows) is made by the caller."""

    def __init__(self, cuda: Any, index: int, name: str, host: np.ndarray) -> None:
        self.cuda, self.index, self.name, self.host = cuda, index, name, host
        self.row_shape = tuple(host.shape[1:])
        self.row_bytes = max(int(np.prod(self.row_shape, dtype=np.int64)) * host.dtype.itemsize, 1)
        self.limit = MAX_ROWS * self.row_bytes  # the most bytes given
        self.mem: Any = None  # the device allocation (pycuda DeviceAllocation)
        self.capacity = 0  # its bytes
        self.allocations = 0  # made so far (tests: none in steady state)
        self.allocator: Any = None  # the IOutputAllocator serving it (``make_allocator``)
        self.begin()

    def begin(self) -> None:
        """Before each enqueue: nothing reported yet."""
        self.rows = 0  # rows notify_shape reported
        self.reported = False
        self.asked = 0  # rows a refused request's size held
        self.refused = False  # past MAX_ROWS: the frame's rows are dropped
        self.failed = ""  # why a request could not be served otherwise

    # -- the IOutputAllocator's calls (never raise: the binding would print and go on) ----

    def reallocate(self, size: int, alignment: int) -> int | None:
        try:
            need = max(int(size), 1)
            if need > self.limit:
                self.refused, self.asked = True, -(-need // self.row_bytes)
                return None
            if need > self.capacity:
                self._grow(need)
            address = int(self.mem)
            if alignment and address % int(alignment):
                self.failed = f"output {self.name!r}: {address:#x} is not {alignment}-byte aligned"
                return None
            return address
        except Exception as e:  # pycuda's MemoryError, LogicError: said after the enqueue
            self.failed = f"output {self.name!r}: {type(e).__name__}: {e}"
            return None

    def _grow(self, need: int) -> None:
        """``FIRST_ROWS`` rows doubled until ``need`` fits, up to the bound (a slot allocates
        at most five times, ever). The old memory goes first: TensorRT has not written this
        frame's rows yet, and the last frame's copy is done (the slot's stream was waited for)."""
        size = max(self.capacity, FIRST_ROWS * self.row_bytes)
        while size < need:
            size *= 2
        size = min(size, self.limit)
        if self.mem is not None:
            self.mem.free()
            self.mem, self.capacity = None, 0
        self.mem = self.cuda.mem_alloc(size)
        self.capacity = size
        self.allocations += 1

    def notify(self, shape: Any) -> None:
        try:
            dims = tuple(int(d) for d in shape)
            if dims[1:] != self.row_shape or not dims:
                self.failed = (
                    f"output {self.name!r}: TensorRT reported shape {dims}, rows of {self.row_shape}"
                )
                return
            self.rows, self.reported = dims[0], True
        except Exception as e:  # a Dims TensorRT made: unexpected, said after the enqueue
            self.failed = f"output {self.name!r}: notify_shape: {type(e).__name__}: {e}"

    # -- after the enqueue ----------------------------------------------------------------

    def kept(self) -> int:
        """Rows of the last enqueue the host gets (0 when refused)."""
        if self.refused or not self.reported:
            return 0
        if self.rows > self.capacity // self.row_bytes:
            raise BackendError(f"output {self.name!r}: {self.rows} rows reported, room was given for fewer")
        return self.rows

    def dropped(self) -> int:
        """Rows of the last enqueue past the bound (0 unless refused)."""
        if not self.refused:
            return 0
        return self.rows if self.reported else self.asked

    def copy_out(self, stream: Any) -> None:
        """Start the copy of the rows kept into ``host`` on the slot's stream."""
        n = self.kept()
        if n:
            self.cuda.memcpy_dtoh_async(self.host[:n], self.mem, stream)

    def view(self) -> np.ndarray:
        """The rows the decoder reads (after the slot's stream was waited for)."""
        return self.host[: self.kept()]

    def free(self) -> None:
        if self.mem is not None:
            self.mem.free()
            self.mem, self.capacity = None, 0
        self.host.base.free()
        self.allocator = None


def check_sizes(outputs: list[TensorSpec], rows: list[int], model: str) -> None:
    """ModelError for a row output whose ``MAX_ROWS`` rows hold more than
    ``MAX_OUTPUT_ELEMENTS`` values (as ONNX Runtime's backend checks its rows' slot)."""
    for i in rows:
        spec = outputs[i]
        why = oversized(spec.name, (1, MAX_ROWS, *spec.shape[1:]))
        if why:
            raise ModelError(f"{model}: {why}")


def row_output(cuda: Any, trt: Any, index: int, spec: TensorSpec) -> RowOutput:
    """A slot's ``RowOutput`` for output ``index`` (``spec``: its rows' shape after axis 0),
    with its host buffer and its allocator. Call with the CUDA context current."""
    host = cuda.pagelocked_empty((MAX_ROWS, *spec.shape[1:]), spec.dtype)
    output = RowOutput(cuda, index, spec.name, host)
    make_allocator(trt, output)
    return output


def hand_over(rows: list[RowOutput], io: IOSet, ran: bool) -> int:
    """After the slot's stream was waited for: each row output's rows become its output in
    ``io``; when the enqueue was refused (``ran`` False) every other output is zeroed, as
    TensorRT did not finish the frame (the frame reads as nothing found). Returns the rows
    dropped."""
    for r in rows:
        io.outputs[r.index] = r.view()
    if not ran:
        mine = {r.index for r in rows}
        for i, out in enumerate(io.outputs):
            if i not in mine:
                out[...] = 0
    return sum(r.dropped() for r in rows)


def make_allocator(trt: Any, output: RowOutput) -> Any:
    """An ``IOutputAllocator`` of ``trt`` serving ``output`` (kept as ``output.allocator``)."""

    class RowAllocator(trt.IOutputAllocator):  # type: ignore[name-defined, misc]
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)

        def reallocate_output_async(
            self, tensor_name: str, memory: int, size: int, alignment: int, stream: int
        ) -> int | None:
            return output.reallocate(size, alignment)

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            output.notify(shape)

    output.allocator = RowAllocator()
    return output.allocator


def attach(context: Any, output: RowOutput) -> None:
    """Set ``output``'s allocator on ``context`` (False from TensorRT: not an output name)."""
    if not context.set_output_allocator(output.name, output.allocator):
        raise BackendError(f"TensorRT refused the output allocator for tensor {output.name!r}")
