"""FakeTensorRT's runtime: the engine, the execution context and its rules (see fake_tensorrt.py).

CUDA graphs (TensorRT's developer guide, "CUDA Graphs"; trtexec's ``--useCudaGraph`` in
samples/common/sampleInference.cpp): an ``execute_async_v3`` on a capturing stream records
its work with the addresses and shapes set at that moment. The context refuses a capture as
a device does, by invalidating it and returning False: an output of data-dependent shape (its
output allocator would allocate), a plugin that allocates in its enqueue
(``FakeTensorRT.plugin_allocates``), a DLA engine (unconfirmed on a device; the fake takes the
safe side). A graph holds the addresses, shapes and device memory its context had at the
capture: replaying it after they changed would compute with the old ones; the fake refuses
that with an AssertionError (stricter than a device, which would silently use them), as it
refuses two contexts sharing user-managed device memory at once (``setDeviceMemoryV2``:
"using it in another execution context running in parallel ... undefined behavior").
``FakeTensorRT.bake_inputs`` models a plugin doing host work in its enqueue: the inputs
are read when the enqueue is issued, so a graph replays the values of the captured frame.
Deserializing an engine uses the legacy stream here (TensorRT copies the weights to the
device; on which stream is not documented: the fake takes the stricter case).

Outputs of data-dependent shape (-1 after the input shapes are set) follow TensorRT 10's
output allocator (``include/NvInferRuntime.h``: ``setTensorAddress``, ``IOutputAllocator``;
the binding, ``python/src/infer/pyCore.cpp`` ``PyOutputAllocator``):
``set_output_allocator(name, allocator) -> bool`` (False for a name that is not an output;
None unsets); ``execute_async_v3`` refuses (AssertionError) such an output without an
allocator, and otherwise, on the host during the enqueue, calls its
``reallocate_output_async(name, memory, size, alignment, stream)`` (the deprecated
``reallocate_output`` where only that one is overridden) with the tensor's bytes (at least 1:
"Always positive, even for an empty tensor"), then ``notify_shape(name, dims)``. The rows an
enqueue gives are ``FakeTensorRT.output_rows[name]`` (0 by default). As the binding does, an
exception in a callback, or a return value that is not an int, reads as nullptr; nullptr
fails the enqueue (False) before ``notify_shape`` and before any work (stricter than a
device, which may have run part of the network). A non-null address must hold the bytes
asked for and be 256-byte aligned (AssertionError: TensorRT would write past it).
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import numpy as np

from fakes.fake_trt_types import (
    _NP,
    MAGIC,
    FakeDataType,
    FakeDims,
    FakeExecutionContextAllocationStrategy,
    FakeIOutputAllocator,
    FakeTensorIOMode,
)

if TYPE_CHECKING:
    from fakes.fake_tensorrt import FakeTensorRT


class FakeEngine:
    """ICudaEngine from a fake plan."""

    def __init__(self, trt: FakeTensorRT, plan: dict) -> None:
        self._trt = trt
        self.plan = plan
        self.label = plan["label"]
        self._io = {t["name"]: t for t in plan["io"]}
        self._names = [t["name"] for t in plan["io"]]

    @property
    def num_io_tensors(self) -> int:
        return len(self._names)

    def get_tensor_name(self, index: int) -> str:
        return self._names[index]

    def get_tensor_mode(self, name: str) -> FakeTensorIOMode:
        t = self._io.get(name)
        return FakeTensorIOMode[t["mode"]] if t else FakeTensorIOMode.NONE

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._io[name]["shape"])

    def get_tensor_dtype(self, name: str) -> FakeDataType:
        return FakeDataType[self._io[name]["dtype"]]

    @property
    def device_memory_size_v2(self) -> int:
        if not self._trt.version_at_least(10, 1):
            raise AttributeError("'ICudaEngine' has no attribute 'device_memory_size_v2' (TensorRT 10.1+)")
        return int(self.plan.get("device_memory", 1 << 20))

    @property
    def device_memory_size(self) -> int:
        if self._trt.version_at_least(11, 0):
            raise AttributeError(
                "'ICudaEngine' has no attribute 'device_memory_size' (removed in TensorRT 11)"
            )
        return int(self.plan.get("device_memory", 1 << 20))

    def create_execution_context(
        self, strategy: FakeExecutionContextAllocationStrategy = FakeExecutionContextAllocationStrategy.STATIC
    ) -> FakeExecutionContext | None:
        self._trt._record("ICudaEngine.create_execution_context", self.label, strategy.name)
        if self.label in self._trt.context_fails:
            return None  # the real call returns None (out of memory, say), it does not raise
        ctx = FakeExecutionContext(self._trt, self, strategy)
        cuda = self._trt.cuda
        if cuda is not None and strategy != FakeExecutionContextAllocationStrategy.USER_MANAGED:
            cuda.unsafe("createExecutionContext (cudaMalloc)")
            object.__setattr__(
                ctx, "_memory", cuda.reserve(int(self.plan.get("device_memory", 1 << 20)) or 1)
            )
        return ctx


class FakeExecutionContext:
    """IExecutionContext; enforces the shape/address/stream rules of ``execute_async_v3``."""

    def __init__(
        self, trt: FakeTensorRT, engine: FakeEngine, strategy: FakeExecutionContextAllocationStrategy
    ) -> None:
        self._trt, self.engine, self.strategy = trt, engine, strategy
        self.input_shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.allocators: dict[str, Any] = {}  # output name -> its IOutputAllocator
        self.placed: dict[str, tuple[int, tuple[int, ...]]] = {}  # the last enqueue's allocated outputs
        self._memory = 0  # activation memory: its own (STATIC) or the application's
        self.generation = 0  # bumped by every change a captured graph depends on

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "device_memory":  # the binding's write-only property (TensorRT 10.0's way)
            self._trt._record("IExecutionContext.device_memory=", self.engine.label, value)
            self._use_memory(value, self.engine.plan.get("device_memory", 1 << 20))
            return
        object.__setattr__(self, name, value)

    @property
    def set_device_memory(self) -> Any:
        """TensorRT 10.1+ (absent before, so ``hasattr`` says which API a version has)."""
        if not self._trt.version_at_least(10, 1):
            raise AttributeError("'IExecutionContext' has no attribute 'set_device_memory' (TensorRT 10.1+)")
        return self._set_device_memory

    def _set_device_memory(self, memory: int, size: int) -> None:
        """256-byte aligned memory of at least ``device_memory_size_v2`` bytes."""
        self._trt._record("IExecutionContext.set_device_memory", self.engine.label, memory, size)
        if size < self.engine.device_memory_size_v2:
            raise AssertionError(
                f"set_device_memory: {size} B < device_memory_size_v2 {self.engine.device_memory_size_v2}"
            )
        self._use_memory(memory, size)

    def _use_memory(self, memory: int, size: int) -> None:
        if not isinstance(memory, int) or isinstance(memory, bool) or memory % 256:
            raise AssertionError(f"device memory must be a 256-byte aligned int address, got {memory!r}")
        cuda = self._trt.cuda
        if cuda is not None and cuda.device_bytes_at(memory) < size:
            raise AssertionError(f"device memory at {memory:#x} holds fewer than {size} B")
        self._memory = memory
        self.generation += 1

    def _dynamic_inputs(self) -> list[str]:
        e = self.engine
        return [
            n
            for n in e._names
            if e.get_tensor_mode(n) == FakeTensorIOMode.INPUT and any(d < 0 for d in e.get_tensor_shape(n))
        ]

    def _check_shapes_set(self, what: str) -> None:
        missing = [n for n in self._dynamic_inputs() if n not in self.input_shapes]
        if missing:
            raise AssertionError(f"{what} before set_input_shape for the dynamic input(s) {missing}")

    def set_input_shape(self, name: str, shape: Any) -> bool:
        shape = tuple(int(d) for d in shape)
        self._trt._record("IExecutionContext.set_input_shape", self.engine.label, name, shape)
        e = self.engine
        if e.get_tensor_mode(name) != FakeTensorIOMode.INPUT:
            return False  # the real call logs an error and returns False

        declared = e.get_tensor_shape(name)
        # The binding returns False (and logs an error) for a refused shape; it does not raise.
        if len(shape) != len(declared) or any(d >= 0 and d != s for d, s in zip(declared, shape)):
            return False
        lo, _, hi = e.plan["profile"].get(name, (declared, declared, declared))
        if not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
            return False
        self.input_shapes[name] = shape
        self.generation += 1
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        self._check_shapes_set(f"get_tensor_shape({name!r})")
        e = self.engine
        if name in self.input_shapes:
            return self.input_shapes[name]
        batch = next(iter(self.input_shapes.values()), (1,))[0]
        # Axis 0 follows the input's batch where it is the input's batch axis (the same ONNX
        # name); any other dynamic axis is data-dependent (NonMaxSuppression's
        # [num_selected, 3]): -1.
        batch_names = {
            t.get("dims", [""])[0] for t in e.plan["io"] if t["mode"] == "INPUT" and t["shape"][:1] == [-1]
        }
        first = (e._io[name].get("dims") or [""])[0]
        follows = first in batch_names or not first  # unnamed: a network built by hand
        shape = e.get_tensor_shape(name)
        return tuple(batch if d < 0 and i == 0 and follows else d for i, d in enumerate(shape))

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self._trt._record("IExecutionContext.set_tensor_address", self.engine.label, name, memory)
        if not isinstance(memory, int) or isinstance(memory, bool):
            raise AssertionError(f"set_tensor_address({name!r}) takes an int address, got {type(memory)}")
        if self.engine.get_tensor_mode(name) == FakeTensorIOMode.NONE:
            return False  # the real call logs an error and returns False
        cuda = self._trt.cuda
        if cuda is not None and not cuda.is_device_address(memory):
            raise AssertionError(f"set_tensor_address({name!r}, {memory:#x}): not a device address")
        self.addresses[name] = memory
        self.generation += 1
        return True

    def set_output_allocator(self, name: str, output_allocator: Any) -> bool:
        self._trt._record("IExecutionContext.set_output_allocator", self.engine.label, name)
        if output_allocator is not None and not (
            isinstance(output_allocator, FakeIOutputAllocator)
            and getattr(output_allocator, "_fake_initialised", False)
        ):
            # pybind11 refuses an instance whose base __init__ was not called.
            raise TypeError(
                "set_output_allocator(): incompatible function arguments (IOutputAllocator.__init__?)"
            )
        if self.engine.get_tensor_mode(name) != FakeTensorIOMode.OUTPUT:
            return False  # the real call returns False for a name that is not an output
        if output_allocator is None:
            self.allocators.pop(name, None)
        else:
            self.allocators[name] = output_allocator
        self.generation += 1
        return True

    def get_output_allocator(self, name: str) -> Any:
        return self.allocators.get(name)

    def _data_dependent(self) -> list[str]:
        """Outputs with a -1 once the input shapes are set."""
        e = self.engine
        return [
            n
            for n in e._names
            if e.get_tensor_mode(n) == FakeTensorIOMode.OUTPUT
            and any(d < 0 for d in self.get_tensor_shape(n))
        ]

    def execute_async_v3(self, stream_handle: int) -> bool:
        self._trt._record("IExecutionContext.execute_async_v3", self.engine.label, stream_handle)
        if not isinstance(stream_handle, int) or isinstance(stream_handle, bool):
            raise AssertionError(
                f"execute_async_v3 takes the stream's int handle, got {type(stream_handle).__name__}"
            )
        self._check_shapes_set("execute_async_v3")
        dds = self._data_dependent()
        unserved = [n for n in dds if n not in self.allocators]
        if unserved:
            raise AssertionError(
                f"execute_async_v3 on {self.engine.label}: output(s) {unserved} have a data-dependent shape "
                "and no output allocator (set_output_allocator)"
            )
        missing = [n for n in self.engine._names if n not in self.addresses and n not in self.allocators]
        if missing:
            raise AssertionError(f"execute_async_v3 on {self.engine.label}: no address set for {missing}")
        cuda = self._trt.cuda
        if cuda is not None:
            capture = cuda.capture_of(stream_handle)
            why = self._uncapturable() if capture is not None else ""
            if why:
                cuda._invalidate(capture, why)
                return False  # enqueue fails when the capture fails (trtexec's comment)
            if not self._allocate_outputs(dds, stream_handle):
                return False
            self._check_buffer_sizes()
            if self.strategy == FakeExecutionContextAllocationStrategy.USER_MANAGED and not self._memory:
                raise AssertionError(
                    f"execute_async_v3 on {self.engine.label}: USER_MANAGED context without device memory"
                )
            cuda.enqueue(
                stream_handle,
                "execute_async_v3",
                self.engine.plan["exec_ms"],
                self._work(stream_handle),
                tuple(self.addresses.values()),
            )
        return self._trt.execute_result

    def _allocate_outputs(self, dds: list[str], stream_handle: int) -> bool:
        """Ask each output served by an allocator (data-dependent, or with no address) for its
        memory, then tell its shape; False: an allocator gave nullptr (the enqueue fails)."""
        trt, e, cuda = self._trt, self.engine, self._trt.cuda
        self.placed = {}
        for name in e._names:
            alloc = self.allocators.get(name)
            if alloc is None or (name not in dds and name in self.addresses):
                continue
            shape = self.get_tensor_shape(name)
            if name in dds:
                rows = int(trt.output_rows.get(name, 0))
                shape = tuple(rows if i == 0 and d < 0 else d for i, d in enumerate(shape))
            size = max(int(np.prod(shape)) * np.dtype(_NP[e.get_tensor_dtype(name)]).itemsize, 1)
            current = self.addresses.get(name, 0)
            ptr = _reallocate(trt, alloc, name, current, size, stream_handle)
            if not ptr:
                return False
            if ptr % 256:
                raise AssertionError(
                    f"reallocate_output_async({name!r}) returned {ptr:#x}: not 256-byte aligned"
                )
            if cuda.device_bytes_at(ptr) < size:
                raise AssertionError(
                    f"reallocate_output_async({name!r}, size={size}) returned {ptr:#x}, which holds "
                    f"{cuda.device_bytes_at(ptr)} B: TensorRT would write past it"
                )
            self.placed[name] = (ptr, shape)
            trt._record("IOutputAllocator.notify_shape", name, shape)
            with contextlib.suppress(Exception):  # the binding prints it and goes on
                alloc.notify_shape(name, FakeDims(shape))
        return True

    def _uncapturable(self) -> str:
        """Why this enqueue cannot be captured ("" if it can)."""
        e = self.engine
        for name in e._names:
            if e.get_tensor_mode(name) == FakeTensorIOMode.OUTPUT and any(
                d < 0 for d in self.get_tensor_shape(name)
            ):
                return f"output {name!r} is data-dependent: its output allocator allocates during the capture"
        allocating = sorted(set(e.plan.get("plugins", ())) & self._trt.plugin_allocates)
        if allocating:
            return f"plugin {allocating[0]} allocates in its enqueue"
        if e.plan.get("dla_core", -1) >= 0:
            return "a DLA engine (whether DLA work can be captured is unconfirmed)"
        return ""

    def _work(self, stream_handle: int):
        """What this enqueue does to memory, on the state set now (a graph keeps this state)."""
        trt, e = self._trt, self.engine
        cuda, generation, memory = trt.cuda, self.generation, self._memory
        shapes = {n: self.get_tensor_shape(n) for n in self.addresses}
        addresses = dict(self.addresses)
        for n, (ptr, shape) in self.placed.items():  # where the output allocators put them
            addresses[n], shapes[n] = ptr, shape
        shared = self.strategy == FakeExecutionContextAllocationStrategy.USER_MANAGED

        def arrays() -> dict[str, np.ndarray]:
            out = {}
            for n, a in addresses.items():
                dtype = np.dtype(_NP[e.get_tensor_dtype(n)])
                raw = cuda.view(a, int(np.prod(shapes[n])) * dtype.itemsize)
                out[n] = raw.view(dtype).reshape(shapes[n])
            return out

        baked = {n: v.copy() for n, v in arrays().items()} if trt.bake_inputs and trt.kernel else None

        def run() -> None:
            if self.generation != generation:
                raise AssertionError(
                    f"{e.label}: a graph replayed after its execution context changed (shapes, addresses or "
                    "device memory set after the capture): it would compute with the captured ones"
                )
            if shared:
                last = trt.scratch_streams.get(memory)
                other = cuda.streams.get(last) if last is not None else None
                if other is not None and last != stream_handle and other.pending:
                    raise AssertionError(
                        f"{e.label}: two execution contexts use the same device memory at once "
                        "(undefined behaviour)"
                    )
                trt.scratch_streams[memory] = stream_handle
            if trt.kernel is None:
                return
            now = arrays()
            source = baked if baked is not None else now
            ins = {n: v for n, v in source.items() if e.get_tensor_mode(n) == FakeTensorIOMode.INPUT}
            outs = {n: v for n, v in now.items() if e.get_tensor_mode(n) == FakeTensorIOMode.OUTPUT}
            trt.kernel(e.label, ins, outs)

        return run


def _reallocate(trt: FakeTensorRT, alloc: Any, name: str, current: int, size: int, stream: int) -> int:
    """PyOutputAllocator.reallocateOutputAsync: the async override, else the deprecated one,
    else nullptr; an exception or a value that is not an int is printed and read as nullptr."""
    trt._record("IOutputAllocator.reallocate_output_async", name, current, size, 256, stream)
    try:
        fn = getattr(alloc, "reallocate_output_async", None)
        if fn is not None:
            ptr = fn(name, current, size, 256, stream)
        else:
            legacy = getattr(alloc, "reallocate_output", None)
            ptr = legacy(name, current, size, 256) if legacy is not None else 0
    except Exception:
        return 0
    return ptr if isinstance(ptr, int) and not isinstance(ptr, bool) else 0


def _check_sizes(ctx: FakeExecutionContext) -> None:
    """Every bound buffer must hold the tensor's volume x itemsize: TensorRT writes all of it."""
    cuda, e = ctx._trt.cuda, ctx.engine
    for name, address in ctx.addresses.items():
        if name in ctx.placed:
            continue  # its allocator's memory, checked when it was given
        shape = ctx.get_tensor_shape(name)
        if any(d < 0 for d in shape):
            raise AssertionError(f"execute_async_v3 on {e.label}: {name!r} has unknown shape {shape}")
        need = int(np.prod(shape)) * np.dtype(_NP[e.get_tensor_dtype(name)]).itemsize
        have = cuda.device_bytes_at(address)
        if have < need:
            raise AssertionError(
                f"execute_async_v3 on {e.label}: {name!r} {shape} needs {need} B at {address:#x}, "
                f"the buffer holds {have} B"
            )


FakeExecutionContext._check_buffer_sizes = _check_sizes  # type: ignore[attr-defined]


class FakeRuntime:
    """trt.Runtime(logger): ``DLA_core`` and ``deserialize_cuda_engine``."""

    def __init__(self, trt: FakeTensorRT, logger: Any) -> None:
        self._trt = trt
        self.DLA_core = -1
        trt._record("Runtime", type(logger).__name__)

    def deserialize_cuda_engine(self, serialized_engine: Any) -> FakeEngine | None:
        data = bytes(serialized_engine)
        self._trt._record("Runtime.deserialize_cuda_engine", len(data), self.DLA_core)
        if self._trt.cuda is not None and self._trt.cuda.initialized:
            self._trt.cuda._legacy_stream("deserialize_cuda_engine (the weights' upload)")
        if not data.startswith(MAGIC):
            return None
        try:
            plan = json.loads(data[len(MAGIC) :])
        except ValueError:
            return None
        if plan.get("version") != self._trt.__version__:
            return None  # "not compatible with this version of TensorRT"
        return FakeEngine(self._trt, plan)
