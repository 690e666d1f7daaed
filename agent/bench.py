"""``edge-agent bench``: where every millisecond goes, measured in one run.

Four phases on the real pipeline code, the model the source runs (the config's, the
source's own, or ``--model``) and frames of the config's source, or of a video file or
image folder (``--source``):

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
When the model runs as an input-adapted copy (``model.input_adapter``: the normalisation
moved into the graph), that work is inside the inference stage: the bench times what the
adapter put in front of the model (a Transpose and a Cast) alone, in a session of its own
with the same settings (``adapter_prefix``), and adds it to the overhead it reports (its
p50 to the p50; its p99 to the p99, an upper bound). The whole adapted and original
models are timed too, in alternating blocks, for information: their difference is within
the noise of two p50s of the model.

Frames: a synthetic camera for a synthetic or live-camera source (a camera may be held by
the agent the bench runs beside); from a video file or an image folder (the config's own
single file source, or ``--source``) the frames are decoded into memory first and played
from there, looped (``sources.MemorySource``): unpaced in the inference, sequential and
saturated phases, as a camera at the live rate in the live phase. Decoding a file (a PNG
costs milliseconds) is thus no part of any figure, as a camera's frames arrive decoded,
and it never competes with inference for the cores. Each phase counts the detections of
every published frame, so the figures describe the model on these scenes.

``compare_bare`` (``--compare-bare``) adds a fifth phase: a plain ONNX Runtime loop on one
thread (letterbox, ``session.run``, decode and NMS) on the same frames, with the config's
ONNX Runtime settings (``bare_loop``), compared with the sequential phase (the same frames,
one at a time): overhead against the loop's pre + post, and inference less the adapter's
in-graph work against the loop's ``session.run``.

``--sources N`` benchmarks several cameras on one accelerator instead (``run_multi_bench``):
saturated throughput of one source, of N sources without batching and of N sources
batched; then N paced sources live, with each source's latency and the batch sizes.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_agent.core.config import (
    SCHEDULING_FIELDS,
    AgentConfig,
    ImageFolderSourceConfig,
    LadderStep,
    ModelConfig,
    OnnxRuntimeConfig,
    SourceConfig,
    SyntheticSourceConfig,
    TensorRTConfig,
    VideoSourceConfig,
)
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stages import STAGES
from edge_agent.models.manifest import InputSpec
from edge_agent.pipelines.decode import Decoder
from edge_agent.pipelines.file_sources import FileSourceConfig, preload
from edge_agent.pipelines.model import LoadedModel, check_io, load_model, model_notes_once
from edge_agent.pipelines.pipeline import PipelineStats
from edge_agent.pipelines.preprocess import Letterbox, Preprocessor, boxes_to_source
from edge_agent.pipelines.source_base import Source, SourceError
from edge_agent.pipelines.sources import MemorySource, create_source, source_rate
from edge_agent.runner import Agent, model_at, onnxruntime_of

BENCH_SCHEMA = 1


class BenchError(ValueError):
    """The bench cannot measure what it was asked to; the message says why."""


def _hist_ms(h: LatencyHistogram) -> dict[str, float]:
    return h.summary_ms()


def lane_settings(src: SourceConfig) -> dict[str, Any]:
    """What a source keeps when it is played from other frames: its name and its lane's
    settings."""
    return {"name": src.name, **{k: getattr(src, k) for k in SCHEDULING_FIELDS}}


def _as_synthetic(src: Any, fps: float | None) -> SyntheticSourceConfig:
    """``src`` as a synthetic camera at ``fps`` (None: a synthetic source's own rate, else
    30), keeping its name and scheduling settings."""
    if isinstance(src, SyntheticSourceConfig):
        return replace(src, fps=src.fps if fps is None else fps)
    return SyntheticSourceConfig(fps=30.0 if fps is None else fps, **lane_settings(src))


PRIVATE_ENDPOINT = "tcp://127.0.0.1:*"  # a free loopback port, chosen at bind


def private_config(config: AgentConfig) -> AgentConfig:
    """``config`` for an agent that runs beside the real one (a service on the same config):
    no metrics endpoint, and results on a private loopback port (any free one), never the
    configured endpoint; it waits for no subscriber: nobody listens to a measurement."""
    metrics = replace(config.metrics, enabled=False)
    publish = replace(config.publish, endpoint=PRIVATE_ENDPOINT, wait_for_subscribers=0)
    return replace(config, metrics=metrics, publish=publish)


def synthetic_config(config: AgentConfig, fps: float | None, sources: int = 0) -> AgentConfig:
    """The config on synthetic cameras at ``fps``: its own sources, or ``sources`` copies
    of its first one."""
    template = config.source_list()
    if sources:
        first = _as_synthetic(template[0], fps)
        made = tuple(replace(first, name=f"cam{i}", seed=first.seed + i) for i in range(sources))
    else:
        made = tuple(_as_synthetic(src, fps) for src in template)
    if len(made) == 1:
        return private_config(replace(config, source=made[0], sources=()))
    return private_config(replace(config, source=SyntheticSourceConfig(), sources=made))


def with_model(config: AgentConfig, path: str, manifest: str = "") -> AgentConfig:
    """The config measuring the model at ``path`` in place of its own (its manifest:
    ``manifest``, else beside it, else read from the ONNX). Sources with a model of their
    own run it too: the model measured is the one every source runs."""
    model = replace(config.model, path=path, manifest=manifest)
    source = replace(config.source, model="", manifest="")
    sources = tuple(replace(s, model="", manifest="") for s in config.sources)
    return replace(config, model=model, source=source, sources=sources)


def bench_source(config: AgentConfig, path: str | None = None) -> FileSourceConfig | None:
    """The file the bench plays (see ``preload``): ``path`` (a video file or an image
    folder, with the name and lane settings of the config's first source), else the
    config's own source when it is a single video file or image folder; None: a synthetic
    camera (live cameras are never opened: the agent may hold them). Raises SourceError
    naming a ``path`` that is neither."""
    if path:
        kept = lane_settings(config.source_list()[0])
        if os.path.isdir(path):
            return ImageFolderSourceConfig(path=path, **kept)
        if os.path.isfile(path):
            return VideoSourceConfig(path=path, **kept)
        raise SourceError(f"--source {path}: no such video file or image folder")
    own = config.source_list()
    if len(own) != 1 or not isinstance(own[0], (VideoSourceConfig, ImageFolderSourceConfig)):
        return None
    return own[0]


def bench_config(
    config: AgentConfig, fps: float | None, sources: int = 0, file_source: FileSourceConfig | None = None
) -> AgentConfig:
    """The config the bench's agents run: on ``file_source`` (its frames preloaded and
    played by ``BenchAgent``, paced there), else on synthetic cameras at ``fps`` (see
    ``synthetic_config``)."""
    if file_source is None:
        return synthetic_config(config, fps, sources)
    return private_config(replace(config, source=file_source, sources=()))


def _raw(config: AgentConfig, sources: int = 0, file_source: FileSourceConfig | None = None) -> AgentConfig:
    """Unpaced, with neither admission nor ladder: the pipeline's own capability.

    The deadline machinery is for the live phase; here a model slower than the budget
    must still be measured, not dropped as stale.
    """
    deadline = replace(config.deadline, admission=False, ladder=(LadderStep(),))
    return replace(bench_config(config, 0.0, sources, file_source), deadline=deadline)


#: Preloaded frames by source name (``sources.preload``).
Played = dict[str, list[np.ndarray]]


class BenchAgent(Agent):
    """An agent that counts the detections of every frame it decodes (each one is then
    published), and plays the frames in ``played`` (a file's, preloaded) in place of the
    file source of that name, as a camera at ``pace_fps`` or unpaced (0)."""

    def __init__(
        self,
        config: AgentConfig,
        max_frames: int = 0,
        played: Played | None = None,
        pace_fps: float = 0.0,
    ) -> None:
        super().__init__(config, max_frames)
        self.played = played or {}
        self.pace_fps = pace_fps
        self.detections: list[int] = []  # per decoded frame, in order (one writer: post)

    def _source(self, cfg: AgentConfig, src: SourceConfig) -> Any:  # type: ignore[override]
        images = self.played.get(src.name)
        if images and isinstance(src, (VideoSourceConfig, ImageFolderSourceConfig)):
            return MemorySource(src.name, images, self.pace_fps)
        return super()._source(cfg, src)

    def build(self) -> None:
        super().build()
        for m in self.models.values():
            m.decode = self._counting(m.decode)

    def _counting(self, decode: Decoder) -> Decoder:
        record = self.detections.append

        class Counted(Decoder):
            def __call__(self, outputs: Any, params: Any) -> Any:
                result = super().__call__(outputs, params)
                record(len(result[1]))
                return result

        return Counted(decode.name, decode.outputs)


@contextlib.contextmanager
def started(agent: Agent) -> Iterator[Agent]:
    """``agent`` (built) started for the block and stopped after it, on every path. After
    the block: BenchError when its pipeline failed, or a stage thread did not end (its
    models then stay loaded: never closed under a stage)."""
    assert agent.pipeline is not None
    try:
        agent.start()
        yield agent
    except BaseException:
        agent.stop()
        raise
    clean = agent.stop()
    failure = agent.pipeline.failure()
    if failure:
        raise BenchError(f"the pipeline failed during the measurement: {failure}")
    if not clean:
        raise BenchError(f"a stage thread did not end when the measurement stopped: {agent.pipeline.alive()}")


def detections_summary(counts: list[int]) -> dict[str, Any]:
    """Detections per frame: how many frames, their mean, median and most."""
    if not counts:
        return {"frames": 0, "mean": 0.0, "p50": 0.0, "max": 0}
    a = np.asarray(counts)
    return {
        "frames": len(a),
        "mean": round(float(a.mean()), 3),
        "p50": float(np.median(a)),
        "max": int(a.max()),
    }


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


def _run_agent(
    config: AgentConfig, frames: int, played: Played | None = None, pace_fps: float = 0.0
) -> tuple[BenchAgent, float]:
    with BenchAgent(config, frames, played, pace_fps) as agent, started(agent):
        assert agent.pipeline is not None
        t0 = time.monotonic()
        agent.pipeline.finished.wait()
        elapsed = time.monotonic() - t0
    return agent, elapsed


def inference_alone(
    agent: Agent, runs: int, original: LoadedModel | None = None
) -> tuple[LatencyHistogram, LatencyHistogram | None]:
    """The backend alone, on one slot whose input holds a preprocessed frame of the source.

    With ``original`` (the model an input-adapted main model was made from) that model
    too, on the same frame preprocessed its own way, ``runs`` times each, in alternating
    blocks, so whatever drifts during the phase (clocks, the machine's other work) weighs
    on both alike. The first run after each switch is not counted: the other session's
    pool threads may still be spinning then (``allow_spinning``) and take cores from it.
    Returns the main model's times and the original's (or None).
    """
    assert agent.pipeline is not None
    p = agent.pipeline
    p.lanes[0].source.open()
    try:
        frame = p.lanes[0].source.read(1.0)
        if frame is None:
            raise BenchError(f"source {p.lanes[0].source.name!r} gave no frame within 1 s")
        slot = p.prepare(frame)
        original_io = None
        if original is not None:
            original_io = original.backend.allocate()
            original.preprocessor(frame.image, original_io.inputs[original.input_name], Letterbox())
            original.backend.upload(original_io)
    finally:
        p.lanes[0].source.close()
    assert slot is not None
    runners = [(slot.profile.model.backend, slot.io, LatencyHistogram())]
    if original is not None and original_io is not None:
        original.backend.warmup(original_io, runs=2)
        runners.append((original.backend, original_io, LatencyHistogram()))
    block = runs if len(runners) == 1 else max(1, min(10, runs // 4))
    done = 0
    while done < runs:
        n = min(block, runs - done)
        for backend, io, hist in runners:
            if len(runners) > 1:
                backend.infer(io)  # the switch (see above)
            for _ in range(n):
                t = time.perf_counter_ns()
                backend.infer(io)
                hist.record(time.perf_counter_ns() - t)
        done += n
    slot.pool.release(slot)  # type: ignore[union-attr]
    return runners[0][2], runners[1][2] if len(runners) > 1 else None


def pure_inference(agent: Agent, runs: int) -> LatencyHistogram:
    """The backend alone, on one slot whose input holds a preprocessed source frame."""
    return inference_alone(agent, runs)[0]


def adapter_prefix(settings: OnnxRuntimeConfig, spec: InputSpec, runs: int) -> LatencyHistogram:
    """The input adapter's in-graph work, timed alone: a graph of only what
    ``models.adapter.rewrite`` puts in front of the model (the uint8 NHWC frame
    [1, H, W, 3] → Transpose to NCHW → Cast to the model's float type), in an ONNX Runtime
    session with the model's ``settings``, warmed up with two runs, then run ``runs``
    times. The rest of the adapted graph costs what the original's does: the folded
    weights are constants of the same size, the convolution the same."""
    import onnx
    from onnx import TensorProto, helper

    from edge_agent.pipelines.backends.onnxruntime import OnnxRuntimeBackend

    elem = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[spec.dtype]
    h, w = spec.height, spec.width
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["frame"], ["nchw_u8"], perm=[0, 3, 1, 2]),
            helper.make_node("Cast", ["nchw_u8"], ["nchw"], to=elem),
        ],
        "adapter-prefix",
        [helper.make_tensor_value_info("frame", TensorProto.UINT8, [1, h, w, 3])],
        [helper.make_tensor_value_info("nchw", elem, [1, 3, h, w])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    backend = OnnxRuntimeBackend(settings)
    try:
        with tempfile.TemporaryDirectory(prefix="edge-agent-bench-") as tmp:
            path = os.path.join(tmp, "adapter-prefix.onnx")
            onnx.save(model, path)
            backend.load(path)
        io = backend.allocate()
        io.inputs["frame"][:] = np.random.default_rng(0).integers(0, 256, (1, h, w, 3), np.uint8)
        backend.warmup(io, runs=2)
        hist = LatencyHistogram()
        for _ in range(runs):
            t = time.perf_counter_ns()
            backend.infer(io)
            hist.record(time.perf_counter_ns() - t)
    finally:
        backend.close()
    return hist


@dataclass
class SequentialRun:
    """The sequential phase: each frame's time through every stage, the seconds it took,
    the pipeline's accounting (stages, overhead) and each frame's detections, in order."""

    per_frame: LatencyHistogram
    seconds: float
    stats: PipelineStats
    detections: list[int]


def sequential(
    config: AgentConfig,
    frames: int,
    file_source: FileSourceConfig | None = None,
    played: Played | None = None,
) -> SequentialRun:
    """Each frame through every stage on this thread, none overlapping."""
    cfg = _raw(config, file_source=file_source)
    with BenchAgent(cfg, played=played) as agent, contextlib.ExitStack() as stack:
        assert agent.pipeline is not None and agent.publisher is not None
        p = agent.pipeline
        agent.publisher.open()
        stack.callback(agent.publisher.close)
        p.lanes[0].source.open()
        stack.callback(p.lanes[0].source.close)
        hist = LatencyHistogram()
        t0 = time.monotonic()
        for _ in range(frames):
            t = time.perf_counter_ns()
            frame = p.read_frame()
            slot = p.prepare(frame)
            if slot is not None and p.infer_one(slot):
                p.publish_one(slot)
            hist.record(time.perf_counter_ns() - t)
        elapsed = time.monotonic() - t0
    return SequentialRun(hist, elapsed, p.lanes[0].stats, agent.detections)


def onnxruntime_settings(config: AgentConfig, running: str = "") -> OnnxRuntimeConfig:
    """The ONNX Runtime settings the config's backend runs the model with (``running``: the
    backend the model was loaded on, which ``auto`` chose). Raises BenchError for another
    backend: the plain loop to compare with is an ONNX Runtime one."""
    settings = onnxruntime_of(config.backend, running)
    if settings is None:
        raise BenchError(
            "--compare-bare compares with a plain ONNX Runtime loop: it needs an ONNX Runtime backend, "
            f"and this config runs the model on {running or config.backend.type}"
            " (set backend: {type: onnxruntime})"
        )
    return settings


@dataclass
class BareRun:
    """The plain loop's result (``summary``, as the JSON has it) and each frame's
    detections, in order."""

    summary: dict[str, Any]
    detections: list[int]


def bare_loop(
    config: AgentConfig,
    model: ModelConfig,
    settings: OnnxRuntimeConfig,
    frames: int,
    params: Any,
    images: list[np.ndarray] | None = None,
) -> BareRun:
    """A plain ONNX Runtime loop on one thread, running ``model`` on the frames the
    sequential phase had (``images``: a file's, preloaded; None: the config's synthetic
    camera's).

    Per frame: the letterbox (the manifest's pad value, 114 by default) and normalisation
    of the original model's input by the project's own ``Preprocessor`` (numpy and OpenCV;
    no input adapter, so the graph as exported), ``session.run``, the manifest's decoder
    with its class-aware NMS (``params``: the agent's thresholds), and the boxes mapped back
    to the frame. Reading the frame is not timed. The session is made the way the agent's
    ONNX Runtime backend makes it, with ``settings`` (threads, spinning, optimisation
    level, providers); it is warmed up with two runs first, as the agent's is.
    """
    from edge_agent.models.manifest import resolve_model
    from edge_agent.pipelines.backends.onnxruntime import OnnxRuntimeBackend

    resolved = resolve_model(model.path, model.manifest)
    m = resolved.manifest
    backend = OnnxRuntimeBackend(settings)
    names = ("pre", "infer", "post", "pre_post", "total")
    hists = {k: LatencyHistogram() for k in names}
    detections: list[int] = []
    try:
        backend.load(resolved.path)  # no input format given: the graph as exported
        input_name, decode, _ = check_io(m, resolved.path, backend.inputs, backend.outputs)
        session = backend.session
        assert session is not None
        spec = next(t for t in backend.inputs if t.name == input_name)
        tensor = np.zeros(spec.concrete(1), spec.dtype)
        feed = {input_name: tensor}
        fetch = [t.name for t in backend.outputs]
        fmt = m.input.format()
        preprocess = Preprocessor(fmt)
        geo = Letterbox()
        source: Source = MemorySource("bare", images) if images else create_source(_raw(config).source)
        source.open()
        try:
            first = source.read(1.0)
            if first is None:
                raise BenchError(f"source {source.name!r} gave no frame within 1 s")
            preprocess(first.image, tensor, geo)
            for _ in range(2):
                session.run(fetch, feed)
        finally:
            source.close()
        source.open()  # from the first frame again, as the sequential phase
        try:
            for _ in range(frames):
                frame = source.read(1.0)
                if frame is None:
                    raise BenchError(f"source {source.name!r} gave no frame within 1 s")
                t0 = time.perf_counter_ns()
                preprocess(frame.image, tensor, geo)
                t1 = time.perf_counter_ns()
                outs = session.run(fetch, feed)
                t2 = time.perf_counter_ns()
                xyxy, scores, _ = decode(outs, params)
                boxes_to_source(xyxy, geo)
                t3 = time.perf_counter_ns()
                hists["pre"].record(t1 - t0)
                hists["infer"].record(t2 - t1)
                hists["post"].record(t3 - t2)
                hists["pre_post"].record(t1 - t0 + t3 - t2)
                hists["total"].record(t3 - t0)
                detections.append(len(scores))
        finally:
            source.close()
    finally:
        backend.close()
    total_s = hists["total"].total_ns / 1e9
    summary = {
        "model": resolved.path,
        "preprocessing": f"letterbox (pad {fmt.pad_value}) + numpy normalisation into the model's own "
        f"{fmt.layout} {fmt.dtype} input (edge_agent Preprocessor, no input adapter)",
        "onnxruntime": {
            "providers": list(settings.providers),
            "intra_op_threads": settings.intra_op_threads,
            "inter_op_threads": settings.inter_op_threads,
            "allow_spinning": settings.allow_spinning,
            "graph_optimization": settings.graph_optimization,
        },
        "frames": frames,
        **{f"{k}_ms": _hist_ms(h) for k, h in hists.items()},
        "throughput_fps": round(frames / total_s, 2) if total_s else 0.0,
        "detections_per_frame": detections_summary(detections),
    }
    return BareRun(summary, detections)


Progress = Callable[[str], None]


def _quiet(_line: str) -> None:
    pass


def _source_info(
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


def _p(h: LatencyHistogram | None, q: float) -> float:
    """A percentile as reported (rounded to the µs; 0 without a histogram), so that the
    figures printed add up."""
    return round(h.percentile_ms(q), 3) if h is not None else 0.0


def _with_prefix(overhead: LatencyHistogram, prefix: LatencyHistogram | None) -> dict[str, float]:
    """The overhead with the adapter's in-graph work added: p50 to p50, p99 to p99 (an
    upper bound: the two tails need not coincide)."""
    return {q: round(_p(overhead, n) + _p(prefix, n), 3) for q, n in (("p50", 50), ("p99", 99))}


def run_bench(
    config: AgentConfig,
    frames: int = 1000,
    source_fps: float | None = None,
    live_s: float = 10.0,
    progress: Progress = _quiet,
    source: str | None = None,
    compare_bare: bool = False,
) -> dict[str, Any]:
    """All four phases (five with ``compare_bare``); returns the result documented in the
    README (schema 1).

    ``frames`` sizes the inference, sequential, saturated and bare phases; the live phase
    lasts ``live_s`` seconds of source time at ``source_fps`` (None: the rate of the source
    played, ``sources.source_rate``). ``source``: a video file or an image folder to
    measure on (None: the config's source, see ``bench_source``). ``progress`` is told the
    name of each phase as it begins. The model measured throughout is the one the source
    runs: its own when it has one, else the config's.
    """
    with model_notes_once():
        return _run_bench(config, frames, source_fps, live_s, progress, source, compare_bare)


def _run_bench(
    config: AgentConfig,
    frames: int,
    source_fps: float | None,
    live_s: float,
    progress: Progress,
    source: str | None,
    compare_bare: bool,
) -> dict[str, Any]:
    if source_fps is not None and source_fps <= 0:
        raise BenchError(f"--source-fps must be > 0 (got {source_fps:g})")
    if compare_bare and isinstance(config.backend, TensorRTConfig):
        onnxruntime_settings(config)  # raises: before minutes of measuring
    file_src = bench_source(config, source)
    live_fps = source_fps or source_rate(file_src or config.source_list()[0])
    live_frames = max(1, round(live_fps * live_s))
    images = None
    played: Played | None = None
    if file_src is not None:
        progress(f"decoding {file_src.path}")
        images = preload(file_src, max(frames, live_frames))
        played = {file_src.name: images}
    steps = 5 if compare_bare else 4
    saturated_cfg = _raw(config, file_source=file_src)
    measured = saturated_cfg.source_list()[0]
    model_cfg = model_at(config, measured.model, measured.manifest)  # what the source runs
    progress("loading the model")
    original: LoadedModel | None = None
    runs = max(frames // 2, 100)
    with BenchAgent(saturated_cfg, played=played) as probe, contextlib.ExitStack() as models:
        assert probe.pipeline is not None
        model = probe.pipeline.lanes[0].primary.model  # the source's own model, else the main one
        settings = onnxruntime_settings(config, model.backend.name) if compare_bare else None
        adapted_from = model.adapted_from
        ort = onnxruntime_of(config.backend, model.backend.name)
        if adapted_from:
            assert ort is not None, "the input adapter runs on ONNX Runtime only"
            # Same settings, same input: only the adapter differs.
            original = models.enter_context(load_model(replace(model_cfg, input_adapter="off"), ort))
        both = ", the adapted and the original model in alternating blocks" if original else ""
        progress(f"1/{steps} inference alone ({runs} runs{both})")
        pure, original_hist = inference_alone(probe, runs, original)
    prefix = None
    if adapted_from and ort is not None:
        progress(f"1/{steps} the input adapter's Transpose + Cast alone ({runs} runs)")
        prefix = adapter_prefix(ort, model.manifest.input, runs)

    progress(f"2/{steps} sequential, one frame at a time ({frames} frames)")
    seq = sequential(config, frames, file_src, played)
    # The backend was warmed up when its slots were allocated: every frame counts.
    progress(f"3/{steps} pipelined at full speed ({frames} frames)")
    sat, sat_s = _run_agent(saturated_cfg, frames, played)
    sat_stats = sat.pipeline.lanes[0].stats  # type: ignore[union-attr]

    progress(
        f"4/{steps} live camera at {live_fps:g} fps ({live_frames} frames, ~{live_frames / live_fps:.0f} s)"
    )
    live_cfg = bench_config(config, live_fps, 0, file_src)
    live, live_elapsed = _run_agent(live_cfg, live_frames, played, live_fps)
    live_stats = live.pipeline.lanes[0].stats  # type: ignore[union-attr]
    monitor = live.pipeline.lanes[0].monitor  # type: ignore[union-attr]

    pure_p50 = pure.percentile_ms(50)
    slowest = _slowest_thread_ms(sat_stats)
    sat_fps = sat_stats.published / sat_s if sat_s else 0.0
    seq_fps = frames / seq.seconds if seq.seconds else 0.0
    pre_inf_post = sum(live_stats.stages[s].percentile_ms(50) for s in ("preprocess", "infer", "postprocess"))
    in_graph = _p(prefix, 50)
    live_overhead = _with_prefix(live_stats.overhead, prefix)
    seq_overhead = _with_prefix(seq.stats.overhead, prefix)

    bare = None
    if settings is not None:
        progress(f"5/{steps} plain ONNX Runtime loop, one thread ({frames} frames)")
        run = bare_loop(config, model_cfg, settings, frames, model.params, images)
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
                "live_infer_p50_ms": round(_p(live_stats.stages["infer"], 50) - in_graph, 3),
                "detections_match_sequential": {
                    "frames": min(len(run.detections), len(seq.detections)),
                    "same_count": sum(a == b for a, b in zip(run.detections, seq.detections)),
                },
            }
        )
    return {
        "schema": BENCH_SCHEMA,
        "model": adapted_from or model.resolved.path,
        "model_input_hw": [model.manifest.input.height, model.manifest.input.width],
        "backend": model.backend.describe(),
        "source": _source_info(config, file_src, images),
        "frames": frames,
        "pure_inference_ms": _hist_ms(pure),
        "input_adapter": {
            "adapted": bool(adapted_from),
            "original_inference_ms": _hist_ms(original_hist) if original_hist is not None else None,
            "prefix_ms": _hist_ms(prefix) if prefix is not None else None,
            "in_graph_ms": in_graph,
        },
        "sequential": {
            "per_frame_ms": _hist_ms(seq.per_frame),
            "throughput_fps": round(seq_fps, 2),
            "stages": _stage_table(seq.stats),
            "overhead_ms": _hist_ms(seq.stats.overhead),
            "overhead_with_adapter_ms": seq_overhead,
            "detections_per_frame": detections_summary(seq.detections),
        },
        "pipelined": {
            "throughput_fps": round(sat_fps, 2),
            "gain_over_sequential": round(sat_fps / seq_fps, 3) if seq_fps else None,
            "slowest_thread_ms": round(slowest, 3),
            "efficiency": round(sat_fps * slowest / 1000.0, 3),
            "end_to_end_ms": _hist_ms(sat_stats.total),
            "stages": _stage_table(sat_stats),
            "detections_per_frame": detections_summary(sat.detections),
        },
        "live": {
            "source_fps": live_fps,
            "seconds": round(live_elapsed, 2),
            "throughput_fps": round(live_stats.published / live_elapsed, 2) if live_elapsed else 0.0,
            "end_to_end_ms": _hist_ms(live_stats.total),
            "end_to_end_ms_by_profile": {k: _hist_ms(h) for k, h in live_stats.by_profile.items()},
            "overhead_ms": _hist_ms(live_stats.overhead),
            "overhead_with_adapter_ms": live_overhead,
            "overhead_minus_pure_p50_ms": round(live_stats.total.percentile_ms(50) - pure_p50, 3),
            "p99_over_pre_infer_post_p50": round(live_stats.total.percentile_ms(99) / pre_inf_post, 3)
            if pre_inf_post
            else None,
            "detections_per_frame": detections_summary(live.detections),
            "stages": _stage_table(live_stats),
            "backend_parts_ms": {k: _hist_ms(h) for k, h in live_stats.backend_parts.items()},
            "counts": live_stats.counts(),
            "ladder": {
                "final_step": monitor.current.name,
                "changes": monitor.changes,
                "history": list(monitor.history),
            },
        },
        "bare": bare,
    }


def _pq(h: dict[str, float]) -> str:
    return f"p50 {h['p50']:8.3f} ms   p99 {h['p99']:8.3f} ms   max {h['max']:8.3f} ms"


def _det(d: dict[str, Any]) -> str:
    return f"mean {d['mean']:.2f}, p50 {d['p50']:g}, max {d['max']} ({d['frames']} frames)"


def format_report(r: dict[str, Any]) -> str:
    """The human-readable form of a ``run_bench`` result."""
    pure, seq, pipe, live = r["pure_inference_ms"], r["sequential"], r["pipelined"], r["live"]
    h, w = r["model_input_hw"]
    backend = r["backend"]
    src = r["source"]
    if src["type"] != "synthetic":
        kind = "image folder" if src["type"] == "images" else "video file"
        frames_from = f"{kind} {src['path']}: {src['frames']} frames preloaded ({src['mib']:g} MiB), looped"
    elif src["config_source"] != "synthetic":
        frames_from = f"synthetic camera (in place of the config's {src['config_source']} source)"
    else:
        frames_from = "synthetic camera"
    adapter = r["input_adapter"]
    adapted = adapter["adapted"]
    oh = live["overhead_with_adapter_ms"]
    lines = [
        f"model {r['model']} ({w}x{h}), {backend.get('backend')} {backend.get('providers', '')}",
        f"source: {frames_from}",
        f"pure inference            {_pq(pure)}",
    ]
    if adapted:
        prefix, orig = adapter["prefix_ms"], adapter["original_inference_ms"]
        lines += [
            f"  input adapter in the graph (Transpose + Cast, timed alone): {_pq(prefix)}",
            f"    whole model, alternating blocks (information only: the difference of two p50s is"
            f" noise): adapted p50 {pure['p50']:.3f} ms, original p50 {orig['p50']:.3f} ms",
        ]
    what = "total - capture - infer, + in-graph adapter prefix" if adapted else "total - capture - infer"
    p99_note = " (an upper bound: the two p99s added)" if adapted else ""
    lines += [
        f"sequential, per frame     {_pq(seq['per_frame_ms'])}   {seq['throughput_fps']:.1f} fps",
        f"pipelined, saturated      {pipe['throughput_fps']:.1f} fps"
        f" = {pipe['gain_over_sequential']}x sequential; slowest stage"
        f" thread {pipe['slowest_thread_ms']:.3f} ms/frame, {pipe['efficiency']:.0%} of its bound",
        f"  end to end (queueing)   {_pq(pipe['end_to_end_ms'])}",
        f"live at {live['source_fps']:g} fps, end to end {_pq(live['end_to_end_ms'])}",
        f"  overhead around model ({what})   p50 {oh['p50']:8.3f} ms   p99 {oh['p99']:8.3f} ms{p99_note}",
    ]
    if adapted:
        measured, prefix = live["overhead_ms"], adapter["prefix_ms"]
        lines.append(
            f"    = measured p50 {measured['p50']:.3f} / p99 {measured['p99']:.3f} ms"
            f" + the prefix's p50 {prefix['p50']:.3f} / p99 {prefix['p99']:.3f} ms"
        )
    lines += [
        f"  detections per published frame: {_det(live['detections_per_frame'])}",
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
    bare = r.get("bare")
    if bare:
        match = bare["detections_match_sequential"]
        less = " less the in-graph prefix" if adapted else ""
        lines += [
            "",
            f"bare ONNX Runtime loop, one thread, {bare['frames']} frames ({bare['preprocessing']}):"
            f" {bare['throughput_fps']:.1f} fps",
        ]
        for name in ("pre", "infer", "post", "pre_post", "total"):
            label = {"pre_post": "pre + post"}.get(name, name)
            lines.append(f"  {label:<12}{_pq(bare[f'{name}_ms'])}")
        lines += [
            f"  detections per frame: bare {_det(bare['detections_per_frame'])}",
            f"                        sequential (the same frames) {_det(seq['detections_per_frame'])};"
            f" the same count on {match['same_count']} of {match['frames']} frames",
            f"  agent (sequential) overhead p50 / bare (pre + post) p50 ="
            f" {bare['agent_overhead_p50_ms']:.3f} / {bare['pre_post_ms']['p50']:.3f}"
            f" = {bare['overhead_over_bare_pre_post_p50']}",
            f"  agent (sequential) infer p50{less} / bare infer p50 = {bare['agent_infer_p50_ms']:.3f} /"
            f" {bare['infer_ms']['p50']:.3f} = {bare['infer_over_bare_infer_p50']}",
            f"  for information, live at {live['source_fps']:g} fps: overhead p50"
            f" {bare['live_overhead_p50_ms']:.3f} ms, infer p50{less} {bare['live_infer_p50_ms']:.3f} ms",
        ]
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
    with model_notes_once():
        return _run_multi_bench(config, sources, frames, source_fps, live_s, progress)


def _run_multi_bench(
    config: AgentConfig,
    sources: int,
    frames: int,
    source_fps: float | None,
    live_s: float,
    progress: Progress,
) -> dict[str, Any]:
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
    with Agent(live_cfg) as live, started(live):
        t0 = time.monotonic()
        time.sleep(live_s)
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
    with Agent(config) as agent:
        assert agent.pipeline is not None
        profile = agent.pipeline.lanes[0].primary
        sets = {1: next(iter(profile.pools.values())).slots[0].io, **profile.batches}
        out = {}
        for size, io in sets.items():
            hist = LatencyHistogram()
            for _ in range(runs):
                t = time.perf_counter_ns()
                profile.model.backend.infer(io)
                hist.record(time.perf_counter_ns() - t)
            out[str(size)] = round(hist.percentile_ms(50) / size, 3)
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
