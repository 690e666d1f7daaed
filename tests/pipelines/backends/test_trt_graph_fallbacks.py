"""TensorRTBackend without CUDA graphs where they cannot serve, on the fakes: every refusal
known at load or met at a capture falls back to plain execution, said once (``cuda_graphs:
on`` fails loudly instead), and the check of a slot's graphs against plain execution on
another input catches what a capture got wrong. The graph path: test_trt_graphs.py."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakeLogicError
from fakes.trt_kit import (
    FLOAT_FMT_SCALED,
    Fakes,
    count,
    graph_backend,
    graph_fakes,
    infer_value,
    mean_kernel,
)

from edge_agent.models.manifest import InputFormat
from edge_agent.models.testmodels import efficient_nms_plugin_graph
from edge_agent.pipelines.backends import trt_graphs
from edge_agent.pipelines.backends.base import BackendError

cache = trt_kit.cache
float_model = trt_kit.float_model
PLUGIN_FMT = InputFormat(height=32, width=32, layout="NCHW", dtype="float32", scale=1 / 255)


# -- refusals and their fallbacks --------------------------------------------------------------


def test_an_unknown_mode_is_refused():
    with pytest.raises(BackendError, match="cuda_graphs must be one of auto, on, off"):
        trt_graphs.Graphs("sometimes")
    assert "DLA core 1" in trt_graphs.refusal(1) and trt_graphs.refusal(-1) == ""


def test_without_cuda_python_auto_runs_plainly_with_one_log_line(const_model, cache, caplog):
    f = Fakes()  # no cuda-python
    f.trt.kernel = mean_kernel
    with caplog.at_level(logging.WARNING):
        be, _ = graph_backend(const_model, cache, fakes=f)
    assert "cuda-python is not installed" in be.describe()["cuda_graphs"]["off"]
    ios = [be.allocate() for _ in range(2)]
    for io in ios:
        assert infer_value(be, io, 8) == 8 and infer_value(be, io, 9) == 9
    assert all(s.context is None for s in be._slots), "the plain path: one context for every slot"
    assert caplog.text.count("CUDA graphs off") == 1
    be.close()


def test_without_cuda_python_on_is_an_error_at_load(const_model, cache):
    with pytest.raises(BackendError, match=r"cuda_graphs is on.*cuda-python is not installed"):
        graph_backend(const_model, cache, fakes=Fakes(), cuda_graphs="on")


def test_off_never_captures(const_model, cache):
    be, f = graph_backend(const_model, cache, cuda_graphs="off")
    io = be.allocate()
    infer_value(be, io, 1)
    infer_value(be, io, 2)
    assert "cudaStreamBeginCapture" not in f.names() and io.handle.context is None
    assert be.describe()["cuda_graphs"]["off"] == "cuda_graphs: off"
    be.close()


def test_a_dla_engine_is_not_captured(const_model, cache, caplog):
    with caplog.at_level(logging.WARNING):
        be, f = graph_backend(const_model, cache, fakes=graph_fakes(num_dla=2), dla_core=0)
    assert "DLA core 0" in be.describe()["cuda_graphs"]["off"] and "CUDA graphs off" in caplog.text
    io = be.allocate()
    assert infer_value(be, io, 3) == 3 and infer_value(be, io, 4) == 4
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
        assert infer_value(be, io, 5) == 5
    assert seen and reason in seen[0]
    assert "capture failed" in be.describe()["cuda_graphs"]["off"] and "invalidated" in caplog.text.lower()
    assert not slot.graphs and not f.cuda.captures
    assert infer_value(be, io, 6) == 6, "plain execution goes on"
    be.close()


def test_an_enqueue_returning_false_in_a_capture_that_ends_cleanly_discards_its_graph(const_model, cache):
    """trtexec's second case: TensorRT reports the failure, the capture itself ends fine."""
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    ctx = io.handle.context
    plain = ctx.execute_async_v3
    ctx.execute_async_v3 = lambda h: plain(h) and f.cuda.capture_of(h) is None
    assert infer_value(be, io, 2) == 2
    assert "an enqueue failed during the capture" in be.describe()["cuda_graphs"]["off"]
    assert f.cudart.live_graphs() == [] and f.cudart.live_execs() == []
    be.close()


# -- the check against plain execution ---------------------------------------------------------


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
    assert infer_value(be, io, 5) == 5
    off = be.describe()["cuda_graphs"]["off"]
    assert "differs from plain execution" in off and "unwritten" in off
    assert not io.handle.graphs
    assert infer_value(be, io, 6) == 6, "the frame and the next keep plain execution's outputs"
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


def test_a_launch_that_fails_in_the_check_replay_falls_back_and_keeps_the_frames_outputs(const_model, cache):
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    err = f.cudart.cudaError_t

    def failing_launch(graph_exec, stream):
        f.cudart.last_error = err.cudaErrorInvalidValue
        return (err.cudaErrorInvalidValue,)

    f.cudart.cudaGraphLaunch = failing_launch
    assert infer_value(be, io, 7) == 7, "the plain run's outputs, not the 0xFF the check wrote"
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
    assert infer_value(be, io, 7) == 7
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
    assert infer_value(be, io, 3) == 3
    assert "differs from plain execution" in be.describe()["cuda_graphs"]["off"]
    assert np.all(io.inputs["images"] == 3), "the frame's input is put back"
    assert infer_value(be, io, 4) == 4, "plain from now on"
    be.close()


def test_the_check_leaves_the_frame_and_its_outputs_as_the_plain_run_made_them(float_model, cache):
    be, _ = graph_backend(float_model, cache, fmt=FLOAT_FMT_SCALED, preprocess="gpu", zero_copy=False)
    io = be.allocate()
    assert infer_value(be, io, 9) == 9
    assert io.handle.graphs and np.all(io.inputs["frame"] == 9)
    be.close()


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


def test_on_with_a_failed_check_raises_once_then_the_slot_runs_plainly(const_model, cache):
    f = graph_fakes()
    f.trt.bake_inputs = True
    be, _ = graph_backend(const_model, cache, fakes=f, cuda_graphs="on")
    io = be.allocate()
    with pytest.raises(BackendError, match=r"cuda_graphs is on.*differs from plain execution"):
        be.infer(io)
    mark = len(f.calls)
    assert infer_value(be, io, 5) == 5
    assert count(f, "cudaStreamBeginCapture", mark) == 0, "the slot is not tried again"
    be.close()
