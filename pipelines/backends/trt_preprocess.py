"""The TensorRT backend's device preprocessing: for a float-input model, normalisation and
the NCHW transpose run in a small engine of their own, on a DLA core (GPU fallback), whose
output feeds the model engine on the device; the host only letterboxes uint8 pixels.

It is an optimisation: where the model's input or the device does not allow it, or its
engine fails to build, the notes say why and preprocessing stays on the CPU (right answers
either way). The network itself is built by ``trt_build.build_preprocess_engine``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_build, trt_support
from edge_agent.pipelines.backends.base import BackendError, TensorSpec, device_format
from edge_agent.pipelines.backends.trt_engine import EngineMaker

FRAME_TENSOR = "frame"  # the preprocessing engine's input
PREPROCESSED = "input"  # its output, the model's input


@dataclass
class DevicePreprocessing:
    """The preprocessing engine, its execution context, and what the host writes for it."""

    engine: Any
    context: Any
    host_format: InputFormat  # uint8 NHWC, letterboxed
    frame: TensorSpec  # the engine's input: what the host writes
    on_gpu: bool  # False: on a DLA (its work runs plainly, outside the model's graph)


def device_preprocessing(
    maker: EngineMaker, fmt: InputFormat, model_in: TensorSpec, batch: tuple[int, bool]
) -> DevicePreprocessing | None:
    """The device preprocessing for a model taking ``model_in`` (the engine's own input, not
    the manifest's word) at ``batch`` (largest, fixed); None: on the CPU (``maker.notes``
    says why). Call with the CUDA context current."""
    cfg = maker.config
    if fmt.dtype == "uint8" or cfg.preprocess == "cpu":
        if fmt.dtype == "uint8":
            maker.notes.append("model takes uint8: normalisation is already in its graph")
        return None
    core = 0 if cfg.preprocess == "dla" else -1
    shape = (1, fmt.height, fmt.width, 3)
    settings, notes = trt_build.settings_for(cfg, FRAME_TENSOR, shape, maker.num_dla, dla_core=core)
    settings = trt_build.BuildSettings(**{**settings.__dict__, "precision": "fp16"})
    maker.notes += [f"preprocessing: {n}" for n in notes]
    why = trt_support.no_device_preprocessing(fmt, settings, model_in, batch)
    if why:
        maker.notes.append(f"preprocessing on the CPU: {why}")
        return None
    trt = maker.trt
    out_dtype = trt.DataType.HALF if model_in.dtype == np.float16 else trt.DataType.FLOAT
    # Only what the device engine computes: the resize happens on the host before it.
    used = (fmt.height, fmt.width, fmt.layout, str(model_in.dtype), fmt.color, fmt.scale, fmt.mean, fmt.std)
    key = maker.key_for(settings, hashlib.sha256(repr(used).encode()).hexdigest(), "preprocess")

    def build() -> bytes:
        plan, off_dla = trt_build.build_preprocess_engine(
            trt, maker.logger, fmt, settings, maker.cache.timing_cache_path(key), out_dtype
        )
        maker.off_dla["preprocess"] = off_dla
        return plan

    try:
        engine = maker.cached("preprocess", key, build)
        context = engine.create_execution_context()
        if context is None:
            raise BackendError("TensorRT could not create the preprocessing engine's execution context")
        trt_support.check_preprocessed(engine, PREPROCESSED, model_in.shape, model_in.dtype, trt)
    except Exception as e:  # BackendError, or an add_* that returned None (AttributeError)
        maker.notes.append(f"preprocessing on the CPU: the device engine failed ({type(e).__name__}: {e})")
        return None
    where = f"DLA{settings.dla_core}" if settings.dla_core >= 0 else "GPU"
    maker.notes.append(f"preprocessing (normalise, NCHW) on {where}")
    host = device_format(fmt)
    frame = TensorSpec(FRAME_TENSOR, shape, np.dtype(np.uint8))
    # A graph holds GPU work only: on a DLA it runs plainly before the model's graph.
    return DevicePreprocessing(engine, context, host, frame, on_gpu=settings.dla_core < 0)
