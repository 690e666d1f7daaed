"""A folder watched for new images (source type ``watch``): uploads from a camera trap or
an FTP drop, each processed once, in the order they arrived.

A file counts once its size has not changed for ``settle_s`` (a file still being written
is not read half-way). Files already there at start are skipped unless ``existing``. What
was seen is remembered only while the file is still there, so the memory follows the
folder, not the run's length; a file written again under the same name after it was
removed is new. Unreadable files are skipped and counted.

What a poll costs does not grow with the folder (a drop may keep millions of files): a
poll reads at most ``scan_limit`` entries of the folder (``os.scandir``, names and types
only; one ``stat`` per new file), and a pass over the folder that needs more goes on at
the next poll where it stopped; a poll that hit the bound is counted (``scan_limited``,
in ``describe``) and the first one logged. A new file then waits up to one pass. A folder
whose modification time has not moved since the last complete pass began is not listed
again (one ``stat`` of the folder per poll), but at least every ``RESCAN_S``; files waiting
to settle are looked at by name. Only ``open`` lists the whole folder at once (names and
types only, unless ``existing``: what is there is not new). Patterns match names as
``glob`` does (hidden names only by a pattern that starts with a dot).

The folder may be written by others (an FTP drop): files are read with ``files.read_image``,
which takes regular files of at most ``files.MAX_IMAGE_BYTES`` only, checked on the open file
(a FIFO swapped in would block the read, a device never end), and reads each one's header
before decoding it: one declaring over ``max_pixels`` (a decompression bomb: a 110 kB PNG can
declare 30000x30000 pixels, 2.7 GB decoded) is skipped unread (``pipelines/images.py``).
"""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import stat
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from edge_agent.core.source_config import WatchFolderSourceConfig
from edge_agent.pipelines.sources.base import Source, SourceError, SourceFrame
from edge_agent.pipelines.sources.files import read_image

log = logging.getLogger(__name__)

#: Folder entries (and waiting files looked at again) a poll handles at most: 10 to 20 ms
#: of one core (a tmpfs folder of 200,000 files, on a busy 2-core VM), a tenth of the
#: default ``poll_s``; a pass over a million files then takes 100 polls (20 s).
SCAN_LIMIT = 10_000
#: A folder is listed again at least this often, even when its modification time says
#: nothing changed (a filesystem whose folder times lag).
RESCAN_S = 30.0
#: A folder's modification time is trusted only when it is at least this much older than
#: the clock as a pass begins: a file added within the same timestamp tick (a few ms on
#: Linux, 2 s on FAT) would leave it unchanged.
_TRUSTED_AGE_NS = 3_000_000_000


def name_matcher(patterns: tuple[str, ...]) -> re.Pattern[str]:
    """One expression for ``patterns`` matched against names as ``glob`` matches them in
    a folder: case-sensitively, and a name starting with a dot only by a pattern that
    starts with one."""
    shown = [fnmatch.translate(p) for p in patterns if not p.startswith(".")]
    dotted = [fnmatch.translate(p) for p in patterns if p.startswith(".")]
    parts = [f"(?!\\.)(?:{'|'.join(shown)})"] if shown else []
    parts += [f"(?:{d})" for d in dotted]
    return re.compile("|".join(parts) or "(?!)")


def _is_file(entry: os.DirEntry[str]) -> bool:
    """A regular file, or a link to one (as ``os.path.isfile``: an entry that cannot be
    looked at is not one)."""
    try:
        return entry.is_file()
    except OSError:
        return False


class WatchFolderSource(Source):
    def __init__(self, config: WatchFolderSourceConfig, scan_limit: int = SCAN_LIMIT) -> None:
        """``scan_limit``: the entries a poll handles at most (``SCAN_LIMIT``)."""
        super().__init__(config.name)
        if scan_limit < 1:
            raise ValueError(f"scan_limit must be at least 1 (got {scan_limit})")
        self.config = config
        self.scan_limit = scan_limit
        self._match = name_matcher(config.patterns).fullmatch
        self._frame = SourceFrame()
        self._seen: set[str] = set()  # names handed over (or skipped), still in the folder
        self._sizes: dict[str, tuple[int, int]] = {}  # a new file's name: (size, when first seen at it)
        self._ready: deque[str] = deque()  # settled files' names not handed over yet, oldest first
        self._pass: Iterator[os.DirEntry[str]] | None = None  # the listing under way
        # What ``_seen`` becomes when the listing under way ends: the names it found seen,
        # and those handed over meanwhile (a name gone before it came to it is forgotten).
        self._pass_seen: set[str] = set()
        self._pass_stamp: int | None = None  # the folder's mtime as it began (None: not trusted)
        self._stamp: int | None = None  # ... as the last complete pass began
        self._last_pass = 0.0  # monotonic s when the last pass began
        self._next_look = 0.0
        self._count = 0
        self.unreadable = 0
        self.scan_limited = 0  # polls that stopped at ``scan_limit`` with work left

    def open(self) -> None:
        c = self.config
        if not os.path.isdir(c.path):
            raise SourceError(f"folder to watch not found: {c.path}")
        self._end_pass(complete=False)
        self._seen = set()
        self._sizes.clear()
        self._ready.clear()
        self._stamp = None
        self._next_look = 0.0
        if not c.existing:  # what is there now is not new: one whole pass, names only
            self._begin_pass()
            self._scan(None, 0, [])

    def close(self) -> None:
        self._end_pass(complete=False)

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
            path = os.path.join(self.config.path, self._ready.popleft())
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
        """One poll: settled files go to ``_ready``, in the order they were written; at most
        ``scan_limit`` entries handled (the files waiting to settle first, then the listing)."""
        now_ns = time.monotonic_ns()
        settled: list[tuple[int, str]] = []
        waiting = len(self._sizes)
        left = self._recheck(self.scan_limit, now_ns, settled)
        if self._pass is None and self._changed():
            self._begin_pass()
        if self._pass is not None and left:
            self._scan(left, now_ns, settled)
        if waiting > self.scan_limit or self._pass is not None:  # work left for the next poll
            self._limited()
        for _, name in sorted(settled):
            self._seen.add(name)
            if self._pass is not None:
                self._pass_seen.add(name)
            self._ready.append(name)

    def _settled(self, name: str, size: int, now_ns: int, was: tuple[int, int] | None = None) -> bool:
        """A new file seen at ``size`` (``was``: its size and since when, as last seen; None:
        seen for the first time): True once that size held for ``settle_s``, else it waits."""
        last, since = was if was is not None else (-1, now_ns)
        if size != last:
            since = now_ns
        if (now_ns - since) / 1e9 < self.config.settle_s:
            self._sizes[name] = (size, since)  # inserted last: the files waiting take turns
            return False
        return True

    def _recheck(self, budget: int, now_ns: int, settled: list[tuple[int, str]]) -> int:
        """The files waiting to settle, looked at again by name (the longest waiting first,
        ``budget`` at most); returns the budget left."""
        folder = self.config.path
        for name in list(self._sizes)[:budget]:
            budget -= 1
            was = self._sizes.pop(name)
            try:
                st = os.stat(os.path.join(folder, name))
            except OSError:  # removed meanwhile
                continue
            if stat.S_ISREG(st.st_mode) and self._settled(name, st.st_size, now_ns, was):
                settled.append((st.st_mtime_ns, name))
        return budget

    def _changed(self) -> bool:
        """Whether the folder may hold what the last complete pass did not see."""
        if self._stamp is None or time.monotonic() - self._last_pass >= RESCAN_S:
            return True
        try:
            return os.stat(self.config.path).st_mtime_ns != self._stamp
        except OSError as e:
            raise SourceError(f"cannot list {self.config.path}: {e}") from None

    def _begin_pass(self) -> None:
        path = self.config.path
        try:
            mtime = os.stat(path).st_mtime_ns
            now = time.time_ns()  # the clock file times are stamped by
            self._pass = os.scandir(path)
        except OSError as e:
            raise SourceError(f"cannot list {path}: {e}") from None
        self._pass_stamp = mtime if now - mtime >= _TRUSTED_AGE_NS else None
        self._pass_seen = set()
        self._last_pass = time.monotonic()

    def _scan(self, budget: int | None, now_ns: int, settled: list[tuple[int, str]]) -> None:
        """Go on with the pass: at most ``budget`` entries (None: to its end, each file found
        counted as seen: the folder at ``open``). New files start to settle (``settled``:
        those that already did); the pass ends with the listing."""
        it, kept, seen, match = self._pass, self._pass_seen, self._seen, self._match
        assert it is not None
        left = budget if budget is not None else -1
        try:
            while left != 0:
                entry = next(it, None)
                if entry is None:
                    break
                left -= 1
                name = entry.name
                if not (match(name) and _is_file(entry)):
                    continue
                if budget is None or name in seen:  # at open, everything there counts as seen
                    kept.add(name)
                elif name not in self._sizes:
                    try:
                        st = entry.stat()
                    except OSError:  # removed meanwhile
                        continue
                    if self._settled(name, st.st_size, now_ns):
                        settled.append((st.st_mtime_ns, name))
            else:
                return  # at the bound: the pass goes on at the next poll
        except OSError as e:
            self._end_pass(complete=False)
            raise SourceError(f"cannot list {self.config.path}: {e}") from None
        self._end_pass(complete=True)

    def _end_pass(self, complete: bool) -> None:
        """Close the listing; a complete one forgets what is gone (a file written again
        under its name is new) and stamps the folder's time."""
        if self._pass is None:
            return
        self._pass.close()  # type: ignore[attr-defined]
        self._pass = None
        if complete:
            self._seen = self._pass_seen  # no pass over the names: a poll stays bounded
            self._stamp = self._pass_stamp
        self._pass_seen = set()

    def _limited(self) -> None:
        self.scan_limited += 1
        if self.scan_limited == 1:
            log.warning(
                "watch %s: %s holds more than a poll handles (%d entries): each poll goes on "
                "where the last stopped, so a new file may wait for a whole pass over the "
                "folder (counted: scan_limited)",
                self.name,
                self.config.path,
                self.scan_limit,
            )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "path": self.config.path,
            "seen": len(self._seen),
            "scan_limited": self.scan_limited,
        }


SOURCES = {"watch": WatchFolderSource}  # source types built here (the registry collects them)
