"""Backends by the ``type`` of their config section, registered explicitly.

Each entry imports its module only when selected, so a backend's heavy or platform
dependencies (onnxruntime, tensorrt, pycuda) are needed only where that backend is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from edge_agent.pipelines.backends.base import BackendError, InferenceBackend

log = logging.getLogger(__name__)

_REGISTRY: dict[str, Callable[[Any], InferenceBackend]] = {}


def register(name: str, factory: Callable[[Any], InferenceBackend]) -> None:
    if name in _REGISTRY:
        raise ValueError(f"backend {name!r} is already registered")
    _REGISTRY[name] = factory


def _lazy(module: str, cls: str, needs: str) -> Callable[[Any], InferenceBackend]:
    def factory(config: Any) -> InferenceBackend:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            raise BackendError(f"backend {config.type!r} needs {needs}: {e}") from None
        return getattr(mod, cls)(config)

    return factory


register(
    "onnxruntime",
    _lazy("edge_agent.pipelines.backends.onnxruntime", "OnnxRuntimeBackend", "the onnxruntime package"),
)
register(
    "tensorrt",
    _lazy("edge_agent.pipelines.backends.tensorrt", "TensorRTBackend", "TensorRT and pycuda"),
)


def select_auto(config: Any, probe: Callable[[], str] | None = None) -> InferenceBackend:
    """TensorRT where it imports and a GPU answers, else ONNX Runtime; logs why.

    ``probe`` returns "" when TensorRT is usable, else the reason it is not.
    """
    reason = (probe or tensorrt_unavailable)()
    if not reason:
        log.info("backend auto: TensorRT (it imports and a GPU answers)")
        return create_backend(config.tensorrt)
    log.info("backend auto: ONNX Runtime, because %s", reason)
    return create_backend(config.onnxruntime)


def tensorrt_unavailable() -> str:
    """Why TensorRT cannot be used here ("" if it can): checked without building anything."""
    if importlib.util.find_spec("tensorrt") is None:
        return "the tensorrt module is not installed (it comes with JetPack)"
    if importlib.util.find_spec("pycuda") is None:
        return "pycuda is not installed (pip install 'edge-agent[jetson]')"
    try:
        import pycuda.driver as cuda

        cuda.init()
        if cuda.Device.count() < 1:
            return "CUDA reports no GPU"
    except Exception as e:  # pycuda raises its own error types for a missing driver
        return f"no GPU answers ({type(e).__name__}: {e})"
    return ""


register("auto", select_auto)


def create_backend(config: Any) -> InferenceBackend:
    """A backend for a config section whose ``type`` names a registered backend."""
    try:
        factory = _REGISTRY[config.type]
    except KeyError:
        raise BackendError(f"unknown backend {config.type!r} (known: {', '.join(_REGISTRY)})") from None
    return factory(config)


def names() -> list[str]:
    return list(_REGISTRY)
