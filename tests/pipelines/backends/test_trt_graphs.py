"""TensorRTBackend's CUDA graphs on the fakes (FakeTensorRT, FakeCudaDriver, FakeCudart):
the graph path chosen, each slot replaying its own buffers with its own context and shapes,
every slot captured before frames, and re-capture on reload. Refusals, fallbacks and the
check against plain execution: test_trt_graph_fallbacks.py.

The fake engine's kernel writes, into every output, the mean of its input (``trt_kit.
mean_kernel``): a frame filled with one value comes out as that value, so a slot replaying
another slot's graph (or a stale one) shows in the outputs."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fakes import trt_kit
from fakes.trt_kit import (
    FLOAT_FMT_SCALED,
    count,
    graph_backend,
    graph_fakes,
    infer_value,
    swap_backend,
)

cache = trt_kit.cache
float_model = trt_kit.float_model


# -- the graph path ------------------------------------------------------------------------


@pytest.mark.parametrize("zero_copy", [True, False])
def test_first_run_is_plain_then_each_slot_is_captured_and_replayed(const_model, cache, zero_copy):
    be, f = graph_backend(const_model, cache, zero_copy=zero_copy)
    io = be.allocate()
    assert infer_value(be, io, 7) == 7
    (slot,) = be._slots
    assert set(slot.graphs) == {"model"}, "captured after the first plain run"
    assert be.describe()["cuda_graphs"] == {"mode": "auto", "replaying": True, "captured_slots": 1, "off": ""}
    mark = len(f.calls)
    for value in (11, 12, 13):
        assert infer_value(be, io, value) == value
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
        assert infer_value(be, io, 10 + k) == 10 + k  # first run of each: plain, then captured
    assert all(s.graphs for s in be._slots)
    # Interleaved, out of order, each with its own frame: every output is its own slot's.
    for rnd in range(3):
        order = [2, 0, 1] if rnd % 2 else [1, 2, 0]
        for k in order:
            assert infer_value(be, ios[k], 50 + 10 * rnd + k) == 50 + 10 * rnd + k
    be.close()


def test_a_slot_replaying_another_slots_graph_shows_in_its_outputs(const_model, cache):
    """The check above can fail: swap two slots' graphs and the outputs are the other's."""
    be, _ = graph_backend(const_model, cache)
    a, b = be.allocate(), be.allocate()
    infer_value(be, a, 1)
    infer_value(be, b, 2)
    a.handle.graphs, b.handle.graphs = b.handle.graphs, a.handle.graphs
    b.inputs["images"][...] = 9
    assert infer_value(be, a, 5) == 1, "slot a replayed b's graph: its own outputs are stale"
    assert np.all(b.outputs[0] == 9), "b's graph computed b's frame into b's outputs"
    be.close()


def test_device_preprocessing_on_the_gpu_is_captured_in_its_own_graph(float_model, cache):
    be, f = graph_backend(float_model, cache, fmt=FLOAT_FMT_SCALED, preprocess="gpu")
    assert be.describe()["preprocess"] == "device"
    io = be.allocate()
    assert infer_value(be, io, 3) == 3
    assert set(io.handle.graphs) == {"pre", "model"}
    mark = len(f.calls)
    assert infer_value(be, io, 4) == 4
    assert count(f, "cudaGraphLaunch", mark) == 2
    # The events stay outside the graphs: the device parts are still timed apart.
    t = be.timings(io)
    assert t["device_preprocess_ms"] == pytest.approx(f.trt.exec_ms.get("network", 0.25))
    assert t["device_compute_ms"] == pytest.approx(1.5)  # the model engine's fake cost
    be.close()


def test_preprocessing_on_a_dla_runs_plainly_before_the_models_graph(float_model, cache):
    f = graph_fakes(num_dla=1)
    be, _ = graph_backend(float_model, cache, fakes=f, fmt=FLOAT_FMT_SCALED, preprocess="dla")
    assert be.describe()["preprocess"] == "device"
    io = be.allocate()
    assert infer_value(be, io, 6) == 6
    assert set(io.handle.graphs) == {"model"}
    mark = len(f.calls)
    assert infer_value(be, io, 8) == 8
    assert (
        count(f, "cudaGraphLaunch", mark) == 1 and count(f, "IExecutionContext.execute_async_v3", mark) == 1
    )
    be.close()


def test_a_dynamic_batch_engine_gives_each_slot_its_own_shape_once(const_model, cache):
    be, f = graph_backend(const_model, cache, max_batch=4)
    one, three = be.allocate(), be.allocate(3)
    shapes = [a[2] for n, a in f.calls if n == "IExecutionContext.set_input_shape"]
    assert (1, 320, 320, 3) in shapes and (3, 320, 320, 3) in shapes
    for rnd in range(3):
        assert infer_value(be, three, 20 + rnd) == 20 + rnd
        assert infer_value(be, one, 30 + rnd) == 30 + rnd
    mark = len(f.calls)
    infer_value(be, three, 1)
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
    assert infer_value(be, io, 5) == 5 and infer_value(be, io, 6) == 6
    assert len(f.trt.args_of("IExecutionContext.device_memory=")) == 2
    be.close()


def test_replay_can_be_paused_for_the_bench(const_model, cache):
    be, f = graph_backend(const_model, cache)
    io = be.allocate()
    infer_value(be, io, 1)
    be.replay_graphs(False)
    mark = len(f.calls)
    assert infer_value(be, io, 2) == 2
    assert (
        count(f, "cudaGraphLaunch", mark) == 0 and count(f, "IExecutionContext.execute_async_v3", mark) == 1
    )
    assert count(f, "IExecutionContext.set_tensor_address", mark) == 0, "plain, on the slot's own context"
    be.replay_graphs(True)
    mark = len(f.calls)
    assert infer_value(be, io, 3) == 3 and count(f, "cudaGraphLaunch", mark) == 1
    be.close()


def test_every_slot_of_every_source_is_captured_before_frames(const_model, cache, monkeypatch):
    """prepare_profiles (the pipeline's warm-up) prepares every frame slot and batch set of
    every source: no live frame pays for a capture; a reload's slots likewise after its
    drain (the same call, with warm on)."""
    from edge_agent.core.model_config import ModelConfig
    from edge_agent.pipelines.backends.tensorrt import TensorRTBackend
    from edge_agent.pipelines.model import load_model
    from edge_agent.pipelines.profile import SLOTS, Profile, prepare_profiles

    f = graph_fakes()
    modules = (f.trt, f.cuda, f.cudart)
    swap_backend(monkeypatch, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=modules))
    model = load_model(ModelConfig(path=str(const_model)), f.backend(cache, max_batch=2).config)
    try:
        buffers = Profile("m", model)
        lanes = [("cam0", [buffers]), ("cam1", [buffers])]
        prepare_profiles(lanes, 2, warm=False)  # a reload while the old pipeline runs: nothing runs
        assert model.backend.graph_state()["captured_slots"] == 1, "only the first slot's warm-up"
        prepare_profiles(lanes, 2)  # the warm-up (after the drain)
        sets = [s.io for pool in buffers.pools.values() for s in pool.slots] + list(buffers.batches.values())
        assert len(sets) == 2 * SLOTS + 1 and all(io.handle.graphs for io in sets)
        assert model.backend.graph_state()["captured_slots"] == len(sets)
        mark = len(f.calls)
        prepare_profiles(lanes, 2)  # again: nothing more to do
        assert count(f, "cudaStreamBeginCapture", mark) == 0
    finally:
        model.close()


# -- reloads ---------------------------------------------------------------------------------


def test_a_reload_captures_anew_on_its_own_buffers(const_model, cache):
    f = graph_fakes()
    old, _ = graph_backend(const_model, cache, fakes=f)
    io = old.allocate()
    infer_value(old, io, 1)
    old_exec = io.handle.graphs["model"]._exec
    # The reload: a new backend from the cached engine, its buffers prepared while the old
    # one still runs, then the old one closed.
    new, _ = graph_backend(const_model, cache, fakes=f)
    assert f.trt.builds == 1, "the engine came from the cache"
    new_io = new.allocate()
    assert infer_value(old, io, 2) == 2
    old.close()
    assert old_exec.destroyed
    assert infer_value(new, new_io, 3) == 3 and infer_value(new, new_io, 4) == 4
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
    assert infer_value(be, io, 4) == 4
    assert made and io.handle.graphs, "captured, and the other thread's slot was made"
    assert infer_value(be, made[0], 6) == 6 and infer_value(be, made[0], 7) == 7
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
    assert infer_value(be, io, 4) == 4 and io.handle.graphs, "captured while the other engine loaded"
    assert other and "Runtime.deserialize_cuda_engine" in f.names()
    other[0].close()
    be.close()
