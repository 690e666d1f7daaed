"""Event snapshots: the annotated frame of a zone's or line's event as a JPEG, written off
the frame path into a bounded folder.

The post stage hands over a frame with events (``offer``): its pixels (the slot's copy,
``FrameSlot.pixels``) and detections go into one of ``POOL`` preallocated frames, or the
frame is dropped and counted when all are busy; nothing else happens on the frame path.
The writer thread draws it as the live view does (``view.annotate``), encodes it once and
writes it under each event's name, atomically and never through a symlink
(``core.files.SafeDir``). Per folder the files it wrote are kept within ``max_files`` and
``max_mib``, the oldest deleted first, counting what an earlier run left there.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import cv2

from edge_agent.core.analytics_config import SnapshotConfig
from edge_agent.core.files import open_dir
from edge_agent.pipelines.view_tap import ViewFrame
from edge_agent.service.view.annotate import annotate

log = logging.getLogger(__name__)

POOL = 4  # frames waiting to be written at most; more are dropped and counted
#: What this writer names its files (and so what it may delete): time, source, event seq.
NAME = re.compile(r"^\d{8}T\d{6}\.\d{3}Z_[A-Za-z0-9_-]+_\d+_[a-z]+_[A-Za-z0-9_-]+(_(in|out))?_t\d+\.jpg$")
#: How the writer named its temporaries before they were unpredictable: stale, removed at start.
_OLD_TEMPORARY = re.compile(r"^\." + NAME.pattern[1:-1] + r"\.tmp$")


@dataclass
class _Job:
    frame: ViewFrame
    source: str
    config: SnapshotConfig
    events: list[dict]


class _Folder:
    """One snapshot folder, opened once as a descriptor (``core.files.SafeDir``: never
    through a symlink, not one others can write to, created 0700), with the files written
    in it, oldest first, with their sizes. Every write, rename and removal is relative to
    that descriptor: names planted in the folder, or the folder swapped for a symlink later,
    send nothing elsewhere."""

    def __init__(self, path: str) -> None:
        self.dir = open_dir(path)
        self.path = path
        self.files: deque[tuple[str, int]] = deque()
        self.bytes = 0
        try:
            # A crash or a full disk in an earlier run left these; they count against no cap.
            self.stale = self.dir.remove_stale(also=_OLD_TEMPORARY)
            found = [
                (st.st_mtime_ns, name, st.st_size) for name, st in self.dir.entries() if NAME.match(name)
            ]
        except BaseException:
            self.dir.close()
            raise
        for _t, name, size in sorted(found):
            self.files.append((name, size))
            self.bytes += size

    def write(self, name: str, data: bytes, config: SnapshotConfig) -> None:
        # A failure leaves no temporary behind. Not fsync'ed: a snapshot lost to a power cut
        # is acceptable, two fsyncs per event on an SD card (tens of ms) would drop events.
        self.dir.write(name, data, durable=False)
        self.files.append((name, len(data)))
        self.bytes += len(data)
        limit = int(config.max_mib * 2**20)
        while self.files and (len(self.files) > config.max_files or self.bytes > limit):
            old, old_size = self.files.popleft()
            self.bytes -= old_size
            self.dir.unlink(old)  # gone already (removed by someone else): nothing to do


class _Refused(Exception):
    """A snapshot folder that could not be opened (the reason already logged)."""


class SnapshotService:
    """The agent's snapshot writer (one thread, started with the first snapshot)."""

    def __init__(self) -> None:
        self.written = 0  # files
        self.dropped = 0  # frames with events not written: the pool was full, or writing failed
        self.failed = 0  # of which writing failed
        self.stale = 0  # temporaries an earlier run left, removed when their folder was opened
        self._free: list[ViewFrame] = []
        self._made = 0
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self._folders: dict[str, _Folder] = {}
        self._refused: dict[str, str] = {}  # folder -> why, as last logged

    # -- the frame path ------------------------------------------------------------------

    def offer(self, analytics: Any, slot: Any, events: list[dict]) -> None:
        """The post stage: ``slot`` (its ``pixels`` kept) had ``events`` of a source's
        ``analytics`` (a ``SourceAnalytics``: its name, settings, zones, lines and counts)."""
        config: SnapshotConfig = analytics.config.snapshots
        with self._cond:
            if self._stop:
                return
            if self._free:
                frame = self._free.pop()
            elif self._made < POOL:
                self._made += 1
                frame = ViewFrame(len(slot.det_score))
            else:
                self.dropped += 1
                return
        n = min(slot.det_count, len(frame.det_score))
        frame.take_pixels(slot.pixels)
        frame.det_xyxy[:n] = slot.det_xyxy[:n]
        frame.det_score[:n] = slot.det_score[:n]
        frame.det_class[:n] = slot.det_class[:n]
        frame.det_track[:n] = slot.det_track[:n]
        frame.det_count = n
        frame.labels = slot.profile.model.manifest.labels
        frame.frame_id = slot.frame_id
        frame.shapes = analytics.shapes(frame.width, frame.height)
        frame.counts = analytics.message_block()
        first = events[0]
        where = " ".join(str(first[k]) for k in ("zone", "line", "direction") if k in first)
        frame.caption = f"frame {slot.frame_id}  {first['kind']} {where}  #{first['track_id']}"
        if len(events) > 1:
            frame.caption += f"  (+{len(events) - 1})"
        with self._cond:
            self._jobs.append(_Job(frame, analytics.source, config, [dict(e) for e in events]))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="snapshots", daemon=True)
                self._thread.start()
            self._cond.notify()

    # -- its thread ----------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stop:
                    self._cond.wait()
                if not self._jobs:
                    return
                job = self._jobs.popleft()
            try:
                self._write(job)
            except Exception as e:  # a full disk, a folder removed or refused: counted, the agent goes on
                self.dropped += 1
                self.failed += 1
                if isinstance(e, _Refused):
                    pass  # logged once per folder and reason
                elif self.failed in (1, 10) or self.failed % 1000 == 0:  # not a line per event
                    # an OSError names the path and why; anything else is a bug: its traceback
                    log.error(
                        "snapshots: frame %d of %s not written (%d failures): %s",
                        *(job.frame.frame_id, job.source, self.failed, e),
                        exc_info=not isinstance(e, OSError),
                    )
            with self._cond:
                self._free.append(job.frame)

    def _write(self, job: _Job) -> None:
        f = job.frame
        image = annotate(f.image[: f.height, : f.width], f)
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, job.config.jpeg_quality])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        folder = self._folder(job.config.dir)
        data = jpeg.tobytes()
        for event in job.events:
            folder.write(file_name(job.source, event), data, job.config)
            self.written += 1

    def _folder(self, path: str) -> _Folder:
        folder = self._folders.get(path)
        if folder is not None:
            return folder
        try:
            folder = _Folder(path)
        except OSError as e:  # refused (a symlink, others can write to it): tried again next time
            if self._refused.get(path) != str(e):  # each folder's reason once, not a line per event
                self._refused[path] = str(e)
                log.error("snapshots: none written: %s", e)
            raise _Refused from e
        self._refused.pop(path, None)
        self._folders[path] = folder
        self.stale += folder.stale
        if folder.stale:
            log.info("snapshots: removed %d stale temporaries in %s", folder.stale, path)
        return folder

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        pass  # the thread starts with the first snapshot: nothing runs while none is taken

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Write what is queued (within ``timeout_s``), then end the thread."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            return False
        for folder in self._folders.values():  # the thread is gone: nobody uses them
            folder.dir.close()
        self._folders.clear()
        return True


def file_name(source: str, event: dict) -> str:
    """``20261202T070312.345Z_cam0_17_cross_door_in_t42.jpg``: when, which source and
    event (its seq), what, where, which track."""
    at = float(event["at_unix_s"])
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(at)) + f".{int(at * 1000) % 1000:03d}Z"
    where = event.get("zone") or event.get("line")
    direction = f"_{event['direction']}" if "direction" in event else ""
    return f"{stamp}_{source}_{event['seq']}_{event['kind']}_{where}{direction}_t{event['track_id']}.jpg"
