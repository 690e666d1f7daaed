"""Latency histograms with fixed logarithmic buckets: O(1) memory, percentiles on demand.

Buckets grow by 2 % from 1 µs to ~100 s, so any percentile read back is within 2 % of
the true value, however many frames were recorded; no list of samples is ever kept.
"""

from __future__ import annotations

import math
import threading

import numpy as np

_MIN_NS = 1_000
_GROWTH = 1.02
_LOG_GROWTH = math.log(_GROWTH)
_BUCKETS = int(math.log(1e11 / _MIN_NS) / _LOG_GROWTH) + 2
# Upper edge of each bucket in ns; a value is reported as its bucket's upper edge.
_UPPER = _MIN_NS * np.power(_GROWTH, np.arange(1, _BUCKETS + 1))


class LatencyHistogram:
    """Records durations in ns; any number of writer and reader threads.

    A record, a ``take`` and a ``merge`` of this histogram each run under its own small
    lock, so a duration recorded while another thread takes the histogram (a heartbeat's
    window) or copies it (the pipeline's figures) lands in exactly one take and is seen whole by a
    copy. Swapping the histogram object itself (``window, self.window = self.window,
    LatencyHistogram()``) is not safe: a writer that read the attribute before the swap
    records into the old one after its taker read it, and the duration is counted in
    neither; take the contents with ``take`` instead. Readers that are not handed a copy
    (``percentile_ns``) may see one field updated before another.
    """

    __slots__ = ("_lock", "count", "counts", "max_ns", "min_ns", "total_ns")

    def __init__(self) -> None:
        self.counts = np.zeros(_BUCKETS, np.int64)
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0
        self.min_ns = 0
        # Uncontended, it adds about a tenth to a record's microsecond (``record``).
        self._lock = threading.Lock()

    def record(self, ns: int) -> None:
        i = 0 if ns <= _MIN_NS else min(int(math.log(ns / _MIN_NS) / _LOG_GROWTH), _BUCKETS - 1)
        lock = self._lock
        lock.acquire()  # not ``with``: its __exit__ call costs twice the lock itself
        try:
            self.counts[i] += 1
            if self.count == 0 or ns < self.min_ns:
                self.min_ns = ns
            self.count += 1
            self.total_ns += ns
            if ns > self.max_ns:
                self.max_ns = ns
        finally:
            lock.release()

    def copy(self) -> LatencyHistogram:
        """A copy, whole (read under this one's lock), that later records do not change."""
        copy = LatencyHistogram()
        copy.merge(self)
        return copy

    def take(self) -> LatencyHistogram:
        """What was recorded since the last take (or since it was made), as a histogram of
        its own; this one goes on empty. Each record lands in exactly one take, whichever
        thread records it."""
        taken = LatencyHistogram()
        with self._lock:
            taken.counts, self.counts = self.counts, taken.counts
            taken.count, self.count = self.count, 0
            taken.total_ns, self.total_ns = self.total_ns, 0
            taken.max_ns, self.max_ns = self.max_ns, 0
            taken.min_ns, self.min_ns = self.min_ns, 0
        return taken

    def percentile_ns(self, q: float) -> float:
        """The ``q``-th percentile (0..100) in ns; 0 when empty. Exact max for q=100."""
        if self.count == 0:
            return 0.0
        if q >= 100:
            return float(self.max_ns)
        # Ranked within the buckets' own total, not ``count``: a reader on another thread
        # may see one updated before the other (2026-12-02, a heartbeat raised IndexError
        # here during a test run).
        cum = np.cumsum(self.counts)
        total = int(cum[-1])
        if total == 0:
            return 0.0
        rank = max(1, math.ceil(total * q / 100.0))
        i = int(np.searchsorted(cum, rank))
        return float(min(_UPPER[i], self.max_ns))

    def percentile_ms(self, q: float) -> float:
        return self.percentile_ns(q) / 1e6

    def mean_ms(self) -> float:
        return self.total_ns / self.count / 1e6 if self.count else 0.0

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s records to this histogram: all of those it held at one instant
        (read under its lock, so a record running beside it counts whole or not at all)."""
        if other is self:
            raise ValueError("a histogram cannot be merged into itself")
        with other._lock:
            counts = other.counts.copy()
            count, total_ns, max_ns, min_ns = other.count, other.total_ns, other.max_ns, other.min_ns
        with self._lock:
            self.counts += counts
            if count:
                self.min_ns = min_ns if self.count == 0 else min(self.min_ns, min_ns)
            self.count += count
            self.total_ns += total_ns
            self.max_ns = max(self.max_ns, max_ns)

    def summary_ms(self) -> dict[str, float]:
        return {
            "count": self.count,
            "mean": round(self.mean_ms(), 3),
            "p50": round(self.percentile_ms(50), 3),
            "p90": round(self.percentile_ms(90), 3),
            "p99": round(self.percentile_ms(99), 3),
            "p99.9": round(self.percentile_ms(99.9), 3),
            "max": round(self.max_ns / 1e6, 3),
        }
