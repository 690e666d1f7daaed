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
        # Frames a live source read but never handed over because they were stale when they
        # came: the backlog a stream delivers in a burst on (re)connect.
        self.stale = 0
        # Frames a damaged input lost (a file that ends before its declared length, or
        # reads that failed mid-file), and what happened, for the summary and heartbeats.
        self.lost = 0
        self.damage = ""

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


#: Containers whose frame count comes from an index (OpenCV reads the stream's nb_frames).
_EXACT_COUNT = (".avi", ".mp4", ".mov", ".m4v", ".3gp")


class VideoFileSource(Source):
    """A video file decoded by OpenCV into one reused buffer.

    A damaged file must not end as if it had finished. OpenCV's FFmpeg backend (4.x, 5.0)
    answers a corrupt packet with a failed ``read()`` (the decoder refused the packet, or 64
    decode errors in a row) and the demuxer stays past it, so a later read can succeed:
    AVI (MJPG) and Matroska resynchronise on the next intact chunk after one failed read,
    MP4 and MOV (mp4v) fail about once per damaged frame. ``grab()`` is the same call
    without the colour conversion and recovers no better. Some damage fails no read at
    all (XVID in AVI, VP8 in WebM): the demuxer skips it and fewer frames come out, which
    only the container's frame count shows. A truncated AVI or Matroska file opens and
    ends early; an MP4 cut before its index (written last by OpenCV) does not open.

    So a failed read is read past (``MAX_FAILED_READS`` in a row), and then, when the file
    declares its length, the frames past the damage are sought (``CAP_PROP_POS_FRAMES``,
    which OpenCV turns into a timestamp): exact where the timestamps come from an intact
    index (MP4), landing later in Matroska, and wrong in AVI, whose timestamps after damage
    count the packets read, so a seek there goes back and delivers frames twice. A seek is
    therefore made only after seeking back onto the frame in the buffer gives that frame.
    ``CAP_PROP_POS_FRAMES`` counts the frames decoded, whatever was skipped, and is never
    read for a position; ``CAP_PROP_POS_MSEC`` comes from the frame's timestamp.

    ``lost`` counts the frames not decoded: the larger of the frames read past and the
    frames missing at the end of a pass against the declared count (trusted only for
    index-based containers, ``_EXACT_COUNT``, when positive, with a tolerance of 1 %, at
    least 2 frames; elsewhere it is an estimate and only failed reads count). ``damage``
    says what happened, in one line; each pass is warned about once.
    """

    # Failed reads in a row read past before a seek past the damage is tried (or the end
    # is believed). At the real end each costs a few microseconds.
    MAX_FAILED_READS = 8

    def __init__(self, config: VideoSourceConfig) -> None:
        super().__init__(config.name)
        self.config = config
        self.policy = BufferPolicy.NEWEST if config.realtime else BufferPolicy.WAIT
        self._cap: cv2.VideoCapture | None = None
        self._frame = SourceFrame()
        self._index = 0
        self._t0 = 0
        self._period_ns = 0
        self._fps = 0.0
        self._declared = 0  # the container's frame count when it gives one, else 0
        self._passes = 0
        self._damaged_passes = 0
        self._start_pass()

    def _start_pass(self) -> None:
        self._passes += 1
        self._index = 0  # frames taken from the file in this pass, decoded or grabbed
        self._pass_skipped = 0  # frames known to be skipped past damage in this pass
        self._pass_lost = 0  # what this pass has added to self.lost so far
        self._events: list[str] = []
        self._warned = False
        self._buffer_at = -1  # frame number (from its timestamp) of the image in the buffer
        self._last_at = -1  # frame number of the last frame decoded or grabbed

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
        self._fps = fps if fps > 0 else 0.0
        self._period_ns = int(1e9 / fps) if self.config.realtime and fps > 0 else 0
        count = cap.get(cv2.CAP_PROP_FRAME_COUNT)
        # Only an index-based container's count is exact; elsewhere (Matroska, WebM, MPEG-TS,
        # FLV) it is duration x fps, and an audio track longer than the video, or a variable
        # frame rate, would make an intact file look short. There only failed reads count.
        exact = os.path.splitext(path)[1].lower() in _EXACT_COUNT
        self._declared = int(count) if count > 0 and exact else 0
        self._passes = 0
        self._start_pass()

    def _position(self) -> int:
        """The frame number of the frame just decoded or grabbed, from its timestamp."""
        assert self._cap is not None
        return round(self._cap.get(cv2.CAP_PROP_POS_MSEC) * self._fps / 1000) if self._fps else -1

    def _grab(self) -> bool:
        assert self._cap is not None
        if not self._cap.grab():
            return False
        self._last_at = self._position()
        return True

    def _decode(self) -> bool:
        assert self._cap is not None
        ok, img = self._cap.read(self._frame.image if self._frame.image.size else None)
        if ok:
            self._frame.image = img
            self._buffer_at = self._last_at = self._position()
        return ok

    def _next_frame(self, failed: int = 0) -> bool:
        """Decode the next frame into the buffer, past damage; False at the end of a pass.

        ``failed``: reads (grabs) that already failed just before this call.
        """
        if not failed and self._decode():
            return True
        at = self._index
        failed = max(failed, 1)
        while failed < self.MAX_FAILED_READS:
            if self._decode():
                reads = "read" if failed == 1 else "reads"
                self._damaged(failed, f"reads failed at frame {at}, resumed after {failed} failed {reads}")
                return True
            failed += 1
        gap_from = self._last_at
        landed = self._seek_past_damage()
        if landed < 0:
            return False
        self._damaged(
            landed - gap_from - 1,
            f"reads failed at frame {at}, sought past the damage to frame {landed}"
            f" after {failed} failed reads",
        )
        return True

    def _seek_past_damage(self) -> int:
        """Seek past damage that reading does not get past; the frame landed on, or -1."""
        cap, declared = self._cap, self._declared
        assert cap is not None
        start = self._last_at + 1
        if not declared or not self._fps or self._buffer_at < 0 or start >= declared - self._tolerance():
            return -1
        # Only where seeking back onto the frame in the buffer gives that frame again do
        # the timestamps say where the reads stopped (see the class notes on AVI).
        ref = self._frame.image
        cap.set(cv2.CAP_PROP_POS_FRAMES, self._buffer_at)
        ok, img = cap.read()
        if (
            not ok
            or self._position() != self._buffer_at
            or img.shape != ref.shape
            or cv2.norm(img, ref, cv2.NORM_L1) > ref.size  # a mean difference of 1 level
        ):
            return -1
        # A seek lands only where the key frame before its target is intact: probe forward
        # in doubling steps for a frame that decodes, then halve the way back to the damage.
        bad, good, step = start - 1, -1, self.MAX_FAILED_READS
        while good < 0:
            target = min(start + step, declared - 1)
            if self._land(target):
                good = target
            elif target >= declared - 1:
                return -1
            else:
                bad, step = target, step * 2
        there = True
        while good - bad > 1:
            middle = (bad + good) // 2
            there = self._land(middle)
            bad, good = (bad, middle) if there else (middle, good)
        if not there and not self._land(good):
            return -1
        return self._last_at

    def _land(self, target: int) -> bool:
        """Seek to frame ``target`` and decode there (or later: Matroska lands later)."""
        assert self._cap is not None
        self._cap.set(cv2.CAP_PROP_POS_FRAMES, target)
        return self._decode() and self._last_at >= target

    def _tolerance(self) -> int:
        return max(2, self._declared // 100)

    def _damaged(self, frames: int, event: str) -> None:
        """Damage read past in this pass: count it, say it (once a pass) and record it."""
        self._pass_skipped += max(frames, 1)
        self._events.append(event)
        self._count(self._pass_skipped)
        self._warn(event)

    def _end_pass(self) -> None:
        """At the end of a pass, count the frames missing against the declared count."""
        declared, seen = self._declared, self._index
        short = declared - seen if declared else 0
        if short <= self._tolerance() and not self._pass_skipped:
            return
        lost = max(short, self._pass_skipped)
        if short > 0:
            self._events.append(f"decoding ended at frame {seen} of {declared}")
        self._count(lost)
        self._warn(f"decoding ended at frame {seen} of the {declared} it declares, {lost} not decoded")

    def _count(self, pass_lost: int) -> None:
        if not self._pass_lost:
            self._damaged_passes += 1
        self.lost += pass_lost - self._pass_lost
        self._pass_lost = pass_lost
        events = "; ".join(self._events[:3])
        if len(self._events) > 3:
            events += f"; {len(self._events) - 3} more"
        of = f"{pass_lost} of {self._declared}" if self._declared else f"at least {pass_lost}"
        line = f"{of} frames not decoded ({events})"
        if self._damaged_passes > 1:
            passes = f"{self.lost} frames not decoded in {self._damaged_passes} passes"
            line = f"{passes}; pass {self._passes}: {line}"
        self.damage = f"damaged: {line}"

    def _warn(self, event: str) -> None:
        if not self._warned:
            self._warned = True
            where = f" (pass {self._passes})" if self.config.loop else ""
            log.warning("video file %s is damaged%s: %s", self.config.path, where, event)

    def read(self, timeout_s: float) -> SourceFrame | None:
        if self._cap is None:
            raise SourceError(f"source {self.name!r} read before open")
        failed = 0
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
            while self._index < due_index:
                if not self._grab():
                    failed = 1  # the end, or damage: _next_frame tells which
                    break
                self._index += 1
                self.skipped += 1
        if not self._next_frame(failed):
            self._end_pass()
            if not self.config.loop:
                raise EndOfStream(self.config.path)
            decoded_any = self._index > 0
            self._cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
            self._t0 = 0
            self._start_pass()
            if not decoded_any or not self._next_frame():
                raise SourceError(f"cannot read from video file: {self.config.path}")
        f = self._frame
        f.frame_id = self._index
        f.capture_ns = time.monotonic_ns()
        self._index += 1
        return f

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "lost": self.lost, "damage": self.damage}

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
