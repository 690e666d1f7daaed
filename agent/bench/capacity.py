"""``edge-agent bench --emulate REC``: how many cameras the host side serves when inference
runs off the CPU, as on a Jetson.

The model runs on the emulated accelerator (``backends/emulated.py``): its recorded
outputs replayed, each inference (a batch) waiting ``device_ms`` off the CPU. The frames
are ``--source``'s (those the recording was made of), decoded into memory once and played
by every camera at ``fps``, each camera starting at another frame and out of step with the
others (their first frames spread over one frame period), so batches form as they would
from independent cameras. Everything else is the agent's own: capture, the host's
letterbox, scheduling and batching, decoding, the source's tracker, zones and lines, the
JSON and the send.

A *trial* runs N cameras for ``seconds`` after a second of warm-up and reports, per
camera, its rate, its frames on time, late and dropped, end-to-end p50/p99; the host CPU
per frame by stage thread (``cpu.ThreadClocks``) and the GIL's share (``cpu.GilProbe``).
N passes when at least ``ON_TIME`` of the frames that ended in the window (published or
dropped) were published within their deadline.

The *capacity search* finds the largest N that passes: N doubles from ``start`` until a
trial fails or N reaches ``most``, then bisects between the last pass and the first fail.
It always ends: at most ``most`` cameras (``MAX_SOURCES``, and what memory allows), at
most ``max_trials`` trials, and no new trial once ``budget_s`` has passed; the result
says which bound ended it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from edge_agent.bench.configs import BenchAgent, BenchError, lane_settings, private_config, started
from edge_agent.bench.cpu import GilProbe, ThreadClocks, idle_probe
from edge_agent.bench.phases import hist_ms
from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import EmulatedConfig
from edge_agent.core.source_config import ImageFolderSourceConfig, SyntheticSourceConfig
from edge_agent.core.stamps import STAGES
from edge_agent.pipelines import jit
from edge_agent.pipelines.backends import recording as recording_file

#: The share of frames on time a number of cameras must keep.
ON_TIME = 0.99
#: The most cameras a trial runs: every camera is a thread and ~3 frame slots.
MAX_SOURCES = 256
WARM_S = 1.0

Progress = Callable[[str], None]


def emulated_config(
    config: AgentConfig, recording: str, device_ms: float, sources: int, frames_path: str, fps: float
) -> AgentConfig:
    """``config`` on the emulated accelerator with ``sources`` cameras named cam0.. that
    play ``frames_path`` at ``fps``, each with the lane settings (tracker, zones, lines,
    budget) of the config's first source."""
    template = lane_settings(config.source_list()[0])
    made = tuple(
        ImageFolderSourceConfig(path=frames_path, **{**template, "name": f"cam{i}"}) for i in range(sources)
    )
    backend = EmulatedConfig(recording=recording, device_ms=device_ms)
    if sources == 1:
        out = replace(config, backend=backend, source=made[0], sources=())
    else:
        out = replace(config, backend=backend, source=SyntheticSourceConfig(), sources=made)
    return private_config(out)


def memory_bound(input_hw: tuple[int, int]) -> int:
    """The cameras whose frame slots fit in half the memory available now (3 slots a
    camera, each a model input of ``input_hw`` and the letterbox canvas), at most
    ``MAX_SOURCES``."""
    per_camera = 3 * 2 * input_hw[0] * input_hw[1] * 3
    try:
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return MAX_SOURCES
    return max(1, min(MAX_SOURCES, avail // 2 // per_camera))


def run_trial(config: AgentConfig, images: list[np.ndarray], fps: float, seconds: float) -> dict[str, Any]:
    """``config``'s cameras (see ``emulated_config``) for ``seconds`` after ``WARM_S``."""
    names = [s.name for s in config.source_list()]
    n = len(names)
    played = {name: images for name in names}
    offsets = {name: ((i * 7) % len(images), i / n) for i, name in enumerate(names)}
    with BenchAgent(config, played=played, pace_fps=fps, offsets=offsets) as agent, started(agent):
        pipeline = agent.pipeline
        assert pipeline is not None
        time.sleep(WARM_S)
        before = {lane.name: lane.counts for lane in pipeline.figures().lanes}
        clocks, probe = ThreadClocks(pipeline.threads()), GilProbe()
        clocks.start()
        probe.start()
        t0 = time.monotonic()
        time.sleep(seconds)
        elapsed = time.monotonic() - t0
        probe.stop()
        clocks.stop()
        figures = pipeline.figures()
    return _trial_result(agent, figures, before, clocks, probe, elapsed)


def _trial_result(
    agent: BenchAgent,
    figures: Any,
    before: dict[str, Any],
    clocks: ThreadClocks,
    probe: GilProbe,
    elapsed: float,
) -> dict[str, Any]:
    per_source = {}
    totals = {"captured": 0, "on_time": 0, "late": 0, "dropped": 0}
    for lane in figures.lanes:
        c, b = lane.counts, before[lane.name]
        d = {
            "captured": c.captured - b.captured,
            "on_time": c.on_time - b.on_time,
            "late": c.late - b.late,
            "dropped": c.dropped - b.dropped,
        }
        for k in totals:
            totals[k] += d[k]
        per_source[lane.name] = {
            "fps": round((d["on_time"] + d["late"]) / elapsed, 2),
            **d,
            "end_to_end_ms": hist_ms(lane.total),
        }
    published = totals["on_time"] + totals["late"]
    first = figures.lanes[0]
    steps = {name: hist_ms(step.cost) for name, step in first.steps.items() if getattr(step, "cost", None)}
    # Of the frames that ended in the window (some were captured before it began).
    ended = published + totals["dropped"]
    on_time = totals["on_time"] / ended if ended else 0.0
    return {
        "sources": len(figures.lanes),
        "seconds": round(elapsed, 2),
        "on_time_share": round(on_time, 4),
        "passed": on_time >= ON_TIME,
        **totals,
        "throughput_fps": round(published / elapsed, 1),
        "host_cpu_us_per_frame": clocks.per_frame_us(published),
        "cores_used": round(clocks.process_s / elapsed, 2),
        "gil": probe.summary(),
        "stages_p50_ms": {name: round(first.stages[name].percentile_ms(50), 3) for name in STAGES},
        "steps_ms": steps,
        "batches": figures.batching.summary(),
        "per_source": per_source,
    }


def search(
    trial: Callable[[int], dict[str, Any]],
    start: int,
    most: int,
    max_trials: int = 16,
    budget_s: float = 900.0,
    progress: Progress = lambda _line: None,
) -> dict[str, Any]:
    """The largest N in 1..``most`` whose ``trial(N)`` passes, as the module's docstring
    says; every trial made, and why the search stopped."""
    if most < 1:
        raise BenchError("the capacity search needs at least one camera")
    t0 = time.monotonic()
    passed, failed = 0, most + 1  # the largest N that passed, the smallest that failed
    n = max(1, min(start, most))
    trials: list[dict[str, Any]] = []
    stopped = ""
    while not stopped:
        progress(f"capacity: trial {len(trials) + 1}, {n} cameras")
        result = trial(n)
        trials.append(result)
        if result["passed"]:
            passed = n
        else:
            failed = n
        if failed - passed <= 1:
            stopped = "found" if failed <= most else f"all {most} cameras passed (the most it tries)"
        elif len(trials) >= max_trials:
            stopped = f"{max_trials} trials made"
        elif time.monotonic() - t0 > budget_s:
            stopped = f"its {budget_s:.0f} s were spent"
        elif failed > most:
            n = min(passed * 2, most)
        else:
            n = (passed + failed) // 2
    return {
        "cameras": passed,
        "first_failed": failed if failed <= most else None,
        "stopped": stopped,
        "trials": [{k: t[k] for k in _SUMMARY} for t in trials],
        "at_capacity": next((t for t in reversed(trials) if t["sources"] == passed), None),
    }


_SUMMARY = (
    "sources",
    "on_time_share",
    "passed",
    "throughput_fps",
    "host_cpu_us_per_frame",
    "cores_used",
    "gil",
)


def run_capacity(
    config: AgentConfig,
    recording: str,
    frames_path: str,
    images: list[np.ndarray],
    device_ms: float = 5.0,
    fps: float = 30.0,
    seconds: float = 6.0,
    sources: int = 0,
    search_to: int = 0,
    progress: Progress = lambda _line: None,
) -> dict[str, Any]:
    """One trial of ``sources`` cameras, or (``search_to``) the capacity search up to that
    many; both with the emulated accelerator's settings and the kernels that ran."""
    model = config.model.path or "(bundled)"
    bound = memory_bound(recording_file.host_size(recording))
    idle = idle_probe()

    def trial(n: int) -> dict[str, Any]:
        cfg = emulated_config(config, recording, device_ms, n, frames_path, fps)
        return run_trial(cfg, images, fps, seconds)

    # One short trial first, not counted: the one-off costs of a first agent in this process
    # (imports, kernels compiled or loaded, the recording's pages) stay out of the figures.
    progress("a short warm-up trial, not counted")
    run_trial(emulated_config(config, recording, device_ms, 2, frames_path, fps), images, fps, 1.0)
    out: dict[str, Any] = {
        "mode": "emulated-accelerator",
        "emulated": {"recording": recording, "device_ms": device_ms, "model": model},
        "frames": {"path": frames_path, "count": len(images), "hw": list(images[0].shape[:2])},
        "fps": fps,
        "on_time_goal": ON_TIME,
        "gil_probe_idle": idle,
    }
    if search_to:
        most = min(search_to, bound)
        if most < search_to:
            progress(f"capacity: at most {most} cameras fit in memory (asked for {search_to})")
        out["search"] = search(trial, 8, most, progress=progress)
    else:
        if sources > bound:
            raise BenchError(
                f"--sources {sources}: at most {bound} cameras fit in memory here (3 frame slots each)"
            )
        progress(f"{sources} cameras at {fps:g} fps for {seconds:g} s on the emulated accelerator")
        out["trial"] = trial(sources)
    out["kernels"] = jit.state()
    return out
