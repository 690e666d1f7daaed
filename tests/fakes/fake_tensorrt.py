"""FakeTensorRT: a fake of the ``tensorrt`` module (TensorRT 10.3 Python API) for tests.

Mirrors only the names and signatures the edge-agent code uses, as documented in the
TensorRT 10.3 Python bindings (NVIDIA/TensorRT tag v10.3.0, summarised in
/work/shared/reference/jetson-apis.md, section 1): ``Logger``, ``Builder``,
``OnnxParser``, ``INetworkDefinition`` (``add_input``/``add_cast``/``add_shuffle``/
``add_constant``/``add_gather``/``add_scale``/``mark_output``), ``IBuilderConfig``,
``IOptimizationProfile``, ``ITimingCache``, ``IProgressMonitor``,
``IInt8EntropyCalibrator2``, ``Runtime``, ``ICudaEngine``, ``IExecutionContext``,
``IOutputAllocator``, the enums and ``nptype``.

- The parser reads the real ONNX file (with ``onnx``), so the network's inputs, outputs and
  layers are the model's own; dynamic dimensions are -1, as in TensorRT.
- A serialized "engine" is ``MAGIC`` + JSON describing its IO tensors; ``Runtime``
  returns None for any other bytes or for a plan of another TensorRT version, like the
  real ``deserialize_cuda_engine``.
- ``build_serialized_network`` returns None (a failed build) where TensorRT fails: a
  dynamic input with no optimisation profile, a DLA build without FP16/INT8, a DLA core
  the device lacks, layers the DLA cannot run without GPU_FALLBACK, a DLA profile whose
  min differs from its max (the DLA takes no dynamic shapes), a Shuffle of a uint8 tensor,
  a Scale whose input has fewer than 4 dimensions. It runs the INT8 calibrator and the
  progress monitor as the bindings do: an exception raised in ``get_batch`` is swallowed
  and read as "no more data" (pyInt8.cpp's trampoline returns false), one raised in the
  progress monitor cancels the build (pyCore.cpp's ``stepComplete`` trampoline catches it
  and returns false). ``get_batch`` must return None/[] (the end) or a list of one plain
  int device address per input name. A network with QuantizeLinear/DequantizeLinear
  (explicit quantisation) never calls the calibrator. ``calibrate_on_thread`` runs the
  calibrator on a builder thread, where no CUDA context is current (which thread TensorRT
  uses is unconfirmed); what it raises is raised again after the join, and a join that
  times out fails the build.
- Split for size: the enums and base classes are in ``fake_trt_types``, the network and
  parser in ``fake_trt_network``, the engine and execution context in ``fake_trt_runtime``;
  every name is importable from here.
- Every call is recorded in order in ``calls`` (``(name, args)``), a list that can be
  shared with a FakeCudaDriver.
- The execution context enforces the documented rules with AssertionError: dynamic input
  shapes set before ``get_tensor_shape`` and ``execute_async_v3``, every IO tensor given
  an address before ``execute_async_v3``, an int stream handle. ``set_input_shape`` returns
  False for a shape the engine refuses or a name that is not an input (the binding returns
  the C++ bool, it does not raise).
  Linked to a FakeCudaDriver (``cuda=``) it also requires a current CUDA context, a real
  stream and device addresses, checks that every bound buffer holds the tensor's volume x
  itemsize (TensorRT writes that much, whatever was allocated), and marks the stream busy
  until it is synchronised. A dynamic output dimension stays -1 after the input shapes are
  set unless it is axis 0 under the input's batch axis's ONNX name: a data-dependent output
  (NonMaxSuppression inside the graph: [num_selected, 3]), which needs an output allocator
  (``set_output_allocator``; the protocol is in fake_trt_runtime's docstring).
"""

from __future__ import annotations

import json
from typing import Any

from fakes.fake_trt_network import (  # noqa: F401 (re-exported)
    FakeConstantLayer,
    FakeLayer,
    FakeNetwork,
    FakeOnnxParser,
    FakeParserError,
    FakeShuffleLayer,
    FakeTensor,
)
from fakes.fake_trt_runtime import FakeEngine, FakeExecutionContext, FakeRuntime  # noqa: F401
from fakes.fake_trt_types import (
    _NP,
    MAGIC,
    PLUGINS,
    FakeBuilderFlag,
    FakeDataType,
    FakeDeviceType,
    FakeExecutionContextAllocationStrategy,
    FakeIInt8EntropyCalibrator2,
    FakeIOutputAllocator,
    FakeIProgressMonitor,
    FakeLogger,
    FakeMemoryPoolType,
    FakeProfilingVerbosity,
    FakeScaleMode,
    FakeTensorIOMode,
)

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
        if not self._monitor(config.progress_monitor):
            trt.build_failures.append("cancelled by the progress monitor")
            return None
        if FakeBuilderFlag.INT8 in config.flags_set:
            if trt.calibrate_on_thread:
                import threading

                failed: list[BaseException] = []

                def run() -> None:
                    try:
                        self._calibrate(network, config.int8_calibrator)
                    except BaseException as e:  # raised again on the caller's thread
                        failed.append(e)

                t = threading.Thread(target=run, daemon=True)
                t.start()
                t.join(timeout=30)
                if t.is_alive():
                    raise AssertionError("calibration on the builder thread did not finish within 30 s")
                if failed:
                    raise failed[0]
            else:
                self._calibrate(network, config.int8_calibrator)
        if config.timing_cache is not None:  # the build adds its layer timings
            config.timing_cache.data = (config.timing_cache.data or b"FAKE-TIMING-CACHE") + b"+"
        dla = config.default_device_type == FakeDeviceType.DLA
        profile = config.profiles[0].shapes if config.profiles else {}

        def dims(t: FakeTensor) -> list[str]:
            return list(getattr(t, "dim_names", ())) or [""] * len(t.shape)

        io = [
            {"name": t.name, "mode": mode, "shape": list(t.shape), "dtype": t.dtype.name, "dims": dims(t)}
            for mode, tensors in (("INPUT", network.inputs), ("OUTPUT", network.outputs))
            for t in tensors
        ]
        plan = {
            "version": trt.__version__,
            "label": network.label,
            "io": io,
            "profile": {k: [list(s) for s in v] for k, v in profile.items()},
            "dla_core": config.DLA_core if dla else -1,
            "flags": sorted(f.name for f in config.flags_set),
            "exec_ms": trt.exec_ms.get(network.label, 1.5),
            "plugins": sorted({la.type for la in network.layers if la.type in PLUGINS}),
            "device_memory": trt.device_memory.get(network.label, 1 << 20),
        }
        trt.builds += 1
        return MAGIC + json.dumps(plan).encode()

    @staticmethod
    def _monitor(monitor: Any) -> bool:
        """Drive the monitor; False: cancelled (it said so, or it raised: the binding's catch)."""
        if monitor is None:
            return True
        try:
            monitor.phase_start("Building engine", None, 10)
            for step in range(10):
                if not monitor.step_complete("Building engine", step):
                    return False
            monitor.phase_finish("Building engine")
        except Exception:  # printed to stderr by the binding, then the build is cancelled
            return False
        return True

    def _refuse(self, network: FakeNetwork, config: FakeBuilderConfig) -> str:
        profile = config.profiles[0].shapes if config.profiles else {}
        for la in network.layers:
            if la.type == "Shuffle" and la.inputs[0].dtype == FakeDataType.UINT8:
                return f"{la.name}: a Shuffle of a uint8 tensor is not supported"
            if la.type == "Scale" and len(la.inputs[0].shape) < 4:
                return f"{la.name}: a Scale input needs at least 4 dimensions"
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
            ranged = [n for n, (lo, _, hi) in profile.items() if lo != hi]
            if ranged:
                return f"the DLA takes no dynamic shapes: profile min != max for {ranged}"
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
        if any(la.type in ("QuantizeLinear", "DequantizeLinear") for la in network.layers):
            return  # explicit quantisation: TensorRT ignores the calibrator
        names = [t.name for t in network.inputs]
        for _ in range(10_000):
            try:
                batch = calibrator.get_batch(names)
            except Exception:  # the binding's trampoline: an exception ends the data, silently
                batch = None
            if batch is None or (isinstance(batch, list) and not batch):
                break
            # The binding converts the list to void* device addresses, one per name.
            if not isinstance(batch, list) or len(batch) != len(names):
                raise AssertionError(
                    f"get_batch({names}) returned {batch!r}: need None or {len(names)} addresses"
                )
            if not all(type(a) is int for a in batch):
                raise AssertionError(f"get_batch returned {batch!r}: need plain int device addresses")
        calibrator.write_calibration_cache(b"FAKE-CALIBRATION-CACHE")


def zero_outputs(label: str, ins: dict, outs: dict) -> None:
    for out in outs.values():
        out[...] = 0


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
    IOutputAllocator = FakeIOutputAllocator
    ExecutionContextAllocationStrategy = FakeExecutionContextAllocationStrategy

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
        self.context_fails: set[str] = set()  # engine labels whose create_execution_context returns None
        self.exec_ms: dict[str, float] = {"network": 0.25}  # device ms per enqueue, by network label
        self.builds = 0
        self.plugins_registered = False
        self.calibrate_on_thread = False  # set: the calibrator runs on a thread of its own
        self.loggers = 0  # trt.Logger instances made through this module
        self.device_memory: dict[str, int] = {}  # activation bytes per context, by network label
        # What an enqueue computes: kernel(engine label, {input name: array}, {output name:
        # array}) writes the outputs. TensorRT writes every output on every enqueue; the
        # default writes zeros (a detector that finds nothing). None: outputs left as they are.
        self.kernel: Any = zero_outputs
        # Plugins whose enqueue allocates (cudaMalloc), which invalidates a stream capture.
        # Empty by default: TensorRT 10.3's EfficientNMS_TRT enqueue only launches kernels and
        # cudaMemsetAsync on its workspace (plugin/efficientNMSPlugin/efficientNMSInference.cu).
        self.plugin_allocates: set[str] = set()
        self.bake_inputs = False  # True: enqueues read their inputs when issued (see fake_trt_runtime)
        self.scratch_streams: dict[int, int] = {}  # user-managed device memory -> the stream last using it
        # Rows each data-dependent output gets per enqueue, by output name (its allocator is
        # asked for that many rows' bytes, then told the shape; the kernel writes them).
        self.output_rows: dict[str, int] = {}

    def version_at_least(self, major: int, minor: int) -> bool:
        got = tuple(int(p) for p in self.__version__.split(".")[:2])
        return got >= (major, minor)

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
