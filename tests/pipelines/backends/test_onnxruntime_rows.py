"""ONNX Runtime's outputs whose row count depends on the frame (pipelines/backends/
onnxruntime.py): at most MAX_ROWS rows kept per frame, and the rows past them counted
exactly, per frame (``counts``) and since load (``describe``)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edge_agent.core.model_config import OnnxRuntimeConfig
from edge_agent.pipelines.backends.base import MAX_ROWS
from edge_agent.pipelines.backends.onnxruntime import OnnxRuntimeBackend

WIDTH = 3000


def nonzero_model(path: Path) -> str:
    """``x`` [1, WIDTH] in; ``rows`` [n, 2] out: the (row, column) of every x > 0, one row
    each (NonZero), so the frame decides how many rows there are."""
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("NonZero", ["positive"], ["where"]),
        helper.make_node("Transpose", ["where"], ["rows"], perm=[1, 0]),
    ]
    graph = helper.make_graph(
        nodes,
        "rows",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("rows", TensorProto.INT64, ["n", 2])],
        [helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return str(path)


@pytest.fixture
def backend(tmp_path):
    be = OnnxRuntimeBackend(OnnxRuntimeConfig())
    be.load(nonzero_model(tmp_path / "rows.onnx"))
    yield be
    be.close()


def run(be: OnnxRuntimeBackend, io, n: int) -> np.ndarray:
    x = io.inputs["x"]
    x[...] = -1
    x[0, :n] = 1
    be.infer(io)
    return io.outputs[0]


def test_rows_past_the_bound_are_dropped_and_counted_exactly(backend, caplog):
    assert backend.batch_axis() == (1, True) and backend.outputs[0].shape == (None, 2)
    io = backend.allocate()
    assert backend.counts(io) == {"rows_dropped": 0}
    with caplog.at_level(logging.WARNING):
        rows = run(backend, io, MAX_ROWS + 476)
    assert len(rows) == MAX_ROWS and backend.counts(io) == {"rows_dropped": 476}
    np.testing.assert_array_equal(rows[:, 1], np.arange(MAX_ROWS))  # the first rows, in order
    assert "rows_dropped" in caplog.text
    for n, dropped in ((MAX_ROWS, 0), (MAX_ROWS + 1, 1), (17, 0), (WIDTH, WIDTH - MAX_ROWS), (0, 0)):
        rows = run(backend, io, n)
        assert len(rows) == min(n, MAX_ROWS) and backend.counts(io) == {"rows_dropped": dropped}
    assert backend.describe()["rows_dropped"] == 476 + 1 + WIDTH - MAX_ROWS
    assert caplog.text.count("rows_dropped") == 1, "said once"


def test_a_model_without_row_outputs_counts_nothing(const_model):
    be = OnnxRuntimeBackend(OnnxRuntimeConfig())
    be.load(str(const_model))
    io = be.allocate()
    be.infer(io)
    assert be.counts(io) == {} and "rows_dropped" not in be.describe()
    assert be.describe()["onnxruntime"], "the version, once loaded"
