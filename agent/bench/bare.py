"""The plain ONNX Runtime loop a user would write (letterbox, run, decode, NMS, one thread),
measured on the bench's frames for ``--compare-bare``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.bench.configs import BenchError, raw_config
from edge_agent.bench.phases import detections_summary, hist_ms
from edge_agent.core.config import AgentConfig
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.core.plan import onnxruntime_of
from edge_agent.pipelines.model import check_io
from edge_agent.pipelines.preprocess import Letterbox, Preprocessor, boxes_to_source
from edge_agent.pipelines.sources.base import Source
from edge_agent.pipelines.sources.memory import MemorySource
from edge_agent.pipelines.sources.registry import create_source

if TYPE_CHECKING:
    from edge_agent.models.decoders.base import BoundDecoder
    from edge_agent.models.manifest import InputFormat, ModelManifest


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


@dataclass
class _Loop:
    """What the loop runs per frame: the session with its preallocated input and outputs to
    fetch, the preprocessing into that input, and the manifest's decoder."""

    session: Any
    fetch: list[str]
    feed: dict[str, np.ndarray]
    tensor: np.ndarray
    fmt: InputFormat
    preprocess: Preprocessor
    geo: Letterbox
    decode: BoundDecoder


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
    backend = OnnxRuntimeBackend(settings)
    try:
        backend.load(resolved.path)  # no input format given: the graph as exported
        loop = _prepare_loop(backend, resolved.manifest, resolved.path)
        source: Source = MemorySource("bare", images) if images else create_source(raw_config(config).source)
        _warm_up(source, loop)
        source.open()  # from the first frame again, as the sequential phase
        try:
            hists, detections = _timed_frames(source, loop, frames, params)
        finally:
            source.close()
    finally:
        backend.close()
    return BareRun(_summary(resolved.path, loop.fmt, settings, frames, hists, detections), detections)


def _prepare_loop(backend: Any, m: ModelManifest, path: str) -> _Loop:
    """The loaded session's input and outputs checked against the manifest, and its input preallocated."""
    input_name, decode = check_io(m, path, backend.inputs, backend.outputs)
    session = backend.session
    assert session is not None
    spec = next(t for t in backend.inputs if t.name == input_name)
    tensor = np.zeros(spec.concrete(1), spec.dtype)
    feed = {input_name: tensor}
    fetch = [t.name for t in backend.outputs]
    fmt = m.input.format()
    preprocess = Preprocessor(fmt)
    geo = Letterbox()
    return _Loop(session, fetch, feed, tensor, fmt, preprocess, geo, decode)


def _warm_up(source: Source, loop: _Loop) -> None:
    """Two runs on the source's first frame, as the agent's backend is warmed up."""
    source.open()
    try:
        first = source.read(1.0)
        if first is None:
            raise BenchError(f"source {source.name!r} gave no frame within 1 s")
        loop.preprocess(first.image, loop.tensor, loop.geo)
        for _ in range(2):
            loop.session.run(loop.fetch, loop.feed)
    finally:
        source.close()


def _timed_frames(
    source: Source, loop: _Loop, frames: int, params: Any
) -> tuple[dict[str, LatencyHistogram], list[int]]:
    """``frames`` frames through the loop: each part's times, and each frame's detections."""
    names = ("pre", "infer", "post", "pre_post", "total")
    hists = {k: LatencyHistogram() for k in names}
    detections: list[int] = []
    for _ in range(frames):
        frame = source.read(1.0)
        if frame is None:
            raise BenchError(f"source {source.name!r} gave no frame within 1 s")
        t0 = time.perf_counter_ns()
        loop.preprocess(frame.image, loop.tensor, loop.geo)
        t1 = time.perf_counter_ns()
        outs = loop.session.run(loop.fetch, loop.feed)
        t2 = time.perf_counter_ns()
        xyxy, scores, *_ = loop.decode(outs, params)
        boxes_to_source(xyxy, loop.geo)
        t3 = time.perf_counter_ns()
        hists["pre"].record(t1 - t0)
        hists["infer"].record(t2 - t1)
        hists["post"].record(t3 - t2)
        hists["pre_post"].record(t1 - t0 + t3 - t2)
        hists["total"].record(t3 - t0)
        detections.append(len(scores))
    return hists, detections


def _summary(
    path: str,
    fmt: InputFormat,
    settings: OnnxRuntimeConfig,
    frames: int,
    hists: dict[str, LatencyHistogram],
    detections: list[int],
) -> dict[str, Any]:
    """The plain loop's result as the JSON has it."""
    total_s = hists["total"].total_ns / 1e9
    return {
        "model": path,
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
        **{f"{k}_ms": hist_ms(h) for k, h in hists.items()},
        "throughput_fps": round(frames / total_s, 2) if total_s else 0.0,
        "detections_per_frame": detections_summary(detections),
    }
