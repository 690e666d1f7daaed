"""The bench's phases on the real pipeline: the model alone (and the input adapter's prefix
alone), one frame at a time through every stage, and the pipelined agent run to the end."""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.bench.configs import BenchAgent, BenchError, Played, raw_config, started
from edge_agent.core.config import AgentConfig, OnnxRuntimeConfig
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stages import STAGES
from edge_agent.models.manifest import InputSpec
from edge_agent.pipelines.file_sources import FileSourceConfig
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.preprocess import Letterbox
from edge_agent.pipelines.stats import PipelineStats
from edge_agent.runner import Agent


def hist_ms(h: LatencyHistogram) -> dict[str, float]:
    return h.summary_ms()


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


def stage_table(stats: PipelineStats) -> dict[str, Any]:
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


def slowest_thread_ms(stats: PipelineStats) -> float:
    """Mean busy time per frame of the busiest stage thread: the pipeline's throughput bound."""
    st = stats.stages
    threads = (
        st["capture"].mean_ms() + st["preprocess"].mean_ms(),
        st["infer"].mean_ms(),
        st["postprocess"].mean_ms() + st["publish"].mean_ms() + stats.send.mean_ms(),
    )
    return max(threads)


def run_agent(
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
    cfg = raw_config(config, file_source=file_source)
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
