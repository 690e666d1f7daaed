"""Live cameras through OpenCV: V4L2 devices, RTSP URLs and GStreamer pipelines (written by
hand, or built for a Jetson camera or stream by ``jetson_capture``).

A reader thread owns the ``cv2.VideoCapture`` and decodes into three reused buffers: one
being written, the newest complete frame, and the one the pipeline is reading. The
pipeline always gets the newest frame; frames it had no time for are overwritten
(counted in ``skipped``), and the backlog a stream delivers at once on (re)connect is
drained (counted in ``stale``). A camera that fails to open, errors or stalls is reopened with
exponential backoff and jitter, without stopping the agent.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import cv2
import numpy as np

from edge_agent.core.source_config import GStreamerSourceConfig, RtspSourceConfig, V4L2SourceConfig
from edge_agent.pipelines.sources.base import BufferPolicy, Source, SourceError, SourceFrame, open_video
from edge_agent.pipelines.sources.jetson_capture import gstreamer_pipeline

log = logging.getLogger(__name__)
CLOSE_WAIT_S = 0.5  # a close waits this long for the reader thread (it may be blocked in the driver)

LiveConfig = V4L2SourceConfig | RtspSourceConfig | GStreamerSourceConfig


def has_gstreamer() -> bool:
    for line in cv2.getBuildInformation().splitlines():
        if line.strip().startswith("GStreamer:"):
            return "YES" in line
    return False


def open_capture(config: LiveConfig) -> cv2.VideoCapture:
    """Open the device, URL or pipeline a live config names. Raises SourceError."""
    timeout_ms = int(config.stall_timeout_s * 1000)
    if config.type == "gstreamer":
        if not has_gstreamer():
            raise SourceError(
                "this OpenCV build has no GStreamer support (cv2.getBuildInformation() shows "
                "'GStreamer: NO'); on a Jetson use JetPack's OpenCV: create the venv with "
                "--system-site-packages and do not install the opencv extra"
            )
        pipeline = gstreamer_pipeline(config)  # as written, or built for its Jetson input
        cap = cv2.VideoCapture(pipeline, cv2.CAP_GSTREAMER)
        what = f"GStreamer pipeline {pipeline!r}"
    elif config.type == "rtsp":
        params = [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout_ms, cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout_ms]
        # The transport is this source's alone (see open_video).
        cap = open_video(config.url, cv2.CAP_FFMPEG, params, f"rtsp_transport;{config.transport}")
        what = f"RTSP stream {config.url}"
    else:
        device: Any = int(config.device) if config.device.isdigit() else config.device
        cap = cv2.VideoCapture(device, cv2.CAP_V4L2)
        what = f"V4L2 device {config.device}"
        if cap.isOpened():
            cap.set(cv2.CAP_PROP_BUFFERSIZE, 1)  # the driver's queue would add latency
            if config.width:
                cap.set(cv2.CAP_PROP_FRAME_WIDTH, config.width)
            if config.height:
                cap.set(cv2.CAP_PROP_FRAME_HEIGHT, config.height)
            if config.fps:
                cap.set(cv2.CAP_PROP_FPS, config.fps)
    if not cap.isOpened():
        cap.release()
        raise SourceError(f"cannot open {what}")
    return cap


_DRAIN_MAX_S = 1.0  # the longest a connect's backlog is drained


def _frame_period_s(cap: Any) -> float:
    """The stream's frame period from its declared rate; 1/30 s when it declares none
    (or nonsense: RTSP streams may report the 90 kHz RTP clock)."""
    get = getattr(cap, "get", None)
    fps = get(cv2.CAP_PROP_FPS) if get is not None else 0.0
    return 1.0 / fps if 1.0 <= fps <= 240.0 else 1.0 / 30


class Backoff:
    """Exponential backoff with full jitter, reset after a success."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self.initial_s, self.max_s = initial_s, max_s
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.max_s, self.initial_s * (2**self.attempt))
        self.attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempt = 0


class OpenCvCapture(Source):
    policy = BufferPolicy.NEWEST

    def __init__(self, config: LiveConfig, opener: Callable[[], cv2.VideoCapture] | None = None) -> None:
        super().__init__(config.name)
        self.config = config
        self._opener = opener or (lambda: open_capture(config))
        self._bufs: list[np.ndarray] = []
        self._cond = threading.Condition()
        self._latest = -1  # index of the newest complete buffer
        self._reading = -1  # index the consumer holds
        self._seq = 0  # complete frames written
        self._taken = 0  # seq of the last frame handed out
        self._ids = [0, 0, 0]
        self._stamps = [0, 0, 0]
        self._frame = SourceFrame()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gen = 0
        self._last_frame_ns = 0
        self._frozen_sample: np.ndarray | None = None
        self._frozen_since = 0.0
        self.failures = 0
        self.stalls = 0
        self.connected = False
        self.last_error = ""  # why it is not connected now ("" while it is)
        self.last_failure = ""  # the latest failure, kept after a reconnect

    def open(self) -> None:
        if isinstance(self.config, GStreamerSourceConfig) and self.config.input is not None:
            # The string to try with gst-launch-1.0 on the device when it does not open.
            log.info("source %s: GStreamer pipeline %s", self.name, gstreamer_pipeline(self.config))
        self._stop.clear()
        self._last_frame_ns = time.monotonic_ns()
        self._start_reader()

    def _start_reader(self) -> None:
        # Each reader has a generation; a reader stuck in the driver that finally returns
        # sees that it was replaced and leaves without touching the new reader's buffers.
        self._gen += 1
        self._bufs = []
        self._thread = threading.Thread(
            target=self._run, args=(self._gen,), name=f"capture-{self.name}", daemon=True
        )
        self._thread.start()

    def _run(self, gen: int) -> None:
        backoff = Backoff(self.config.retry_initial_s, self.config.retry_max_s)
        frame_id = 0
        current = lambda: gen == self._gen and not self._stop.is_set()  # noqa: E731
        while current():
            try:
                cap = self._opener()
            except Exception as e:  # SourceError, or whatever the driver raised
                self._failed(str(e), backoff)
                continue
            if not current():
                cap.release()
                return
            self.connected = True
            self.last_error = ""  # the state now; ``last_failure`` keeps what happened
            self._last_frame_ns = time.monotonic_ns()
            self._frozen_sample = None  # a new connection starts a new comparison
            log.info("source %s: connected", self.name)
            # A stream hands over the frames it buffered while the connection was set up
            # (FFmpeg's probing, the server's burst) far faster than its frame rate. They
            # are old: drained here and counted stale, instead of flooding the pipeline
            # with frames that would each be overrun by the next a moment later.
            period_s = _frame_period_s(cap)
            drain_end = time.monotonic() + _DRAIN_MAX_S
            drain_left = int(_DRAIN_MAX_S / period_s)  # at most a second's worth of frames
            draining = True
            try:
                while current():
                    slot = self._free_slot()
                    t = time.monotonic()
                    ok, img = cap.read(self._bufs[slot] if self._bufs else None)
                    if not current():
                        return
                    if not ok:
                        raise SourceError("read failed (camera gone, stream ended or stalled)")
                    if not self._bufs or img is not self._bufs[slot]:
                        # First frame, or the camera changed resolution: (re)allocate.
                        self._bufs = [img, np.empty_like(img), np.empty_like(img)]
                        slot = 0
                    frame_id += 1
                    if draining:
                        now = time.monotonic()
                        if now - t < period_s / 2 and now < drain_end and drain_left > 0:
                            drain_left -= 1
                            self.stale += 1
                            self._last_frame_ns = time.monotonic_ns()  # not stalled
                            continue
                        draining = False
                    self._check_frozen(self._bufs[slot])
                    self._publish(slot, frame_id - 1)
                    backoff.reset()
            except Exception as e:
                if current():
                    self.connected = False  # during the backoff too, not only after it
                    self._failed(str(e), backoff)
            finally:
                if gen == self._gen:
                    self.connected = False
                cap.release()

    def _failed(self, error: str, backoff: Backoff) -> None:
        self.failures += 1
        self.last_error = self.last_failure = error
        delay = backoff.next_delay()
        log.warning("source %s: %s; retrying in %.1f s", self.name, error, delay)
        self._stop.wait(delay)

    def _free_slot(self) -> int:
        with self._cond:
            for i in range(3):
                if i != self._latest and i != self._reading:
                    return i
        return 0

    def _check_frozen(self, img: np.ndarray) -> None:
        """A camera that keeps sending the same picture is as good as gone: after
        stall_timeout_s of identical frames it is reopened like a stalled one. A sparse
        sample of pixels is compared; a live sensor's noise always changes it."""
        sample = img[::37, ::41]
        now = time.monotonic()
        if self._frozen_sample is not None and np.array_equal(sample, self._frozen_sample):
            if now - self._frozen_since > self.config.stall_timeout_s:
                self._frozen_sample = None
                raise SourceError(f"frozen: the same image for {now - self._frozen_since:.1f} s")
            return
        self._frozen_sample = sample.copy()
        self._frozen_since = now

    def _publish(self, slot: int, frame_id: int) -> None:
        with self._cond:
            self._ids[slot] = frame_id
            self._last_frame_ns = self._stamps[slot] = time.monotonic_ns()
            self._latest = slot
            self._seq += 1
            self._cond.notify()

    def read(self, timeout_s: float) -> SourceFrame | None:
        with self._cond:
            if not self._cond.wait_for(lambda: self._seq > self._taken, timeout_s):
                self._check_stall()
                return None
            self.skipped += self._seq - self._taken - 1
            self._taken = self._seq
            self._reading = self._latest
            slot = self._reading
            f = self._frame
            f.image, f.frame_id, f.capture_ns = self._bufs[slot], self._ids[slot], self._stamps[slot]
        return f

    def _check_stall(self) -> None:
        """Called with the lock held when no frame came: replace a reader stuck in the driver.

        A blocked ``cap.read`` cannot be interrupted from outside (releasing a capture
        another thread is reading is unsafe in OpenCV), so a new reader with a new
        capture takes over and the stuck one is abandoned until its call returns.
        """
        silent_s = (time.monotonic_ns() - self._last_frame_ns) / 1e9
        if not self.connected or silent_s < self.config.stall_timeout_s:
            return
        self.failures += 1
        self.stalls += 1
        self.last_error = self.last_failure = f"no frame for {silent_s:.1f} s (stalled)"
        log.warning("source %s: %s; reopening", self.name, self.last_error)
        self.connected = False
        self._last_frame_ns = time.monotonic_ns()
        self._start_reader()

    def close(self) -> None:
        self.stop(CLOSE_WAIT_S)

    def stop(self, timeout_s: float = CLOSE_WAIT_S) -> bool:
        """Stop the reader; True if it ended within ``timeout_s``. A reader blocked in the
        driver is a daemon thread: it is abandoned (and said so), not waited for."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout=timeout_s)
        if thread.is_alive():
            log.warning("source %s: capture thread still blocked in the driver", self.name)
            return False
        return True

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "connected": self.connected,
            "failures": self.failures,
            "stalls": self.stalls,
            "last_error": self.last_error,
            "last_failure": self.last_failure,
        }


SOURCES = {
    t: OpenCvCapture for t in ("v4l2", "rtsp", "gstreamer")
}  # source types built here (the registry collects them)
