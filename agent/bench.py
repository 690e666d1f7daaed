"""``edge-agent bench``: where every millisecond goes, measured in one run.

Four phases on the real pipeline code and the synthetic camera:

1. **pure inference**: the backend alone on one fixed, preprocessed input;
2. **sequential**: capture → preprocess → infer → postprocess → publish one frame after
   another on one thread (what a hand-written loop does);
3. **pipelined, saturated**: the three stage threads with an unpaced source, for the
   highest throughput (frames queue in the hand-offs by design);
4. **pipelined, live**: a paced source (the config's fps, or ``--source-fps``), so the
   latency and the overhead around the model are those a camera would see, including
   admission drops and the degradation ladder under overload.

``overhead`` is each frame's end-to-end time minus its capture and inference stages:
preprocessing, hand-offs, postprocessing and publishing (JSON + socket send included).

``--sources N`` benchmarks several cameras on one accelerator instead (``run_multi_bench``):
saturated throughput of one source, of N sources without batching and of N sources
batched; then N paced sources live, with each source's latency and the batch sizes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from edge_agent.config import AgentConfig, LadderStep, SyntheticSourceConfig
from edge_agent.latency import LatencyHistogram
from edge_agent.pipelines.handoff import STAGES
from edge_agent.pipelines.pipeline import PipelineStats
from edge_agent.runner import Agent

BENCH_SCHEMA = 1


def _hist_ms(h: LatencyHistogram) -> dict[str, float]:
    return h.summary_ms()


def _as_synthetic(src: Any, fps: float | None) -> SyntheticSourceConfig:
    """``src`` as a synthetic camera at ``fps`` (None: a synthetic source's own rate, else
    30), keeping its name and scheduling settings."""
    if isinstance(src, SyntheticSourceConfig):
        return replace(src, fps=src.fps if fps is None else fps)
    keep = ("name", "priority", "budget_ms", "max_fps", "model", "manifest")
    return SyntheticSourceConfig(fps=30.0 if fps is None else fps, **{k: getattr(src, k) for k in keep})


PRIVATE_ENDPOINT = "tcp://127.0.0.1:*"  # a free loopback port, chosen at bind


def synthetic_config(config: AgentConfig, fps: float | None, sources: int = 0) -> AgentConfig:
    """The config on synthetic cameras at ``fps``: its own sources, or ``sources`` copies
    of its first one."""
    template = config.source_list()
    if sources:
        first = _as_synthetic(template[0], fps)
        made = tuple(replace(first, name=f"cam{i}", seed=first.seed + i) for i in range(sources))
    else:
        made = tuple(_as_synthetic(src, fps) for src in template)
    # Its own agents run beside the real one (a service on the same config): no metrics
    # endpoint, and results on a private loopback port (any free one), never the configured
    # endpoint; they wait for no subscriber: nobody listens to a measurement.
    metrics = replace(config.metrics, enabled=False)
    publish = replace(config.publish, endpoint=PRIVATE_ENDPOINT, wait_for_subscribers=0)
    if len(made) == 1:
        return replace(config, source=made[0], sources=(), metrics=metrics, publish=publish)
    return replace(config, source=SyntheticSourceConfig(), sources=made, metrics=metrics, publish=publish)


def _raw(config: AgentConfig, sources: int = 0) -> AgentConfig:
    """Unpaced, with neither admission nor ladder: the pipeline's own capability.

    The deadline machinery is for the live phase; here a model slower than the budget
    must still be measured, not dropped as stale.
    """
    deadline = replace(config.deadline, admission=False, ladder=(LadderStep(),))
    return replace(synthetic_config(config, 0.0, sources), deadline=deadline)


def _stage_table(stats: PipelineStats) -> dict[str, Any]:
    means = {name: stats.stages[name].mean_ms() for name in STAGES}
    total = sum(means.values()) or 1.0
    return {
        name: {
            "p50_ms": round(stats.stages[name].percentile_ms(50), 3),
            "p99_ms": round(stats.stages[name].percentile_ms(99), 3),
            "mean_ms": round(means[name], 3),
            "share": round(means[name] / total, 4),
        }
        for name in STAGES
    }


def _slowest_thread_ms(stats: PipelineStats) -> float:
    """Mean busy time per frame of the busiest stage thread: the pipeline's throughput bound."""
    st = stats.stages
    threads = (
        st["capture"].mean_ms() + st["preprocess"].mean_ms(),
        st["infer"].mean_ms(),
        st["postprocess"].mean_ms() + st["publish"].mean_ms() + stats.send.mean_ms(),
    )
    return max(threads)


def _run_agent(config: AgentConfig, frames: int) -> tuple[Agent, float]:
    agent = Agent(config, max_frames=frames)
    agent.build()
    assert agent.pipeline is not None
    agent.start()
    t0 = time.monotonic()
    agent.pipeline.finished.wait()
    elapsed = time.monotonic() - t0
    agent.stop()
    return agent, elapsed


def pure_inference(agent: Agent, runs: int) -> LatencyHistogram:
    """The backend alone, on one slot whose input holds a preprocessed synthetic frame."""
    assert agent.pipeline is not None
    p = agent.pipeline
    p.source.open()
    frame = p.source.read(1.0)
    slot = p.prepare(frame)
    p.source.close()
    assert slot is not None
    backend = slot.profile.model.backend
    hist = LatencyHistogram()
    for _ in range(runs):
        t = time.perf_counter_ns()
        backend.infer(slot.io)
        hist.record(time.perf_counter_ns() - t)
    slot.pool.release(slot)
    return hist


def sequential(config: AgentConfig, frames: int) -> tuple[LatencyHistogram, float]:
    """Each frame through every stage on this thread, none overlapping."""
    agent = Agent(_raw(config))
    agent.build()
    assert agent.pipeline is not None and agent.publisher is not None
    p = agent.pipeline
    agent.publisher.open()
    p.source.open()
    hist = LatencyHistogram()
    t0 = time.monotonic()
    try:
        for _ in range(frames):
            t = time.perf_counter_ns()
            frame = p.read_frame()
            slot = p.prepare(frame)
            if slot is not None and p.infer_one(slot):
                p.publish_one(slot)
            hist.record(time.perf_counter_ns() - t)
    finally:
        elapsed = time.monotonic() - t0
        p.source.close()
        agent.publisher.close()
        for m in agent.models.values():
            m.backend.close()
    return hist, elapsed


Progress = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


def run_bench(
    config: AgentConfig,
    frames: int = 1000,
    source_fps: float | None = None,
    live_s: float = 10.0,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """All four phases; returns the result documented in the README (schema 1).

    ``frames`` sizes the inference, sequential and saturated phases; the live phase
    lasts ``live_s`` seconds of source time (at most ``frames`` frames). ``progress`` is
    told the name of each phase as it begins.
    """
    saturated_cfg = _raw(config)
    progress("loading the model")
    probe = Agent(saturated_cfg)
    probe.build()
    runs = max(frames // 2, 100)
    progress(f"1/4 inference alone ({runs} runs)")
    pure = pure_inference(probe, runs)
    model = probe.model
    assert model is not None
    for m in probe.models.values():
        m.backend.close()

    progress(f"2/4 sequential, one frame at a time ({frames} frames)")
    seq, seq_s = sequential(config, frames)
    # The backend was warmed up when its slots were allocated: every frame counts.
    progress(f"3/4 pipelined at full speed ({frames} frames)")
    sat, sat_s = _run_agent(saturated_cfg, frames)
    sat_stats = sat.pipeline.stats  # type: ignore[union-attr]

    live_fps = source_fps
    if live_fps is None:
        src = config.source_list()[0]
        live_fps = src.fps if isinstance(src, SyntheticSourceConfig) and src.fps > 0 else 30.0
    live_frames = max(1, min(frames, round(live_fps * live_s)))
    progress(f"4/4 live camera at {live_fps:g} fps ({live_frames} frames, ~{live_frames / live_fps:.0f} s)")
    live, live_elapsed = _run_agent(synthetic_config(config, live_fps), live_frames)
    live_stats = live.pipeline.stats  # type: ignore[union-attr]
    monitor = live.pipeline.monitor  # type: ignore[union-attr]

    pure_p50 = pure.percentile_ms(50)
    slowest = _slowest_thread_ms(sat_stats)
    sat_fps = sat_stats.published / sat_s if sat_s else 0.0
    seq_fps = frames / seq_s if seq_s else 0.0
    overhead = live_stats.overhead
    pre_inf_post = sum(live_stats.stages[s].percentile_ms(50) for s in ("preprocess", "infer", "postprocess"))
    return {
        "schema": BENCH_SCHEMA,
        "model": model.resolved.path,
        "model_input_hw": [model.manifest.input.height, model.manifest.input.width],
        "backend": model.backend.describe(),
        "frames": frames,
        "pure_inference_ms": _hist_ms(pure),
        "sequential": {
            "per_frame_ms": _hist_ms(seq),
            "throughput_fps": round(seq_fps, 2),
        },
        "pipelined": {
            "throughput_fps": round(sat_fps, 2),
            "gain_over_sequential": round(sat_fps / seq_fps, 3) if seq_fps else None,
            "slowest_thread_ms": round(slowest, 3),
            "efficiency": round(sat_fps * slowest / 1000.0, 3),
            "end_to_end_ms": _hist_ms(sat_stats.total),
            "stages": _stage_table(sat_stats),
        },
        "live": {
            "source_fps": live_fps,
            "seconds": round(live_elapsed, 2),
            "throughput_fps": round(live_stats.published / live_elapsed, 2) if live_elapsed else 0.0,
            "end_to_end_ms": _hist_ms(live_stats.total),
            "end_to_end_ms_by_profile": {k: _hist_ms(h) for k, h in live_stats.by_profile.items()},
            "overhead_ms": _hist_ms(overhead),
            "overhead_minus_pure_p50_ms": round(live_stats.total.percentile_ms(50) - pure_p50, 3),
            "p99_over_pre_infer_post_p50": round(live_stats.total.percentile_ms(99) / pre_inf_post, 3)
            if pre_inf_post
            else None,
            "stages": _stage_table(live_stats),
            "backend_parts_ms": {k: _hist_ms(h) for k, h in live_stats.backend_parts.items()},
            "counts": live_stats.counts(),
            "ladder": {
                "final_step": monitor.current.name,
                "changes": monitor.changes,
                "history": list(monitor.history),
            },
        },
    }


def _pq(h: dict[str, float]) -> str:
    return f"p50 {h['p50']:8.3f} ms   p99 {h['p99']:8.3f} ms   max {h['max']:8.3f} ms"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable form of a ``run_bench`` result."""
    pure, seq, pipe, live = r["pure_inference_ms"], r["sequential"], r["pipelined"], r["live"]
    h, w = r["model_input_hw"]
    backend = r["backend"]
    lines = [
        f"model {r['model']} ({w}x{h}), {backend.get('backend')} {backend.get('providers', '')}",
        f"pure inference            {_pq(pure)}",
        f"sequential, per frame     {_pq(seq['per_frame_ms'])}   {seq['throughput_fps']:.1f} fps",
        f"pipelined, saturated      {pipe['throughput_fps']:.1f} fps"
        f" = {pipe['gain_over_sequential']}x sequential; slowest stage"
        f" thread {pipe['slowest_thread_ms']:.3f} ms/frame, {pipe['efficiency']:.0%} of its bound",
        f"  end to end (queueing)   {_pq(pipe['end_to_end_ms'])}",
        f"live at {live['source_fps']:g} fps, end to end {_pq(live['end_to_end_ms'])}",
        f"  overhead around model   {_pq(live['overhead_ms'])}   (end to end - capture - inference)",
        f"  p99 / (pre + infer + post p50) = {live['p99_over_pre_infer_post_p50']}",
        f"  frames: {live['counts']}",
        f"  ladder: final step {live['ladder']['final_step']!r}, {live['ladder']['changes']} change(s)",
        "",
        f"{'stage (live)':<14}{'p50 ms':>9}{'p99 ms':>9}{'share':>8}",
    ]
    for name, st in live["stages"].items():
        lines.append(f"{name:<14}{st['p50_ms']:9.3f}{st['p99_ms']:9.3f}{st['share']:8.1%}")
    for name, h in live["end_to_end_ms_by_profile"].items():
        if len(live["end_to_end_ms_by_profile"]) > 1:
            lines.append(f"published by {name:<12} {h['count']:5d} frames, end to end {_pq(h)}")
    for change in live["ladder"]["history"]:
        lines.append(f"ladder: {change['from']} -> {change['to']} ({change['reason']})")
    return "\n".join(lines)


# -- several sources ----------------------------------------------------------------


def _published_fps(agent: Agent, elapsed_s: float) -> float:
    assert agent.pipeline is not None
    return agent.pipeline.published() / elapsed_s if elapsed_s else 0.0


def run_multi_bench(
    config: AgentConfig,
    sources: int = 0,
    frames: int = 500,
    source_fps: float | None = None,
    live_s: float = 10.0,
    progress: Progress = _quiet,
) -> dict[str, Any]:
    """Several cameras on one model (schema in the README); ``progress`` as in ``run_bench``.

    The cameras: ``sources`` copies of the config's first source, or (0) the config's own
    sources, all made synthetic. Saturated phases (unpaced, ``frames`` per camera): one
    camera; all cameras with batching off; the same batched. Live phase: the cameras at
    ``source_fps`` (None: each its own rate) for ``live_s`` seconds, each with its own
    latency and counts.
    """
    n = sources or len(config.source_list())
    progress(f"1/5 inference alone per frame, batches of 1..{n}")
    per_frame = _inference_per_frame(_raw(config, sources), max(frames // 5, 20))
    progress(f"2/5 one camera at full speed ({frames} frames)")
    single, single_s = _run_agent(_raw(config, 1), frames)
    unbatched_cfg = _raw(config, sources)
    unbatched_cfg = replace(unbatched_cfg, batching=replace(config.batching, max_batch=1))
    progress(f"3/5 {n} cameras at full speed, unbatched ({frames} frames each)")
    unbatched, unbatched_s = _run_agent(unbatched_cfg, frames)
    progress(f"4/5 {n} cameras at full speed, batched ({frames} frames each)")
    batched, batched_s = _run_agent(_raw(config, sources), frames)
    live_cfg = synthetic_config(config, source_fps, sources)
    fps = {s.name: s.fps for s in live_cfg.source_list() if isinstance(s, SyntheticSourceConfig)}
    # Cameras at different rates: the phase lasts live_s, not a number of frames.
    progress(f"5/5 {n} live cameras for {live_s:g} s")
    live = Agent(live_cfg)
    live.build()
    live.start()
    t0 = time.monotonic()
    time.sleep(live_s)
    live.stop()
    live_elapsed = time.monotonic() - t0
    assert live.pipeline is not None and batched.pipeline is not None and live.model is not None
    single_fps = _published_fps(single, single_s)
    unbatched_fps = _published_fps(unbatched, unbatched_s)
    batched_fps = _published_fps(batched, batched_s)
    per_source = {}
    for lane in live.pipeline.lanes:
        st = lane.stats
        per_source[lane.name] = {
            "source_fps": fps.get(lane.name),
            "priority": lane.priority,
            "budget_ms": lane.monitor.config.budget_ms,
            "throughput_fps": round(st.published / live_elapsed, 2) if live_elapsed else 0.0,
            "end_to_end_ms": _hist_ms(st.total),
            "stages_p99_ms": {name: round(st.stages[name].percentile_ms(99), 3) for name in STAGES},
            "counts": st.counts(),
        }
    model = live.model
    return {
        "schema": BENCH_SCHEMA,
        "mode": "multi-source",
        "model": model.resolved.path,
        "model_input_hw": [model.manifest.input.height, model.manifest.input.width],
        "backend": model.backend.describe(),
        "sources": n,
        "frames_per_source": frames,
        "inference_per_frame_ms": per_frame,
        "saturated": {
            "single_source_fps": round(single_fps, 2),
            "unbatched_fps": round(unbatched_fps, 2),
            "batched_fps": round(batched_fps, 2),
            "gain_from_batching": round(batched_fps / unbatched_fps, 3) if unbatched_fps else None,
            "gain_over_single_source": round(batched_fps / single_fps, 3) if single_fps else None,
            "batches": batched.pipeline.scheduler.summary(),
        },
        "live": {
            "source_fps": source_fps,
            "seconds": round(live_elapsed, 2),
            "throughput_fps": round(_published_fps(live, live_elapsed), 2),
            "batches": live.pipeline.scheduler.summary(),
            "per_source": per_source,
        },
    }


def _inference_per_frame(config: AgentConfig, runs: int) -> dict[str, float]:
    """The model alone on its preallocated sets: p50 ms per frame, by batch size (what
    batching saves on this accelerator, before the rest of the pipeline shares it)."""
    agent = Agent(config)
    agent.build()
    assert agent.pipeline is not None
    profile = agent.pipeline.primary
    sets = {1: next(iter(profile.pools.values())).slots[0].io, **profile.batches}
    out = {}
    for size, io in sets.items():
        hist = LatencyHistogram()
        for _ in range(runs):
            t = time.perf_counter_ns()
            profile.model.backend.infer(io)
            hist.record(time.perf_counter_ns() - t)
        out[str(size)] = round(hist.percentile_ms(50) / size, 3)
    for m in agent.models.values():
        m.backend.close()
    return out


def format_multi_report(r: dict[str, Any]) -> str:
    """The human-readable form of a ``run_multi_bench`` result."""
    sat, live = r["saturated"], r["live"]
    h, w = r["model_input_hw"]
    n = r["sources"]
    lines = [
        f"model {r['model']} ({w}x{h}), {r['backend'].get('backend')}, {n} sources",
        "inference alone, ms per frame by batch size: "
        + ", ".join(f"{b}: {ms:.2f}" for b, ms in r["inference_per_frame_ms"].items()),
        f"saturated: 1 source {sat['single_source_fps']:.1f} fps; {n} sources unbatched"
        f" {sat['unbatched_fps']:.1f} fps, batched {sat['batched_fps']:.1f} fps"
        f" ({sat['gain_from_batching']}x from batching, {sat['gain_over_single_source']}x one source)",
        f"  batches: mean {sat['batches']['mean_size']} frames, by size {sat['batches']['sizes']}",
        f"live: {n} sources at {live['source_fps'] or 'their own'} fps for {live['seconds']:.1f} s,"
        f" {live['throughput_fps']:.1f} fps published; batches: mean {live['batches']['mean_size']},"
        f" by size {live['batches']['sizes']}",
    ]
    for name, src in live["per_source"].items():
        c = src["counts"]
        lines.append(
            f"  {name:<10} {src['source_fps']:g} fps prio {src['priority']:>3} budget {src['budget_ms']:g} ms"
            f"  {_pq(src['end_to_end_ms'])}  on time {c['on_time']} late {c['late']} dropped {c['dropped']}"
        )
    return "\n".join(lines)
