"""The process's own footprint: resident memory, open file descriptors, threads.

Read from /proc (Linux) so a soak run can show that nothing grows after warm-up; where
/proc is missing the values are None.
"""

from __future__ import annotations

import os
import threading


def _status_field(name: str) -> int | None:
    """A number from /proc/self/status (``VmRSS: 123 kB`` gives 123)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def rss_bytes() -> int | None:
    kib = _status_field("VmRSS")
    return None if kib is None else kib * 1024


def native_threads() -> int | None:
    """Every thread of the process (ONNX Runtime's and OpenCV's pools, FFmpeg's
    decoders, ZeroMQ's I/O threads), not only the Python ones ``threading`` knows."""
    return _status_field("Threads")


def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def snapshot() -> dict[str, int | None]:
    return {
        "rss_bytes": rss_bytes(),
        "open_fds": open_fds(),
        "threads": native_threads(),
        "python_threads": threading.active_count(),
    }
