"""The bench's phases on the real pipeline: the model alone (and the input adapter's prefix
alone), one frame at a time through every stage, and the pipelined agent run to the end.

The bench's own timed loops (the model alone, the adapter's prefix, the sequential frames)
keep every duration (``Samples``: exact percentiles) and start alike (``settle``): no
other session's threads spinning, nothing left of a load or warm-up, so the model alone
is measured as the sequential phase runs it."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from edge_agent.bench.configs import BenchAgent, BenchError, Played, raw_config, started
from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import OnnxRuntimeConfig
from edge_agent.core.stamps import STAGES
from edge_agent.models.manifest import InputSpec
from edge_agent.pipelines.figures import LaneFigures
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.preprocess import Letterbox
from edge_agent.pipelines.sources.files import FileSourceConfig
from edge_agent.service.runner import Agent


class Timed(Protocol):
    """What the result is made from: a histogram of the pipeline's, or the bench's own
    ``Samples``."""

    def percentile_ms(self, q: float) -> float: ...

    def summary_ms(self) -> dict[str, float]: ...


class Samples:
    """Durations kept one by one, for the bench's own loops (hundreds to a few thousand
    runs): exact percentiles. The pipeline's histograms report a bucket's upper edge (2 %
    wide), so two models 1 % apart would read the same."""

    def __init__(self) -> None:
        self.ns: list[int] = []

    @property
    def count(self) -> int:
        return len(self.ns)

    def record(self, ns: int) -> None:
        self.ns.append(ns)

    def percentile_ms(self, q: float) -> float:
        """The nearest-rank ``q``-th percentile (a duration measured, as the histogram's rank)."""
        if not self.ns:
            return 0.0
        ordered = sorted(self.ns)
        rank = max(1, math.ceil(len(ordered) * min(q, 100.0) / 100.0))
        return ordered[rank - 1] / 1e6

    def summary_ms(self) -> dict[str, float]:
        n = self.count
        summary = {"count": n, "mean": round(sum(self.ns) / n / 1e6, 3) if n else 0.0}
        for name, q in (("p50", 50), ("p90", 90), ("p99", 99), ("p99.9", 99.9), ("max", 100)):
            summary[name] = round(self.percentile_ms(q), 3)
        return summary


def hist_ms(h: Timed) -> dict[str, float]:
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


def stage_table(stats: LaneFigures) -> dict[str, Any]:
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


def tracker_ms(stats: LaneFigures) -> dict[str, float] | None:
    """The source's tracker's time per frame (part of the postprocess stage); None when it
    has none (then it costs nothing: no step runs)."""
    return hist_ms(stats.tracking.cost) if stats.tracking is not None else None


def analytics_ms(stats: LaneFigures) -> dict[str, float] | None:
    """The source's zones' and lines' time per frame (part of the postprocess stage); None
    when it has none (no step runs)."""
    return hist_ms(stats.analytics.cost) if stats.analytics is not None else None


def slowest_thread_ms(stats: LaneFigures) -> float:
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


def _cpu_s() -> tuple[float, float] | None:
    """(CPU seconds every process used, this process's), or None off Linux."""
    try:
        with open("/proc/stat") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    t = os.times()
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK"), t.user + t.system


@contextlib.contextmanager
def host_load(into: dict[str, float | None], phase: str) -> Iterator[None]:
    """Into ``into[phase]``: the cores other processes (an agent beside the bench, a build)
    used on average while the block ran: what a phase's figures measured beside them lose.
    ONNX Runtime's threads meet at every operator, so one core taken from one of them
    slows the whole inference. None where the host does not say (not Linux)."""
    start, t0 = _cpu_s(), time.monotonic()
    try:
        yield
    finally:
        end, wall = _cpu_s(), time.monotonic() - t0
        if start is None or end is None or wall <= 0:
            into[phase] = None
        else:
            into[phase] = round(max(0.0, (end[0] - start[0]) - (end[1] - start[1])) / wall, 2)


def _others_running() -> bool | None:
    """Whether another thread of this process is running or runnable (Linux: its state in
    /proc); None where the host does not say."""
    me = threading.get_native_id()
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except (OSError, ValueError):
        return None
    for tid in tids:
        if tid == me:
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # ended meanwhile
        if state == "R":
            return True
    return False


def settle(max_s: float = 1.0, slice_s: float = 0.002) -> bool:
    """Wait until no other thread of this process runs, up to ``max_s``; False if one still
    did.

    ONNX Runtime's pool threads spin for a while after each run (``allow_spinning``: about
    30 ms of CPU on a 2-core VM, more on other CPUs), so a session loaded or run just
    before would take cores from the runs timed next. Every timed loop of the bench starts
    here, so none is measured beside another session's spinning. A spinning thread is
    runnable even while the scheduler has it off the CPU: its state says so where the CPU
    time it used would not (elsewhere, that is what is judged)."""
    end = time.monotonic() + max_s
    while time.monotonic() < end:
        cpu = time.process_time()
        time.sleep(slice_s)
        running = _others_running()
        if running is None:
            running = time.process_time() - cpu >= 0.2 * slice_s
        if not running:
            return True
    return False


def timed_runs(
    backend: Any, io: Any, runs: int, into: Samples | None = None, settle_first: bool = True
) -> Samples:
    """``runs`` inferences back to back, as the pipeline runs them, after one untimed run
    (it wakes the session's pool, asleep after a ``settle``); ``settle_first``: after a
    ``settle`` (off where this session ran last, and nothing else since)."""
    out = into if into is not None else Samples()
    if settle_first:
        settle()
    backend.infer(io)
    for _ in range(runs):
        t = time.perf_counter_ns()
        backend.infer(io)
        out.record(time.perf_counter_ns() - t)
    return out


@contextlib.contextmanager
def prepared(agent: Agent) -> Iterator[tuple[Any, Any]]:
    """A frame slot of the agent's first source whose input holds a preprocessed frame
    (the model's own preprocessing, as the capture stage runs it), and the frame; the slot
    goes back after the block.

    The frame is read from the source by the bench, never taken through the pipeline
    (``Pipeline.take_one``): a frame the lane took is counted captured and must end
    published or dropped, and this one is neither (inference alone runs on it), so the
    sequential phase's figures would show it in flight. Raises BenchError when the source
    gives no frame, or every slot of its pool is taken, within 1 s."""
    assert agent.pipeline is not None
    source = next(iter(agent.sources.values()))
    profile = agent.primary_profile(0)  # the model the lane's frames run on (no ladder here)
    once = threading.Event()
    once.set()  # ``SlotPool.take`` tries once, then gives up: the bench holds one slot at a time
    source.open()
    try:
        frame = source.read(1.0)
        if frame is None:
            raise BenchError(f"source {source.name!r} gave no frame within 1 s")
        slot = profile.pools[source.name].take(frame, 0, source.name, once, 1.0)
        if slot is None:
            raise BenchError(f"source {source.name!r}: no free frame slot within 1 s")
        try:
            profile.preprocess(slot)
        except BaseException:
            slot.pool.release(slot)  # type: ignore[union-attr]
            raise
    finally:
        source.close()
    try:
        yield slot, frame
    finally:
        slot.pool.release(slot)  # type: ignore[union-attr]


def infer_cpu(backend: Any, io: Any, runs: int, into: Samples) -> None:
    """``runs`` inferences back to back, each one's CPU time on this thread
    (``time.thread_time_ns``: the launches, copies and the wait's own cost, not the time it
    sleeps waiting for the device)."""
    for _ in range(runs):
        t = time.thread_time_ns()
        backend.infer(io)
        into.record(time.thread_time_ns() - t)


def graph_cpu(agent: Agent, runs: int) -> dict[str, Any]:
    """``compare_graphs`` on a frame slot of the agent's first source holding a frame."""
    with prepared(agent) as (slot, _):
        return compare_graphs(slot.profile.model.backend, slot.io, runs)


def compare_graphs(backend: Any, io: Any, runs: int) -> dict[str, Any]:
    """The infer stage's CPU time per frame with the TensorRT backend's CUDA graphs replayed
    and with plain enqueues on the same slot, ``runs`` each, in alternating blocks
    (``infer_cpu``); for a backend with CUDA graphs (TensorRT's ``graph_state``). Where
    graphs are off for the model, only the plain figure, and why."""
    backend.infer(io)  # the slot's first run captures its graphs
    state = backend.graph_state()
    replaying = state["replaying"]
    graphs, plain = Samples(), Samples()
    block = max(1, min(50, runs // 4))
    try:
        for done in range(0, runs, block):
            n = min(block, runs - done)
            backend.replay_graphs(False)
            infer_cpu(backend, io, n, plain)
            backend.replay_graphs(True)
            if replaying:
                infer_cpu(backend, io, n, graphs)
    finally:
        backend.replay_graphs(True)
    result: dict[str, Any] = {
        "replaying": replaying,
        "off": state["off"],
        "plain_cpu_ms": plain.summary_ms(),
        "graphs_cpu_ms": graphs.summary_ms() if replaying else None,
    }
    if replaying:
        result["saving_p50_ms"] = round(plain.percentile_ms(50) - graphs.percentile_ms(50), 3)
    return result


def pure_inference(agent: Agent, runs: int) -> Samples:
    """The backend alone: the session the agent's pipeline runs (the input-adapted copy,
    when adapted), on one slot holding a preprocessed source frame, ``runs`` times back to
    back (``timed_runs``). No other model is loaded beside it."""
    with prepared(agent) as (slot, _):
        return timed_runs(slot.profile.model.backend, slot.io, runs)


def adapted_vs_original(agent: Agent, original: LoadedModel, runs: int) -> tuple[Samples, Samples]:
    """The agent's input-adapted model and the ``original`` it was made from, on the same
    frame (each preprocessed its own way), ``runs`` times each, in alternating blocks, so
    whatever drifts during the phase (clocks, the machine's other work) weighs on both
    alike; each block starts as ``timed_runs`` does (the other session's pool asleep).
    Returns the adapted model's times and the original's."""
    with prepared(agent) as (slot, frame):
        io = original.backend.allocate()
        original.preprocessor(frame.image, io.inputs[original.input_name], Letterbox())
        original.backend.upload(io)
        original.backend.warmup(io, runs=2)
        runners = [(slot.profile.model.backend, slot.io, Samples()), (original.backend, io, Samples())]
        block = max(1, min(10, runs // 4))
        for done in range(0, runs, block):
            for backend, io_, samples in runners:
                timed_runs(backend, io_, min(block, runs - done), samples)
    return runners[0][2], runners[1][2]


def adapter_prefix(settings: OnnxRuntimeConfig, spec: InputSpec, runs: int) -> Samples:
    """The input adapter's in-graph work, timed alone: a graph of only what
    ``models.adapter.rewrite`` puts in front of the model (the uint8 NHWC frame
    [1, H, W, 3] → Transpose to NCHW → Cast to the model's float type), in an ONNX Runtime
    session with the model's ``settings``, warmed up with two runs, then run ``runs``
    times (``timed_runs``). The rest of the adapted graph costs what the original's does: the folded
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
        return timed_runs(backend, io, runs)
    finally:
        backend.close()


@dataclass
class SequentialRun:
    """The sequential phase: each frame's time through every stage, the seconds it took,
    the pipeline's accounting (stages, overhead) and each frame's detections, in order."""

    per_frame: Samples
    seconds: float
    stats: LaneFigures
    detections: list[int]


def sequential(
    config: AgentConfig,
    frames: int,
    file_source: FileSourceConfig | None = None,
    played: Played | None = None,
) -> SequentialRun:
    """Each frame through every stage on this thread, none overlapping, on an agent of its
    own (``alone_and_sequential`` without inference alone)."""
    cfg = raw_config(config, file_source=file_source)
    with BenchAgent(cfg, played=played) as agent:
        return alone_and_sequential(agent, frames, 0)[1]


#: Sequential frames per block, between two blocks of inference alone.
BLOCK_FRAMES = 10


def alone_and_sequential(agent: BenchAgent, frames: int, runs: int) -> tuple[Samples, SequentialRun]:
    """Phases 1 and 2 on one agent (built, not started), in alternating blocks: ``runs``
    inferences alone (``pure_inference``, on the session the frames run on) and
    ``frames`` frames each through every stage on this thread, none overlapping (capture,
    preprocess, infer, postprocess, publish: what a hand-written loop does), from the
    source's first frame on. Both see the host alike: its load and clocks drift over a
    bench (a VM measured here ran 30 % slower a second into a sustained load, an agent
    beside the bench takes cores at times), and a phase measured at another moment would
    differ by that. Returns inference alone and the sequential run (its seconds: its
    frames' only)."""
    assert agent.pipeline is not None and agent.publisher is not None
    p = agent.pipeline
    alone, per_frame, seconds = Samples(), Samples(), 0.0
    blocks = max(1, math.ceil(frames / BLOCK_FRAMES))
    with contextlib.ExitStack() as stack:
        slot = stack.enter_context(prepared(agent))[0] if runs else None
        agent.publisher.open()
        stack.callback(agent.publisher.close)
        source = next(iter(agent.sources.values()))
        source.open()
        stack.callback(source.close)
        settle()  # this session's warm-up, and anything loaded before, quiet
        for k in range(blocks):
            if slot is not None:  # this block's share of the runs
                n = runs * (k + 1) // blocks - runs * k // blocks
                timed_runs(slot.profile.model.backend, slot.io, n, alone, settle_first=False)
            t0 = time.monotonic()
            for _ in range(frames * (k + 1) // blocks - frames * k // blocks):
                t = time.perf_counter_ns()
                one = p.take_one()
                if one is not None:
                    p.run_one(one)
                per_frame.record(time.perf_counter_ns() - t)
            seconds += time.monotonic() - t0
    return alone, SequentialRun(per_frame, seconds, p.figures().lanes[0], agent.detections)
