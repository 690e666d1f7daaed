"""``edge-agent bench`` on one source: the phases in order, and the result as a dict (the
``--json`` schema in docs/deadline.md)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_agent.bench.bare import BareRun, bare_loop, onnxruntime_settings
from edge_agent.bench.configs import (
    BENCH_SCHEMA,
    BenchAgent,
    BenchError,
    Played,
    bench_config,
    bench_source,
    raw_config,
)
from edge_agent.bench.phases import (
    Samples,
    SequentialRun,
    Timed,
    adapted_vs_original,
    adapter_prefix,
    alone_and_sequential,
    analytics_ms,
    detections_summary,
    graph_cpu,
    hist_ms,
    host_load,
    run_agent,
    slowest_thread_ms,
    stage_table,
    tracker_ms,
)
from edge_agent.core.budget_fit import BudgetFit
from edge_agent.core.config import AgentConfig
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig, TensorRTConfig
from edge_agent.core.plan import model_at, onnxruntime_of
from edge_agent.pipelines.figures import LaneFigures
from edge_agent.pipelines.model import LoadedModel, load_model, model_notes_once
from edge_agent.pipelines.sources.files import FileSourceConfig, preload
from edge_agent.pipelines.sources.registry import source_rate

Progress = Callable[[str], None]


def quiet(_line: str) -> None:
    pass


def eta(seconds: float) -> str:
    """How long a phase will take, roughly, for its progress line."""
    if seconds < 1:
        return "under 1 s"
    return f"~{seconds:.0f} s" if seconds < 120 else f"~{seconds / 60:.0f} min"


def source_info(
    config: AgentConfig, file_source: FileSourceConfig | None, images: list[np.ndarray] | None
) -> dict[str, Any]:
    """Where the frames came from, the type of the config's own (first) source, and the
    frames preloaded from a file (how many, how much memory)."""
    own = config.source_list()[0].type
    if file_source is None or not images:
        return {"type": "synthetic", "path": "", "config_source": own, "frames": 0, "mib": 0.0}
    mib = round(sum(i.nbytes for i in images) / (1 << 20), 1)
    return {
        "type": file_source.type,
        "path": file_source.path,
        "config_source": own,
        "frames": len(images),
        "mib": mib,
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None


def _p(h: Timed | None, q: float) -> float:
    """A percentile as reported (rounded to the µs; 0 without a histogram), so that the
    figures printed add up."""
    return round(h.percentile_ms(q), 3) if h is not None else 0.0


def with_prefix(overhead: LatencyHistogram, prefix: Samples | None) -> dict[str, float]:
    """The overhead with the adapter's in-graph work added: p50 to p50, p99 to p99 (an
    upper bound: the two tails need not coincide)."""
    return {q: round(_p(overhead, n) + _p(prefix, n), 3) for q, n in (("p50", 50), ("p99", 99))}


def run_bench(
    config: AgentConfig,
    frames: int = 1000,
    source_fps: float | None = None,
    live_s: float = 10.0,
    progress: Progress = quiet,
    source: str | None = None,
    compare_bare: bool = False,
) -> dict[str, Any]:
    """All four phases (five with ``compare_bare``); returns the result documented in the
    docs/deadline.md (schema 1).

    ``frames`` sizes the inference, sequential, saturated and bare phases; the live phase
    lasts ``live_s`` seconds of source time at ``source_fps`` (None: the rate of the source
    played, ``sources.source_rate``). ``source``: a video file or an image folder to
    measure on (None: the config's source, see ``bench_source``). ``progress`` is told the
    name of each phase as it begins. The model measured throughout is the one the source
    runs: its own when it has one, else the config's.
    """
    with model_notes_once():
        return _run_bench(config, frames, source_fps, live_s, progress, source, compare_bare)


@dataclass
class _Frames:
    """The file measured on (None: the synthetic camera), its frames preloaded, and the live
    phase's rate and length in frames."""

    file_src: FileSourceConfig | None
    live_fps: float
    live_frames: int
    images: list[np.ndarray] | None
    played: Played | None


@dataclass
class _Inference:
    """Phase 1: the model the source runs, its inference timed alone (and, when adapted,
    the adapted and original models in alternating blocks and the input adapter's prefix),
    and the settings of the bare loop."""

    model: LoadedModel
    settings: OnnxRuntimeConfig | None
    adapted_from: str
    pure: Samples
    adapted_hist: Samples | None
    original_hist: Samples | None
    prefix: Samples | None
    graphs: dict[str, Any] | None = None  # CUDA graphs' CPU time per inference (TensorRT)

    @property
    def per_frame_s(self) -> float:
        """Inference alone, p50, in seconds: what the later phases' lengths are guessed from."""
        return self.pure.percentile_ms(50) / 1e3


@dataclass
class _Runs:
    """Phases 2 to 4: the sequential run, the saturated agent and the live agent, with the
    seconds each pipelined run took."""

    seq: SequentialRun
    sat: BenchAgent
    sat_s: float
    live: BenchAgent
    live_elapsed: float
    host_load: dict[str, float | None]  # other processes' cores, by phase (``phases.host_load``)

    @property
    def sat_stats(self) -> LaneFigures:
        """The saturated run's accounting (its source's figures)."""
        assert self.sat.pipeline is not None
        return self.sat.pipeline.figures().lanes[0]

    @property
    def live_stats(self) -> LaneFigures:
        """The live run's accounting (its source's figures)."""
        assert self.live.pipeline is not None
        return self.live.pipeline.figures().lanes[0]


def _run_bench(
    config: AgentConfig,
    frames: int,
    source_fps: float | None,
    live_s: float,
    progress: Progress,
    source: str | None,
    compare_bare: bool,
) -> dict[str, Any]:
    """The phases in order, as ``run_bench`` documents them."""
    if source_fps is not None and source_fps <= 0:
        raise BenchError(f"--source-fps must be > 0 (got {source_fps:g})")
    if compare_bare and isinstance(config.backend, TensorRTConfig):
        onnxruntime_settings(config)  # raises: before minutes of measuring
    fr = _preload_frames(config, frames, source_fps, live_s, progress, source)
    steps = 5 if compare_bare else 4
    saturated_cfg = raw_config(config, file_source=fr.file_src)
    measured = saturated_cfg.source_list()[0]
    model_cfg = model_at(config, measured.model, measured.manifest)  # what the source runs
    progress("loading the model")
    load: dict[str, float | None] = {}  # other processes' cores, by phase
    inf, seq = _first_phases(
        config, saturated_cfg, model_cfg, fr.played, frames, steps, compare_bare, progress, load
    )
    runs = _agent_phases(config, saturated_cfg, seq, frames, fr, steps, progress, inf.per_frame_s, load)
    in_graph = _p(inf.prefix, 50)
    live_overhead = with_prefix(runs.live_stats.overhead, inf.prefix)
    seq_overhead = with_prefix(runs.seq.stats.overhead, inf.prefix)
    bare = None
    if inf.settings is not None:
        progress(
            f"5/{steps} bare loop: letterbox, ONNX Runtime, decode and NMS on one thread, as a user would"
            f" write it, {frames} frames ({eta(frames * inf.per_frame_s)})"
        )
        with host_load(load, "bare"):
            run = bare_loop(config, model_cfg, inf.settings, frames, inf.model.params, fr.images)
        bare = _bare_summary(run, runs, in_graph, seq_overhead, live_overhead)
    return _result(config, frames, fr, inf, runs, in_graph, seq_overhead, live_overhead, bare)


def _preload_frames(
    config: AgentConfig,
    frames: int,
    source_fps: float | None,
    live_s: float,
    progress: Progress,
    source: str | None,
) -> _Frames:
    """The source to measure on, the live phase's rate and length, and a file's frames decoded."""
    file_src = bench_source(config, source)
    live_fps = source_fps or source_rate(file_src or config.source_list()[0])
    live_frames = max(1, round(live_fps * live_s))
    images = None
    played: Played | None = None
    if file_src is not None:
        progress(f"decoding {file_src.path}")
        images = preload(file_src, max(frames, live_frames))
        played = {file_src.name: images}
    return _Frames(file_src, live_fps, live_frames, images, played)


def _first_phases(
    config: AgentConfig,
    saturated_cfg: AgentConfig,
    model_cfg: ModelConfig,
    played: Played | None,
    frames: int,
    steps: int,
    compare_bare: bool,
    progress: Progress,
    load: dict[str, float | None],
) -> tuple[_Inference, SequentialRun]:
    """Phases 1 and 2 on one agent, in alternating blocks (``alone_and_sequential``): the
    model alone, as the pipeline runs it, and the frames one at a time; then, if adapted,
    the adapted and the original model in alternating blocks, and the adapter's prefix
    (for information)."""
    runs = max(frames // 2, 100)
    with BenchAgent(saturated_cfg, played=played) as agent, contextlib.ExitStack() as models:
        primary = agent.primary_profile(0)
        model = primary.model  # the source's own model, else the main one
        settings = onnxruntime_settings(config, model.backend.name) if compare_bare else None
        adapted_from = model.adapted_from
        ort = onnxruntime_of(config.backend, model.backend.name)
        warm_s = primary.warm_ns.get(1, 0) / 1e9  # the warm-up's inference: a first guess
        progress(
            f"1-2/{steps} inference alone (the model on one preprocessed frame, back to back, {runs} runs)"
            f" and sequential (capture, preprocess, infer, postprocess, publish, one frame at a time,"
            f" {frames} frames), in alternating blocks ({eta((runs + frames) * warm_s)})"
        )
        # Before any other model is loaded beside it.
        with host_load(load, "inference_alone_and_sequential"):
            pure, seq = alone_and_sequential(agent, frames, runs)
        graphs = None
        if hasattr(model.backend, "graph_state"):  # TensorRT: CUDA graphs against plain enqueues
            progress(f"1/{steps} the infer stage's CPU time with and without CUDA graphs, {runs} runs each")
            graphs = graph_cpu(agent, runs)
        adapted = original = None
        if adapted_from:
            assert ort is not None, "the input adapter runs on ONNX Runtime only"
            each = max(runs // 2, 20)
            progress(
                f"1/{steps} the adapted and the original model in alternating blocks, for information,"
                f" {each} runs each ({eta(2 * each * pure.percentile_ms(50) / 1e3)})"
            )
            # Same settings, same input: only the adapter differs.
            loaded = models.enter_context(load_model(replace(model_cfg, input_adapter="off"), ort))
            adapted, original = adapted_vs_original(agent, loaded, each)
    prefix = None
    if adapted_from and ort is not None:
        progress(f"1/{steps} the input adapter's Transpose + Cast alone, {runs} runs (about a second)")
        prefix = adapter_prefix(ort, model.manifest.input, runs)
    return _Inference(model, settings, adapted_from, pure, adapted, original, prefix, graphs), seq


def _agent_phases(
    config: AgentConfig,
    saturated_cfg: AgentConfig,
    seq: SequentialRun,
    frames: int,
    fr: _Frames,
    steps: int,
    progress: Progress,
    per_frame_s: float,
    load: dict[str, float | None],
) -> _Runs:
    """Phases 3 and 4: pipelined at full speed, and live at the source's rate (``seq``:
    phase 2's run). ``per_frame_s``: inference alone, to say how long each will take."""
    # The backend was warmed up when its slots were allocated: every frame counts.
    progress(
        f"3/{steps} pipelined at full speed: the stage threads on an unpaced source, {frames} frames"
        f" ({eta(frames * per_frame_s)})"
    )
    with host_load(load, "pipelined"):
        sat, sat_s = run_agent(saturated_cfg, frames, fr.played)
    live_fps, live_frames = fr.live_fps, fr.live_frames
    progress(
        f"4/{steps} live: a camera at {live_fps:g} fps through the agent, with its deadline,"
        f" {live_frames} frames ({eta(live_frames / live_fps)})"
    )
    live_cfg = bench_config(config, live_fps, 0, fr.file_src)
    with host_load(load, "live"):
        live, live_elapsed = run_agent(live_cfg, live_frames, fr.played, live_fps)
    return _Runs(seq, sat, sat_s, live, live_elapsed, load)


def _bare_summary(
    run: BareRun,
    runs: _Runs,
    in_graph: float,
    seq_overhead: dict[str, float],
    live_overhead: dict[str, float],
) -> dict[str, Any]:
    """The bare loop's summary, with the agent's figures to compare it with."""
    seq = runs.seq
    bare = run.summary
    # The same frames one at a time: the sequential phase. The adapter's in-graph work
    # is the agent's preprocessing: counted in its overhead, taken out of its inference.
    seq_infer = round(_p(seq.stats.stages["infer"], 50) - in_graph, 3)
    bare.update(
        {
            "agent_phase": "sequential",
            "agent_overhead_p50_ms": seq_overhead["p50"],
            "agent_infer_p50_ms": seq_infer,
            "overhead_over_bare_pre_post_p50": _ratio(seq_overhead["p50"], bare["pre_post_ms"]["p50"]),
            "infer_over_bare_infer_p50": _ratio(seq_infer, bare["infer_ms"]["p50"]),
            "live_overhead_p50_ms": live_overhead["p50"],
            "live_infer_p50_ms": round(_p(runs.live_stats.stages["infer"], 50) - in_graph, 3),
            "detections_match_sequential": {
                "frames": min(len(run.detections), len(seq.detections)),
                "same_count": sum(a == b for a, b in zip(run.detections, seq.detections)),
            },
        }
    )
    return bare


def _result(
    config: AgentConfig,
    frames: int,
    fr: _Frames,
    inf: _Inference,
    runs: _Runs,
    in_graph: float,
    seq_overhead: dict[str, float],
    live_overhead: dict[str, float],
    bare: dict[str, Any] | None,
) -> dict[str, Any]:
    """The result documented in docs/deadline.md (schema 1)."""
    model, prefix = inf.model, inf.prefix
    seq_fps = frames / runs.seq.seconds if runs.seq.seconds else 0.0
    return {
        "schema": BENCH_SCHEMA,
        "model": inf.adapted_from or model.resolved.path,
        "model_input_hw": [model.manifest.input.height, model.manifest.input.width],
        "backend": model.backend.describe(),
        "source": source_info(config, fr.file_src, fr.images),
        "frames": frames,
        "pure_inference_ms": hist_ms(inf.pure),
        "cuda_graphs": inf.graphs,
        "input_adapter": {
            "adapted": bool(inf.adapted_from),
            "adapted_inference_ms": hist_ms(inf.adapted_hist) if inf.adapted_hist is not None else None,
            "original_inference_ms": hist_ms(inf.original_hist) if inf.original_hist is not None else None,
            "prefix_ms": hist_ms(prefix) if prefix is not None else None,
            "in_graph_ms": in_graph,
        },
        "sequential": _sequential_section(runs.seq, seq_fps, seq_overhead),
        "pipelined": _pipelined_section(runs, seq_fps),
        "live": _live_section(runs, fr.live_fps, inf.pure, live_overhead),
        "budget": _budget_section(config, runs, inf),
        "host": {"cpus": os.cpu_count(), "other_processes_cores": runs.host_load},
        "bare": bare,
    }


def _budget_section(config: AgentConfig, runs: _Runs, inf: _Inference) -> dict[str, Any]:
    """Does the model's inference fit the per-frame budget the live phase ran with? Judged on
    the larger p50 of inference alone and of inference in the live phase (a camera's frames
    come apart: the pool sleeps between them, and a host's clocks may drop under load),
    with ``core.budget_fit``'s advice when it does not (None when it does)."""
    lane = runs.live_stats
    budget_ms = lane.deadline.budget_ms
    alone = round(inf.pure.percentile_ms(50), 3)
    live = round(lane.stages["infer"].percentile_ms(50), 3)  # 0: none published
    fit = BudgetFit(max(alone, live), budget_ms, lane.frame_period_ms)
    name = os.path.basename(inf.adapted_from or inf.model.resolved.path)
    return {
        "budget_ms": budget_ms,
        "inference_p50_ms": fit.infer_ms,
        "inference_alone_p50_ms": alone,
        "live_inference_p50_ms": live,
        "fits": fit.fits,
        "suggested_budget_ms": None if fit.fits else fit.suggested_budget_ms,
        "advice": fit.advice(f"model {name}", _budget_setting(config)),
    }


def _budget_setting(config: AgentConfig) -> str:
    """Where the measured source's budget is set: its own ``budget_ms``, else the deadline's."""
    src = config.source_list()[0]
    if not src.budget_ms:
        return "deadline.budget_ms"
    return f"the {src.name} source's budget_ms" if config.sources else "source.budget_ms"


def _sequential_section(seq: SequentialRun, seq_fps: float, seq_overhead: dict[str, float]) -> dict[str, Any]:
    """The result's ``sequential`` section."""
    return {
        "per_frame_ms": hist_ms(seq.per_frame),
        "throughput_fps": round(seq_fps, 2),
        "stages": stage_table(seq.stats),
        "tracker_ms": tracker_ms(seq.stats),
        "analytics_ms": analytics_ms(seq.stats),
        "overhead_ms": hist_ms(seq.stats.overhead),
        "overhead_with_adapter_ms": seq_overhead,
        "detections_per_frame": detections_summary(seq.detections),
    }


def _pipelined_section(runs: _Runs, seq_fps: float) -> dict[str, Any]:
    """The result's ``pipelined`` section: the saturated run."""
    sat, sat_stats = runs.sat, runs.sat_stats
    slowest = slowest_thread_ms(sat_stats)
    sat_fps = sat_stats.published / runs.sat_s if runs.sat_s else 0.0
    return {
        "throughput_fps": round(sat_fps, 2),
        "gain_over_sequential": round(sat_fps / seq_fps, 3) if seq_fps else None,
        "slowest_thread_ms": round(slowest, 3),
        "efficiency": round(sat_fps * slowest / 1000.0, 3),
        "end_to_end_ms": hist_ms(sat_stats.total),
        "stages": stage_table(sat_stats),
        "detections_per_frame": detections_summary(sat.detections),
    }


def _live_section(
    runs: _Runs, live_fps: float, pure: Samples, live_overhead: dict[str, float]
) -> dict[str, Any]:
    """The result's ``live`` section."""
    live, live_elapsed, live_stats = runs.live, runs.live_elapsed, runs.live_stats
    ladder = live_stats.deadline
    pure_p50 = pure.percentile_ms(50)
    pre_inf_post = sum(live_stats.stages[s].percentile_ms(50) for s in ("preprocess", "infer", "postprocess"))
    return {
        "source_fps": live_fps,
        "seconds": round(live_elapsed, 2),
        "throughput_fps": round(live_stats.published / live_elapsed, 2) if live_elapsed else 0.0,
        "end_to_end_ms": hist_ms(live_stats.total),
        "end_to_end_ms_by_profile": {k: hist_ms(h) for k, h in live_stats.by_profile.items()},
        "overhead_ms": hist_ms(live_stats.overhead),
        "overhead_with_adapter_ms": live_overhead,
        "overhead_minus_pure_p50_ms": round(live_stats.total.percentile_ms(50) - pure_p50, 3),
        "p99_over_pre_infer_post_p50": round(live_stats.total.percentile_ms(99) / pre_inf_post, 3)
        if pre_inf_post
        else None,
        "detections_per_frame": detections_summary(live.detections),
        "stages": stage_table(live_stats),
        "tracker_ms": tracker_ms(live_stats),
        "analytics_ms": analytics_ms(live_stats),
        "backend_parts_ms": {k: hist_ms(h) for k, h in live_stats.backend_parts.items()},
        "counts": live_stats.counts.as_dict(),
        "ladder": {
            "final_step": ladder.step_name,
            "changes": ladder.changes,
            "history": [dict(h) for h in ladder.history],
        },
    }
