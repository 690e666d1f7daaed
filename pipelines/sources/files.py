"""Sources that read files: a video (``VideoFileSource``) and an image folder
(``ImageFolderSource``), and the helpers that list, count, decode and preload their frames
for bench and tune."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import time
from collections.abc import Collection, Iterator
from dataclasses import fields, replace
from typing import Any

import cv2
import numpy as np

from edge_agent.core.source_config import ImageFolderSourceConfig, VideoSourceConfig
from edge_agent.pipelines.images import MAX_IMAGE_BYTES, MAX_PIXELS, ImageError, read_image_file
from edge_agent.pipelines.sources.base import (
    BufferPolicy,
    EndOfStream,
    Pacer,
    Source,
    SourceError,
    SourceFrame,
    open_video,
)

log = logging.getLogger(__name__)


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
        self._clock = Pacer(0)
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
        self._clock = Pacer(fps if self.config.realtime else 0)
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
        if self._clock.period_ns:
            # Real time, as a camera: wait for a frame that is not due yet, and skip the
            # frames whose time has passed while the pipeline was busy.
            due_index = self._clock.wait_due(self._index, timeout_s)
            if due_index is None:
                return None
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
            self._clock.reset()
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


#: What an image folder is searched for unless its config says otherwise.
IMAGE_PATTERNS: tuple[str, ...] = next(
    f.default for f in fields(ImageFolderSourceConfig) if f.name == "patterns"
)


def list_images(folder: str, patterns: tuple[str, ...] = IMAGE_PATTERNS) -> list[str]:
    """The regular files of ``folder`` matching ``patterns``, in name order (a FIFO would
    block a read, a device never end). The folder's name is taken as it is: glob characters
    in it (``cam[1]``) match themselves."""
    base = glob.escape(folder)
    return sorted({f for p in patterns for f in glob.glob(os.path.join(base, p)) if os.path.isfile(f)})


def folder_images(src: ImageFolderSourceConfig) -> list[str]:
    """The images an image-folder source plays; SourceError naming the folder when it is
    missing or holds none."""
    folder = src.path
    if not os.path.isdir(folder):
        raise SourceError(f"image folder not found: {folder}")
    files = list_images(folder, src.patterns)
    if not files:
        raise SourceError(f"no images matching {list(src.patterns)} in {folder}")
    return files


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
        self._files = folder_images(self.config)
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
            img = read_image(path, self.name, max_pixels=self.config.max_pixels)
            if img is None:
                self.unreadable += 1
                continue
            f = self._frame
            f.image, f.frame_id, f.capture_ns = img, index, time.monotonic_ns()
            return f
        raise SourceError(f"no readable image in {self.config.path}")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "files": len(self._files)}


def read_image(
    path: str, source: str, max_bytes: int | None = None, max_pixels: int = MAX_PIXELS
) -> np.ndarray | None:
    """The image in ``path``, decoded by ``images.read_image_file``; None, with a warning
    naming the file and why, when it is not a regular file, is over ``max_bytes`` (default
    ``MAX_IMAGE_BYTES``), declares over ``max_pixels`` pixels, is not a format read there, or
    does not decode. Nothing waits on a FIFO or a device put in the image's place."""
    limit = MAX_IMAGE_BYTES if max_bytes is None else max_bytes
    try:
        return read_image_file(path, max_pixels, limit)
    except ImageError as e:
        log.warning("source %s: skipping %s", source, e)
        return None


# -- a file's frames, decoded beforehand --------------------------------------------------

FileSourceConfig = VideoSourceConfig | ImageFolderSourceConfig

#: Most memory a file's frames take once decoded (``preload``); a longer file plays its
#: first ones.
PRELOAD_MIB = 256


def video_fps(path: str) -> float:
    """A video file's own frame rate; 0 when it gives none (or an implausible one)."""
    if not os.path.isfile(path):
        return 0.0
    cap = open_video(path)
    try:
        fps = float(cap.get(cv2.CAP_PROP_FPS) or 0.0) if cap.isOpened() else 0.0
    finally:
        cap.release()
    return fps if 0 < fps <= 1000 else 0.0


def frame_count(src: FileSourceConfig) -> int:
    """The images of a folder, or the frames a video file declares (0: it declares none;
    a damaged file may give fewer). Raises SourceError as the source's open would."""
    if isinstance(src, ImageFolderSourceConfig):
        return len(folder_images(src))
    if not os.path.isfile(src.path):
        raise SourceError(f"video file not found: {src.path}")
    cap = open_video(src.path)
    try:
        if not cap.isOpened():
            raise SourceError(f"cannot decode video file: {src.path}")
        return max(int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0)
    finally:
        cap.release()


def file_frames(src: FileSourceConfig, picks: Collection[int] | None = None) -> Iterator[np.ndarray]:
    """The frames of a video file or an image folder, one pass, decoded one at a time (each
    valid until the next): all of them, or those at the indices ``picks`` (of the folder's
    images; of the video's frames, each decoded in turn). Unreadable images are skipped, a
    video is read past damage, as their sources do. Raises SourceError naming the file.
    Close the iterator when leaving it early (``contextlib.closing``)."""
    wanted = sorted(set(picks)) if picks is not None else None
    if isinstance(src, ImageFolderSourceConfig) and wanted is not None:
        files = folder_images(src)
        for i in wanted:
            if i < len(files) and (img := read_image(files[i], src.name, None, src.max_pixels)) is not None:
                yield img
        return
    once: FileSourceConfig = replace(src, loop=False)
    if isinstance(once, VideoSourceConfig):
        once = replace(once, realtime=False)  # as fast as it decodes
    source: Source = VideoFileSource(once) if isinstance(once, VideoSourceConfig) else ImageFolderSource(once)
    source.open()
    try:
        keep = set(wanted) if wanted is not None else None
        last = wanted[-1] if wanted else -1
        index = 0
        while keep is None or index <= last:
            try:
                frame = source.read(1.0)
            except EndOfStream:
                return
            if frame is None:
                return
            if keep is None or index in keep:
                yield frame.image
            index += 1
    finally:
        source.close()


def preload(src: FileSourceConfig, wanted: int, max_mib: float = PRELOAD_MIB) -> list[np.ndarray]:
    """The first ``wanted`` frames of ``src``, decoded into memory for a ``MemorySource``
    (one pass at most: a shorter file is looped when played; and at most ``max_mib`` of
    them). Raises SourceError, naming the file, for one that cannot be opened or gives no
    frame."""
    images: list[np.ndarray] = []
    size = 0
    with contextlib.closing(file_frames(src)) as frames:
        for image in frames:
            if images and size + image.nbytes > max_mib * (1 << 20):
                break
            images.append(image.copy())  # a video decodes into one reused buffer
            size += image.nbytes
            if len(images) >= wanted:
                break
    if not images:
        raise SourceError(f"no frame read from {src.path}")
    return images


SOURCES = {
    "video": VideoFileSource,
    "images": ImageFolderSource,
}  # source types built here (the registry collects them)
