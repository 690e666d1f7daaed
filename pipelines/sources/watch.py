"""A folder watched for new images (source type ``watch``): uploads from a camera trap or
an FTP drop, each processed once, in the order they arrived.

A file counts once its size has not changed for ``settle_s`` (a file still being written
is not read half-way). Files already there at start are skipped unless ``existing``. What
was seen is remembered only while the file is still there, so the memory follows the
folder, not the run's length; a file written again under the same name after it was
removed is new. Unreadable files are skipped and counted.

The folder may be written by others (an FTP drop): files are read with ``files.read_image``,
which takes regular files of at most ``files.MAX_IMAGE_BYTES`` only, checked on the open file
(a FIFO swapped in would block the read, a device never end), and reads each one's header
before decoding it: one declaring over ``max_pixels`` (a decompression bomb: a 110 kB PNG can
declare 30000x30000 pixels, 2.7 GB decoded) is skipped unread (``pipelines/images.py``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from edge_agent.core.source_config import WatchFolderSourceConfig
from edge_agent.pipelines.sources.base import Source, SourceError, SourceFrame
from edge_agent.pipelines.sources.files import list_images, read_image

log = logging.getLogger(__name__)


class WatchFolderSource(Source):
    def __init__(self, config: WatchFolderSourceConfig) -> None:
        super().__init__(config.name)
        self.config = config
        self._frame = SourceFrame()
        self._seen: set[str] = set()  # files handed over (or skipped), still in the folder
        self._sizes: dict[str, tuple[int, int]] = {}  # a new file: (size, when first seen at it)
        self._ready: list[str] = []  # settled files not handed over yet, oldest first
        self._next_look = 0.0
        self._count = 0
        self.unreadable = 0

    def open(self) -> None:
        c = self.config
        if not os.path.isdir(c.path):
            raise SourceError(f"folder to watch not found: {c.path}")
        self._seen = set() if c.existing else set(list_images(c.path, c.patterns))
        self._sizes.clear()
        self._ready.clear()
        self._next_look = 0.0

    def read(self, timeout_s: float) -> SourceFrame | None:
        deadline = time.monotonic() + timeout_s
        while True:
            frame = self._next_ready()
            if frame is not None:
                return frame
            now = time.monotonic()
            if now >= self._next_look:
                self._next_look = now + self.config.poll_s
                self._look()
                if self._ready:
                    continue
            if now >= deadline:
                return None
            time.sleep(max(0.0, min(deadline, self._next_look) - now))

    def _next_ready(self) -> SourceFrame | None:
        """The oldest settled file's image (unreadable ones skipped); None when none is left."""
        while self._ready:
            path = self._ready.pop(0)
            img = read_image(path, self.name, max_pixels=self.config.max_pixels)
            if img is None:
                self.unreadable += 1
                continue
            f = self._frame
            f.image, f.frame_id, f.capture_ns = img, self._count, time.monotonic_ns()
            self._count += 1
            return f
        return None

    def _look(self) -> None:
        """New files whose size settled go to ``_ready``, in the order they were written."""
        try:
            files = list_images(self.config.path, self.config.patterns)
        except OSError as e:
            raise SourceError(f"cannot list {self.config.path}: {e}") from None
        present = set(files)
        self._seen &= present  # forget what is gone: a file written again is new
        now_ns = time.monotonic_ns()
        settled = []
        for path in files:
            if path in self._seen:
                continue
            try:
                st = os.stat(path)
            except OSError:  # removed meanwhile
                continue
            size, since = self._sizes.get(path, (-1, now_ns))
            if st.st_size != size:
                self._sizes[path] = (st.st_size, now_ns)
                since = now_ns
            if (now_ns - since) / 1e9 < self.config.settle_s:
                continue
            settled.append((st.st_mtime_ns, path))
        for _, path in sorted(settled):
            self._seen.add(path)
            self._sizes.pop(path, None)
            self._ready.append(path)
        for path in set(self._sizes) - present:
            del self._sizes[path]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "path": self.config.path, "seen": len(self._seen)}


SOURCES = {"watch": WatchFolderSource}  # source types built here (the registry collects them)
