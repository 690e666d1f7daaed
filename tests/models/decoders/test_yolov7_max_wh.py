"""The YOLOv7 ``--end2end --max-wh`` decoder, ``[N, 7]`` (models/decoders/yolov7_max_wh.py),
on arrays and on a small real ONNX graph built as YOLOv7's export builds its NMS."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from decoder_checks import check_types, decode
from onnx import TensorProto, helper, numpy_helper

from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.models.decoders.base import DecodeParams, OutputMismatch
from edge_agent.models.decoders.yolov7_max_wh import YoloV7MaxWh
from edge_agent.models.manifest import resolve_model
from edge_agent.pipelines.model import load_model


def test_rows_are_ranked_and_thresholded_without_nms():
    rows = np.array(
        [
            [0, 10, 10, 50, 50, 2, 0.60],
            [0, 12, 12, 52, 52, 2, 0.90],  # overlaps the first: NMS ran in the model, both stay
            [0, 100, 100, 140, 160, 0, 0.20],  # under the threshold
            [0, 200, 50, 260, 90, 7, 0.75],
        ],
        np.float32,
    )
    decoded = decode("yolov7_max_wh", rows)
    check_types(decoded, 3)
    xyxy, scores, classes, _ = decoded
    np.testing.assert_allclose(scores, [0.90, 0.75, 0.60])
    assert classes.tolist() == [2, 7, 2]
    np.testing.assert_allclose(xyxy, [[12, 12, 52, 52], [200, 50, 260, 90], [10, 10, 50, 50]])
    _, scores, _, _ = decode("yolov7_max_wh", rows, p=DecodeParams(0.25, 0.45, max_detections=1))
    np.testing.assert_allclose(scores, [0.90])
    check_types(decode("yolov7_max_wh", np.zeros((0, 7), np.float32)), 0)


@pytest.mark.parametrize(
    ("shape", "needs"),
    [((None, 7), ""), ((100, 7), ""), ((None, 6), "7 on axis 1"), ((1, 100, 7), "2 axes")],
)
def test_fit_needs_rows_of_seven(shape, needs):
    if needs:
        with pytest.raises(OutputMismatch, match=needs):
            YoloV7MaxWh().fit([shape], 80)
    else:
        assert YoloV7MaxWh().fit([shape], 80) == YoloV7MaxWh()


def _yolov7_max_wh(path: str, max_wh: float = 640.0) -> str:
    """A model ending as YOLOv7's ONNX_ORT module does: candidates (cx, cy, w, h, objectness,
    class probabilities), boxes to xyxy, score = objectness × probability, each class's
    boxes shifted by class × max_wh, ONNX's NonMaxSuppression, and the kept rows gathered as
    (batch id, x1, y1, x2, y2, class id, score). The candidates are constants (the image's
    mean is added times zero, so the graph reads its input)."""
    pred = np.zeros((1, 6, 5 + 3), np.float32)
    pred[0, 0] = (10, 10, 8, 8, 0.9, 0.9, 0.1, 0.0)  # 0.81, class 0
    pred[0, 1] = (11, 10, 8, 8, 0.9, 0.8, 0.0, 0.0)  # 0.72, class 0: suppressed by the first
    pred[0, 2] = (11, 10, 8, 8, 0.9, 0.0, 0.7, 0.0)  # 0.63, class 1: kept (another class)
    pred[0, 3] = (30, 30, 8, 8, 0.2, 0.0, 0.0, 0.5)  # 0.10: under the graph's threshold
    pred[0, 4] = (20, 20, 4, 6, 1.0, 0.0, 0.0, 0.3)  # 0.30, class 2
    to_xyxy = np.array([[1, 0, 1, 0], [0, 1, 0, 1], [-0.5, 0, 0.5, 0], [0, -0.5, 0, 0.5]], np.float32)
    consts = {
        "pred": pred,
        "zero": np.zeros(1, np.float32),
        "to_xyxy": to_xyxy,
        "max_wh": np.array(max_wh, np.float32),
        "max_obj": np.array([100], np.int64),
        "iou": np.array([0.45], np.float32),
        "score_thr": np.array([0.25], np.float32),
        "s0": np.array([0], np.int64),
        "s4": np.array([4], np.int64),
        "s5": np.array([5], np.int64),
        "s_end": np.array([1000], np.int64),
        "axis2": np.array([2], np.int64),
        "col0": np.array([0], np.int64),
        "col02": np.array([0, 2], np.int64),
    }
    node = helper.make_node
    nodes = [
        node("ReduceMean", ["images"], ["m"], keepdims=0),
        node("Mul", ["m", "zero"], ["m0"]),
        node("Add", ["pred", "m0"], ["x"]),
        node("Slice", ["x", "s0", "s4", "axis2"], ["cxcywh"]),
        node("Slice", ["x", "s4", "s5", "axis2"], ["obj"]),
        node("Slice", ["x", "s5", "s_end", "axis2"], ["probs"]),
        node("Mul", ["probs", "obj"], ["scores"]),
        node("MatMul", ["cxcywh", "to_xyxy"], ["boxes"]),
        node("ReduceMax", ["scores"], ["best"], axes=[2], keepdims=1),
        node("ArgMax", ["scores"], ["cls"], axis=2, keepdims=1),
        node("Cast", ["cls"], ["cls_f"], to=TensorProto.FLOAT),
        node("Mul", ["cls_f", "max_wh"], ["offset"]),
        node("Add", ["boxes", "offset"], ["nms_boxes"]),
        node("Transpose", ["best"], ["best_t"], perm=[0, 2, 1]),
        node("NonMaxSuppression", ["nms_boxes", "best_t", "max_obj", "iou", "score_thr"], ["sel"]),
        node("Gather", ["sel", "col02"], ["xy"], axis=1),  # (batch, anchor) of each kept row
        node("GatherND", ["boxes", "xy"], ["kept_boxes"]),
        node("GatherND", ["cls_f", "xy"], ["kept_cls"]),
        node("GatherND", ["best", "xy"], ["kept_scores"]),
        node("Gather", ["sel", "col0"], ["batch"], axis=1),
        node("Cast", ["batch"], ["batch_f"], to=TensorProto.FLOAT),
        node("Concat", ["batch_f", "kept_boxes", "kept_cls", "kept_scores"], ["output"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "yolov7-max-wh",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["num_dets", 7])],
        [numpy_helper.from_array(v, k) for k, v in consts.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def test_a_yolov7_max_wh_export_is_recognised_bound_and_decoded(tmp_path):
    path = _yolov7_max_wh(str(tmp_path / "yolov7.onnx"))
    resolved = resolve_model(path)  # what `models check` and `run` read without a manifest
    assert resolved.manifest.output.decoder == "yolov7_max_wh"
    (said,) = [n for n in resolved.assumptions if n.startswith("decoder ")]
    assert "shape [N, 7]: rows of batch id" in said and "--max-wh" in said, said
    assert len(resolved.manifest.labels) == 80, "the rows do not tell the class count"
    model = load_model(ModelConfig(path=path, input_adapter="off"), OnnxRuntimeConfig())
    with model:
        assert model.decode.name == "yolov7_max_wh" and model.decode.decoder.nms_in_model
        assert model.backend.outputs[model.output_index].shape == (None, 7)
        # The row count is the detections' (NonMaxSuppression's), not a batch: the backend
        # runs it one frame at a time and gives each run's rows in the slot's output.
        assert model.backend.batch_axis() == (1, True)
        io = model.backend.allocate()
        io.inputs["images"][:] = 0.5
        for _ in range(2):  # the slot is reused run after run
            model.backend.infer(io)
            rows = io.outputs[model.output_index]
            assert rows.shape == (3, 7)
            xyxy, scores, classes, _ = model.decode(io.outputs, model.params)
            np.testing.assert_allclose(scores, [0.81, 0.63, 0.30], rtol=1e-6)
            assert classes.tolist() == [0, 1, 2]
            np.testing.assert_allclose(xyxy, [[6, 6, 14, 14], [7, 6, 15, 14], [18, 17, 22, 23]])
    # The same rows as plain ONNX Runtime gives.
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    (plain,) = session.run(None, {"images": np.full((1, 3, 32, 32), 0.5, np.float32)})
    np.testing.assert_array_equal(plain, rows)
