"""Frame sources behind one interface: open / read(timeout) / close / describe.

Each source names its buffer policy. ``NEWEST``: a live source keeps only the newest
frame, and frames the pipeline had no time for are skipped (latency beats completeness).
``WAIT``: a file source hands over every frame and the source waits for the pipeline.

``read`` returns a ``SourceFrame`` that the source owns and reuses: its image stays valid
until the next ``read`` call, which is all the capture stage needs to preprocess it.
"""

from __future__ import annotations

import enum
import glob
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

from edge_agent.config import (
    ImageFolderSourceConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.pipelines.synthetic import SceneSpec, SyntheticScene

log = logging.getLogger(__name__)


# OpenCV's FFmpeg backend takes its demuxer options from this process-wide variable,
# read inside VideoCapture's open; no open parameter sets them per capture (OpenCV 4.8 to
# 5.0 accept only the timeouts, threads, format and hardware-acceleration ones there).
FFMPEG_OPTIONS_VAR = "OPENCV_FFMPEG_CAPTURE_OPTIONS"
_ffmpeg_options_lock = threading.Lock()


def open_video(
    target: str, api: int = cv2.CAP_ANY, params: list[int] | None = None, ffmpeg_options: str = ""
) -> cv2.VideoCapture:
    """``cv2.VideoCapture(target, api, params)`` with FFmpeg ``ffmpeg_options`` ("key;value",
    appended to the user's own OPENCV_FFMPEG_CAPTURE_OPTIONS) for this open alone.

    Files and streams are opened under one lock: the variable is set, the capture opened
    and the previous value put back, so two RTSP sources opening at once never see each
    other's transport, and no open reads the variable while another thread writes it.
    OpenCV serialises FFmpeg opens with a lock of its own (unless
    OPENCV_FFMPEG_IS_THREAD_SAFE=1), so this one costs no concurrency.
    """
    with _ffmpeg_options_lock:
        previous = os.environ.get(FFMPEG_OPTIONS_VAR)
        if ffmpeg_options:
            os.environ[FFMPEG_OPTIONS_VAR] = f"{previous}|{ffmpeg_options}" if previous else ffmpeg_options
        try:
            return cv2.VideoCapture(target, api, params or [])
        finally:
            if previous is None:
                os.environ.pop(FFMPEG_OPTIONS_VAR, None)
            else:
                os.environ[FFMPEG_OPTIONS_VAR] = previous


class BufferPolicy(enum.Enum):
    NEWEST = "newest"  # live: older untaken frames are dropped
    WAIT = "wait"  # files: every frame is delivered


class SourceError(RuntimeError):
    """A source cannot be opened or read; the message names the device, URL or file."""


class EndOfStream(Exception):
    """A finite source has delivered its last frame."""


class SourceFrame:
    """One frame as delivered by a source (reused by the source between reads)."""

    __slots__ = ("capture_ns", "frame_id", "gt", "image")

    def __init__(self) -> None:
        self.image: np.ndarray = np.empty((0, 0, 3), np.uint8)
        self.frame_id: int = -1
        self.capture_ns: int = 0  # time.monotonic_ns() when the frame was taken
        self.gt: np.ndarray | None = None  # ground truth (synthetic source only)


class Source(ABC):
    policy: BufferPolicy = BufferPolicy.WAIT

    def __init__(self, name: str) -> None:
        self.name = name
        self.skipped = 0  # frames a live source dropped because a newer one arrived

    @abstractmethod
    def open(self) -> None: ...

    @abstractmethod
    def read(self, timeout_s: float) -> SourceFrame | None:
        """The next frame, or None if none arrived within ``timeout_s``.

        Raises EndOfStream when a finite source is exhausted, SourceError when it failed.
        """

    def close(self) -> None:  # noqa: B027 - sources without resources need nothing
        pass

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "type": type(self).__name__, "policy": self.policy.value}


class SyntheticSource(Source):
    """The synthetic scene, paced like a camera at ``fps`` (or unpaced when fps is 0).

    Paced, it behaves like a live camera: frame k exists at t0 + k/fps whether or not the
    pipeline asks for it, so a busy pipeline gets the newest frame and the ones in
    between are skipped. Its capture time is when frame k was due, as a camera's would be.
    """

    def __init__(self, config: SyntheticSourceConfig) -> None:
        super().__init__(config.name)
        self.config = config
        self.policy = BufferPolicy.NEWEST if config.fps > 0 else BufferPolicy.WAIT
        self.scene: SyntheticScene | None = None
        self._frame = SourceFrame()
        self._next = 0
        self._t0 = 0
        self._period_ns = int(1e9 / config.fps) if config.fps > 0 else 0

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
        self._next = 0
        self._t0 = 0

    def read(self, timeout_s: float) -> SourceFrame | None:
        if self.scene is None:
            raise SourceError(f"source {self.name!r} read before open")
        if self._period_ns:
            now = time.monotonic_ns()
            if self._t0 == 0:
                self._t0 = now
            due = self._t0 + self._next * self._period_ns
            if due > now:
                wait = (due - now) / 1e9
                if wait > timeout_s:
                    time.sleep(timeout_s)
                    return None
                time.sleep(wait)
                index = self._next
            else:
                index = (now - self._t0) // self._period_ns
                self.skipped += index - self._next
            capture_ns = self._t0 + index * self._period_ns
        else:
            index = self._next
            capture_ns = time.monotonic_ns()
        f = self._frame
        self.scene.render(index, f.image, f.gt)
        f.frame_id = index
        f.capture_ns = capture_ns
        self._next = index + 1
        return f

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {**super().describe(), "size_wh": [c.width, c.height], "fps": c.fps, "seed": c.seed}


class VideoFileSource(Source):
    """A video file decoded by OpenCV into one reused buffer."""

    def __init__(self, config: VideoSourceConfig) -> None:
        super().__init__(config.name)
        self.config = config
        self.policy = BufferPolicy.NEWEST if config.realtime else BufferPolicy.WAIT
        self._cap: cv2.VideoCapture | None = None
        self._frame = SourceFrame()
        self._index = 0
        self._t0 = 0
        self._period_ns = 0

    def open(self) -> None:
        path = self.config.path
        if not os.path.isfile(path):
            raise SourceError(f"video file not found: {path}")
        cap = open_video(path)
        if not cap.isOpened():
            cap.release()
            raise SourceError(f"cannot decode video file: {path}")
        self._cap = cap
        fps = cap.get(cv2.CAP_PROP_FPS) or 0.0
        self._period_ns = int(1e9 / fps) if self.config.realtime and fps > 0 else 0
        self._index = 0

    def _decode(self) -> bool:
        assert self._cap is not None
        ok, img = self._cap.read(self._frame.image if self._frame.image.size else None)
        if ok:
            self._frame.image = img
        return ok

    def read(self, timeout_s: float) -> SourceFrame | None:
        if self._cap is None:
            raise SourceError(f"source {self.name!r} read before open")
        if self._period_ns:
            # Real time, as a camera: wait for a frame that is not due yet, and skip the
            # frames whose time has passed while the pipeline was busy.
            now = time.monotonic_ns()
            self._t0 = self._t0 or now
            wait_s = (self._t0 + self._index * self._period_ns - now) / 1e9
            if wait_s > timeout_s:
                time.sleep(timeout_s)
                return None
            if wait_s > 0:
                time.sleep(wait_s)
            due_index = (time.monotonic_ns() - self._t0) // self._period_ns
            while self._index < due_index and self._cap.grab():
                self._index += 1
                self.skipped += 1
        if not self._decode():
            if not self.config.loop:
                raise EndOfStream(self.config.path)
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            self._t0, self._index = 0, 0
            if not self._decode():
                raise SourceError(f"cannot read from video file: {self.config.path}")
        f = self._frame
        f.frame_id = self._index
        f.capture_ns = time.monotonic_ns()
        self._index += 1
        return f

    def close(self) -> None:
        if self._cap is not None:
            self._cap.release()
            self._cap = None


class ImageFolderSource(Source):
    """Every image of a folder, in name order; unreadable files are skipped and logged."""

    def __init__(self, config: ImageFolderSourceConfig) -> None:
        super().__init__(config.name)
        self.config = config
        self._files: list[str] = []
        self._pos = 0
        self._frame = SourceFrame()
        self.unreadable = 0

    def open(self) -> None:
        folder = self.config.path
        if not os.path.isdir(folder):
            raise SourceError(f"image folder not found: {folder}")
        files = {f for p in self.config.patterns for f in glob.glob(os.path.join(folder, p))}
        self._files = sorted(files)
        if not self._files:
            raise SourceError(f"no images matching {list(self.config.patterns)} in {folder}")
        self._pos = 0

    def read(self, timeout_s: float) -> SourceFrame | None:
        for _ in range(len(self._files)):
            if self._pos >= len(self._files):
                if not self.config.loop:
                    raise EndOfStream(self.config.path)
                self._pos = 0
            path = self._files[self._pos]
            index = self._pos
            self._pos += 1
            img = cv2.imread(path, cv2.IMREAD_COLOR)
            if img is None:
                self.unreadable += 1
                log.warning("source %s: skipping unreadable image %s", self.name, path)
                continue
            f = self._frame
            f.image, f.frame_id, f.capture_ns = img, index, time.monotonic_ns()
            return f
        raise SourceError(f"no readable image in {self.config.path}")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "files": len(self._files)}


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
