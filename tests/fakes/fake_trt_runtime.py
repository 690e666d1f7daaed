"""FakeTensorRT's runtime: the engine, the execution context and its rules (see fake_tensorrt.py)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

from fakes.fake_trt_types import _NP, MAGIC, FakeDataType, FakeTensorIOMode

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

    def create_execution_context(self) -> FakeExecutionContext | None:
        self._trt._record("ICudaEngine.create_execution_context", self.label)
        if self.label in self._trt.context_fails:
            return None  # the real call returns None (out of memory, say), it does not raise
        return FakeExecutionContext(self._trt, self)


class FakeExecutionContext:
    """IExecutionContext; enforces the shape/address/stream rules of ``execute_async_v3``."""

    def __init__(self, trt: FakeTensorRT, engine: FakeEngine) -> None:
        self._trt, self.engine = trt, engine
        self.input_shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}

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
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        self._trt._record("IExecutionContext.execute_async_v3", self.engine.label, stream_handle)
        if not isinstance(stream_handle, int) or isinstance(stream_handle, bool):
            raise AssertionError(
                f"execute_async_v3 takes the stream's int handle, got {type(stream_handle).__name__}"
            )
        self._check_shapes_set("execute_async_v3")
        missing = [n for n in self.engine._names if n not in self.addresses]
        if missing:
            raise AssertionError(f"execute_async_v3 on {self.engine.label}: no address set for {missing}")
        if self._trt.cuda is not None:
            self._check_buffer_sizes()
            self._trt.cuda.enqueue(stream_handle, "execute_async_v3", self.engine.plan["exec_ms"])
        return self._trt.execute_result


def _check_sizes(ctx: FakeExecutionContext) -> None:
    """Every bound buffer must hold the tensor's volume x itemsize: TensorRT writes all of it."""
    cuda, e = ctx._trt.cuda, ctx.engine
    for name, address in ctx.addresses.items():
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
        if not data.startswith(MAGIC):
            return None
        try:
            plan = json.loads(data[len(MAGIC) :])
        except ValueError:
            return None
        if plan.get("version") != self._trt.__version__:
            return None  # "not compatible with this version of TensorRT"
        return FakeEngine(self._trt, plan)
