"""Frame sources by type: the registry ``create_source`` builds from a source's config, the
synthetic camera and the memory source (frames played from RAM as a camera, for bench and
tune). The interface is ``source_base``; files are ``file_sources``; cameras, streams and
GStreamer pipelines are ``capture``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.core.source_config import (
    SourceConfig,
    SyntheticSourceConfig,
    V4L2SourceConfig,
    VideoSourceConfig,
)
from edge_agent.pipelines.file_sources import ImageFolderSource, VideoFileSource, video_fps
from edge_agent.pipelines.source_base import PacedSource, Source, SourceError, SourceFrame
from edge_agent.pipelines.synthetic import SceneSpec, SyntheticScene

log = logging.getLogger(__name__)


class SyntheticSource(PacedSource):
    """The synthetic scene, paced like a camera at ``fps`` (or unpaced when fps is 0).

    Paced, it behaves like a live camera (``Pacer``): frame k exists at t0 + k/fps whether
    or not the pipeline asks for it, so a busy pipeline gets the newest frame and the ones
    in between are skipped. Its capture time is when frame k was due.
    """

    def __init__(self, config: SyntheticSourceConfig) -> None:
        super().__init__(config.name, config.fps)
        self.config = config
        self.scene: SyntheticScene | None = None

    @property
    def _next(self) -> int:
        """The next frame's index."""
        return self._pacer.next_index

    def open(self) -> None:
        c = self.config
        self.scene = SyntheticScene(
            SceneSpec(
                width=c.width,
                height=c.height,
                seed=c.seed,
                num_objects=c.num_objects,
                noise_sigma=c.noise_sigma,
            )
        )
        self._frame.image = np.empty((c.height, c.width, 3), np.uint8)
        self._frame.gt = np.zeros((c.num_objects, 6), np.float32)
        self._pacer.reset()

    def read(self, timeout_s: float) -> SourceFrame | None:
        if self.scene is None:
            raise SourceError(f"source {self.name!r} read before open")
        return super().read(timeout_s)

    def _fill(self, index: int, frame: SourceFrame) -> None:
        assert self.scene is not None
        self.scene.render(index, frame.image, frame.gt)

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {**super().describe(), "size_wh": [c.width, c.height], "fps": c.fps, "seed": c.seed}


class MemorySource(PacedSource):
    """Frames decoded beforehand (``preload``), played from memory, looped; nothing is
    decoded while it plays.

    Unpaced (``fps`` 0) it hands over the next frame whenever the pipeline asks, each one
    processed, as a file source does. Paced, it is a live camera (``Pacer``, as the
    synthetic camera): a busy pipeline gets the newest frame, those in between are
    skipped, and a frame's capture time is when it was due. (The file sources are no
    camera: a video's ``realtime`` decodes on the capture thread and stamps a frame after
    decoding it, and ``max_fps`` only spaces the reads of a source that still hands over
    every frame.)
    """

    def __init__(self, name: str, images: list[np.ndarray], fps: float = 0.0) -> None:
        super().__init__(name, fps)
        if not images:
            raise SourceError(f"source {name!r}: no frames to play")
        self.images = images
        self.fps = fps

    def open(self) -> None:
        self._pacer.reset()

    def _fill(self, index: int, frame: SourceFrame) -> None:
        frame.image = self.images[index % len(self.images)]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "frames": len(self.images), "fps": self.fps}


def source_rate(src: SourceConfig) -> float:
    """The rate a source is played at as a camera (bench's live phase, tune's candidates):
    a synthetic or V4L2 camera's configured fps, a video file's own frame rate, else 30.
    A source's ``max_fps`` is no part of it: that is its lane's cap, applied there."""
    if isinstance(src, (SyntheticSourceConfig, V4L2SourceConfig)) and src.fps > 0:
        return src.fps
    if isinstance(src, VideoSourceConfig):
        return video_fps(src.path) or 30.0
    return 30.0


_REGISTRY: dict[str, Callable[[Any], Source]] = {}


def register(type_name: str, factory: Callable[[Any], Source]) -> None:
    if type_name in _REGISTRY:
        raise ValueError(f"source type {type_name!r} is already registered")
    _REGISTRY[type_name] = factory


def _live(config: Any) -> Source:
    from edge_agent.pipelines.capture import OpenCvCapture

    return OpenCvCapture(config)


register("synthetic", SyntheticSource)
register("video", VideoFileSource)
register("images", ImageFolderSource)
for _t in ("v4l2", "rtsp", "gstreamer"):
    register(_t, _live)


def create_source(config: SourceConfig) -> Source:
    try:
        return _REGISTRY[config.type](config)
    except KeyError:
        raise SourceError(f"unknown source type {config.type!r}") from None
