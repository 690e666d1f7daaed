"""Building TensorRT engines: the model from its ONNX, and the small preprocessing network.

Written against the TensorRT 10.x Python API (JetPack 6 ships 10.3); every call is
listed with its documentation in docs/jetson.md. ``trt`` is passed in as a
module so this code never imports TensorRT itself: on a Jetson it is the real
``tensorrt``, in the tests a fake that records the calls.

TensorRT 11 removed ``BuilderFlag.FP16``/``INT8`` and the INT8 calibrator: with it, a
build that asks for fp16 or int8 fails with a message saying so instead of an
AttributeError deep in the builder.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from edge_agent.core.files import atomic_write
from edge_agent.core.model_config import TensorRTConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends.base import BackendError

log = logging.getLogger(__name__)


def trt_version(trt: Any) -> tuple[int, int]:
    parts = str(trt.__version__).split(".")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def check_version(trt: Any, precision: str) -> None:
    """Refuse TensorRT versions this code was not written for, with the reason."""
    major, _ = trt_version(trt)
    if major < 10:
        raise BackendError(f"TensorRT {trt.__version__} is too old: edge-agent needs TensorRT 10 (JetPack 6)")
    if major >= 11 and precision in ("fp16", "int8"):
        raise BackendError(
            f"TensorRT {trt.__version__} removed the FP16/INT8 builder flags and the INT8 "
            f"calibrator: precision {precision!r} needs TensorRT 10 (JetPack 6), or export the "
            "model with FP16 weights and use precision fp32 (a strongly typed build)"
        )


@dataclass(frozen=True)
class BuildSettings:
    """What one engine build asks of the builder; derived from the config and the device."""

    precision: str
    dla_core: int  # -1: GPU
    gpu_fallback: bool
    workspace_bytes: int
    optimization_level: int
    input_name: str
    input_shape: tuple[int, ...]  # the largest (and the optimal) shape
    # > 0: the input's batch axis runs any size from this one up to input_shape's; 0: fixed.
    min_batch: int = 0


def settings_for(
    cfg: TensorRTConfig,
    input_name: str,
    input_shape: tuple[int, ...],
    num_dla_cores: int,
    dla_core: int | None = None,
    dynamic_batch: bool = False,
) -> tuple[BuildSettings, list[str]]:
    """Build settings for this device, and notes on what had to change and why.

    ``dla_core`` overrides the config's (the preprocessing engine has its own);
    ``dynamic_batch``: the model's batch axis is dynamic, and ``input_shape`` holds the
    largest batch wanted (the GPU takes any batch up to it, the DLA only that one).
    """
    notes: list[str] = []
    core = cfg.dla_core if dla_core is None else dla_core
    precision = cfg.precision
    if core >= 0 and core >= num_dla_cores:
        what = "no DLA (an Orin Nano has none)" if num_dla_cores == 0 else f"{num_dla_cores} DLA cores"
        notes.append(f"DLA core {core} asked for, but this device has {what}: building for the GPU")
        core = -1
    if core >= 0 and precision == "fp32":
        notes.append("the DLA runs FP16 or INT8 only: building in fp16")
        precision = "fp16"
    batch = input_shape[0] if input_shape else 1
    if dynamic_batch and batch > 1 and core >= 0:
        notes.append(f"the DLA takes fixed shapes: batches of fewer than {batch} frames are padded")
    return (
        BuildSettings(
            precision=precision,
            dla_core=core,
            gpu_fallback=cfg.gpu_fallback,
            workspace_bytes=cfg.workspace_mib << 20,
            optimization_level=cfg.optimization_level,
            input_name=input_name,
            input_shape=tuple(input_shape),
            min_batch=1 if dynamic_batch and batch > 1 and core < 0 else 0,
        ),
        notes,
    )


def apply_settings(trt: Any, builder: Any, network: Any, config: Any, s: BuildSettings) -> list[str]:
    """Set the builder config as ``s`` says; returns the layers that stay off the DLA."""
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, s.workspace_bytes)
    config.builder_optimization_level = s.optimization_level
    # DETAILED keeps layer names and placement in the engine for the inspector.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if s.precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if s.precision == "int8":
        config.set_flag(trt.BuilderFlag.INT8)
    off_dla: list[str] = []
    if s.dla_core >= 0:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = s.dla_core
        if s.gpu_fallback:
            config.set_flag(trt.BuilderFlag.GPU_FALLBACK)
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if not config.can_run_on_DLA(layer):
                off_dla.append(layer.name)
    # Inputs with a dynamic axis (the batch of our exports) get a profile of exactly the
    # size the pipeline feeds (the DLA takes no dynamic shapes, and one size is fastest),
    # except the batch axis of a GPU engine for several sources: 1 up to the largest
    # batch, tuned for the largest (a full batch is the case under load).
    dynamic = [
        network.get_input(i)
        for i in range(network.num_inputs)
        if any(d < 0 for d in tuple(network.get_input(i).shape))
    ]
    if dynamic:
        profile = builder.create_optimization_profile()
        for tensor in dynamic:
            shape = s.input_shape if tensor.name == s.input_name else _fixed(tuple(tensor.shape))
            low = (s.min_batch, *shape[1:]) if s.min_batch and tensor.name == s.input_name else shape
            profile.set_shape(tensor.name, low, shape, shape)
        config.add_optimization_profile(profile)
        if s.precision == "int8":
            # Implicit-quantisation calibration of a network with runtime dimensions needs
            # its own profile (deprecated with the calibrator in 10.1, still required).
            config.set_calibration_profile(profile)
    return off_dla


def _fixed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if d < 0 else d for d in shape)


def make_progress_monitor(trt: Any, out: TextIO | None = None) -> Any:
    """A ``trt.IProgressMonitor`` that prints build phases (builds take minutes on a Nano)."""
    out = out or sys.stderr

    class BuildProgress(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self._steps: dict[str, int] = {}
            self._t0 = time.monotonic()

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self._steps[phase_name] = num_steps
            indent = "  " if parent_phase else ""
            print(f"[{time.monotonic() - self._t0:6.1f}s] {indent}{phase_name} ({num_steps} steps)", file=out)

        def step_complete(self, phase_name: str, step: int) -> bool:
            total = self._steps.get(phase_name, 0)
            if total >= 10 and (step + 1) % max(total // 10, 1) == 0:
                print(f"[{time.monotonic() - self._t0:6.1f}s]   {phase_name}: {step + 1}/{total}", file=out)
            return True  # False would cancel the build

        def phase_finish(self, phase_name: str) -> None:
            self._steps.pop(phase_name, None)

    return BuildProgress()


class _Feed:
    """The calibrator's work, apart from the TensorRT base class: one device buffer,
    allocated here (with the context current), filled batch by batch."""

    def __init__(self, cuda: Any, batches: Callable[[], Iterator[np.ndarray]], nbytes: int, context: Any):
        self.cuda, self.batches, self.nbytes, self.context = cuda, batches, nbytes, context
        self.device = cuda.mem_alloc(nbytes)
        self.it: Iterator[np.ndarray] | None = None
        self.count = 0  # batches fed
        self.asked = 0  # calls of get_batch: 0 if TensorRT never calibrated (refused first, or Q/DQ)

    def next(self) -> list[int] | None:
        self.asked += 1
        if self.it is None:
            self.it = self.batches()
        batch = next(self.it, None)
        if batch is None:
            return None
        batch = np.ascontiguousarray(batch)
        if batch.nbytes != self.nbytes:
            raise BackendError(f"calibration batch of {batch.nbytes} B, the input takes {self.nbytes} B")
        if self.context is not None:
            self.context.push()  # the builder's thread may have no current context
        try:
            self.cuda.memcpy_htod(self.device, batch)
        finally:
            if self.context is not None:
                self.cuda.Context.pop()
        self.count += 1
        return [int(self.device)]

    def close(self) -> None:
        if self.device is not None:
            self.device.free()
            self.device = None


def make_calibrator(
    trt: Any,
    cuda: Any,
    batches: Callable[[], Iterator[np.ndarray]],
    cache: Path,
    nbytes: int,
    context: Any = None,
) -> Any:
    """An entropy calibrator fed with preprocessed frames; its cache is kept in ``cache``.

    Deprecated since TensorRT 10.1 but the only INT8 path the DLA takes (implicit
    quantisation), and still working in 10.x. Call it with the CUDA context current: the
    device buffer (``nbytes``, one batch) is allocated here, not in the callback.
    ``get_batch`` runs on whatever thread TensorRT calls it from (unconfirmed), so it
    pushes ``context`` itself. The binding turns an exception in ``get_batch`` into "no
    more data" (pyInt8.cpp), which would end calibration early without a word: it is kept
    in ``error`` instead, and ``_build`` raises it once the build returns. Anything that is
    not an Exception (KeyboardInterrupt, SystemExit) goes through as it is.
    """

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self.feed = _Feed(cuda, batches, nbytes, context)
            self.error: BaseException | None = None
            self.from_cache = False

        @property
        def count(self) -> int:
            return self.feed.count

        @property
        def asked(self) -> int:
            return self.feed.asked

        def get_batch_size(self) -> int:
            return 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            if self.error is not None:
                return None
            try:
                return self.feed.next()
            except Exception as e:  # raised again after the build, see check_calibration
                self.error = e
                return None

        def read_calibration_cache(self) -> bytes | None:
            data = cache.read_bytes() if cache.exists() else None
            self.from_cache = bool(data)
            return data

        def write_calibration_cache(self, data: Any) -> None:
            atomic_write(cache, bytes(data))

        def close(self) -> None:
            """Free the device buffer (with the context current)."""
            self.feed.close()

    return Calibrator()


def check_calibration(calibrator: Any, what: str) -> None:
    """After a successful build: raise what the calibrator swallowed, or that TensorRT asked
    for frames and got none at all.

    TensorRT may never ask (a network with explicit Q/DQ ignores the calibrator): that is
    not "no frames".
    """
    if calibrator is None:
        return
    error = getattr(calibrator, "error", None)
    if error is not None:
        raise BackendError(f"{what}: int8 calibration failed: {type(error).__name__}: {error}") from error
    asked, fed = getattr(calibrator, "asked", 0), getattr(calibrator, "count", 1)
    if not getattr(calibrator, "from_cache", False) and asked and not fed:
        raise BackendError(f"{what}: int8 calibration fed no frames (no image could be read)")


def _parse(trt: Any, logger: Any, onnx_path: str) -> tuple[Any, Any, Any]:
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(onnx_path):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BackendError(f"{onnx_path}: TensorRT cannot parse this ONNX: {errors}")
    return builder, network, parser


def build_engine(
    trt: Any,
    logger: Any,
    onnx_path: str,
    settings: BuildSettings,
    timing_cache: Path,
    calibrator: Any = None,
    progress: bool = True,
) -> tuple[bytes, list[str]]:
    """Build a serialized engine from ``onnx_path``; returns it and the layers off the DLA.

    Raises BackendError with the parser's or the builder's reason.
    """
    check_version(trt, settings.precision)
    builder, network, _parser = _parse(trt, logger, onnx_path)
    return _build(trt, builder, network, settings, timing_cache, calibrator, progress, onnx_path)


def build_preprocess_engine(
    trt: Any,
    logger: Any,
    fmt: InputFormat,
    settings: BuildSettings,
    timing_cache: Path,
    out_dtype: Any = None,
) -> tuple[bytes, list[str]]:
    """The preprocessing network for a float-input model, as an engine.

    Input ``frame``: the letterboxed uint8 NHWC BGR frame (1, H, W, 3). Output ``input``:
    the model's input, NCHW, colour order, scale and mean/std as the manifest says. The
    uint8 → fp16 cast cannot run on the DLA (it has no uint8 tensors); the transpose, the
    channel swap and the per-channel scale are what the DLA may take. ``out_dtype`` (a
    ``trt.DataType``): the model input's own type, which the output must match; without it
    the manifest's dtype.
    """
    check_version(trt, settings.precision)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    x = network.add_input("frame", trt.DataType.UINT8, (1, fmt.height, fmt.width, 3))
    t = network.add_cast(x, trt.DataType.HALF).get_output(0)
    shuffle = network.add_shuffle(t)
    shuffle.first_transpose = (0, 3, 1, 2)
    t = shuffle.get_output(0)
    if fmt.color == "rgb":
        order = network.add_constant((3,), np.array([2, 1, 0], np.int32))
        t = network.add_gather(t, order.get_output(0), 1).get_output(0)
    scale = (np.float32(fmt.scale) / np.asarray(fmt.std, np.float32)).astype(np.float32)
    shift = (-np.asarray(fmt.mean, np.float32) / np.asarray(fmt.std, np.float32)).astype(np.float32)
    # Kept referenced until the build ends: TensorRT holds pointers to the weights.
    weights = (scale, shift)
    out = network.add_scale(t, trt.ScaleMode.CHANNEL, shift=shift, scale=scale).get_output(0)
    out.name = "input"
    network.mark_output(out)
    if out_dtype is None:
        out_dtype = trt.DataType.HALF if fmt.dtype == "float16" else trt.DataType.FLOAT
    out.dtype = out_dtype
    plan, off_dla = _build(trt, builder, network, settings, timing_cache, None, False, "preprocessing")
    del weights
    return plan, off_dla


def _build(
    trt: Any,
    builder: Any,
    network: Any,
    settings: BuildSettings,
    timing_cache: Path,
    calibrator: Any,
    progress: bool,
    what: str,
) -> tuple[bytes, list[str]]:
    config = builder.create_builder_config()
    blob = timing_cache.read_bytes() if timing_cache.exists() else b""
    cache = config.create_timing_cache(blob)
    # A cache made on another device (or corrupt) is refused, not used: start a new one.
    if cache is None or not config.set_timing_cache(cache, False):
        log.warning("%s: timing cache %s not usable here; starting a new one", what, timing_cache)
        config.set_timing_cache(config.create_timing_cache(b""), False)
    if progress and hasattr(trt, "IProgressMonitor"):
        config.progress_monitor = make_progress_monitor(trt)
    off_dla = apply_settings(trt, builder, network, config, settings)
    if settings.precision == "int8":
        if calibrator is None:
            raise BackendError(f"{what}: int8 needs calibration frames")
        config.int8_calibrator = calibrator
    if off_dla:
        log.warning(
            "%s: %d layer(s) cannot run on DLA%d and fall back to the GPU: %s",
            what,
            len(off_dla),
            settings.dla_core,
            ", ".join(off_dla[:20]),
        )
    t0 = time.monotonic()
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        # The builder's reason first (it may refuse before calibrating); a calibration
        # error, if any, rides along.
        error = getattr(calibrator, "error", None)
        also = f"; int8 calibration failed too: {type(error).__name__}: {error}" if error else ""
        raise BackendError(
            f"{what}: TensorRT could not build the engine (see its log above){also}"
        ) from error
    check_calibration(calibrator, what)
    log.info("%s: engine built in %.1f s", what, time.monotonic() - t0)
    used = config.get_timing_cache()
    if used is not None:
        atomic_write(timing_cache, memoryview(used.serialize()))
    return bytes(plan), off_dla
