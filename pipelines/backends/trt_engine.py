"""The TensorRT backend's engines: from the engine cache, or built and stored.

The model engine is keyed by everything that decides its plan (``engine_cache.EngineKey``):
the ONNX's contents, the TensorRT version, the device, the build settings and, for INT8, the
calibration images' fingerprint. A cached engine that fails to deserialize (stale or
corrupt) is discarded and rebuilt once. The input shape to build for is read from the ONNX
itself (no TensorRT parse, and a plugin graph that ONNX Runtime cannot load is read too):
its dynamic axes take what the pipeline feeds (the largest batch, the manifest's H and W).

``EngineMaker`` holds what every engine of one backend's load shares (the modules, the
logger, the cache, the device); the caller makes the CUDA context current around it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.core.files import file_sha256
from edge_agent.core.model_config import TensorRTConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_build, trt_support
from edge_agent.pipelines.backends.base import BackendError
from edge_agent.pipelines.backends.engine_cache import EngineCache, EngineKey

log = logging.getLogger(__name__)


@dataclass
class ModelEngine:
    """The model engine and what its build decided."""

    engine: Any
    key: EngineKey
    batch: tuple[int, bool]  # (largest batch, fixed): a fixed one pads smaller batches
    plugins: list[str]  # the TensorRT plugins (``*_TRT`` ops) the ONNX holds


@dataclass
class EngineMaker:
    """Engines for one backend's load. ``notes`` and ``off_dla`` collect what was decided
    and why (the backend's own lists: ``describe`` reports them)."""

    config: TensorRTConfig
    trt: Any
    cuda: Any
    cuda_ctx: Any  # the primary context (the INT8 calibrator makes it current on its thread)
    logger: Any
    cache: EngineCache
    device: str  # the device part of every key
    num_dla: int
    fmt: InputFormat  # the manifest's input format
    notes: list[str] = field(default_factory=list)
    off_dla: dict[str, list[str]] = field(default_factory=dict)

    def key_for(
        self, settings: trt_build.BuildSettings, onnx_sha: str, role: str, calib: str = ""
    ) -> EngineKey:
        return EngineKey(
            onnx_sha256=onnx_sha,
            tensorrt_version=str(self.trt.__version__),
            device=self.device,
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

    def cached(self, stem: str, key: EngineKey, build: Callable[[], bytes]) -> Any:
        """Deserialize the cached engine, building it first if missing, stale or corrupt."""
        runtime = self.trt.Runtime(self.logger)
        if key.dla_core >= 0:
            runtime.DLA_core = key.dla_core
        for attempt in (1, 2):
            path = self.cache.lookup(stem, key)
            if path is None:
                path = self.cache.store(stem, key, build())
            engine = runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is not None:
                return engine
            self.cache.invalidate(stem, key, "TensorRT could not deserialize it")
            if attempt == 2:
                raise BackendError(f"{path}: the engine TensorRT just built does not deserialize")
        raise AssertionError("unreachable")

    # -- the model engine ---------------------------------------------------------------

    def model_engine(self, model_path: str) -> ModelEngine:
        name, shape, dynamic, dtype, plugins = self._model_input(model_path)
        settings, notes = trt_build.settings_for(
            self.config, name, shape, self.num_dla, dynamic_batch=dynamic
        )
        self.notes += notes
        # A GPU engine runs any batch up to its largest; a DLA one (or a model exported with
        # a fixed batch) only its own, which smaller batches pad.
        batch = (shape[0], settings.min_batch == 0)
        onnx_sha = file_sha256(model_path)
        make_calibrator, calib_sha = None, ""
        stem = Path(model_path).parent.name if Path(model_path).stem == "model" else Path(model_path).stem
        if settings.precision == "int8":
            make_calibrator, calib_sha = self._calibrator(stem, onnx_sha, shape, dtype)
        key = self.key_for(settings, onnx_sha, "model", calib_sha)

        def build() -> bytes:
            log.info("tensorrt: building %s (minutes on a Nano; cached afterwards)", key.describe())
            # Made (its device buffer allocated) only for a build, with the context current.
            calibrator = make_calibrator() if make_calibrator else None
            try:
                plan, off_dla = trt_build.build_engine(
                    self.trt, self.logger, model_path, settings, self.cache.timing_cache_path(key), calibrator
                )
            finally:
                if calibrator is not None:
                    calibrator.close()
            self.off_dla["model"] = off_dla
            return plan

        return ModelEngine(self.cached(stem, key, build), key, batch, plugins)

    def _model_input(self, model_path: str) -> tuple[str, tuple[int, ...], bool, str, list[str]]:
        """The input's name, the shape to build for, whether its batch axis is dynamic, its
        dtype (numpy's name; the manifest's where the ONNX type is not one the agent reads),
        and the ONNX's TensorRT plugins (a failed capture names them, the likely cause)."""
        from edge_agent.models import onnx_info

        try:
            info = onnx_info.read(model_path)
            inp = info.inputs[0]
        except Exception as e:  # protobuf's DecodeError, OSError, IndexError (no input)
            raise BackendError(f"cannot read the input of {model_path}: {e}") from None
        plugins = sorted(op for op in info.ops if op.endswith("_TRT"))
        f, b = self.fmt, self._max_batch()
        fed = (b, f.height, f.width, 3) if f.layout == "NHWC" else (b, 3, f.height, f.width)
        dims = list(inp.shape)
        if len(dims) != len(fed):
            fed = (1,) * len(dims)
        shape = tuple(d if d else w for d, w in zip(dims, fed))
        dynamic = bool(dims) and not dims[0]
        return inp.name, shape, dynamic, inp.dtype or f.dtype, plugins

    def _max_batch(self) -> int:
        """The batch to build for: the config's, except where batching is not supported."""
        want, f = self.config.max_batch or 1, self.fmt
        if want > 1 and self.config.precision == "int8":
            self.notes.append("batch 1: int8 calibration with a batch profile is unverified")
            return 1
        if want > 1 and f.dtype != "uint8" and f.layout == "NCHW" and self.config.preprocess != "cpu":
            self.notes.append("batch 1: the device preprocessing engine takes one frame at a time")
            return 1
        return want

    def _calibrator(self, stem: str, onnx_sha: str, shape: tuple[int, ...], dtype: str) -> tuple[Any, str]:
        cfg = self.config

        def cache(calib_sha: str) -> Path:
            return self.cache.calibration_cache_path(stem, onnx_sha, calib_sha)

        modules = (self.trt, self.cuda, self.cuda_ctx)
        return trt_support.calibration(
            modules, cfg.calibration_images, cfg.calibration_frames, self.fmt, cache, shape, dtype
        )
