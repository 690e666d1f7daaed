"""Backends by the ``type`` of their config section, registered explicitly.

Each entry imports its module only when selected, so a backend's heavy or platform
dependencies (onnxruntime, tensorrt, pycuda) are needed only where that backend is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from edge_agent.pipelines.backends.base import BackendError, InferenceBackend

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


def create_backend(config: Any) -> InferenceBackend:
    """A backend for a config section whose ``type`` names a registered backend."""
    try:
        factory = _REGISTRY[config.type]
    except KeyError:
        raise BackendError(f"unknown backend {config.type!r} (known: {', '.join(_REGISTRY)})") from None
    return factory(config)


def names() -> list[str]:
    return list(_REGISTRY)
