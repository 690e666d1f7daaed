"""What every frame source is: the ``Source`` interface (open / read(timeout) / close /
describe), the frame it hands over, its buffer policy and errors, and the one frame clock
(``Pacer``: the synthetic camera and the memory source through ``PacedSource``, a video
played in real time, and the capture loop's frame-rate cap).

Each source names its buffer policy. ``NEWEST``: a live source keeps only the newest
frame, and frames the pipeline had no time for are skipped (latency beats completeness).
``WAIT``: a file source hands over every frame and the source waits for the pipeline.

``read`` returns a ``SourceFrame`` that the source owns and reuses: its image stays valid
until the next ``read`` call, which is all the capture stage needs to preprocess it.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

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

    # The agent's lifecycle (core.lifecycle.Component): a source starts by opening.
    def start(self) -> None:
        self.open()

    def stop(self, timeout_s: float = 0.0) -> bool:
        """Close; a source with no thread of its own ends at once, so ``timeout_s`` is not
        needed (live sources, which read on a thread, wait for it up to ``timeout_s``)."""
        self.close()
        return True

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "type": type(self).__name__, "policy": self.policy.value}


class Pacer:
    """The one frame clock, at ``fps``: frame k is due at t0 + k/fps (t0: the first call),
    whether or not anyone asks for it. A caller that comes late gets the newest frame due
    and those in between are skipped (never a burst to catch up); a frame's capture time is
    when it was due, as a camera's would be. Unpaced (``fps`` 0) each call is the next
    frame, captured now.

    It paces a camera (``PacedSource``), a video file played in real time, and a source's
    frame-rate cap in the capture loop, which passes its stop event's ``wait`` so a stop
    cuts a wait short (``wait`` returns True to abandon it)."""

    def __init__(
        self, fps: float, wait: Callable[[float], bool | None] = time.sleep, phase: float = 0.0
    ) -> None:
        self.fps = fps
        self.period_ns = int(1e9 / fps) if fps > 0 else 0
        # The first frame is due this fraction of a period after the first call: cameras
        # that are not in step with each other (the bench spreads its cameras so).
        self.phase_ns = int(phase * self.period_ns)
        self.next_index = 0
        self._t0 = 0
        self._wait = wait

    def reset(self) -> None:
        self.next_index, self._t0 = 0, 0

    def wait_due(self, index: int, timeout_s: float) -> int | None:
        """Wait until frame ``index`` is due; the newest frame due by then (``index`` or
        later), or None when it is not due within ``timeout_s`` or the wait was abandoned."""
        now = time.monotonic_ns()
        if self._t0 == 0:
            self._t0 = now + self.phase_ns
        due = self._t0 + index * self.period_ns
        if due > now:
            wait = (due - now) / 1e9
            if wait > timeout_s:
                self._wait(timeout_s)
                return None
            if self._wait(wait):
                return None
            return index
        return max(index, (now - self._t0) // self.period_ns)

    def tick(self, timeout_s: float) -> tuple[int, int, int] | None:
        """(frame index, capture time in ``time.monotonic_ns``, frames skipped before it);
        None when the next frame is not due within ``timeout_s`` (waited for), or when
        ``wait`` abandoned the wait (a stop)."""
        if not self.period_ns:
            index, capture_ns = self.next_index, time.monotonic_ns()
        else:
            due = self.wait_due(self.next_index, timeout_s)
            if due is None:
                return None
            index, capture_ns = due, self._t0 + due * self.period_ns
        skipped = index - self.next_index
        self.next_index = index + 1
        return index, capture_ns, skipped


class PacedSource(Source):
    """A source whose frames exist on a ``Pacer``'s clock (a camera) or, at fps 0, one
    after the other as asked (a file); ``_fill`` puts frame ``index``'s image in place."""

    def __init__(self, name: str, fps: float) -> None:
        super().__init__(name)
        self.policy = BufferPolicy.NEWEST if fps > 0 else BufferPolicy.WAIT
        self._pacer = Pacer(fps)
        self._frame = SourceFrame()

    def read(self, timeout_s: float) -> SourceFrame | None:
        tick = self._pacer.tick(timeout_s)
        if tick is None:
            return None
        index, capture_ns, skipped = tick
        self.skipped += skipped
        f = self._frame
        self._fill(index, f)
        f.frame_id = index
        f.capture_ns = capture_ns
        return f

    def _fill(self, index: int, frame: SourceFrame) -> None:
        raise NotImplementedError
