"""Backends by the ``type`` of their config section: ``create_backend`` builds one.

Each module of this package that adds a backend declares it as ``BACKENDS``: (type name,
the class or factory taking the config section) pairs. The registry
(``core.plugins.PackageRegistry``) imports the package's modules on the first lookup and
puts those in a plain dict that refuses a name twice; importing a module registers nothing
by itself, and a backend's module is all it takes to add one. This module adds ``auto``.

Collecting imports every module of the package, so none of them imports a backend's own
packages at import time: onnxruntime, tensorrt, pycuda and cuda-python are imported by the
functions that need them (a backend's ``load``), and a missing one is a BackendError naming
it when that backend is used, never when another is.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from edge_agent.core.plugins import PackageRegistry
from edge_agent.pipelines.backends.base import BackendError, InferenceBackend

log = logging.getLogger(__name__)

Factory = Callable[[Any], InferenceBackend]


def _declared(module: ModuleType) -> tuple[tuple[str, Factory], ...]:
    return tuple(getattr(module, "BACKENDS", ()))


_REGISTRY: PackageRegistry[Factory] = PackageRegistry(
    "backend", __package__, str(Path(__file__).parent), _declared
)


def register(name: str, factory: Factory) -> None:
    """Make ``factory`` build the backends of ``name``; a name twice is refused (ValueError),
    a declared one too (the modules are collected first)."""
    _REGISTRY.register(name, factory)


def names() -> list[str]:
    return _REGISTRY.names()


def create_backend(config: Any) -> InferenceBackend:
    """A backend for a config section whose ``type`` names a registered backend
    (BackendError naming the known ones otherwise)."""
    try:
        factory = _REGISTRY.get(config.type)
    except LookupError as e:
        raise BackendError(str(e)) from None
    return factory(config)


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


BACKENDS = (("auto", select_auto),)  # what this module adds (the registry collects it)
