"""Sources by type: ``create_source`` builds one from a source's config.

Each module of this package that builds sources from a config declares them as
``SOURCES`` (type name -> the class or factory taking the config); the registry imports
the package's modules on the first lookup and puts those in a plain dict that refuses a
name twice. Importing a module registers nothing by itself, and a source's module is all
the frame path needs to know it (its config dataclass sits in ``core/source_config.py``).
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.core.source_config import (
    SourceConfig,
    SyntheticSourceConfig,
    V4L2SourceConfig,
    VideoSourceConfig,
)
from edge_agent.pipelines.sources.base import Source, SourceError
from edge_agent.pipelines.sources.files import video_fps

_REGISTRY: dict[str, Callable[[Any], Source]] = {}
_lock = threading.Lock()
_imported = False


def register(type_name: str, factory: Callable[[Any], Source]) -> None:
    """Make ``factory`` build the sources of ``type_name``; a name twice is refused."""
    if type_name in _REGISTRY:
        raise ValueError(f"source type {type_name!r} is already registered")
    _REGISTRY[type_name] = factory


def _import_modules() -> None:
    """Register the ``SOURCES`` of every module of the package, in name order."""
    global _imported
    with _lock:
        if _imported:
            return
        for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
            declared = getattr(importlib.import_module(f"{__package__}.{info.name}"), "SOURCES", {})
            for type_name, factory in declared.items():
                register(type_name, factory)
        _imported = True


def source_types() -> list[str]:
    _import_modules()
    return sorted(_REGISTRY)


def create_source(config: SourceConfig) -> Source:
    _import_modules()
    try:
        factory = _REGISTRY[config.type]
    except KeyError:
        raise SourceError(
            f"unknown source type {config.type!r} (one of {', '.join(sorted(_REGISTRY))})"
        ) from None
    return factory(config)


def source_rate(src: SourceConfig) -> float:
    """The rate a source is played at as a camera (bench's live phase, tune's candidates):
    a synthetic or V4L2 camera's configured fps, a video file's own frame rate, else 30.
    A source's ``max_fps`` is no part of it: that is its lane's cap, applied there."""
    if isinstance(src, (SyntheticSourceConfig, V4L2SourceConfig)) and src.fps > 0:
        return src.fps
    if isinstance(src, VideoSourceConfig):
        return video_fps(src.path) or 30.0
    return 30.0
