"""FakeTensorRT: a fake of the ``tensorrt`` module (TensorRT 10.3 Python API) for tests.

Mirrors only the names and signatures the edge-agent code uses, as documented in the
TensorRT 10.3 Python bindings (NVIDIA/TensorRT tag v10.3.0, summarised in
/work/shared/reference/jetson-apis.md, section 1): ``Logger``, ``Builder``,
``OnnxParser``, ``INetworkDefinition`` (``add_input``/``add_cast``/``add_shuffle``/
``add_constant``/``add_gather``/``add_scale``/``mark_output``), ``IBuilderConfig``,
``IOptimizationProfile``, ``ITimingCache``, ``IProgressMonitor``,
``IInt8EntropyCalibrator2``, ``Runtime``, ``ICudaEngine``, ``IExecutionContext``, the
enums and ``nptype``.

- The parser reads the real ONNX file (with ``onnx``), so the network's inputs, outputs and
  layers are the model's own; dynamic dimensions are -1, as in TensorRT.
- A serialized "engine" is ``MAGIC`` + JSON describing its IO tensors; ``Runtime``
  returns None for any other bytes or for a plan of another TensorRT version, like the
  real ``deserialize_cuda_engine``.
- ``build_serialized_network`` returns None (a failed build) where TensorRT fails: a
  dynamic input with no optimisation profile, a DLA build without FP16/INT8, a DLA core
  the device lacks, layers the DLA cannot run without GPU_FALLBACK. It runs the INT8
  calibrator and the progress monitor as TensorRT does.
- Every call is recorded in order in ``calls`` (``(name, args)``), a list that can be
  shared with a FakeCudaDriver.
- The execution context enforces the documented rules with AssertionError: dynamic input
  shapes set before ``get_tensor_shape`` and ``execute_async_v3``, every IO tensor given
  an address before ``execute_async_v3``, an int stream handle. Linked to a FakeCudaDriver
  (``cuda=``) it also requires a current CUDA context, a real stream and device
  addresses, and marks the stream busy until it is synchronised.
"""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

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


# -- network ---------------------------------------------------------------------------


class FakeTensor:
    """ITensor: ``name`` and ``dtype`` are settable; ``shape`` comes from its producer."""

    def __init__(self, name: str, dtype: FakeDataType, shape: tuple[int, ...] = (), producer: Any = None):
        self.name = name
        self.dtype = dtype
        self._shape = tuple(shape)
        self._producer = producer

    @property
    def shape(self) -> tuple[int, ...]:
        return self._producer.output_shape() if self._producer is not None else self._shape


class FakeLayer:
    """ILayer: ``name``, ``type`` and ``get_output(0)``."""

    def __init__(self, kind: str, name: str, inputs: list[FakeTensor], dtype: FakeDataType | None = None):
        self.type = kind
        self.name = name
        self.inputs = inputs
        dtype = dtype or (inputs[0].dtype if inputs else FakeDataType.FLOAT)
        self._output = FakeTensor(f"({name} output)", dtype, producer=self)

    def output_shape(self) -> tuple[int, ...]:
        return self.inputs[0].shape

    def get_output(self, index: int) -> FakeTensor:
        if index != 0:
            raise IndexError(f"{self.name} has one output")
        return self._output


class FakeShuffleLayer(FakeLayer):
    def __init__(self, trt: FakeTensorRT, name: str, inputs: list[FakeTensor]) -> None:
        super().__init__("Shuffle", name, inputs)
        self._trt = trt
        self._first_transpose: tuple[int, ...] | None = None

    @property
    def first_transpose(self) -> tuple[int, ...] | None:
        return self._first_transpose

    @first_transpose.setter
    def first_transpose(self, perm: Any) -> None:
        perm = tuple(int(p) for p in perm)
        self._trt._record("IShuffleLayer.first_transpose=", perm)
        self._first_transpose = perm

    def output_shape(self) -> tuple[int, ...]:
        shape = self.inputs[0].shape
        if self.first_transpose is None:
            return shape
        perm = tuple(self.first_transpose)
        if sorted(perm) != list(range(len(shape))):
            raise AssertionError(f"first_transpose {perm} is not a permutation of {len(shape)} axes")
        return tuple(shape[p] for p in perm)


class FakeConstantLayer(FakeLayer):
    def __init__(self, name: str, shape: tuple[int, ...], weights: np.ndarray) -> None:
        dtype = FakeDataType.INT32 if weights.dtype == np.int32 else FakeDataType.FLOAT
        super().__init__("Constant", name, [], dtype)
        self.shape, self.weights = tuple(shape), weights

    def output_shape(self) -> tuple[int, ...]:
        return self.shape


class FakeNetwork:
    """INetworkDefinition."""

    def __init__(self, trt: FakeTensorRT, flags: int) -> None:
        self._trt = trt
        self.flags = flags
        self.label = "network"
        self.layers: list[FakeLayer] = []
        self.inputs: list[FakeTensor] = []
        self.outputs: list[FakeTensor] = []

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, index: int) -> FakeLayer:
        return self.layers[index]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> FakeTensor:
        return self.inputs[index]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_output(self, index: int) -> FakeTensor:
        return self.outputs[index]

    def _layer(self, layer: FakeLayer) -> FakeLayer:
        self.layers.append(layer)
        return layer

    def _name(self, kind: str) -> str:
        return f"{kind}_{len(self.layers)}"

    def add_input(self, name: str, dtype: FakeDataType, shape: Any) -> FakeTensor:
        self._trt._record("INetworkDefinition.add_input", name, dtype, tuple(shape))
        t = FakeTensor(name, dtype, tuple(shape))
        self.inputs.append(t)
        return t

    def add_cast(self, input: FakeTensor, to_type: FakeDataType) -> FakeLayer:
        self._trt._record("INetworkDefinition.add_cast", input.name, to_type)
        return self._layer(FakeLayer("Cast", self._name("Cast"), [input], to_type))

    def add_shuffle(self, input: FakeTensor) -> FakeShuffleLayer:
        self._trt._record("INetworkDefinition.add_shuffle", input.name)
        return self._layer(FakeShuffleLayer(self._trt, self._name("Shuffle"), [input]))

    def add_constant(self, shape: Any, weights: Any) -> FakeConstantLayer:
        weights = np.asarray(weights)
        self._trt._record("INetworkDefinition.add_constant", tuple(shape), weights.copy())
        return self._layer(FakeConstantLayer(self._name("Constant"), tuple(shape), weights))

    def add_gather(self, input: FakeTensor, indices: FakeTensor, axis: int) -> FakeLayer:
        self._trt._record("INetworkDefinition.add_gather", input.name, indices.name, axis)
        return self._layer(FakeLayer("Gather", self._name("Gather"), [input, indices]))

    def add_scale(
        self, input: FakeTensor, mode: FakeScaleMode, shift: Any = None, scale: Any = None, power: Any = None
    ) -> FakeLayer:
        if len(input.shape) < 3:
            raise AssertionError("add_scale: the input needs at least 3 dimensions")
        arrays = [None if a is None else np.asarray(a).copy() for a in (shift, scale, power)]
        self._trt._record("INetworkDefinition.add_scale", input.name, mode, *arrays)
        return self._layer(FakeLayer("Scale", self._name("Scale"), [input]))

    def mark_output(self, tensor: FakeTensor) -> None:
        self._trt._record("INetworkDefinition.mark_output", tensor.name)
        self.outputs.append(tensor)


class FakeParserError:
    def __init__(self, desc: str) -> None:
        self._desc = desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return self._desc


class FakeOnnxParser:
    """trt.OnnxParser(network, logger): fills the network from the real ONNX file."""

    def __init__(self, trt: FakeTensorRT, network: FakeNetwork, logger: Any) -> None:
        self._trt, self._network = trt, network
        self._errors: list[FakeParserError] = []
        trt._record("OnnxParser", type(logger).__name__)

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> FakeParserError:
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()

    def parse_from_file(self, model: str) -> bool:
        self._trt._record("OnnxParser.parse_from_file", model)
        if self._trt.parse_error:
            self._errors.append(FakeParserError(self._trt.parse_error))
            return False
        import onnx

        try:
            proto = onnx.load(model)
        except Exception as e:  # the real parser reports unreadable files as errors too
            self._errors.append(FakeParserError(f"failed to load {model}: {type(e).__name__}: {e}"))
            return False
        net = self._network
        net.label = Path(model).name
        inits = {i.name for i in proto.graph.initializer}

        def tensor(vi: Any) -> FakeTensor:
            tt = vi.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
            return FakeTensor(vi.name, _FROM_ONNX[tt.elem_type], dims)

        plugins = sorted({n.op_type for n in proto.graph.node if n.op_type in PLUGINS})
        if plugins and not self._trt.plugins_registered:
            # What the real parser says for a plugin op it finds no creator for.
            self._errors.append(FakeParserError(f"No importer registered for op: {plugins[0]}"))
            return False
        net.inputs = [tensor(vi) for vi in proto.graph.input if vi.name not in inits]
        for i, node in enumerate(proto.graph.node):
            net.layers.append(FakeLayer(node.op_type, node.name or f"{node.op_type}_{i}", net.inputs[:1]))
        net.outputs = [tensor(vi) for vi in proto.graph.output]
        return True


# -- builder ---------------------------------------------------------------------------


class FakeOptimizationProfile:
    def __init__(self, trt: FakeTensorRT) -> None:
        self._trt = trt
        self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

    def set_shape(self, input: str, min: Any, opt: Any, max: Any) -> None:
        shapes = tuple(tuple(int(d) for d in s) for s in (min, opt, max))
        self._trt._record("IOptimizationProfile.set_shape", input, *shapes)
        lo, mid, hi = shapes
        if not (len(lo) == len(mid) == len(hi)) or not all(0 <= a <= b <= c for a, b, c in zip(lo, mid, hi)):
            raise AssertionError(f"set_shape({input!r}): need same rank and 0 <= min <= opt <= max")
        self.shapes[input] = shapes


class FakeTimingCache:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def serialize(self) -> bytes:
        return self.data or b"FAKE-TIMING-CACHE"


class FakeBuilderConfig:
    """IBuilderConfig: properties are recorded as ``IBuilderConfig.<name>=`` calls."""

    _PROPERTIES = (
        "builder_optimization_level",
        "profiling_verbosity",
        "default_device_type",
        "DLA_core",
        "progress_monitor",
        "int8_calibrator",
    )

    def __init__(self, trt: FakeTensorRT) -> None:
        object.__setattr__(self, "_trt", trt)
        object.__setattr__(self, "flags_set", set())
        object.__setattr__(self, "pools", {})
        object.__setattr__(self, "profiles", [])
        object.__setattr__(self, "timing_cache", None)
        object.__setattr__(self, "builder_optimization_level", 3)
        object.__setattr__(self, "profiling_verbosity", FakeProfilingVerbosity.LAYER_NAMES_ONLY)
        object.__setattr__(self, "default_device_type", FakeDeviceType.GPU)
        object.__setattr__(self, "DLA_core", -1)
        object.__setattr__(self, "progress_monitor", None)
        object.__setattr__(self, "int8_calibrator", None)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._PROPERTIES:
            raise AttributeError(f"IBuilderConfig has no settable attribute {name!r}")
        if name == "builder_optimization_level" and not 0 <= value <= 5:
            raise AssertionError(f"builder_optimization_level {value} is outside 0..5")
        self._trt._record(f"IBuilderConfig.{name}=", value)
        object.__setattr__(self, name, value)

    def set_memory_pool_limit(self, pool: FakeMemoryPoolType, pool_size: int) -> None:
        self._trt._record("IBuilderConfig.set_memory_pool_limit", pool, pool_size)
        self.pools[pool] = pool_size

    def set_flag(self, flag: FakeBuilderFlag) -> None:
        self._trt._record("IBuilderConfig.set_flag", flag)
        self.flags_set.add(flag)

    def get_flag(self, flag: FakeBuilderFlag) -> bool:
        return flag in self.flags_set

    def can_run_on_DLA(self, layer: FakeLayer) -> bool:
        self._trt._record("IBuilderConfig.can_run_on_DLA", layer.name)
        return layer.type not in self._trt.dla_unsupported

    def add_optimization_profile(self, profile: FakeOptimizationProfile) -> int:
        self._trt._record("IBuilderConfig.add_optimization_profile", dict(profile.shapes))
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def set_calibration_profile(self, profile: FakeOptimizationProfile) -> bool:
        self._trt._record("IBuilderConfig.set_calibration_profile", dict(profile.shapes))
        object.__setattr__(self, "calibration_profile", profile)
        return True

    def create_timing_cache(self, serialized_timing_cache: bytes) -> FakeTimingCache | None:
        data = bytes(serialized_timing_cache)
        self._trt._record("IBuilderConfig.create_timing_cache", data)
        if data and not data.startswith(b"FAKE-TIMING-CACHE"):
            return None  # not a timing cache: TensorRT logs an error and returns None
        return FakeTimingCache(data)

    def set_timing_cache(self, cache: FakeTimingCache, ignore_mismatch: bool) -> bool:
        self._trt._record("IBuilderConfig.set_timing_cache", cache.data, ignore_mismatch)
        if b"OTHER-DEVICE" in cache.data and not ignore_mismatch:
            return False  # made on another device: refused
        object.__setattr__(self, "timing_cache", cache)
        return True

    def get_timing_cache(self) -> FakeTimingCache | None:
        self._trt._record("IBuilderConfig.get_timing_cache")
        return self.timing_cache


class FakeBuilder:
    """trt.Builder(logger)."""

    def __init__(self, trt: FakeTensorRT, logger: Any) -> None:
        self._trt = trt
        trt._record("Builder", type(logger).__name__)

    @property
    def num_DLA_cores(self) -> int:
        return self._trt.num_dla_cores

    def create_network(self, flags: int = 0) -> FakeNetwork:
        self._trt._record("Builder.create_network", flags)
        return FakeNetwork(self._trt, flags)

    def create_builder_config(self) -> FakeBuilderConfig:
        self._trt._record("Builder.create_builder_config")
        return FakeBuilderConfig(self._trt)

    def create_optimization_profile(self) -> FakeOptimizationProfile:
        self._trt._record("Builder.create_optimization_profile")
        return FakeOptimizationProfile(self._trt)

    def build_serialized_network(self, network: FakeNetwork, config: FakeBuilderConfig) -> bytes | None:
        trt = self._trt
        trt._record("Builder.build_serialized_network", network.label)
        reason = self._refuse(network, config)
        if reason or trt.build_fails:
            trt.build_failures.append(reason or "build_fails set")
            return None
        monitor = config.progress_monitor
        if monitor is not None:
            monitor.phase_start("Building engine", None, 10)
            for step in range(10):
                if not monitor.step_complete("Building engine", step):
                    return None
            monitor.phase_finish("Building engine")
        if FakeBuilderFlag.INT8 in config.flags_set:
            self._calibrate(network, config.int8_calibrator)
        if config.timing_cache is not None:  # the build adds its layer timings
            config.timing_cache.data = (config.timing_cache.data or b"FAKE-TIMING-CACHE") + b"+"
        dla = config.default_device_type == FakeDeviceType.DLA
        profile = config.profiles[0].shapes if config.profiles else {}
        io = [
            {"name": t.name, "mode": "INPUT", "shape": list(t.shape), "dtype": t.dtype.name}
            for t in network.inputs
        ] + [
            {"name": t.name, "mode": "OUTPUT", "shape": list(t.shape), "dtype": t.dtype.name}
            for t in network.outputs
        ]
        plan = {
            "version": trt.__version__,
            "label": network.label,
            "io": io,
            "profile": {k: [list(s) for s in v] for k, v in profile.items()},
            "dla_core": config.DLA_core if dla else -1,
            "flags": sorted(f.name for f in config.flags_set),
            "exec_ms": trt.exec_ms.get(network.label, 1.5),
        }
        trt.builds += 1
        return MAGIC + json.dumps(plan).encode()

    def _refuse(self, network: FakeNetwork, config: FakeBuilderConfig) -> str:
        profile = config.profiles[0].shapes if config.profiles else {}
        for t in network.inputs:
            if any(d < 0 for d in t.shape) and t.name not in profile:
                return f"input {t.name!r} is dynamic and no optimization profile defines it"
        if not network.outputs:
            return "the network has no outputs"
        if config.default_device_type == FakeDeviceType.DLA:
            if not 0 <= config.DLA_core < self._trt.num_dla_cores:
                return f"DLA core {config.DLA_core} does not exist ({self._trt.num_dla_cores} cores)"
            if not config.flags_set & {FakeBuilderFlag.FP16, FakeBuilderFlag.INT8}:
                return "the DLA needs FP16 or INT8"
            off = [la.name for la in network.layers if la.type in self._trt.dla_unsupported]
            if off and FakeBuilderFlag.GPU_FALLBACK not in config.flags_set:
                return f"layers {off} cannot run on the DLA and GPU_FALLBACK is not set"
        return ""

    def _calibrate(self, network: FakeNetwork, calibrator: Any) -> None:
        if calibrator is None:
            return
        if not getattr(calibrator, "_fake_initialised", False):
            raise AssertionError("the calibrator did not call IInt8EntropyCalibrator2.__init__")
        if calibrator.read_calibration_cache():
            return
        names = [t.name for t in network.inputs]
        for _ in range(10_000):
            if not calibrator.get_batch(names):
                break
        calibrator.write_calibration_cache(b"FAKE-CALIBRATION-CACHE")


# -- runtime ---------------------------------------------------------------------------


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

    def create_execution_context(self) -> FakeExecutionContext:
        self._trt._record("ICudaEngine.create_execution_context", self.label)
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
            raise AssertionError(f"set_input_shape({name!r}): not an input of {e.label}")
        declared = e.get_tensor_shape(name)
        if len(shape) != len(declared) or any(d >= 0 and d != s for d, s in zip(declared, shape)):
            raise AssertionError(f"set_input_shape({name!r}, {shape}): the engine's shape is {declared}")
        lo, _, hi = e.plan["profile"].get(name, (declared, declared, declared))
        if not all(a <= s <= b for a, s, b in zip(lo, shape, hi)):
            raise AssertionError(f"set_input_shape({name!r}, {shape}) is outside the profile {lo}..{hi}")
        self.input_shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        self._check_shapes_set(f"get_tensor_shape({name!r})")
        e = self.engine
        if name in self.input_shapes:
            return self.input_shapes[name]
        batch = next(iter(self.input_shapes.values()), (1,))[0]
        return tuple(batch if d < 0 else d for d in e.get_tensor_shape(name))

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
            self._trt.cuda.enqueue(stream_handle, "execute_async_v3", self.engine.plan["exec_ms"])
        return self._trt.execute_result


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


class FakeTensorRT:
    """A fake ``tensorrt`` module. One instance per test; configure it with the arguments."""

    Logger = FakeLogger
    DataType = FakeDataType
    TensorIOMode = FakeTensorIOMode
    MemoryPoolType = FakeMemoryPoolType
    BuilderFlag = FakeBuilderFlag
    DeviceType = FakeDeviceType
    ProfilingVerbosity = FakeProfilingVerbosity
    ScaleMode = FakeScaleMode
    IProgressMonitor = FakeIProgressMonitor
    IInt8EntropyCalibrator2 = FakeIInt8EntropyCalibrator2

    def __init__(
        self,
        version: str = "10.3.0",
        num_dla_cores: int = 0,
        calls: list[tuple[str, tuple]] | None = None,
        cuda: Any = None,
        dla_unsupported: tuple[str, ...] = ("Cast", "Shape"),
    ) -> None:
        self.__version__ = version
        self.num_dla_cores = num_dla_cores
        self.calls = calls if calls is not None else []
        self.cuda = cuda
        self.dla_unsupported = set(dla_unsupported)
        self.parse_error = ""  # set: parse_from_file fails with this error
        self.build_fails = False  # set: build_serialized_network returns None
        self.build_failures: list[str] = []
        self.execute_result = True
        self.exec_ms: dict[str, float] = {"network": 0.25}  # device ms per enqueue, by network label
        self.builds = 0
        self.plugins_registered = False

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def init_libnvinfer_plugins(self, logger: Any, namespace: str) -> bool:
        """Registers TensorRT's own plugins (EfficientNMS_TRT, ...) with the plugin registry."""
        self._record("init_libnvinfer_plugins", namespace)
        self.plugins_registered = True
        return True

    def Builder(self, logger: Any) -> FakeBuilder:
        return FakeBuilder(self, logger)

    def OnnxParser(self, network: FakeNetwork, logger: Any) -> FakeOnnxParser:
        return FakeOnnxParser(self, network, logger)

    def Runtime(self, logger: Any) -> FakeRuntime:
        return FakeRuntime(self, logger)

    @staticmethod
    def nptype(trt_type: FakeDataType) -> type:
        return _NP[trt_type]

    # -- for assertions ------------------------------------------------------------------

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    def args_of(self, name: str) -> list[tuple]:
        return [args for n, args in self.calls if n == name]
