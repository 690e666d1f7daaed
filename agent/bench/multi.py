"""``edge-agent bench --sources N``: several cameras on one accelerator, with and without
batching, then live."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import Any

from edge_agent.bench.configs import BENCH_SCHEMA, BenchAgent, raw_config, started, synthetic_config
from edge_agent.bench.phases import hist_ms, run_agent, timed_runs
from edge_agent.bench.single import Progress, eta, quiet
from edge_agent.core.budget_fit import BudgetFit
from edge_agent.core.config import AgentConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.core.stamps import STAGES
from edge_agent.pipelines.model import model_notes_once
from edge_agent.service.runner import Agent


def published_fps(agent: Agent, elapsed_s: float) -> float:
    assert agent.pipeline is not None
    return agent.pipeline.published() / elapsed_s if elapsed_s else 0.0


def run_multi_bench(
    config: AgentConfig,
    sources: int = 0,
    frames: int = 500,
    source_fps: float | None = None,
    live_s: float = 10.0,
    progress: Progress = quiet,
) -> dict[str, Any]:
    """Several cameras on one model (schema in docs/deadline.md); ``progress`` as in ``run_bench``.

    The cameras: ``sources`` copies of the config's first source, or (0) the config's own
    sources, all made synthetic. Saturated phases (unpaced, ``frames`` per camera): one
    camera; all cameras with batching off; the same batched. Live phase: the cameras at
    ``source_fps`` (None: each its own rate) for ``live_s`` seconds, each with its own
    latency and counts.
    """
    with model_notes_once():
        return _run_multi_bench(config, sources, frames, source_fps, live_s, progress)


@dataclass
class _Saturated:
    """The saturated phases' agents, each with the seconds it ran: one camera, all cameras
    unbatched, all cameras batched."""

    single: BenchAgent
    single_s: float
    unbatched: BenchAgent
    unbatched_s: float
    batched: BenchAgent
    batched_s: float


def _run_multi_bench(
    config: AgentConfig,
    sources: int,
    frames: int,
    source_fps: float | None,
    live_s: float,
    progress: Progress,
) -> dict[str, Any]:
    """The phases in order, as ``run_multi_bench`` documents them."""
    n = sources or len(config.source_list())
    per_frame = _inference_per_frame(raw_config(config, sources), max(frames // 5, 20), n, progress)
    sat = _saturated_phases(config, sources, n, frames, progress, per_frame["1"] / 1e3)
    live_cfg = synthetic_config(config, source_fps, sources)
    fps = {s.name: s.fps for s in live_cfg.source_list() if isinstance(s, SyntheticSourceConfig)}
    # Cameras at different rates: the phase lasts live_s, not a number of frames.
    progress(f"5/5 live: {n} cameras at their rates through the agent, with their deadlines ({eta(live_s)})")
    live, live_elapsed = _live_phase(live_cfg, live_s)
    assert live.pipeline is not None and sat.batched.pipeline is not None and live.model is not None
    saturated = _saturated_section(sat)
    model = live.model
    per_source = _per_source(live, fps, live_elapsed, per_frame["1"], os.path.basename(model.resolved.path))
    return {
        "schema": BENCH_SCHEMA,
        "mode": "multi-source",
        "model": model.resolved.path,
        "model_input_hw": [model.manifest.input.height, model.manifest.input.width],
        "backend": model.backend.describe(),
        "sources": n,
        "frames_per_source": frames,
        "inference_per_frame_ms": per_frame,
        "saturated": saturated,
        "live": {
            "source_fps": source_fps,
            "seconds": round(live_elapsed, 2),
            "throughput_fps": round(published_fps(live, live_elapsed), 2),
            "batches": live.pipeline.figures().batching.summary(),
            "per_source": per_source,
        },
    }


def _saturated_phases(
    config: AgentConfig, sources: int, n: int, frames: int, progress: Progress, per_frame_s: float
) -> _Saturated:
    """Phases 2 to 4, unpaced: one camera, then all cameras unbatched, then batched.
    ``per_frame_s``: inference alone (batch of 1), to say how long each will take."""
    progress(f"2/5 one camera at full speed, {frames} frames ({eta(frames * per_frame_s)})")
    single, single_s = run_agent(raw_config(config, 1), frames)
    unbatched_cfg = raw_config(config, sources)
    unbatched_cfg = replace(unbatched_cfg, batching=replace(config.batching, max_batch=1))
    all_s = n * frames * per_frame_s
    progress(f"3/5 {n} cameras at full speed, unbatched, {frames} frames each ({eta(all_s)})")
    unbatched, unbatched_s = run_agent(unbatched_cfg, frames)
    progress(f"4/5 {n} cameras at full speed, batched, {frames} frames each ({eta(all_s)} or less)")
    batched, batched_s = run_agent(raw_config(config, sources), frames)
    return _Saturated(single, single_s, unbatched, unbatched_s, batched, batched_s)


def _live_phase(live_cfg: AgentConfig, live_s: float) -> tuple[Agent, float]:
    """Phase 5: the cameras at their rates for ``live_s`` seconds; the agent and the seconds it ran."""
    with BenchAgent(live_cfg) as live, started(live):
        t0 = time.monotonic()
        time.sleep(live_s)
    live_elapsed = time.monotonic() - t0
    return live, live_elapsed


def _saturated_section(sat: _Saturated) -> dict[str, Any]:
    """The result's ``saturated`` section: published rates, the gains, and the batches made."""
    assert sat.batched.pipeline is not None
    single_fps = published_fps(sat.single, sat.single_s)
    unbatched_fps = published_fps(sat.unbatched, sat.unbatched_s)
    batched_fps = published_fps(sat.batched, sat.batched_s)
    return {
        "single_source_fps": round(single_fps, 2),
        "unbatched_fps": round(unbatched_fps, 2),
        "batched_fps": round(batched_fps, 2),
        "gain_from_batching": round(batched_fps / unbatched_fps, 3) if unbatched_fps else None,
        "gain_over_single_source": round(batched_fps / single_fps, 3) if single_fps else None,
        "batches": sat.batched.pipeline.figures().batching.summary(),
    }


def _per_source(
    live: Agent, fps: dict[str, float], live_elapsed: float, infer_ms: float, model: str
) -> dict[str, Any]:
    """The live phase by camera: its rate, priority and budget (with ``core.budget_fit``'s
    advice when inference alone, ``infer_ms``, does not fit it), latency, stages' p99 and
    counts."""
    assert live.pipeline is not None
    per_source = {}
    for lane in live.pipeline.figures().lanes:
        budget_ms = lane.deadline.budget_ms
        per_source[lane.name] = {
            "source_fps": fps.get(lane.name),
            "priority": lane.priority,
            "budget_ms": budget_ms,
            "budget_advice": BudgetFit(infer_ms, budget_ms, lane.frame_period_ms).advice(
                f"source {lane.name}, model {model}"
            ),
            "throughput_fps": round(lane.published / live_elapsed, 2) if live_elapsed else 0.0,
            "end_to_end_ms": hist_ms(lane.total),
            "stages_p99_ms": {name: round(lane.stages[name].percentile_ms(99), 3) for name in STAGES},
            "counts": lane.counts.as_dict(),
        }
    return per_source


def _inference_per_frame(config: AgentConfig, runs: int, n: int, progress: Progress) -> dict[str, float]:
    """Phase 1: the model alone on its preallocated sets: p50 ms per frame, by batch size
    (what batching saves on this accelerator, before the rest of the pipeline shares it);
    each size timed as ``phases.timed_runs`` does."""
    with BenchAgent(config) as agent:
        profile = agent.primary_profile(0)
        sets = {1: next(iter(profile.pools.values())).slots[0].io, **profile.batches}
        guess_s = sum(profile.warm_ns.get(size, profile.warm_ns.get(1, 0)) for size in sets) * runs / 1e9
        progress(f"1/5 inference alone, batches of 1..{n}, {runs} runs each ({eta(guess_s)})")
        return {
            str(size): round(timed_runs(profile.model.backend, io, runs).percentile_ms(50) / size, 3)
            for size, io in sets.items()
        }
