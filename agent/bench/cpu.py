"""Where the host's CPU goes while the pipeline runs: each stage thread's CPU time, the
process's, and an estimate of how much of the time the GIL is held.

**Threads.** ``ThreadClocks`` reads each stage thread's own CPU clock
(``pthread_getcpuclockid``): the capture threads (capture and preprocessing), the
inference thread (scheduling, the wait on the device, and decoding and publishing a frame
itself while the post thread is idle) and the post thread (decoding, tracking,
analytics, the result's JSON and its send); the rest of the process (heartbeat, sockets,
the bench itself) is the process's CPU time less theirs.

**The GIL.** CPython says nothing of who holds it, so ``GilProbe`` measures it from
outside: a thread that sleeps ``PROBE_S`` again and again and times each wake-up. A
sleeping thread gives the GIL up; waking, it must take it back, and waits while another
thread holds it (up to the switch interval, 5 ms). The share of wake-ups that waited
longer than ``LATE_S`` beyond the sleep estimates the share of time the GIL was held;
a wake-up also waits for a core when every core is busy, so on a saturated machine the
figure is an upper bound. Its baseline (wake-ups in an idle process) is given beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

PROBE_S = 0.002
LATE_S = 0.0002


def _thread_cpu_s(t: threading.Thread) -> float | None:
    """CPU seconds thread ``t`` used so far, or None once it has ended."""
    if t.ident is None or not t.is_alive():
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    except (OSError, ProcessLookupError):
        return None


def _group(name: str) -> str:
    return "capture" if name.startswith("capture-") else "post" if name.startswith("post") else name


class ThreadClocks:
    """CPU seconds by thread group (``capture``, ``infer``, ``post``) between ``start``
    and ``stop``, and the process's."""

    def __init__(self, threads: Iterable[threading.Thread]) -> None:
        self.threads = list(threads)
        self._t0: dict[int, float] = {}
        self._p0 = 0.0
        self.by_group: dict[str, float] = {}
        self.process_s = 0.0

    def start(self) -> None:
        self._p0 = _process_cpu_s()
        self._t0 = {id(t): c for t in self.threads if (c := _thread_cpu_s(t)) is not None}

    def stop(self) -> None:
        groups: dict[str, float] = {}
        for t in self.threads:
            c, c0 = _thread_cpu_s(t), self._t0.get(id(t))
            if c is not None and c0 is not None:
                groups[_group(t.name)] = groups.get(_group(t.name), 0.0) + c - c0
        self.process_s = _process_cpu_s() - self._p0
        groups["other"] = max(0.0, self.process_s - sum(groups.values()))
        self.by_group = groups

    def per_frame_us(self, frames: int) -> dict[str, float]:
        if not frames:
            return {}
        out = {k: round(v / frames * 1e6, 1) for k, v in self.by_group.items()}
        out["total"] = round(self.process_s / frames * 1e6, 1)
        return out


def _process_cpu_s() -> float:
    return time.process_time()  # every thread's, to the nanosecond (os.times: 10 ms ticks)


class GilProbe:
    """A thread that measures how often a wake-up has to wait for the GIL (see the
    module's docstring); ``start``, ``stop``, then ``summary``."""

    def __init__(self) -> None:
        self._late: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._late.clear()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gil-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        late = self._late
        while not self._stop.is_set():
            t = time.perf_counter()
            time.sleep(PROBE_S)
            late.append(time.perf_counter() - t - PROBE_S)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def summary(self) -> dict[str, Any]:
        late = sorted(self._late)
        if not late:
            return {"wakeups": 0}
        held = sum(1 for x in late if x > LATE_S)
        return {
            "held_share": round(held / len(late), 3),
            "wakeups": len(late),
            "wait_p50_ms": round(late[len(late) // 2] * 1e3, 3),
            "wait_p99_ms": round(late[min(len(late) - 1, int(len(late) * 0.99))] * 1e3, 3),
        }


def idle_probe(seconds: float = 0.5) -> dict[str, Any]:
    """The probe in this process with nothing else running: its baseline."""
    probe = GilProbe()
    probe.start()
    time.sleep(seconds)
    probe.stop()
    return probe.summary()
