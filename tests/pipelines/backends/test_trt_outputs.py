"""Outputs whose row count depends on the frame, on the TensorRT backend (pipelines/backends/
trt_outputs.py), against FakeTensorRT's output allocator protocol: the rows the engine
reported are what the decoder sees, a slot's memory grows geometrically to the bound and is
reused, a frame past the bound drops its rows and counts them, and the shapes the agent
cannot take are refused by name.

The fake kernel writes row i of the end-to-end output as (0, i, i, i + 10, i + 10, i % 3,
score) and the frame's row count into the fixed output ``count``."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from fakes import trt_kit
from fakes.trt_kit import FLOAT_FMT_SCALED, Fakes, float_detector, swap_backend
from onnx import TensorProto, helper

from edge_agent.core.model_config import ModelConfig, TensorRTConfig
from edge_agent.models.manifest import InputFormat, ModelError
from edge_agent.pipelines.backends import trt_outputs
from edge_agent.pipelines.backends.base import MAX_ROWS, BackendError, TensorSpec
from edge_agent.pipelines.backends.tensorrt import TensorRTBackend
from edge_agent.pipelines.model import load_model

cache = trt_kit.cache
trt_cuda = trt_kit.cuda  # a FakeCudaDriver with a context current
FMT = InputFormat(height=32, width=32, layout="NCHW", dtype="float32", scale=1 / 255)
ROW_BYTES = 7 * 4


def e2e_model(tmp_path: Path, batch: int | str = 1, name: str = "e2e") -> Path:
    """An end-to-end export's IO: float NCHW 32x32 in, ``output`` [num_dets, 7] (one row per
    kept box, YOLOv7 --max-wh's layout) and ``count`` [1, 1] out; with its manifest."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, 32, 32])
    rows = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["num_dets", 7])
    count = helper.make_tensor_value_info("count", TensorProto.FLOAT, [1, 1])
    nodes = [helper.make_node("Identity", ["images"], [o]) for o in ("output", "count")]
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "e2e", [x], [rows, count])), str(path))
    path.with_suffix(".yaml").write_text(
        "name: e2e\ninput: {height: 32, width: 32}\noutput: {decoder: yolov7_max_wh, name: output}\n"
        "labels: [a, b, c]\n"
    )
    return path


def expected(n: int) -> np.ndarray:
    i = np.arange(n, dtype=np.float32)
    score = 0.99 - i / (2 * max(n, 1))
    return np.stack([0 * i, i, i, i + 10, i + 10, i % 3, score], axis=1).astype(np.float32)


def rows_kernel(label: str, ins: dict, outs: dict) -> None:
    for name, out in outs.items():
        if name == "output":
            out[...] = expected(len(out))
        elif name == "count":
            out[...] = len(outs["output"])


def fakes(rows: int = 0, **kw) -> Fakes:
    f = Fakes(**kw)
    f.trt.kernel = rows_kernel
    f.trt.output_rows = {"output": rows}
    return f


def loaded(tmp_path, cache, f: Fakes, model: Path | None = None, **cfg) -> TensorRTBackend:
    be = f.backend(cache, preprocess="cpu", **cfg)
    be.load(str(model or e2e_model(tmp_path)), FMT)
    return be


def frame(be: TensorRTBackend, f: Fakes, io, rows: int) -> np.ndarray:
    f.trt.output_rows["output"] = rows
    be.infer(io)
    return io.outputs[0]


# -- the rows the engine reported -------------------------------------------------------------


@pytest.mark.parametrize("zero_copy", [True, False])
def test_the_rows_the_engine_reported_are_the_output(tmp_path, cache, zero_copy):
    f = fakes()
    be = loaded(tmp_path, cache, f, zero_copy=zero_copy)
    assert be.outputs[0] == TensorSpec("output", (None, 7), np.dtype(np.float32))
    assert be.outputs[1] == TensorSpec("count", (1, 1), np.dtype(np.float32))
    assert be.batch_axis() == (1, True), "rows carry no batch axis: one frame at a time"
    io = be.allocate()
    assert io.outputs[0].shape == (0, 7)
    for n in (3, 0, 5):
        mark = len(f.calls)
        out = frame(be, f, io, n)
        np.testing.assert_array_equal(out, expected(n))
        assert io.outputs[1][0, 0] == n and be.counts(io) == {"rows_dropped": 0}
        names = [c for c, _ in f.since(mark)]
        realloc, notify = "IOutputAllocator.reallocate_output_async", "IOutputAllocator.notify_shape"
        assert names.index(realloc) < names.index(notify) < names.index("Event.synchronize")
    assert f.cuda.pending_streams() == [] and f.cuda.context_depth() == 0


def test_an_allocator_is_set_on_the_context_before_each_enqueue(tmp_path, cache):
    f = fakes(2)
    be = loaded(tmp_path, cache, f)
    a, b = be.allocate(), be.allocate()
    for io in (a, b, a):
        mark = len(f.calls)
        be.infer(io)
        names = [c for c, _ in f.since(mark)]
        assert names.index("IExecutionContext.set_output_allocator") < names.index(
            "IExecutionContext.execute_async_v3"
        )
    assert be.context.get_output_allocator("output") is a.handle.rows["output"].allocator
    ra, rb = a.handle.rows["output"], b.handle.rows["output"]
    assert ra.host.base is not rb.host.base and int(ra.mem) != int(rb.mem), "each slot its own"


def test_memory_grows_geometrically_to_the_bound_then_nothing_is_allocated(tmp_path, cache):
    f = fakes()
    be = loaded(tmp_path, cache, f)
    io = be.allocate()
    rows = io.handle.rows["output"]
    sizes = []
    for n in (1, 64, 65, 200, 130, MAX_ROWS, 10):
        mark = len(f.calls)
        frame(be, f, io, n)
        sizes += [a[0] for c, a in f.since(mark) if c == "mem_alloc"]
    assert sizes == [64 * ROW_BYTES, 128 * ROW_BYTES, 256 * ROW_BYTES, MAX_ROWS * ROW_BYTES]
    assert rows.capacity == MAX_ROWS * ROW_BYTES and rows.allocations == 4
    assert f.names().count("DeviceAllocation.free") == 3, "each outgrown allocation given back"
    mark = len(f.calls)
    for n in (MAX_ROWS, 0, 700, 1):  # steady state
        np.testing.assert_array_equal(frame(be, f, io, n), expected(n))
    allocs = [c for c, _ in f.since(mark) if c in ("mem_alloc", "pagelocked_empty", "DeviceAllocation.free")]
    assert allocs == [], "an allocation in steady state"


# -- past the bound: dropped and counted ---------------------------------------------------------


def test_a_frame_past_the_bound_drops_its_rows_and_counts_them(tmp_path, cache, caplog):
    f = fakes()
    be = loaded(tmp_path, cache, f)
    io = be.allocate()
    frame(be, f, io, 4)
    with caplog.at_level(logging.WARNING):
        out = frame(be, f, io, MAX_ROWS + 476)
    assert out.shape == (0, 7) and be.counts(io) == {"rows_dropped": MAX_ROWS + 476}
    assert io.outputs[1][0, 0] == 0, "the refused frame's other outputs read as nothing found"
    assert "rows_dropped" in caplog.text
    allocated = [a[0] for c, a in f.calls if c == "mem_alloc"]
    assert allocated == [64 * ROW_BYTES], "the refused frame allocated nothing"
    np.testing.assert_array_equal(frame(be, f, io, 5), expected(5))
    assert be.counts(io) == {"rows_dropped": 0}
    frame(be, f, io, 2000)
    assert be.counts(io) == {"rows_dropped": 2000}
    assert be.describe()["rows_dropped"] == MAX_ROWS + 476 + 2000
    assert caplog.text.count("rows_dropped") == 1, "said once"
    assert f.cuda.pending_streams() == []


def test_an_allocation_that_fails_is_an_error_naming_the_output(tmp_path, cache, monkeypatch):
    f = fakes(3)
    be = loaded(tmp_path, cache, f)
    io = be.allocate()

    def out_of_memory(nbytes):
        raise MemoryError("cuMemAlloc failed: out of memory")

    monkeypatch.setattr(f.cuda, "mem_alloc", out_of_memory)
    with pytest.raises(BackendError, match="failed to enqueue: output 'output': MemoryError"):
        be.infer(io)


def test_a_model_without_row_outputs_counts_nothing(const_model, cache):
    be, _ = trt_kit.loaded(const_model, cache)
    io = be.allocate()
    be.infer(io)
    assert be.counts(io) == {} and "rows_dropped" not in be.describe()


# -- batches, graphs ---------------------------------------------------------------------------


def test_a_batch_profile_runs_at_one_frame(tmp_path, cache):
    f = fakes(2)
    be = loaded(tmp_path, cache, f, e2e_model(tmp_path, batch="batch"), max_batch=4)
    assert be.batch_axis() == (1, True)
    assert any("batch 1: output 'output'" in n for n in be.notes), be.notes
    assert f.trt.args_of("IExecutionContext.set_input_shape")[-1][2] == (1, 3, 32, 32)
    io = be.allocate(4)
    assert io.inputs["images"].shape == (1, 3, 32, 32)
    np.testing.assert_array_equal(frame(be, f, io, 2), expected(2))


def test_a_fixed_batch_of_several_frames_is_refused(tmp_path, cache):
    with pytest.raises(BackendError, match="no batch axis, and the engine takes a fixed batch of 4"):
        loaded(tmp_path, cache, fakes(), e2e_model(tmp_path, batch=4))


def test_graphs_are_off_for_a_row_output_and_on_is_an_error(tmp_path, cache):
    f = fakes(3, graphs=True)
    be = loaded(tmp_path, cache, f)
    assert "output 'output' has a data-dependent shape" in be.describe()["cuda_graphs"]["off"]
    io = be.allocate()  # the slot's own context (the shared activation memory was made)
    np.testing.assert_array_equal(frame(be, f, io, 3), expected(3))
    assert io.handle.graphs == {} or io.handle.graphs is None
    assert "cudaStreamBeginCapture" not in f.names()
    f = fakes(graphs=True)
    with pytest.raises(BackendError, match=r"cuda_graphs is on.*data-dependent shape"):
        loaded(tmp_path, cache, f, e2e_model(tmp_path, name="on"), cuda_graphs="on")
    assert all(c.detached for c in f.cuda.contexts), "a failed load gives its context back"
    assert not f.cuda._device_ranges, "and its memory (the shared block too)"


def test_the_decoder_sees_the_rows_through_load_model(tmp_path, cache, monkeypatch):
    f = fakes(3)
    swap_backend(monkeypatch, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=(f.trt, f.cuda))
    )
    cfg = TensorRTConfig(cache_dir=str(cache), preprocess="cpu")
    model = load_model(ModelConfig(path=str(e2e_model(tmp_path)), input_adapter="off"), cfg)
    with model:
        assert model.decode.name == "yolov7_max_wh"
        io = model.backend.allocate()
        model.backend.infer(io)
        xyxy, scores, classes, _ = model.decode(io.outputs, model.params)
        np.testing.assert_allclose(scores, expected(3)[:, 6])
        assert classes.tolist() == [0, 1, 2]
        np.testing.assert_allclose(xyxy, expected(3)[:, 1:5])


# -- shapes refused --------------------------------------------------------------------------------


def test_a_data_dependent_axis_after_the_first_is_refused_by_name(tmp_path, cache):
    path = float_detector(tmp_path, "nms")
    proto = onnx.load(path)
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "num_dets"  # [1, -1, 2100]
    onnx.save(proto, path)
    be = Fakes().backend(cache, preprocess="cpu")
    with pytest.raises(BackendError, match=r"output 'output0' has a data-dependent shape \(1, -1, 2100\)"):
        be.load(path, FLOAT_FMT_SCALED)


def test_rows_too_large_for_the_bound_are_refused_at_load(tmp_path, cache):
    """[num_selected, 8, 2100]: MAX_ROWS such rows hold more than MAX_OUTPUT_ELEMENTS."""
    path = float_detector(tmp_path, "nms")
    proto = onnx.load(path)
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "num_selected"
    onnx.save(proto, path)
    f = Fakes()
    with pytest.raises(ModelError, match=r"output 'output0' \[1, 1024, 8, 2100\] holds 17,203,200 values"):
        f.backend(cache, preprocess="cpu").load(path, FLOAT_FMT_SCALED)
    assert all(c.detached for c in f.cuda.contexts)


# -- RowOutput on its own ----------------------------------------------------------------------------


def test_the_allocator_never_raises_into_tensorrt(trt_cuda):
    host = trt_cuda.pagelocked_empty((MAX_ROWS, 7), np.float32)
    out = trt_outputs.RowOutput(trt_cuda, 0, "output", host)
    assert out.reallocate(3 * ROW_BYTES, 256) == int(out.mem)
    out.notify((3, 6))
    assert "rows of (7,)" in out.failed
    out.begin()
    assert out.reallocate(MAX_ROWS * ROW_BYTES + 1, 256) is None and out.refused and out.asked == MAX_ROWS + 1
    out.notify("not a shape")
    assert out.failed.startswith("output 'output': notify_shape")
    out.free()
    assert out.mem is None and host.base.freed
