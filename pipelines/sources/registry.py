"""Sources by type: ``create_source`` builds one from a source's config.

Each module of this package that builds sources from a config declares them as
``SOURCES`` (type name -> the class or factory taking the config); the registry imports
the package's modules on the first lookup and puts those in a plain dict that refuses a
name twice. Importing a module registers nothing by itself, and a source's module is all
the frame path needs to know it (its config dataclass sits in ``core/source_config.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.core.plugins import PackageRegistry
from edge_agent.core.source_config import (
    SourceConfig,
    SyntheticSourceConfig,
    V4L2SourceConfig,
    VideoSourceConfig,
)
from edge_agent.pipelines.sources.base import Source, SourceError
from edge_agent.pipelines.sources.files import video_fps

_REGISTRY: PackageRegistry[Callable[[Any], Source]] = PackageRegistry(
    "source type",
    __package__,
    str(Path(__file__).parent),
    lambda module: getattr(module, "SOURCES", {}).items(),
)


def register(type_name: str, factory: Callable[[Any], Source]) -> None:
    """Make ``factory`` build the sources of ``type_name``; a name twice is refused."""
    _REGISTRY.register(type_name, factory)


def source_types() -> list[str]:
    return _REGISTRY.names()


def create_source(config: SourceConfig) -> Source:
    try:
        factory = _REGISTRY.get(config.type)
    except LookupError as e:
        raise SourceError(str(e)) from None
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
