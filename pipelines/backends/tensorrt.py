"""TensorRT backend: cached FP16/INT8 engines, per-slot CUDA streams, device preprocessing.

Written against TensorRT 10.x and pycuda (JetPack 6); docs/jetson.md gives the API calls and
their sources. Not run on hardware by us: ``edge-agent selftest`` on a Jetson verifies it.
This module is the backend the registry names (``BACKENDS``): its load, buffers and frame
protocol; the parts live in modules of their own:

- ``trt_engine``: the model engine from the engine cache, or built from the ONNX (with
  progress) and stored atomically; an engine that fails to deserialize is rebuilt once.
- ``trt_preprocess``: for float-input models, normalisation and the NCHW transpose in a
  small engine on a DLA core (GPU fallback) that feeds the model engine on the device.
- ``trt_buffers``: each frame slot's stream, events and buffers (mapped page-locked memory
  on Jetson's integrated GPU, or device buffers copied on the slot's stream).
- ``trt_io``: the engine's IO tensors; ``trt_outputs``: an output allocator for an output
  whose row count depends on the frame.
- ``trt_graphs``: with ``cuda_graphs`` (auto by default) each slot gets execution contexts of
  its own, bound once to its buffers and sharing one block of activation memory; after the
  slot's first plain run its preprocessing and its model enqueue (with the output copies)
  are captured into CUDA graphs, checked once against the plain run, and replayed per frame.
  A model that cannot be captured runs plainly, said once in the log.
- ``trt_build``, ``trt_support``, ``engine_cache``: building, helpers, the cache.

CUDA events time each part; ``timings`` reports them to the pipeline's accounting, and
``counts`` the rows a row output dropped.

Importing this module imports neither TensorRT nor pycuda: ``load`` does.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from edge_agent.core.model_config import TensorRTConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_buffers, trt_build, trt_graphs, trt_io, trt_outputs, trt_support
from edge_agent.pipelines.backends.base import MAX_ROWS, BackendError, InferenceBackend, IOSet, TensorSpec
from edge_agent.pipelines.backends.engine_cache import EngineCache, EngineKey
from edge_agent.pipelines.backends.trt_buffers import Slot
from edge_agent.pipelines.backends.trt_engine import EngineMaker
from edge_agent.pipelines.backends.trt_preprocess import FRAME_TENSOR, PREPROCESSED, device_preprocessing
from edge_agent.pipelines.backends.trt_support import bind, import_tensorrt, sized
from edge_agent.power import sysfs

log = logging.getLogger(__name__)


class TensorRTBackend(InferenceBackend):
    name = "tensorrt"
    off_cpu = True

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
        self._rows: list[int] = []  # outputs whose row count depends on the frame (first axis)
        self._model_input = ""
        self._zero_copy = config.zero_copy
        self.notes: list[str] = []  # what was decided and why (device, DLA, fallbacks)
        self.off_dla: dict[str, list[str]] = {}
        self._model_path = ""
        self._key: EngineKey | None = None
        self._cache = EngineCache(config.cache_dir)
        self._device = ""
        self._host_fmt = InputFormat(height=640, width=640)  # what the host writes (set by load)
        self._slots: list[Slot] = []
        self._batch = (1, True)  # (largest batch, fixed), set by load
        self._graphs = trt_graphs.Graphs(config.cuda_graphs)  # with the memory contexts share
        self._pre_on_gpu = False
        self._plugins: list[str] = []
        self.rows_dropped = 0  # rows past MAX_ROWS in row outputs, over this backend's life

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
        """Whether this model may run from CUDA graphs and, if so, the activation memory the
        load's context and every slot's share (``trt_graphs.Graphs.setup``)."""
        why = self._graphs.setup(
            self.cuda, self.engine, self._key.dla_core if self._key else -1, self._runtime
        )
        if why and self._graphs.wanted:
            self._refuse_graphs(why)
        elif not why:
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
        the shared block (``trt_graphs.new_context``)."""
        ctx = self._graphs.new_context(self.trt, self.engine)
        if ctx is None:
            raise BackendError(f"{self._model_path}: TensorRT could not create an execution context")
        return ctx

    def _refuse_graphs(self, reason: str) -> None:
        """No graphs for this model (``on``: an error): every slot goes on plainly."""
        self._graphs.refuse(reason)
        self.notes.append(f"CUDA graphs off: {reason}")
        for slot in list(self._slots):
            trt_buffers.drop_graphs(slot)

    # -- loading --------------------------------------------------------------------

    def load(self, model_path: str, input_format: InputFormat | None = None) -> None:
        fmt = input_format or InputFormat(height=640, width=640)
        self.trt, self.cuda = (self._modules or import_tensorrt())[:2]
        trt, cuda = self.trt, self.cuda
        trt_build.check_version(trt, self.config.precision)
        cuda.init()
        dev = cuda.Device(0)
        # The primary context is the one TensorRT (through the CUDA runtime) uses.
        self._cuda_ctx = dev.retain_primary_context()
        try:
            self._load(model_path, dev, fmt)
        except BaseException:
            # Nothing else gives a failed load's context and memory back: the caller gets no backend.
            with contextlib.suppress(Exception):
                self.close()
            raise

    def _load(self, model_path: str, dev: Any, fmt: InputFormat) -> None:
        trt, cuda = self.trt, self.cuda
        self._device = trt_support.device_description(cuda, dev, sysfs.detect().l4t)
        self._model_path = model_path
        logger = trt_support.shared_logger(trt)
        # TensorRT's own plugins (EfficientNMS_TRT in end-to-end exports) must be registered
        # before the parser or the runtime meets a graph or an engine that holds one.
        trt.init_libnvinfer_plugins(logger, "")
        self._host_fmt = fmt
        with self._current():
            maker = EngineMaker(
                config=self.config,
                trt=trt,
                cuda=cuda,
                cuda_ctx=self._cuda_ctx,
                logger=logger,
                cache=self._cache,
                device=self._device,
                num_dla=trt.Builder(logger).num_DLA_cores,
                fmt=fmt,
                notes=self.notes,
                off_dla=self.off_dla,
            )
            model = maker.model_engine(model_path)
            self.engine, self._key, self._batch = model.engine, model.key, model.batch
            self._plugins = model.plugins
            self._graph_memory()
            self.context = self._new_context()
            self._read_io()
            pre = device_preprocessing(maker, fmt, self._model_in_spec, self._batch)
        if pre is not None:
            self.pre_engine, self.pre_context, self._host_fmt = pre.engine, pre.context, pre.host_format
            self._pre_on_gpu = pre.on_gpu
            self._inputs = [pre.frame]
        log.info("tensorrt: %s; %s", model.key.describe(), "; ".join(self.notes) or "as asked")

    def _read_io(self) -> None:
        key_shape = self._key.input_shape if self._key else None
        io = trt_io.read_io(self.trt, self.engine, self.context, key_shape, self._batch, self._model_path)
        self._model_input, self._outputs = io.model_input, io.outputs
        self._rows, self._batch = io.rows, io.batch
        self.notes += io.notes
        self._inputs = [io.input]
        # Kept: ``allocate`` may run (a reload) while another thread enqueues on the
        # context, and an execution context is not thread-safe.
        self._model_in_spec = io.input
        if self._rows and self._graphs.wanted:
            first = self._outputs[self._rows[0]].name
            self._refuse_graphs(
                f"output {first!r} has a data-dependent shape: its output allocator allocates in the enqueue"
            )

    def batch_axis(self) -> tuple[int, bool]:
        return self._batch

    def host_format(self, fmt: InputFormat) -> InputFormat:
        return self._host_fmt

    @property
    def _device_pre(self) -> bool:
        """Preprocessing runs in the device engine (its engine and context both made)."""
        return self.pre_engine is not None and self.pre_context is not None

    # -- buffers ----------------------------------------------------------------------

    def allocate(self, batch: int = 1) -> IOSet:
        """Buffers for ``batch`` frames (a fixed-batch engine's own size whatever is asked)."""
        if self.engine is None:
            raise BackendError("allocate() before load()")
        largest, fixed = self._batch
        size = largest if fixed else min(batch, largest)
        cuda, zc = self.cuda, self._zero_copy
        with self._current():
            # With graphs, NON_BLOCKING streams (CU_STREAM_NON_BLOCKING = 1): while a blocking
            # stream captures, any use of the legacy stream from any thread (a reload's engine
            # load, say) would break the capture; every wait here is on an event anyway.
            flags = 1 if self._graphs.scratch is not None else 0
            slot = Slot(stream=cuda.Stream(flags), host={}, device={}, batch=size)
            self._slots.append(slot)
            if self._device_pre:
                frame, model_in = self._inputs[0], self._model_in_spec
                trt_buffers.add_buffer(cuda, slot, frame.name, frame.shape, frame.dtype, True, zc)
                trt_buffers.add_buffer(cuda, slot, model_in.name, model_in.shape, model_in.dtype, False, zc)
            else:
                spec = self._inputs[0]
                trt_buffers.add_buffer(cuda, slot, spec.name, sized(spec.shape, size), spec.dtype, True, zc)
            for i, spec in enumerate(self._outputs):
                if i in self._rows:
                    slot.rows[spec.name] = trt_outputs.row_output(cuda, self.trt, i, spec)
                else:
                    trt_buffers.add_buffer(
                        cuda, slot, spec.name, sized(spec.shape, size), spec.dtype, True, zc
                    )
            flags = cuda.event_flags
            blocking = cuda.Event(flags.BLOCKING_SYNC | flags.DISABLE_TIMING)
            slot.events = [cuda.Event(), cuda.Event(), cuda.Event(), blocking]
            if self._graphs.scratch is not None:
                self._bind_slot(slot)
        host_in = self._inputs[0].name
        outputs = [
            slot.rows[o.name].view() if o.name in slot.rows else slot.host[o.name] for o in self._outputs
        ]
        return IOSet(inputs={host_in: slot.host[host_in]}, outputs=outputs, handle=slot)

    def _bind_slot(self, slot: Slot) -> None:
        """The slot's own contexts, with its shapes and addresses set once: what a graph of
        the slot holds, so nothing changes them after its capture."""
        ctx = self._new_context()
        name = self._model_input
        if any(d < 0 for d in self.engine.get_tensor_shape(name)):
            shape = sized(self._model_in_spec.shape, slot.batch)
            if not ctx.set_input_shape(name, shape):
                raise BackendError(f"{self._model_path}: the engine refused input shape {shape}")
        bind(ctx, name, slot.device[name])
        trt_buffers.bind_outputs(ctx, slot, self._outputs)
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
        slot: Slot = io.handle
        with self._current():
            self._copy_in(slot)
        slot.uploaded = True

    def infer(self, io: IOSet) -> None:
        slot: Slot = io.handle
        stream = slot.stream
        start, mid, end, _done = slot.events
        graphs = slot.graphs if self._graphs.replay else None
        ran = True
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
                ran = self._execute(slot)
                end.record(stream)
                if ran:
                    self._copy_out(slot)
            # The host reads the outputs next: everything on the stream must be done.
            self._wait(slot)
            slot.uploaded = False
            io.extra["device_preprocess_ms"] = mid.time_since(start)
            io.extra["device_compute_ms"] = end.time_since(mid)
            if slot.rows:
                self._rows_given(slot, io, ran)
            if slot.graphs is None and slot.context is not None and self._graphs.wanted:
                self._capture(slot, io)  # after this first plain run, as TensorRT asks

    def _preprocess(self, slot: Slot, graphs: dict[str, trt_graphs.CudaGraph] | None) -> None:
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

    def _execute(self, slot: Slot) -> bool:
        """Enqueue the model on the slot; False: a row output's frame was past ``MAX_ROWS``
        (its allocator refused it, so the enqueue failed: the frame's rows are dropped)."""
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
            trt_buffers.bind_outputs(ctx, slot, self._outputs)
        for rows in slot.rows.values():
            rows.begin()
        if ctx.execute_async_v3(slot.stream.handle):
            for r in slot.rows.values():
                if r.failed or not r.reported:
                    why = r.failed or f"TensorRT reported no shape for output {r.name!r}"
                    raise BackendError(f"the model engine ran, but {why}")
            return True
        if any(r.refused for r in slot.rows.values()):
            return False
        failed = [r.failed for r in slot.rows.values() if r.failed]
        raise BackendError("the model engine failed to enqueue" + (f": {failed[0]}" if failed else ""))

    def _rows_given(self, slot: Slot, io: IOSet, ran: bool) -> None:
        """After the wait: the rows each row output was given, and the rows dropped."""
        dropped = io.extra["rows_dropped"] = trt_outputs.hand_over(list(slot.rows.values()), io, ran)
        if dropped and not self.rows_dropped:
            log.warning(
                "tensorrt: %s: a frame gave more than %d rows in an output whose row count depends on "
                "the frame; such a frame's rows are dropped (counted as rows_dropped)",
                self._model_path,
                MAX_ROWS,
            )
        self.rows_dropped += dropped

    def _copy_out(self, slot: Slot) -> None:
        trt_buffers.copy_out(self.cuda, slot, self._outputs, self._zero_copy)

    def _copy_in(self, slot: Slot) -> None:
        if not self._zero_copy:
            trt_buffers.copy_in(self.cuda, slot, self._inputs[0].name)

    @staticmethod
    def _wait(slot: Slot) -> None:
        trt_buffers.wait(slot)

    def _capture(self, slot: Slot, io: IOSet) -> None:
        """Capture the slot's work into graphs and check them (``trt_graphs.check_replay``); a failure
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
                graphs["pre"] = trt_graphs.capture(
                    self._graphs.cudart, handle, lambda: pre.execute_async_v3(handle)
                )
            graphs["model"] = trt_graphs.capture(self._graphs.cudart, handle, model)
            frame = io.inputs[self._inputs[0].name]
            trt_graphs.check_replay(
                frame, io.outputs, lambda: self._replay(slot, io, graphs), lambda: self._plain(slot)
            )
            slot.graphs, graphs = graphs, {}
            self._graphs.captured += 1
        except (trt_graphs.GraphRefused, BackendError) as e:
            slot.graphs = {}
            held = f" (the engine holds the plugin(s) {', '.join(self._plugins)})" if self._plugins else ""
            self._refuse_graphs(f"a slot's capture failed: {e}{held}")
        finally:
            for g in graphs.values():  # not kept: a failure, or an exception passing through
                g.close()

    def _replay(self, slot: Slot, io: IOSet, graphs: dict[str, trt_graphs.CudaGraph]) -> None:
        """The check's replay (``trt_graphs.check_replay``): device buffers filled with 0xFF too."""
        self._copy_in(slot)
        if not self._zero_copy:
            for spec, o in zip(self._outputs, io.outputs):
                self.cuda.memset_d8_async(slot.allocations[spec.name], 0xFF, o.nbytes, slot.stream)
        if self._device_pre:
            self._preprocess(slot, graphs)
        graphs["model"].launch()
        self._wait(slot)

    def _plain(self, slot: Slot) -> None:
        """The check's plain run of the same input."""
        if self._device_pre:
            self._preprocess(slot, None)
        self._execute(slot)
        self._copy_out(slot)
        self._wait(slot)

    def prepare(self, io: IOSet) -> None:
        """Capture the slot's graphs now (its first run), not on a live frame."""
        slot: Slot = io.handle
        if slot.graphs is None and slot.context is not None and self._graphs.wanted:
            self.infer(io)

    def timings(self, io: IOSet) -> dict[str, float]:
        return {k: io.extra[k] for k in ("device_preprocess_ms", "device_compute_ms") if k in io.extra}

    def describe(self) -> dict[str, Any]:
        d = {
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
        if self._rows:
            d["rows_dropped"] = self.rows_dropped
        return d

    def graph_state(self) -> dict[str, Any]:
        """The config's mode, whether slots replay graphs, how many were captured, and why not."""
        return self._graphs.state()

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
            with self._current():
                for slot in self._slots:
                    trt_buffers.free(slot)
                self._slots.clear()
                self.pre_context = self.pre_engine = None
                self.context = self.engine = None
                self._graphs.free()
        finally:  # the context is released even if a free raised
            with contextlib.suppress(Exception):
                self._cuda_ctx.detach()
            self._cuda_ctx = None


BACKENDS = (("tensorrt", TensorRTBackend),)  # what this module adds (the registry collects it)
