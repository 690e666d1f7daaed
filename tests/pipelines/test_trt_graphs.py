"""TensorRTBackend's CUDA graphs on the fakes (FakeTensorRT, FakeCudaDriver, FakeCudart):
the graph path chosen, each slot replaying its own buffers, re-capture on reload, every
refusal with its fallback, and ``cuda_graphs: on`` failing loudly.

The fake engine's kernel writes, into every output, the mean of its input: a frame filled
with one value comes out as that value, so a slot replaying another slot's graph (or a stale
one) shows in the outputs."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakeLogicError
from fakes.trt_kit import FLOAT_FMT_SCALED, UINT8_FMT, Fakes

from edge_agent.models.manifest import InputFormat
from edge_agent.models.testmodels import efficient_nms_plugin_graph
from edge_agent.pipelines.backends import trt_graphs
from edge_agent.pipelines.backends.base import BackendError

cache = trt_kit.cache
float_model = trt_kit.float_model
PLUGIN_FMT = InputFormat(height=32, width=32, layout="NCHW", dtype="float32", scale=1 / 255)


def mean_kernel(label: str, ins: dict, outs: dict) -> None:
    value = float(next(iter(ins.values())).astype(np.float64).mean())
    for out in outs.values():
        out[...] = value


def graph_fakes(**kw) -> Fakes:
    f = Fakes(graphs=True, **kw)
    f.trt.kernel = mean_kernel
    return f


def graph_backend(model, cache, fakes=None, fmt=UINT8_FMT, **cfg):
    fakes = fakes or graph_fakes()
    be = fakes.backend(cache, **cfg)
    be.load(str(model), fmt)
    return be, fakes


def run(be, io, value: int) -> float:
    """Fill the frame with ``value``, infer, and return what the outputs hold (one value)."""
    io.inputs[be.inputs[0].name][...] = value
    be.upload(io)
    be.infer(io)
    out = io.outputs[0]
    assert np.all(out == out.flat[0]), "the kernel writes one value everywhere"
    return float(out.flat[0])


def count(fakes: Fakes, name: str, since: int = 0) -> int:
    return sum(1 for n, _ in fakes.since(since) if n == name)


# -- the graph path ------------------------------------------------------------------------


@pytest.mark.parametrize("zero_copy", [True, False])
def test_first_run_is_plain_then_each_slot_is_captured_and_replayed(const_model, cache, zero_copy):
    be, f = graph_backend(const_model, cache, zero_copy=zero_copy)
    io = be.allocate()
    assert run(be, io, 7) == 7
    (slot,) = be._slots
    assert set(slot.graphs) == {"model"}, "captured after the first plain run"
    assert be.describe()["cuda_graphs"] == {"mode": "auto", "replaying": True, "captured_slots": 1, "off": ""}
    mark = len(f.calls)
    for value in (11, 12, 13):
        assert run(be, io, value) == value
    assert count(f, "cudaGraphLaunch", mark) == 3
    assert count(f, "IExecutionContext.execute_async_v3", mark) == 0, "no plain enqueue once captured"
    assert count(f, "IExecutionContext.set_tensor_address", mark) == 0, "addresses were set once"
    copies = count(f, "memcpy_dtoh_async", mark)
    assert copies == 0, "the output copies replay inside the graph"
    assert f.cuda.context_depth() == 0 and not f.cuda.pending_streams()
    be.close()
    assert f.cudart.live_execs() == [] and f.cudart.live_graphs() == []


def test_every_slot_replays_its_own_buffers(const_model, cache):
    be, _ = graph_backend(const_model, cache, zero_copy=False)
    ios = [be.allocate() for _ in range(3)]
    for k, io in enumerate(ios):
        assert run(be, io, 10 + k) == 10 + k  # first run of each: plain, then captured
    assert all(s.graphs for s in be._slots)
    # Interleaved, out of order, each with its own frame: every output is its own slot's.
    for rnd in range(3):
        order = [2, 0, 1] if rnd % 2 else [1, 2, 0]
        for k in order:
            assert run(be, ios[k], 50 + 10 * rnd + k) == 50 + 10 * rnd + k
    be.close()


def test_a_slot_replaying_another_slots_graph_shows_in_its_outputs(const_model, cache):
    """The check above can fail: swap two slots' graphs and the outputs are the other's."""
    be, _ = graph_backend(const_model, cache)
    a, b = be.allocate(), be.allocate()
    run(be, a, 1)
    run(be, b, 2)
    a.handle.graphs, b.handle.graphs = b.handle.graphs, a.handle.graphs
    b.inputs["images"][...] = 9
    assert run(be, a, 5) == 1, "slot a replayed b's graph: its own outputs are stale"
    assert np.all(b.outputs[0] == 9), "b's graph computed b's frame into b's outputs"
    be.close()


def test_device_preprocessing_on_the_gpu_is_captured_in_its_own_graph(float_model, cache):
    be, f = graph_backend(float_model, cache, fmt=FLOAT_FMT_SCALED, preprocess="gpu")
    assert be.describe()["preprocess"] == "device"
    io = be.allocate()
    assert run(be, io, 3) == 3
    assert set(io.handle.graphs) == {"pre", "model"}
    mark = len(f.calls)
    assert run(be, io, 4) == 4
    assert count(f, "cudaGraphLaunch", mark) == 2
    # The events stay outside the graphs: the device parts are still timed apart.
    t = be.timings(io)
    assert t["device_preprocess_ms"] == pytest.approx(f.trt.exec_ms.get("network", 0.25))
    assert t["device_compute_ms"] == pytest.approx(1.5)  # the model engine's fake cost
    be.close()


def test_a_dynamic_batch_engine_gives_each_slot_its_own_shape_once(const_model, cache):
    be, f = graph_backend(const_model, cache, max_batch=4)
    one, three = be.allocate(), be.allocate(3)
    shapes = [a[2] for n, a in f.calls if n == "IExecutionContext.set_input_shape"]
    assert (1, 320, 320, 3) in shapes and (3, 320, 320, 3) in shapes
    for rnd in range(3):
        assert run(be, three, 20 + rnd) == 20 + rnd
        assert run(be, one, 30 + rnd) == 30 + rnd
    mark = len(f.calls)
    run(be, three, 1)
    assert count(f, "IExecutionContext.set_input_shape", mark) == 0, "no per-frame shape changes"
    be.close()


def test_slot_contexts_share_one_block_of_activation_memory(const_model, cache):
    f = graph_fakes()
    f.trt.device_memory["model.onnx"] = 4096
    be, _ = graph_backend(const_model, cache, fakes=f)
    for _ in range(3):
        be.allocate()
    sets = f.trt.args_of("IExecutionContext.set_device_memory")
    assert len(sets) == 4, "the load's context and three slots'"
    assert len({(mem, size) for _label, mem, size in sets}) == 1 and sets[0][2] == 4096
    strategies = [a[1] for a in f.trt.args_of("ICudaEngine.create_execution_context") if a[0] == "model.onnx"]
    assert strategies == ["USER_MANAGED"] * 4
    be.close()
    assert not f.cuda.is_live(sets[0][1]), "the shared block is freed by close()"


def test_tensorrt_10_0_sets_the_memory_through_the_property(const_model, cache):
    be, f = graph_backend(const_model, cache, fakes=graph_fakes(version="10.0.1"))
    io = be.allocate()
    assert run(be, io, 5) == 5 and run(be, io, 6) == 6
    assert len(f.trt.args_of("IExecutionContext.device_memory=")) == 2
    be.close()


def test_replay_can_be_paused_for_the_bench(const_model, cache):
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    run(be, io, 1)
    be.replay_graphs(False)
    mark = len(f.calls)
    assert run(be, io, 2) == 2
    assert (
        count(f, "cudaGraphLaunch", mark) == 0 and count(f, "IExecutionContext.execute_async_v3", mark) == 1
    )
    assert count(f, "IExecutionContext.set_tensor_address", mark) == 0, "plain, on the slot's own context"
    be.replay_graphs(True)
    mark = len(f.calls)
    assert run(be, io, 3) == 3 and count(f, "cudaGraphLaunch", mark) == 1
    be.close()


# -- reloads ---------------------------------------------------------------------------------


def test_a_reload_captures_anew_on_its_own_buffers(const_model, cache):
    f = graph_fakes()
    old, _ = graph_backend(const_model, cache, fakes=f)
    io = old.allocate()
    run(old, io, 1)
    old_exec = io.handle.graphs["model"]._exec
    # The reload: a new backend from the cached engine, its buffers prepared while the old
    # one still runs, then the old one closed.
    new, _ = graph_backend(const_model, cache, fakes=f)
    assert f.trt.builds == 1, "the engine came from the cache"
    new_io = new.allocate()
    assert run(old, io, 2) == 2
    old.close()
    assert old_exec.destroyed
    assert run(new, new_io, 3) == 3 and run(new, new_io, 4) == 4
    assert new_io.handle.graphs["model"]._exec is not old_exec
    assert [e for e in f.cudart.live_execs()] == [new_io.handle.graphs["model"]._exec]
    new.close()


def test_buffers_allocated_on_another_thread_during_a_capture_break_nothing(const_model, cache):
    """A reload allocates slots on its own thread while the inference thread may be capturing:
    THREAD_LOCAL capture mode allows that (GLOBAL mode would fail it; see the fake tests)."""
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    made: list = []
    ctx = io.handle.context
    plain = ctx.execute_async_v3

    def enqueue_and_allocate_elsewhere(handle: int) -> bool:
        if f.cuda.capture_of(handle) is not None and not made:
            t = threading.Thread(target=lambda: made.append(be.allocate()))
            t.start()
            t.join(10)
        return plain(handle)

    ctx.execute_async_v3 = enqueue_and_allocate_elsewhere
    assert run(be, io, 4) == 4
    assert made and io.handle.graphs, "captured, and the other thread's slot was made"
    assert run(be, made[0], 6) == 6 and run(be, made[0], 7) == 7
    be.close()


# -- refusals and their fallbacks --------------------------------------------------------------


def test_without_cuda_python_auto_runs_plainly_with_one_log_line(const_model, cache, caplog):
    f = Fakes()  # no cuda-python
    f.trt.kernel = mean_kernel
    with caplog.at_level(logging.WARNING):
        be, _ = graph_backend(const_model, cache, fakes=f)
    assert "cuda-python is not installed" in be.describe()["cuda_graphs"]["off"]
    ios = [be.allocate() for _ in range(2)]
    for io in ios:
        assert run(be, io, 8) == 8 and run(be, io, 9) == 9
    assert all(s.context is None for s in be._slots), "the plain path: one context for every slot"
    assert caplog.text.count("CUDA graphs off") == 1
    be.close()


def test_without_cuda_python_on_is_an_error_at_load(const_model, cache):
    with pytest.raises(BackendError, match=r"cuda_graphs is on.*cuda-python is not installed"):
        graph_backend(const_model, cache, fakes=Fakes(), cuda_graphs="on")


def test_off_never_captures(const_model, cache):
    be, f = graph_backend(const_model, cache, cuda_graphs="off")
    io = be.allocate()
    run(be, io, 1)
    run(be, io, 2)
    assert "cudaStreamBeginCapture" not in f.names() and io.handle.context is None
    assert be.describe()["cuda_graphs"]["off"] == "cuda_graphs: off"
    be.close()


def test_a_dla_engine_is_not_captured(const_model, cache, caplog):
    with caplog.at_level(logging.WARNING):
        be, f = graph_backend(const_model, cache, fakes=graph_fakes(num_dla=2), dla_core=0)
    assert "DLA core 0" in be.describe()["cuda_graphs"]["off"] and "CUDA graphs off" in caplog.text
    io = be.allocate()
    assert run(be, io, 3) == 3 and run(be, io, 4) == 4
    assert "cudaStreamBeginCapture" not in f.names()
    be.close()
    with pytest.raises(BackendError, match="DLA core 0"):
        graph_backend(const_model, cache, fakes=graph_fakes(num_dla=2), dla_core=0, cuda_graphs="on")


def test_a_plugin_that_allocates_in_its_enqueue_falls_back_naming_it(tmp_path, cache, caplog):
    model = efficient_nms_plugin_graph(tmp_path / "plugin.onnx")
    f = graph_fakes()
    f.trt.plugin_allocates = {"EfficientNMS_TRT"}
    fmt = PLUGIN_FMT
    with caplog.at_level(logging.WARNING):
        be, _ = graph_backend(model, cache, fakes=f, fmt=fmt, preprocess="cpu")
        ios = [be.allocate(), be.allocate()]
        be.infer(ios[0])
    off = be.describe()["cuda_graphs"]["off"]
    assert "capture failed" in off and "EfficientNMS_TRT" in off
    assert f.cudart.last_error == f.cudart.cudaError_t.cudaSuccess, "the failed capture's error was cleared"
    assert not f.cuda.captures, "the stream left capture mode"
    mark = len(f.calls)
    for io in ios:  # every slot, the one that failed too: plain from now on
        be.infer(io)
    assert (
        count(f, "IExecutionContext.execute_async_v3", mark) == 2 and count(f, "cudaGraphLaunch", mark) == 0
    )
    assert "cudaStreamBeginCapture" not in [n for n, _ in f.since(mark)], "no capture is tried again"
    assert caplog.text.count("CUDA graphs off") == 1
    be.close()


def test_a_plugin_capture_failure_with_on_is_an_error(tmp_path, cache):
    model = efficient_nms_plugin_graph(tmp_path / "plugin.onnx")
    f = graph_fakes()
    f.trt.plugin_allocates = {"EfficientNMS_TRT"}
    fmt = PLUGIN_FMT
    be, _ = graph_backend(model, cache, fakes=f, fmt=fmt, preprocess="cpu", cuda_graphs="on")
    io = be.allocate()
    with pytest.raises(BackendError, match=r"cuda_graphs is on.*EfficientNMS_TRT"):
        be.infer(io)  # the warm-up's first run: the agent does not start
    assert not f.cuda.captures
    be.close()


def test_a_plugin_that_does_not_allocate_is_captured(tmp_path, cache):
    """TensorRT 10.3's EfficientNMS_TRT only launches kernels and cudaMemsetAsync: captured."""
    model = efficient_nms_plugin_graph(tmp_path / "plugin.onnx")
    fmt = PLUGIN_FMT
    be, _ = graph_backend(model, cache, fmt=fmt, preprocess="cpu")
    io = be.allocate()
    be.infer(io)
    assert io.handle.graphs and be.describe()["cuda_graphs"]["replaying"]
    be.close()


@pytest.mark.parametrize(
    "breach, reason",
    [
        ("sync", "cuStreamSynchronize on the capturing stream"),
        ("alloc", "cuMemAlloc during the capture"),
    ],
)
def test_a_capture_broken_by_a_forbidden_call_falls_back(const_model, cache, breach, reason, caplog):
    """An enqueue that synchronises or allocates while capturing (what a misbehaving plugin
    would do) invalidates the capture: plain execution goes on."""
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    ctx, slot = io.handle.context, io.handle
    plain = ctx.execute_async_v3
    seen: list[str] = []

    def enqueue(handle: int) -> bool:
        ok = plain(handle)
        capture = f.cuda.capture_of(handle)
        if capture is not None:
            try:
                if breach == "sync":
                    slot.stream.synchronize()
                else:
                    f.cuda.mem_alloc(64)
            except FakeLogicError:
                pass  # TensorRT reports it through its enqueue's result; the capture is broken
            seen.append(capture.invalidated)
        return ok

    ctx.execute_async_v3 = enqueue
    with caplog.at_level(logging.WARNING):
        assert run(be, io, 5) == 5
    assert seen and reason in seen[0]
    assert "capture failed" in be.describe()["cuda_graphs"]["off"] and "invalidated" in caplog.text.lower()
    assert not slot.graphs and not f.cuda.captures
    assert run(be, io, 6) == 6, "plain execution goes on"
    be.close()


def test_work_issued_on_another_stream_is_missing_from_the_replay_and_caught(const_model, cache):
    """The output copies issued on the wrong stream run at once instead of being captured; the
    replay then leaves the outputs unwritten: the one-replay check sees it and falls back."""
    be, f = graph_backend(const_model, cache, zero_copy=False)
    io = be.allocate()
    with be._current():
        stray = f.cuda.Stream()
    real_copy_out = be._copy_out

    def copy_out(slot):
        if f.cuda.capture_of(slot.stream.handle) is None:
            real_copy_out(slot)
            return
        for spec in be._outputs:  # the mistake: another stream than the capturing one
            f.cuda.memcpy_dtoh_async(slot.host[spec.name], slot.allocations[spec.name], stray)

    be._copy_out = copy_out
    assert run(be, io, 5) == 5
    off = be.describe()["cuda_graphs"]["off"]
    assert "differs from plain execution" in off and "unwritten" in off
    assert not io.handle.graphs
    assert run(be, io, 6) == 6, "the frame and the next keep plain execution's outputs"
    be.close()


def test_a_replay_that_differs_from_plain_execution_falls_back(const_model, cache):
    """A kernel whose results are not reproducible (far beyond rounding) fails the one-replay
    check: the frame keeps the plain run's outputs and graphs go off."""
    f = graph_fakes()
    rng = np.random.default_rng(0)

    def noisy(label, ins, outs):
        for out in outs.values():
            out[...] = rng.random()

    f.trt.kernel = noisy
    be, _ = graph_backend(const_model, cache, fakes=f)
    io = be.allocate()
    be.infer(io)
    first = io.outputs[0].copy()
    assert "differs from plain execution" in be.describe()["cuda_graphs"]["off"]
    assert np.isfinite(io.outputs[0]).all() and np.array_equal(io.outputs[0], first)
    be.close()


def test_a_data_dependent_output_is_refused_at_load_whatever_the_mode(tmp_path, cache):
    """Its allocator would allocate in the enqueue (the fakes' capture rule); the backend
    never gets that far: the pipeline's buffers are fixed, so the model is refused at load."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("images", TensorProto.UINT8, [1, 320, 320, 3])
    y = helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["num_selected", 3])
    node = helper.make_node("Identity", ["images"], ["boxes"])
    model = helper.make_model(helper.make_graph([node], "nms", [x], [y]))
    path = tmp_path / "nms.onnx"
    onnx.save(model, str(path))
    for mode in ("auto", "on"):
        f = graph_fakes()
        with pytest.raises(BackendError, match="data-dependent shape"):
            graph_backend(path, cache, fakes=f, cuda_graphs=mode)
        assert all(c.detached for c in f.cuda.contexts), "a failed load gives its context back"
        assert not f.cuda._device_ranges, "and its memory (the shared block too)"
    assert "DLA core 1" in trt_graphs.refusal(1) and trt_graphs.refusal(-1) == ""


def test_an_unknown_mode_is_refused():
    with pytest.raises(BackendError, match="cuda_graphs must be one of auto, on, off"):
        trt_graphs.GraphPolicy("sometimes")


def test_a_launch_that_fails_in_the_check_replay_falls_back_and_keeps_the_frames_outputs(const_model, cache):
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    err = f.cudart.cudaError_t

    def failing_launch(graph_exec, stream):
        f.cudart.last_error = err.cudaErrorInvalidValue
        return (err.cudaErrorInvalidValue,)

    f.cudart.cudaGraphLaunch = failing_launch
    assert run(be, io, 7) == 7, "the plain run's outputs, not the 0xFF the check wrote"
    off = be.describe()["cuda_graphs"]["off"]
    assert "cudaGraphLaunch failed: cudaErrorInvalidValue" in off
    assert f.cudart.live_execs() == [], "the slot's graphs were destroyed"
    be.close()


def test_device_buffers_filled_before_the_check_replay_show_outputs_a_graph_leaves_unwritten(
    const_model, cache
):
    """Copy mode: the check fills the device outputs too, so a replay whose kernels write
    nothing is seen as such (the copies would otherwise bring the plain run's values back)."""
    f = graph_fakes()
    calls = []

    def skips_the_replay(label, ins, outs):
        calls.append(label)
        if len(calls) != 2:  # 1: the plain run, 2: the check's replay, 3: its plain run
            mean_kernel(label, ins, outs)

    f.trt.kernel = skips_the_replay
    be, _ = graph_backend(const_model, cache, fakes=f, zero_copy=False)
    io = be.allocate()
    assert run(be, io, 7) == 7
    off = be.describe()["cuda_graphs"]["off"]
    assert "differs from plain execution (unwritten values: 16800)" in off, off
    be.close()


def test_a_value_baked_in_at_the_capture_is_caught_by_the_check_on_another_input(const_model, cache):
    """A plugin doing host work in its enqueue replays the captured frame's values: the
    check replays another input than the captured frame's, so it shows."""
    f = graph_fakes()
    f.trt.bake_inputs = True
    be, _ = graph_backend(const_model, cache, fakes=f)
    io = be.allocate()
    assert run(be, io, 3) == 3
    assert "differs from plain execution" in be.describe()["cuda_graphs"]["off"]
    assert np.all(io.inputs["images"] == 3), "the frame's input is put back"
    assert run(be, io, 4) == 4, "plain from now on"
    be.close()


def test_the_check_leaves_the_frame_and_its_outputs_as_the_plain_run_made_them(float_model, cache):
    be, _ = graph_backend(float_model, cache, fmt=FLOAT_FMT_SCALED, preprocess="gpu", zero_copy=False)
    io = be.allocate()
    assert run(be, io, 9) == 9
    assert io.handle.graphs and np.all(io.inputs["frame"] == 9)
    be.close()


def test_an_enqueue_returning_false_in_a_capture_that_ends_cleanly_discards_its_graph(const_model, cache):
    """trtexec's second case: TensorRT reports the failure, the capture itself ends fine."""
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    ctx = io.handle.context
    plain = ctx.execute_async_v3
    ctx.execute_async_v3 = lambda h: plain(h) and f.cuda.capture_of(h) is None
    assert run(be, io, 2) == 2
    assert "an enqueue failed during the capture" in be.describe()["cuda_graphs"]["off"]
    assert f.cudart.live_graphs() == [] and f.cudart.live_execs() == []
    be.close()


def test_on_with_a_failed_check_raises_once_then_the_slot_runs_plainly(const_model, cache):
    f = graph_fakes()
    f.trt.bake_inputs = True
    be, _ = graph_backend(const_model, cache, fakes=f, cuda_graphs="on")
    io = be.allocate()
    with pytest.raises(BackendError, match=r"cuda_graphs is on.*differs from plain execution"):
        be.infer(io)
    mark = len(f.calls)
    assert run(be, io, 5) == 5
    assert count(f, "cudaStreamBeginCapture", mark) == 0, "the slot is not tried again"
    be.close()


def test_preprocessing_on_a_dla_runs_plainly_before_the_models_graph(float_model, cache):
    f = graph_fakes(num_dla=1)
    be, _ = graph_backend(float_model, cache, fakes=f, fmt=FLOAT_FMT_SCALED, preprocess="dla")
    assert be.describe()["preprocess"] == "device"
    io = be.allocate()
    assert run(be, io, 6) == 6
    assert set(io.handle.graphs) == {"model"}
    mark = len(f.calls)
    assert run(be, io, 8) == 8
    assert (
        count(f, "cudaGraphLaunch", mark) == 1 and count(f, "IExecutionContext.execute_async_v3", mark) == 1
    )
    be.close()


def test_a_reload_loading_an_engine_during_a_capture_does_not_break_it(const_model, cache):
    """Loading an engine uses the legacy stream (the fake's assumption); the slots' streams
    are NON_BLOCKING in graph mode, so a capture on one is not tied to it."""
    f = graph_fakes()
    be, _ = graph_backend(const_model, cache, fakes=f)
    io = be.allocate()
    assert io.handle.stream.flags == 1
    ctx = io.handle.context
    plain = ctx.execute_async_v3
    other: list = []

    def enqueue(handle: int) -> bool:
        if f.cuda.capture_of(handle) is not None and not other:
            t = threading.Thread(target=lambda: other.append(graph_backend(const_model, cache, fakes=f)[0]))
            t.start()
            t.join(10)
        return plain(handle)

    ctx.execute_async_v3 = enqueue
    assert run(be, io, 4) == 4 and io.handle.graphs, "captured while the other engine loaded"
    assert other and "Runtime.deserialize_cuda_engine" in f.names()
    other[0].close()
    be.close()


def test_every_slot_of_every_source_is_captured_before_frames(const_model, cache, monkeypatch):
    """prepare_buffers (the pipeline's warm-up) prepares every frame slot and batch set of
    every source: no live frame pays for a capture; a reload's slots likewise after its
    drain (the same call, with warm on)."""
    from edge_agent.core.config import ModelConfig
    from edge_agent.pipelines.backends import registry
    from edge_agent.pipelines.backends.tensorrt import TensorRTBackend
    from edge_agent.pipelines.model import load_model
    from edge_agent.pipelines.slots import SLOTS, ModelBuffers, prepare_buffers

    f = graph_fakes()
    modules = (f.trt, f.cuda, f.cudart)
    monkeypatch.setitem(registry._REGISTRY, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=modules))
    model = load_model(ModelConfig(path=str(const_model)), f.backend(cache, max_batch=2).config)
    try:
        buffers = ModelBuffers("m", model)
        lanes = [("cam0", {"m": buffers}), ("cam1", {"m": buffers})]
        prepare_buffers(lanes, 2, warm=False)  # a reload while the old pipeline runs: nothing runs
        assert model.backend.graph_state()["captured_slots"] == 1, "only the first slot's warm-up"
        prepare_buffers(lanes, 2)  # the warm-up (after the drain)
        sets = [s.io for pool in buffers.pools.values() for s in pool.slots] + list(buffers.batches.values())
        assert len(sets) == 2 * SLOTS + 1 and all(io.handle.graphs for io in sets)
        assert model.backend.graph_state()["captured_slots"] == len(sets)
        mark = len(f.calls)
        prepare_buffers(lanes, 2)  # again: nothing more to do
        assert count(f, "cudaStreamBeginCapture", mark) == 0
    finally:
        model.close()


def test_the_check_runs_on_finite_values_whatever_the_buffer_held(float_model, cache):
    """A set never written may hold NaN: the check's own input is a finite ramp, so an
    output the replay leaves unwritten still shows (NaN in and NaN out would hide it)."""
    f = graph_fakes()
    calls = []

    def skips_the_replay(label, ins, outs):
        calls.append(label)
        if len(calls) != 2:
            mean_kernel(label, ins, outs)

    f.trt.kernel = skips_the_replay
    be, _ = graph_backend(float_model, cache, fakes=f, fmt=FLOAT_FMT_SCALED, preprocess="cpu")
    io = be.allocate()
    io.inputs[be.inputs[0].name][...] = np.nan
    be.infer(io)
    assert "unwritten values" in be.describe()["cuda_graphs"]["off"]
    assert np.isnan(io.inputs[be.inputs[0].name]).all(), "the set's own input is put back"
    be.close()
