"""TensorRT backend: cached FP16/INT8 engines, per-slot CUDA streams, device preprocessing.

Written against TensorRT 10.x and pycuda (JetPack 6); see docs/jetson.md for
every API call and its source. Not run on hardware by us: ``edge-agent selftest`` on a
Jetson is what verifies it.

- The engine comes from the engine cache, or is built from the ONNX (with progress) and
  stored atomically; an engine that fails to deserialize is discarded and rebuilt once.
- Every frame slot gets its own CUDA stream and its own page-locked host buffers (mapped
  into the GPU's address space on Jetson's integrated GPU, so nothing is copied) or
  device buffers (then ``upload`` copies the input on the slot's stream from the capture
  thread, so the copy of frame N+1 overlaps the inference of frame N).
- For float-input models, normalisation and the NCHW transpose run in a small
  preprocessing engine on a DLA core (GPU fallback), whose output feeds the model engine
  on the device; the CPU only letterboxes uint8 pixels.
- CUDA events time each part; ``timings`` reports them to the pipeline's accounting.
- With ``cuda_graphs`` (auto by default) each slot gets execution contexts of its own, bound
  once to its buffers and sharing one block of activation memory; after the slot's first
  plain run its preprocessing and its model enqueue (with the output copies) are captured
  into CUDA graphs, checked once against the plain run, and replayed per frame
  (``trt_graphs``). A model that cannot be captured runs plainly, said once in the log.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core.config import TensorRTConfig
from edge_agent.core.files import file_sha256
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_build, trt_graphs, trt_support
from edge_agent.pipelines.backends.base import BackendError, InferenceBackend, IOSet, TensorSpec
from edge_agent.pipelines.backends.engine_cache import EngineCache, EngineKey
from edge_agent.pipelines.backends.trt_support import bind, import_tensorrt, ones, sized
from edge_agent.power import sysfs

log = logging.getLogger(__name__)

FRAME_TENSOR = "frame"  # the preprocessing engine's input
PREPROCESSED = "input"  # its output, the model's input


@dataclass
class _Slot:
    """One frame slot's CUDA state."""

    stream: Any
    host: dict[str, np.ndarray]  # page-locked, one per IO tensor the host touches
    device: dict[str, int]  # device address of every tensor, preprocessing's included
    allocations: dict[str, Any] = field(default_factory=dict)  # DeviceAllocation per tensor
    events: list[Any] = field(default_factory=list)  # start, after preprocessing, end, done (blocking)
    uploaded: bool = False
    batch: int = 1  # frames the buffers hold
    # With CUDA graphs: execution contexts of this slot's own, bound once to its buffers
    # (a graph holds its context's state), and the graphs once captured ("pre", "model").
    context: Any = None
    pre_context: Any = None
    graphs: dict[str, trt_graphs.CudaGraph] | None = None


class TensorRTBackend(InferenceBackend):
    name = "tensorrt"

    def __init__(self, config: TensorRTConfig, modules: tuple[Any, ...] | None = None) -> None:
        self.config = config
        # (tensorrt, pycuda.driver[, cuda-python's runtime]); injected by tests
        self._modules = modules
        self.trt: Any = None
        self.cuda: Any = None
        self._cuda_ctx: Any = None
        self.engine: Any = None
        self.context: Any = None
        self.pre_engine: Any = None
        self.pre_context: Any = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._model_input = ""
        self._zero_copy = config.zero_copy
        self.notes: list[str] = []  # what was decided and why (device, DLA, fallbacks)
        self.off_dla: dict[str, list[str]] = {}
        self._model_path = ""
        self._key: EngineKey | None = None
        self._cache = EngineCache(config.cache_dir)
        self._device = ""
        self._num_dla = 0
        self._fmt = InputFormat(height=640, width=640)
        self._host_fmt = self._fmt
        self._slots: list[_Slot] = []
        self._batch = (1, True)  # (largest batch, fixed), set by load
        self._graphs = trt_graphs.GraphPolicy(config.cuda_graphs)
        self._cudart: Any = None
        self._scratch: Any = None  # activation memory every context shares (graphs only)
        self._scratch_size = 0
        self._pre_on_gpu = False
        self._plugins: list[str] = []
        self._captured = 0  # slots whose graphs were captured, over this backend's life

    # -- CUDA context ---------------------------------------------------------------

    @contextlib.contextmanager
    def _current(self):
        """Make the primary context current in the calling thread for the block.

        The pipeline calls in from the capture and the inference threads; a pycuda
        context is current per thread, and push/pop must balance.
        """
        self._cuda_ctx.push()
        try:
            yield
        finally:
            self.cuda.Context.pop()

    # -- CUDA graphs: shared activation memory, per-slot contexts -------------------

    def _graph_memory(self) -> None:
        """Decide whether this model may run from CUDA graphs and, if so, allocate the one
        block of activation memory that the load's context and every slot's share: their
        enqueues never overlap (one inference at a time, each waited for), which is what
        sharing needs (``set_device_memory``'s documentation)."""
        if not self._graphs.wanted:
            return
        why = trt_graphs.refusal(self._key.dla_core if self._key else -1)
        if not why:
            try:
                self._cudart = self._runtime()
            except trt_graphs.GraphRefused as e:
                why = str(e)
        if why:
            self._refuse_graphs(why)
            return
        engine = self.engine
        # TensorRT 10.1+ (and 11): device_memory_size_v2; 10.0: device_memory_size.
        size = getattr(engine, "device_memory_size_v2", None)
        if size is None:
            size = engine.device_memory_size
        self._scratch_size = max(int(size), 256)
        self._scratch = self.cuda.mem_alloc(self._scratch_size)
        self.notes.append("CUDA graphs: each slot's work captured after its first run")

    def _runtime(self) -> Any:
        """cuda-python's runtime bindings: imported, or the injected ones (none: not installed)."""
        if self._modules is None:
            return trt_graphs.import_cudart()
        if len(self._modules) > 2 and self._modules[2] is not None:
            return self._modules[2]
        raise trt_graphs.GraphRefused("cuda-python is not installed")

    def _new_context(self) -> Any:
        """An execution context of the model engine: with its own memory, or (graphs) with
        the shared block. TensorRT v10.3.0 ``python/src/infer/pyCore.cpp``:
        ``ICudaEngine.create_execution_context(strategy=ExecutionContextAllocationStrategy.STATIC)``,
        ``device_memory_size_v2`` and ``IExecutionContext.set_device_memory(memory, size)``
        (10.1+), the write-only ``device_memory`` property and ``device_memory_size`` on 10.0
        (the latter gone in 11). ``include/NvInferRuntime.h``, setDeviceMemoryV2: "in use
        from the invocation of enqueueV3() until network execution is complete"; using it
        "in another execution context running in parallel" is undefined: the slots never
        run in parallel (one inference at a time, each waited for)."""
        engine = self.engine
        if self._scratch is None:
            ctx = engine.create_execution_context()
        else:
            ctx = engine.create_execution_context(self.trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if ctx is None:
            raise BackendError(f"{self._model_path}: TensorRT could not create an execution context")
        if self._scratch is not None:
            if hasattr(ctx, "set_device_memory"):  # 10.1+: set_device_memory(memory, size)
                ctx.set_device_memory(int(self._scratch), self._scratch_size)
            else:  # 10.0: the write-only property
                ctx.device_memory = int(self._scratch)
        return ctx

    def _refuse_graphs(self, reason: str) -> None:
        """No graphs for this model (``on``: an error): every slot goes on plainly."""
        self._graphs.refuse(reason)
        self.notes.append(f"CUDA graphs off: {reason}")
        for slot in list(self._slots):
            _drop_graphs(slot)

    # -- loading --------------------------------------------------------------------

    def load(self, model_path: str, input_format: InputFormat | None = None) -> None:
        self._fmt = input_format or InputFormat(height=640, width=640)
        self.trt, self.cuda = (self._modules or import_tensorrt())[:2]
        trt, cuda = self.trt, self.cuda
        trt_build.check_version(trt, self.config.precision)
        cuda.init()
        dev = cuda.Device(0)
        # The primary context is the one TensorRT (through the CUDA runtime) uses.
        self._cuda_ctx = dev.retain_primary_context()
        try:
            self._load(model_path, dev)
        except BaseException:
            # Nothing else gives a failed load's context and memory back: the caller gets no backend.
            with contextlib.suppress(Exception):
                self.close()
            raise

    def _load(self, model_path: str, dev: Any) -> None:
        trt, cuda = self.trt, self.cuda
        self._device = trt_support.device_description(cuda, dev, sysfs.detect().l4t)
        self._model_path = model_path
        self._logger = trt_support.shared_logger(trt)
        # TensorRT's own plugins (EfficientNMS_TRT in end-to-end exports) must be registered
        # before the parser or the runtime meets a graph or an engine that holds one.
        trt.init_libnvinfer_plugins(self._logger, "")
        with self._current():
            self._num_dla = trt.Builder(self._logger).num_DLA_cores
            self.engine = self._engine_for_model(model_path)
            self._graph_memory()
            self.context = self._new_context()
            self._read_io()
        self._host_fmt = self._device_preprocessing(self._fmt)
        log.info(
            "tensorrt: %s; %s", self._key.describe() if self._key else "", "; ".join(self.notes) or "as asked"
        )

    def _model_input_shape(self, model_path: str) -> tuple[str, tuple[int, ...], bool, str]:
        """The input's name, the shape to build for, whether its batch axis is dynamic, and
        its dtype (numpy's name; the manifest's where the ONNX type is not one the agent reads)."""
        # Read from the ONNX itself: no TensorRT parse, and a plugin graph (which ONNX
        # Runtime cannot load) is read too.
        from edge_agent.models import onnx_info

        try:
            info = onnx_info.read(model_path)
            inp = info.inputs[0]
        except Exception as e:  # protobuf's DecodeError, OSError, IndexError (no input)
            raise BackendError(f"cannot read the input of {model_path}: {e}") from None
        # TensorRT plugins (named *_TRT): a failed capture names them, the likely cause.
        self._plugins = sorted(op for op in info.ops if op.endswith("_TRT"))
        # Dynamic axes take the size the pipeline feeds: the largest batch, the manifest's H and W.
        f, b = self._fmt, self._max_batch()
        fed = (b, f.height, f.width, 3) if f.layout == "NHWC" else (b, 3, f.height, f.width)
        dims = list(inp.shape)
        if len(dims) != len(fed):
            fed = (1,) * len(dims)
        shape = tuple(d if d else w for d, w in zip(dims, fed))
        dynamic = bool(dims) and not dims[0]
        return inp.name, shape, dynamic, inp.dtype or f.dtype

    def _max_batch(self) -> int:
        """The batch to build for: the config's, except where batching is not supported."""
        want, f = self.config.max_batch or 1, self._fmt
        if want > 1 and self.config.precision == "int8":
            self.notes.append("batch 1: int8 calibration with a batch profile is unverified")
            return 1
        if want > 1 and f.dtype != "uint8" and f.layout == "NCHW" and self.config.preprocess != "cpu":
            self.notes.append("batch 1: the device preprocessing engine takes one frame at a time")
            return 1
        return want

    def _key_for(
        self, settings: trt_build.BuildSettings, onnx_sha: str, role: str, calib: str = ""
    ) -> EngineKey:
        return EngineKey(
            onnx_sha256=onnx_sha,
            tensorrt_version=str(self.trt.__version__),
            device=self._device,
            precision=settings.precision,
            dla_core=settings.dla_core,
            input_shape=settings.input_shape,
            gpu_fallback=settings.gpu_fallback,
            workspace_mib=settings.workspace_bytes >> 20,
            optimization_level=settings.optimization_level,
            calibration_sha256=calib,
            role=role,
            min_batch=settings.min_batch,
        )

    def _engine_for_model(self, model_path: str) -> Any:
        name, shape, dynamic, dtype = self._model_input_shape(model_path)
        settings, notes = trt_build.settings_for(
            self.config, name, shape, self._num_dla, dynamic_batch=dynamic
        )
        self.notes += notes
        # A GPU engine runs any batch up to its largest; a DLA one (or a model exported with
        # a fixed batch) only its own, which smaller batches pad.
        self._batch = (shape[0], settings.min_batch == 0)
        onnx_sha = file_sha256(model_path)
        make_calibrator, calib_sha = None, ""
        stem = Path(model_path).parent.name if Path(model_path).stem == "model" else Path(model_path).stem
        if settings.precision == "int8":
            make_calibrator, calib_sha = self._calibrator(stem, onnx_sha, shape, dtype)
        key = self._key_for(settings, onnx_sha, "model", calib_sha)
        self._key = key

        def build() -> bytes:
            log.info("tensorrt: building %s (minutes on a Nano; cached afterwards)", key.describe())
            # Made (its device buffer allocated) only for a build, with the context current.
            calibrator = make_calibrator() if make_calibrator else None
            try:
                plan, off_dla = trt_build.build_engine(
                    self.trt,
                    self._logger,
                    model_path,
                    settings,
                    self._cache.timing_cache_path(key),
                    calibrator,
                )
            finally:
                if calibrator is not None:
                    calibrator.close()
            self.off_dla["model"] = off_dla
            return plan

        return self._cached_engine(stem, key, build)

    def _cached_engine(self, stem: str, key: EngineKey, build) -> Any:
        """Deserialize the cached engine, building it first if missing, stale or corrupt."""
        runtime = self.trt.Runtime(self._logger)
        if key.dla_core >= 0:
            runtime.DLA_core = key.dla_core
        for attempt in (1, 2):
            path = self._cache.lookup(stem, key)
            if path is None:
                path = self._cache.store(stem, key, build())
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is not None:
                return engine
            self._cache.invalidate(stem, key, "TensorRT could not deserialize it")
            if attempt == 2:
                raise BackendError(f"{path}: the engine TensorRT just built does not deserialize")
        raise AssertionError("unreachable")

    def _calibrator(self, stem: str, onnx_sha: str, shape: tuple[int, ...], dtype: str) -> tuple[Any, str]:
        cfg = self.config
        folder, frames = cfg.calibration_images, cfg.calibration_frames
        cache = lambda calib_sha: self._cache.calibration_cache_path(stem, onnx_sha, calib_sha)  # noqa: E731
        modules = (self.trt, self.cuda, self._cuda_ctx)
        return trt_support.calibration(modules, folder, frames, self._fmt, cache, shape, dtype)

    def host_format(self, fmt: InputFormat) -> InputFormat:
        return self._host_fmt

    @property
    def _device_pre(self) -> bool:
        """Preprocessing runs in the device engine (its engine and context both made)."""
        return self.pre_engine is not None and self.pre_context is not None

    def _device_preprocessing(self, fmt: InputFormat) -> InputFormat:
        """Float models: normalisation moves to a device engine, the host writes uint8 NHWC."""
        if fmt.dtype == "uint8" or self.config.preprocess == "cpu":
            if fmt.dtype == "uint8":
                self.notes.append("model takes uint8: normalisation is already in its graph")
            return fmt
        core = 0 if self.config.preprocess == "dla" else -1
        shape = (1, fmt.height, fmt.width, 3)
        settings, notes = trt_build.settings_for(
            self.config, FRAME_TENSOR, shape, self._num_dla, dla_core=core
        )
        settings = trt_build.BuildSettings(**{**settings.__dict__, "precision": "fp16"})
        self.notes += [f"preprocessing: {n}" for n in notes]
        why = trt_support.no_device_preprocessing(fmt, settings, self._model_in_spec, self._batch)
        if why:
            self.notes.append(f"preprocessing on the CPU: {why}")
            return fmt
        model_in = self._model_in_spec  # the engine's own input, not the manifest's word
        out_dtype = self.trt.DataType.HALF if model_in.dtype == np.float16 else self.trt.DataType.FLOAT
        # Only what the device engine computes: the resize happens on the host before it.
        used = (
            fmt.height,
            fmt.width,
            fmt.layout,
            str(model_in.dtype),
            fmt.color,
            fmt.scale,
            fmt.mean,
            fmt.std,
        )
        key = self._key_for(settings, hashlib.sha256(repr(used).encode()).hexdigest(), "preprocess")
        try:
            self._build_preprocessing(fmt, settings, key, out_dtype)
        except Exception as e:  # BackendError, or an add_* that returned None (AttributeError)
            # Device preprocessing is an optimisation: the CPU path still gives right answers.
            self.notes.append(f"preprocessing on the CPU: the device engine failed ({type(e).__name__}: {e})")
            self.pre_engine = self.pre_context = None
            return fmt
        where = f"DLA{settings.dla_core}" if settings.dla_core >= 0 else "GPU"
        self.notes.append(f"preprocessing (normalise, NCHW) on {where}")
        # A graph holds GPU work only: on a DLA it runs plainly before the model's graph.
        self._pre_on_gpu = settings.dla_core < 0
        self._inputs = [TensorSpec(FRAME_TENSOR, shape, np.dtype(np.uint8))]
        return InputFormat(
            height=fmt.height,
            width=fmt.width,
            layout="NHWC",
            dtype="uint8",
            color="bgr",
            pad_value=fmt.pad_value,
            resize=fmt.resize,
            interpolation=fmt.interpolation,
        )

    def _build_preprocessing(
        self, fmt: InputFormat, settings: trt_build.BuildSettings, key: EngineKey, out_dtype: Any
    ) -> None:
        with self._current():

            def build() -> bytes:
                plan, off_dla = trt_build.build_preprocess_engine(
                    self.trt, self._logger, fmt, settings, self._cache.timing_cache_path(key), out_dtype
                )
                self.off_dla["preprocess"] = off_dla
                return plan

            engine = self._cached_engine("preprocess", key, build)
            context = engine.create_execution_context()
            if context is None:  # the caller falls back to CPU preprocessing
                raise BackendError("TensorRT could not create the preprocessing engine's execution context")
            spec = self._model_in_spec
            trt_support.check_preprocessed(engine, PREPROCESSED, spec.shape, spec.dtype, self.trt)
            # Both or neither: ``_device_pre`` is the one condition every path tests.
            self.pre_engine, self.pre_context = engine, context

    def _read_io(self) -> None:
        trt, engine, ctx = self.trt, self.engine, self.context
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1:
            raise BackendError(f"{self._model_path}: the pipeline feeds one input, the engine has {inputs}")
        self._model_input = inputs[0]
        shape = tuple(engine.get_tensor_shape(self._model_input))
        if any(d < 0 for d in shape):
            # Input shapes first: output shapes resolve from them.
            want = self._key.input_shape if self._key else ones(shape)
            if not ctx.set_input_shape(self._model_input, want):
                raise BackendError(f"{self._model_path}: the engine refused input shape {want}")
        self._inputs = [self._spec(self._model_input)]
        # Kept: ``allocate`` may run (a reload) while another thread enqueues on the
        # context, and an execution context is not thread-safe.
        self._model_in_spec = self._inputs[0]
        self._outputs = [self._spec(n) for n in outputs]
        for spec in self._outputs:
            trt_support.known_shape(spec.name, spec.shape, self._model_path)

    def batch_axis(self) -> tuple[int, bool]:
        return self._batch

    def _spec(self, name: str) -> TensorSpec:
        shape = tuple(self.context.get_tensor_shape(name))
        return TensorSpec(name, shape, np.dtype(self.trt.nptype(self.engine.get_tensor_dtype(name))))

    # -- buffers ----------------------------------------------------------------------

    def _buffer(self, slot: _Slot, name: str, shape: tuple[int, ...], dtype: np.dtype, host: bool) -> None:
        cuda = self.cuda
        nbytes = int(np.prod(shape)) * dtype.itemsize
        if host and self._zero_copy:
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

    def allocate(self, batch: int = 1) -> IOSet:
        """Buffers for ``batch`` frames (a fixed-batch engine's own size whatever is asked)."""
        if self.engine is None:
            raise BackendError("allocate() before load()")
        largest, fixed = self._batch
        size = largest if fixed else min(batch, largest)
        cuda = self.cuda
        with self._current():
            # With graphs, NON_BLOCKING streams (CU_STREAM_NON_BLOCKING = 1): while a blocking
            # stream captures, any use of the legacy stream from any thread (a reload's engine
            # load, say) would break the capture; every wait here is on an event anyway.
            flags = 1 if self._scratch is not None else 0
            slot = _Slot(stream=cuda.Stream(flags), host={}, device={}, batch=size)
            self._slots.append(slot)
            if self._device_pre:
                self._buffer(slot, FRAME_TENSOR, self._inputs[0].shape, np.dtype(np.uint8), host=True)
                model_in = self._model_in_spec
                self._buffer(slot, self._model_input, model_in.shape, model_in.dtype, host=False)
            else:
                spec = self._inputs[0]
                self._buffer(slot, spec.name, sized(spec.shape, size), spec.dtype, host=True)
            for spec in self._outputs:
                self._buffer(slot, spec.name, sized(spec.shape, size), spec.dtype, host=True)
            flags = cuda.event_flags
            blocking = cuda.Event(flags.BLOCKING_SYNC | flags.DISABLE_TIMING)
            slot.events = [cuda.Event(), cuda.Event(), cuda.Event(), blocking]
            if self._scratch is not None:
                self._bind_slot(slot)
        host_in = self._inputs[0].name
        return IOSet(
            inputs={host_in: slot.host[host_in]},
            outputs=[slot.host[s.name] for s in self._outputs],
            handle=slot,
        )

    def _bind_slot(self, slot: _Slot) -> None:
        """The slot's own contexts, with its shapes and addresses set once: what a graph of
        the slot holds, so nothing changes them after its capture."""
        ctx = self._new_context()
        name = self._model_input
        if any(d < 0 for d in self.engine.get_tensor_shape(name)):
            shape = sized(self._model_in_spec.shape, slot.batch)
            if not ctx.set_input_shape(name, shape):
                raise BackendError(f"{self._model_path}: the engine refused input shape {shape}")
        bind(ctx, name, slot.device[name])
        for spec in self._outputs:
            bind(ctx, spec.name, slot.device[spec.name])
        slot.context = ctx
        if self._device_pre:
            pre = self.pre_engine.create_execution_context()
            if pre is None:
                raise BackendError("TensorRT could not create a preprocessing execution context")
            bind(pre, FRAME_TENSOR, slot.device[FRAME_TENSOR])
            bind(pre, PREPROCESSED, slot.device[name])
            slot.pre_context = pre

    # -- per frame ----------------------------------------------------------------------

    def upload(self, io: IOSet) -> None:
        """Capture thread: start the input copy on the slot's stream (no wait)."""
        if self._zero_copy:
            return
        slot: _Slot = io.handle
        with self._current():
            self._copy_in(slot)
        slot.uploaded = True

    def infer(self, io: IOSet) -> None:
        slot: _Slot = io.handle
        stream = slot.stream
        start, mid, end, _done = slot.events
        graphs = slot.graphs if self._graphs.replay else None
        with self._current():
            if not slot.uploaded:
                self._copy_in(slot)
            start.record(stream)
            if self._device_pre:
                self._preprocess(slot, graphs)
            mid.record(stream)
            if graphs:  # the enqueue and the output copies, one launch
                graphs["model"].launch()
                end.record(stream)
            else:
                self._execute(slot)
                end.record(stream)
                self._copy_out(slot)
            # The host reads the outputs next: everything on the stream must be done. A
            # BLOCKING_SYNC event sleeps the thread; stream.synchronize() on the primary
            # context (CU_CTX_SCHED_AUTO) would spin a CPU core for the whole inference.
            self._wait(slot)
            slot.uploaded = False
            io.extra["device_preprocess_ms"] = mid.time_since(start)
            io.extra["device_compute_ms"] = end.time_since(mid)
            if slot.graphs is None and slot.context is not None and self._graphs.wanted:
                self._capture(slot, io)  # after this first plain run, as TensorRT asks

    def _preprocess(self, slot: _Slot, graphs: dict[str, trt_graphs.CudaGraph] | None) -> None:
        if graphs and "pre" in graphs:
            graphs["pre"].launch()
            return
        ctx = slot.pre_context
        if ctx is None:  # one context for every slot: this slot's addresses first
            ctx = self.pre_context
            bind(ctx, FRAME_TENSOR, slot.device[FRAME_TENSOR])
            bind(ctx, PREPROCESSED, slot.device[self._model_input])
        if not ctx.execute_async_v3(slot.stream.handle):
            raise BackendError("the preprocessing engine failed to enqueue")

    def _execute(self, slot: _Slot) -> None:
        ctx = slot.context
        if ctx is None:
            # One execution context serves every slot, one batch at a time: the batch size
            # (a dynamic engine) and the addresses are set for this slot before each enqueue.
            ctx = self.context
            if not self._batch[1]:
                shape = sized(self._inputs[0].shape, slot.batch)
                if not ctx.set_input_shape(self._model_input, shape):
                    raise BackendError(f"the engine refused input shape {shape} (outside its profile)")
            bind(ctx, self._model_input, slot.device[self._model_input])
            for spec in self._outputs:
                bind(ctx, spec.name, slot.device[spec.name])
        if not ctx.execute_async_v3(slot.stream.handle):
            raise BackendError("the model engine failed to enqueue")

    def _copy_out(self, slot: _Slot) -> None:
        if not self._zero_copy:
            for spec in self._outputs:
                self.cuda.memcpy_dtoh_async(slot.host[spec.name], slot.allocations[spec.name], slot.stream)

    def _capture(self, slot: _Slot, io: IOSet) -> None:
        """Capture the slot's work into graphs and check them (``_check_replay``); a failure
        turns graphs off for the model (``on``: raises BackendError, once: the slot is not
        tried again)."""
        handle = slot.stream.handle
        graphs: dict[str, trt_graphs.CudaGraph] = {}

        def model() -> bool:
            ok = bool(slot.context.execute_async_v3(handle))
            if ok:
                self._copy_out(slot)
            return ok

        try:
            if self._device_pre and self._pre_on_gpu:
                pre = slot.pre_context
                graphs["pre"] = trt_graphs.capture(self._cudart, handle, lambda: pre.execute_async_v3(handle))
            graphs["model"] = trt_graphs.capture(self._cudart, handle, model)
            self._check_replay(slot, io, graphs)
            slot.graphs, graphs = graphs, {}
            self._captured += 1
        except (trt_graphs.GraphRefused, BackendError) as e:
            slot.graphs = {}
            held = f" (the engine holds the plugin(s) {', '.join(self._plugins)})" if self._plugins else ""
            self._refuse_graphs(f"a slot's capture failed: {e}{held}")
        finally:
            for g in graphs.values():  # not kept: a failure, or an exception passing through
                g.close()

    def _check_replay(self, slot: _Slot, io: IOSet, graphs: dict[str, trt_graphs.CudaGraph]) -> None:
        """Replay the graphs once on another input than the captured frame's (``other_frame``)
        into outputs filled with 0xFF, on the host and (device buffers) on the
        device, then run the same input plainly and compare: a value the graphs do not write,
        or one baked in at the capture (a plugin doing host work in its enqueue), shows. The
        frame's input and the plain run's outputs are put back after. Once per slot."""
        frame = io.inputs[self._inputs[0].name]
        kept_in, kept_out = frame.copy(), [o.copy() for o in io.outputs]
        try:
            other_frame(frame)
            self._copy_in(slot)
            for o in io.outputs:
                o.reshape(-1).view(np.uint8)[:] = 0xFF
            if not self._zero_copy:
                for spec, o in zip(self._outputs, io.outputs):
                    self.cuda.memset_d8_async(slot.allocations[spec.name], 0xFF, o.nbytes, slot.stream)
            if self._device_pre:
                self._preprocess(slot, graphs)
            graphs["model"].launch()
            self._wait(slot)
            replayed = [o.copy() for o in io.outputs]
            if self._device_pre:
                self._preprocess(slot, None)
            self._execute(slot)
            self._copy_out(slot)
            self._wait(slot)
            why = trt_graphs.same_outputs(io.outputs, replayed)
            if why:
                raise trt_graphs.GraphRefused(f"one replay against plain execution on the same input: {why}")
        finally:
            np.copyto(frame, kept_in)
            for o, kept in zip(io.outputs, kept_out):
                np.copyto(o, kept)

    def _copy_in(self, slot: _Slot) -> None:
        if not self._zero_copy:
            name = self._inputs[0].name
            self.cuda.memcpy_htod_async(slot.allocations[name], slot.host[name], slot.stream)

    @staticmethod
    def _wait(slot: _Slot) -> None:
        done = slot.events[3]
        done.record(slot.stream)
        done.synchronize()

    def prepare(self, io: IOSet) -> None:
        """Capture the slot's graphs now (its first run), not on a live frame."""
        slot: _Slot = io.handle
        if slot.graphs is None and slot.context is not None and self._graphs.wanted:
            self.infer(io)

    def timings(self, io: IOSet) -> dict[str, float]:
        return {k: io.extra[k] for k in ("device_preprocess_ms", "device_compute_ms") if k in io.extra}

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "tensorrt": str(getattr(self.trt, "__version__", "")),
            "device": self._device,
            "engine": self._key.describe() if self._key else "",
            "zero_copy": self._zero_copy,
            "preprocess": "device" if self._device_pre else "cpu",
            "notes": list(self.notes),
            "off_dla": self.off_dla,
            "cuda_graphs": self.graph_state(),
        }

    def graph_state(self) -> dict[str, Any]:
        """The config's mode, whether slots replay graphs, how many were captured (over the
        backend's life: still said after ``close``), and why not."""
        return {
            "mode": self._graphs.mode,
            "replaying": bool(self._captured) and self._graphs.wanted and self._graphs.replay,
            "captured_slots": self._captured,
            "off": self._graphs.off,
        }

    def replay_graphs(self, on: bool) -> None:
        """Replay the captured graphs (True, the default) or enqueue plainly on the same
        slots' contexts: ``edge-agent bench`` compares the CPU time of the two."""
        self._graphs.replay = on

    def close(self) -> None:
        """Free every slot's memory with the context current, drop the engines, release it.

        pycuda frees silently skip when no context is current, leaking the memory, so the
        frees happen here explicitly. Call it from the thread that called ``load``: the
        primary context's release only counts there.
        """
        if self._cuda_ctx is None:
            return
        try:
            self._free()
        finally:  # the context is released even if a free raised
            with contextlib.suppress(Exception):
                self._cuda_ctx.detach()
            self._cuda_ctx = None

    def _free(self) -> None:
        with self._current():
            for slot in self._slots:
                # The graphs and contexts first: they hold the buffers' addresses.
                _drop_graphs(slot)
                slot.context, slot.pre_context = None, None
                for mem in slot.allocations.values():
                    mem.free()
                for arr in slot.host.values():
                    arr.base.free()
                # An IOSet may still hold the slot (``handle``): its stream and events must
                # go now, with the context current, not after the detach below.
                slot.events, slot.stream = [], None
                for held in (slot.allocations, slot.host, slot.device):
                    held.clear()
            self._slots.clear()
            self.pre_context = self.pre_engine = None
            self.context = self.engine = None
            if self._scratch is not None:
                self._scratch.free()
                self._scratch = None


def _drop_graphs(slot: _Slot) -> None:
    for g in (slot.graphs or {}).values():
        g.close()
    slot.graphs = {}


def other_frame(frame: np.ndarray) -> None:
    """Make ``frame`` another input than it holds, in place: a fixed ramp of finite values
    (a buffer never written may hold NaN, which would hide an unwritten output), inverted
    where it happens to equal the frame."""
    ramp = np.arange(frame.size, dtype=np.int64) % 251
    kept = frame.copy()
    if frame.dtype.kind == "f":
        frame.reshape(-1)[:] = ramp / 251.0
    else:
        frame.reshape(-1)[:] = ramp
    if not np.array_equal(frame, kept):
        return
    if frame.dtype.kind == "f":
        np.subtract(1, frame, out=frame)
    else:
        np.invert(frame, out=frame)
