"""The enums, constants and base classes of FakeTensorRT (see fake_tensorrt.py)."""

from __future__ import annotations

import enum

import numpy as np

MAGIC = b"FAKE-TRT-PLAN\x00"
#: Ops of TensorRT's plugin library: the parser knows them once ``init_libnvinfer_plugins`` ran.
PLUGINS = frozenset({"EfficientNMS_TRT", "BatchedNMSDynamic_TRT", "EfficientNMS_ONNX_TRT"})


class FakeDataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    UINT8 = 5
    INT64 = 8


_NP = {
    FakeDataType.FLOAT: np.float32,
    FakeDataType.HALF: np.float16,
    FakeDataType.INT8: np.int8,
    FakeDataType.INT32: np.int32,
    FakeDataType.BOOL: np.bool_,
    FakeDataType.UINT8: np.uint8,
    FakeDataType.INT64: np.int64,
}
# onnx.TensorProto element types
_FROM_ONNX = {
    1: FakeDataType.FLOAT,
    10: FakeDataType.HALF,
    3: FakeDataType.INT8,
    6: FakeDataType.INT32,
    9: FakeDataType.BOOL,
    2: FakeDataType.UINT8,
    7: FakeDataType.INT64,
}


class FakeExecutionContextAllocationStrategy(enum.Enum):
    """trt.ExecutionContextAllocationStrategy (TensorRT 10)."""

    STATIC = 0
    ON_PROFILE_CHANGE = 1
    USER_MANAGED = 2


class FakeTensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class FakeMemoryPoolType(enum.Enum):
    WORKSPACE = 0
    DLA_MANAGED_SRAM = 1
    DLA_LOCAL_DRAM = 2
    DLA_GLOBAL_DRAM = 3


class FakeBuilderFlag(enum.Enum):
    FP16 = 0
    INT8 = 1
    DEBUG = 2
    GPU_FALLBACK = 3
    REFIT = 4


class FakeDeviceType(enum.Enum):
    GPU = 0
    DLA = 1


class FakeProfilingVerbosity(enum.Enum):
    LAYER_NAMES_ONLY = 0
    NONE = 1
    DETAILED = 2


class FakeScaleMode(enum.Enum):
    UNIFORM = 0
    CHANNEL = 1
    ELEMENTWISE = 2


class FakeLogger:
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4

    def __init__(self, min_severity: int = WARNING) -> None:
        self.min_severity = min_severity


class FakeIProgressMonitor:
    """trt.IProgressMonitor: subclasses call ``__init__`` and override the three methods."""

    def __init__(self) -> None:
        self._fake_initialised = True


class FakeIInt8EntropyCalibrator2:
    """trt.IInt8EntropyCalibrator2 (deprecated in 10.1, still working in 10.x)."""

    def __init__(self) -> None:
        self._fake_initialised = True


class FakeIOutputAllocator:
    """trt.IOutputAllocator (TensorRT 10): subclasses call ``__init__`` and override
    ``reallocate_output_async(tensor_name, memory, size, alignment, stream)`` (or the
    deprecated ``reallocate_output(tensor_name, memory, size, alignment)``) and
    ``notify_shape(tensor_name, shape)``. The binding defines only ``__init__`` on the base
    (python/src/infer/pyCore.cpp: ``py::class_<IOutputAllocator, PyOutputAllocator>`` with
    ``py::init<>()``): the callbacks are the subclass's own."""

    def __init__(self) -> None:
        self._fake_initialised = True


class FakeDims(tuple):
    """trt.Dims as ``notify_shape`` receives it: a sequence of ints (len, index, iterate)."""
