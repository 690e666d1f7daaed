"""What the stage threads share with the pipeline that owns them: the stop and abort
events, the finished event, each thread's progress stamp, and the first fatal error."""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger(__name__)

#: How long a stage waits before it looks at the stop flag again.
POLL_S = 0.1


class StageControl:
    """One pipeline's run, as its stage threads see it.

    ``stop``: capture ends, the stages drain behind the last frame. ``abort``: the owner
    gave up draining (a stage is stuck); a capture thread waiting to hand a frame over
    stops waiting. ``finished``: the post stage published (or dropped) the last frame.
    """

    def __init__(self, sources: int) -> None:
        self.stop = threading.Event()
        self.abort = threading.Event()
        self.finished = threading.Event()
        self.error: str | None = None  # why the run failed (the first fatal error)
        self.progress: dict[str, int] = {}  # by stage thread: monotonic ns of its last loop turn
        self.slowest_ns = 0  # the longest inference run so far (warm-ups included)
        self._sources = sources
        self._failed_sources = 0
        self._lock = threading.Lock()

    def beat(self, stage: str) -> None:
        """``stage``'s thread went round its loop (it is not stuck)."""
        self.progress[stage] = time.monotonic_ns()

    def inferred(self, ns: int) -> None:
        """An inference took ``ns`` (the inference thread, or a warm-up)."""
        if ns > self.slowest_ns:
            self.slowest_ns = ns

    def fatal(self, stage: str, exc: BaseException) -> None:
        """An unexpected error in a stage thread: record it and stop the pipeline."""
        log.error("pipeline: unexpected error in the %s stage", stage, exc_info=exc)
        with self._lock:
            if self.error is None:
                self.error = f"{stage} stage: {type(exc).__name__}: {exc}"
        self.stop.set()

    def source_failed(self, error: str) -> None:
        """A source ended with ``error``. One dead source does not stop the others; when
        none is left, the pipeline fails."""
        log.error("%s", error)
        with self._lock:
            self._failed_sources += 1
            if self._failed_sources >= self._sources and self.error is None:
                self.error = error if self._sources == 1 else "every source failed: " + error
