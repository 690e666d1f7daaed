"""The process's own footprint: resident memory, open file descriptors, threads.

Read from /proc (Linux) so a soak run can show that nothing grows after warm-up; where
/proc is missing the values are None.
"""

from __future__ import annotations

import os
import threading


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def snapshot() -> dict[str, int | None]:
    return {"rss_bytes": rss_bytes(), "open_fds": open_fds(), "threads": threading.active_count()}
