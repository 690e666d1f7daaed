"""Every detector export format: how the agent picks its decoder (metadata, output names,
shape), what it refuses and why, letterbox or stretch back to source pixels, thresholds,
batches, TensorRT's EfficientNMS tensors, and ``edge-agent models check``.

The models are small real ONNX graphs (``testmodels.brightness_detector``) run in real ONNX
Runtime sessions: their outputs are fixed rows moved by the frame's mean brightness, so
each frame's result is known exactly and a batch mix-up shows.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import yaml
from conftest import agent_command, run_process, started, wait_until
from fakes.fake_pycuda import FakeCudaDriver
from fakes.fake_tensorrt import FakeTensorRT
from fakes.trt_kit import swap_backend
from helpers import Subscriber
from onnx import TensorProto, helper

from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig, TensorRTConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import ImageFolderSourceConfig
from edge_agent.models.manifest import ModelError, resolve_model
from edge_agent.models.testmodels import brightness_detector, efficient_nms_plugin_graph
from edge_agent.pipelines.backends.tensorrt import TensorRTBackend
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.preprocess import Letterbox, boxes_to_source
from edge_agent.pipelines.profile import Profile
from edge_agent.service.runner import Agent

F, I32 = TensorProto.FLOAT, TensorProto.INT32
NAMES80 = repr({i: f"c{i}" for i in range(80)})
META = {"names": NAMES80, "imgsz": "[320, 320]", "task": "detect"}


def rows(*r: tuple[float, ...], k: int = 8) -> np.ndarray:
    """End-to-end rows (x1, y1, x2, y2, score, class) padded with zero rows to ``k``."""
    out = np.zeros((1, k, 6), np.float32)
    out[0, : len(r)] = r
    return out


def still(base: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    return base, np.zeros_like(base), F


def nms_outputs(num: int, boxes, scores, classes, k: int = 6, names=None) -> dict:
    """EfficientNMS' four outputs: ``num`` real rows, the rest padding that scores high (it
    must be ignored because of num_dets, not because of its score)."""
    b = np.full((1, k, 4), 5.0, np.float32)
    s = np.full((1, k), 0.99, np.float32)
    c = np.zeros((1, k), np.float32)
    b[0, : len(boxes)], s[0, : len(scores)], c[0, : len(classes)] = boxes, scores, classes
    n = names or ("num_dets", "det_boxes", "det_scores", "det_classes")
    return {
        n[0]: (np.array([[num]], np.float32), np.zeros((1, 1), np.float32), I32),
        n[1]: still(b),
        n[2]: still(s),
        n[3]: (c, np.zeros_like(c), I32),
    }


def frame(value: int) -> np.ndarray:
    return np.full((480, 640, 3), value, np.uint8)


def run_one(path: str, **model_kw) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One 640x480 frame through the model as the pipeline runs it; boxes in source pixels."""
    loaded = load_model(ModelConfig(path=path, input_adapter="off", **model_kw), OnnxRuntimeConfig())
    geo = Letterbox()
    try:
        xyxy, scores, classes, _ = loaded.run_one(frame(90), loaded.backend.allocate(), geo)
    finally:
        loaded.backend.close()
    return boxes_to_source(xyxy.copy(), geo), scores, classes


# -- choosing the decoder -----------------------------------------------------------------------

E2E = rows((100, 60, 200, 140, 0.9, 2))


@pytest.mark.parametrize(
    ("outputs", "metadata", "decoder", "rule"),
    [
        pytest.param(
            {"output0": still(E2E)}, {**META, "end2end": "True"}, "end2end", "end2end=True", id="yolo26"
        ),
        pytest.param(
            {"output0": still(E2E)},
            {**META, "end2end": "False", "args": "{'nms': True, 'batch': 1}"},
            "end2end",
            "nms=True",
            id="nms-export",
        ),
        pytest.param(
            {"output0": still(E2E)}, {**META, "head": "RTDETRDecoder"}, "rtdetr", "RTDETRDecoder", id="rtdetr"
        ),
        pytest.param({"output0": still(E2E)}, {}, "end2end", "8 rows of 6", id="shape-end2end"),
        pytest.param(
            nms_outputs(1, [[0, 0, 9, 9]], [0.9], [1]), {}, "efficient_nms", "named", id="nms-names"
        ),
        pytest.param(
            nms_outputs(1, [[0, 0, 9, 9]], [0.9], [1], names=("n", "b", "s", "c")),
            {},
            "efficient_nms",
            "shaped like",
            id="nms-shapes",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 84, 2100), np.float32))},
            META,
            "yolov8",
            "2100 = the anchors",
            id="shape-yolov8",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 6300, 85), np.float32))},
            {},
            "yolov5",
            "6300 = the anchors of a YOLOv5 head",
            id="shape-yolov5",
        ),
    ],
)
def test_the_decoder_is_chosen_by_metadata_names_then_shape_and_the_rule_is_said(
    tmp_path, outputs, metadata, decoder, rule
):
    path = brightness_detector(str(tmp_path / "m.onnx"), outputs, metadata=metadata)
    resolved = resolve_model(path)
    out = resolved.manifest.output
    assert out.decoder == decoder
    (said,) = [n for n in resolved.assumptions if n.startswith("decoder ")]
    assert rule in said, said
    if decoder == "efficient_nms":
        assert out.names() == tuple(outputs), "the four outputs mapped in EfficientNMS' order"
    assert resolved.manifest.input.resize == ("stretch" if decoder == "rtdetr" else "letterbox")


def _dynamic(path: str, dims: list, metadata: dict, height: int = 320, width: int = 320) -> str:
    """A model whose one output has symbolic axes (``yolo export ... dynamic=True``): only
    its declared shape matters to the rules, so it is written by hand."""
    import onnx

    x = helper.make_tensor_value_info("images", F, ["batch", 3, height, width])
    y = helper.make_tensor_value_info("output0", F, dims)
    node = helper.make_node("Identity", ["images"], ["output0"])
    model = helper.make_model(
        helper.make_graph([node], "dyn", [x], [y]), opset_imports=[helper.make_opsetid("", 17)]
    )
    for k, v in metadata.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    onnx.save(model, path)
    return path


@pytest.mark.parametrize(
    ("dims", "metadata", "size", "decoder", "rule"),
    [
        pytest.param(
            ["batch", 84, "anchors"], META, (320, 320), "yolov8", "axis 1 = 4 + 80 labels", id="v8-dynamic"
        ),
        pytest.param(
            ["batch", "anchors", 85], META, (320, 320), "yolov5", "axis 2 = 5 + 80 labels", id="v5-dynamic"
        ),
        pytest.param(["batch", "k", 6], {}, (320, 320), "end2end", "K rows of 6", id="e2e-dynamic"),
        pytest.param([1, 84, 2125], {}, (320, 320), "yolov8", "2125 = the anchors", id="p6"),
        pytest.param(
            [1, 15120, 85],
            {},
            (384, 640),
            "yolov5",
            "15120 = the anchors of a YOLOv5 head at 640x384",
            id="v5-wide",
        ),
        pytest.param(
            [1, 84, 2100],
            {**META, "end2end": "True"},
            (320, 320),
            "yolov8",
            "(metadata end2end=True (an end-to-end head), but the output output0 [1, 84, 2100] float32",
            id="metadata-disagrees",
        ),
    ],
)
def test_shape_rules_read_dynamic_axes_p6_heads_and_wide_inputs(
    tmp_path, dims, metadata, size, decoder, rule
):
    path = _dynamic(str(tmp_path / "m.onnx"), dims, metadata, *size)
    resolved = resolve_model(path)
    assert resolved.manifest.output.decoder == decoder
    (said,) = [n for n in resolved.assumptions if n.startswith("decoder ")]
    assert rule in said, said


def test_an_extra_image_shaped_output_of_a_detection_model_is_left_unread(tmp_path):
    outputs = {
        "output0": still(np.zeros((1, 84, 2100), np.float32)),
        "feats": still(np.zeros((1, 8, 40, 40))),
    }
    resolved = resolve_model(brightness_detector(str(tmp_path / "m.onnx"), outputs, metadata=META))
    assert resolved.manifest.output.decoder == "yolov8"
    assert "outputs ['feats'] are not read" in resolved.assumptions


@pytest.mark.parametrize(
    ("outputs", "metadata", "message"),
    [
        pytest.param(
            {"output0": still(np.zeros((1, 1000), np.float32))},
            {**META, "task": "classify"},
            "a classification model (Ultralytics metadata task='classify') scores the whole image, "
            "not objects in it",
            id="classify",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 56, 2100), np.float32))},
            {**META, "task": "pose"},
            "output 'output0' fits no decoder of task 'pose' at 320x320 with 80 labels",
            id="pose-with-too-many-labels",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 84, 2100), np.float32))},
            {**META, "task": "depth"},
            "Ultralytics metadata task='depth' is not a task the agent runs (detect, pose, obb, segment)",
            id="unknown-task",
        ),
        pytest.param(
            {
                "output0": still(np.zeros((1, 116, 2100), np.float32)),
                "output1": still(np.zeros((1, 32, 80, 80))),
            },
            {},
            "output1 [?, 32, 80, 80] float32 is an image-shaped tensor (mask prototypes",
            id="seg-shape",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 7, 13), np.float32))},
            {},
            "fits no decoder at 320x320 (outputs: output0 [?, 7, 13] float32); the decoders known: ",
            id="unknown-shape",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 7, 13), np.float32))},
            {},
            "yolov8 [B, 4+C, N]",
            id="unknown-shape-lists-each-decoders-layout",
        ),
        pytest.param(
            {"output0": still(np.zeros((1, 84, 2100), np.float32))},
            {"names": repr({0: "a", 1: "b"})},
            "with 2 labels",
            id="labels-disagree",
        ),
    ],
)
def test_a_model_the_agent_cannot_decode_is_refused_with_the_reason(tmp_path, outputs, metadata, message):
    path = brightness_detector(str(tmp_path / "m.onnx"), outputs, metadata=metadata)
    with pytest.raises(ModelError) as e:
        resolve_model(path)
    assert message in str(e.value)
    assert path in str(e.value)


def test_a_manifest_names_efficient_nms_outputs_of_any_name(tmp_path):
    names = ("count", "xyxy", "conf", "label")
    path = brightness_detector(
        str(tmp_path / "m.onnx"),
        nms_outputs(2, [[10, 50, 20, 60], [0, 40, 5, 45]], [0.9, 0.8], [1, 0], names=names),
    )
    (tmp_path / "m.yaml").write_text(
        "name: m\ninput: {height: 320, width: 320, layout: NCHW, dtype: float32}\n"
        "output:\n  decoder: efficient_nms\n"
        "  efficient_nms: {num_dets: count, boxes: xyxy, scores: conf, classes: label}\n"
        "labels: [a, b]\n"
    )
    _, scores, classes = run_one(path)
    assert classes.tolist() == [1, 0] and scores.tolist() == pytest.approx([0.9, 0.8])
    (tmp_path / "m.yaml").write_text((tmp_path / "m.yaml").read_text().replace("conf", "confidence"))
    with pytest.raises(
        ModelError, match=r"manifest output\(s\) \['confidence'\] are not outputs of the model"
    ):
        run_one(path)


# -- decoding back to source pixels ---------------------------------------------------------------


def test_end_to_end_rows_map_back_through_the_letterbox_with_thresholds_and_max_detections(tmp_path):
    out = rows(
        (100, 60, 200, 140, 0.9, 2),
        (10, 50, 30, 70, 0.3, 1),  # under the config's 0.5
        (0, 40, 50, 90, 0.8, 1),
        (5, 45, 9, 49, 0.7, 85),  # a class id past the labels: kept (published under its number)
    )
    path = brightness_detector(
        str(tmp_path / "m.onnx"), {"output0": still(out)}, metadata={**META, "end2end": "True"}
    )
    xyxy, scores, classes = run_one(path, score_threshold=0.5)
    # 640x480 into 320x320: scale 0.5, 40 px bars above and below.
    assert classes.tolist() == [2, 1, 85]
    np.testing.assert_allclose(xyxy, [[200, 40, 400, 200], [0, 0, 100, 100], [10, 10, 18, 18]])
    assert scores.tolist() == pytest.approx([0.9, 0.8, 0.7])
    _, scores, _ = run_one(path, score_threshold=0.5, max_detections=1)
    assert scores.tolist() == pytest.approx([0.9])


@pytest.mark.parametrize("topk", [True, False], ids=["topk-rows", "class-scores"])
def test_rtdetr_boxes_are_normalised_and_the_frame_is_stretched(tmp_path, topk):
    if topk:  # Ultralytics 8.4: cx, cy, w, h (0..1), score, class id
        out = np.array([[[0.5, 0.5, 0.25, 0.5, 0.9, 2], [0.1, 0.1, 0.1, 0.1, 0.2, 1]]], np.float32)
    else:  # older exports: cx, cy, w, h, then one sigmoid score per class
        out = np.array(
            [[[0.5, 0.5, 0.25, 0.5, 0.0, 0.1, 0.9], [0.1, 0.1, 0.1, 0.1, 0.2, 0.0, 0.0]]], np.float32
        )
    names = repr({0: "a", 1: "b", 2: "c"})
    path = brightness_detector(
        str(tmp_path / "m.onnx"), {"output0": still(out)}, metadata={"names": names, "head": "RTDETRDecoder"}
    )
    xyxy, scores, classes = run_one(path)
    # Input box (120, 80, 200, 240); the frame filled the input: x / 0.5, y / (320 / 480).
    np.testing.assert_allclose(xyxy, [[240, 120, 400, 360]], rtol=1e-5)
    assert classes.tolist() == [2] and scores.tolist() == pytest.approx([0.9])


def test_efficient_nms_reads_only_num_dets_rows(tmp_path):
    outs = nms_outputs(2, [[100, 60, 200, 140], [0, 40, 50, 90]], [0.6, 0.9], [3, 1])
    path = brightness_detector(str(tmp_path / "m.onnx"), outs)
    xyxy, scores, classes = run_one(path)
    assert classes.tolist() == [1, 3], "best first; the padding rows (score 0.99) are not read"
    assert scores.tolist() == pytest.approx([0.9, 0.6])
    np.testing.assert_allclose(xyxy, [[0, 0, 100, 100], [200, 40, 400, 200]])


# -- batches --------------------------------------------------------------------------------------


def _moving(fmt: str) -> tuple[dict, dict]:
    """Per format, outputs whose box x, score and (for EfficientNMS) class follow the frame."""
    move = np.zeros((1, 8, 6), np.float32)
    move[0, 0, [0, 2]] = 100.0  # x1, x2 shift with brightness
    move[0, 0, 4] = -0.5
    base = rows((50, 60, 150, 140, 0.95, 2), (0, 40, 50, 90, 0.8, 1))
    if fmt == "rtdetr":
        base, move = base / [320, 320, 320, 320, 1, 1], move / [320, 320, 320, 320, 1, 1]
        base[..., :4] = [[[0.3, 0.4, 0.2, 0.1]] * 8]  # cx, cy, w, h
        return {"output0": (base.astype(np.float32), move.astype(np.float32), F)}, {"head": "RTDETRDecoder"}
    if fmt == "efficient_nms":
        outs = nms_outputs(2, [[50, 60, 150, 140], [0, 40, 50, 90]], [0.95, 0.8], [2, 1])
        box_move = np.zeros((1, 6, 4), np.float32)
        box_move[0, 0, [0, 2]] = 100.0
        cls_move = np.zeros((1, 6), np.float32)
        cls_move[0, 1] = 3.99  # class 1 + floor(3.99 m): the class follows the frame too
        outs["num_dets"] = (np.array([[1.0]], np.float32), np.array([[2.5]], np.float32), I32)  # 1, 2, 3 rows
        outs["det_boxes"] = (outs["det_boxes"][0], box_move, F)
        outs["det_classes"] = (outs["det_classes"][0], cls_move, I32)
        return outs, {}
    return {"output0": (base, move, F)}, {"end2end": "True"}


@pytest.mark.parametrize("fmt", ["end2end", "rtdetr", "efficient_nms"])
def test_a_batch_of_frames_decodes_as_each_frame_alone(tmp_path, fmt):
    outputs, meta = _moving(fmt)
    path = brightness_detector(str(tmp_path / "m.onnx"), outputs, metadata={**META, **meta})
    model = load_model(ModelConfig(path=path, input_adapter="off"), OnnxRuntimeConfig())
    assert model.decode.name == fmt
    profile = Profile("m", model)
    pool = profile.pool("cam")
    profile.prepare_batches(3)
    slots = [pool.acquire(1.0) for _ in range(3)]
    alone = []
    for value, slot in zip((20, 130, 250), slots):
        model.preprocessor(frame(value), slot.tensor, slot.geo)
        profile.infer([slot])
        alone.append(model.decode(slot.io.outputs, model.params))
        for out in slot.io.outputs:
            out[:] = 0
    profile.infer(slots)
    assert len(profile.batches[3].outputs) == len(outputs)
    for slot, want in zip(slots, alone):
        got = model.decode(slot.io.outputs, model.params)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    assert alone[0][0][0, 0] != alone[2][0][0, 0], "the frames' boxes differ, so a mix-up would show"
    if fmt == "efficient_nms":
        assert [len(a[1]) for a in alone] == [1, 2, 3], "num_dets follows the frame too"
    model.backend.close()


def test_an_efficient_nms_model_publishes_its_detections(tmp_path):
    outs = nms_outputs(
        3, [[100, 60, 200, 140], [0, 40, 50, 90], [10, 50, 20, 60]], [0.6, 0.9, 0.5], [3, 1, 85]
    )
    path = brightness_detector(str(tmp_path / "m.onnx"), outs)
    frames = tmp_path / "frames"
    frames.mkdir()
    import cv2

    cv2.imwrite(str(frames / "a.png"), frame(90))
    endpoint = "ipc://" + str(tmp_path / "results")
    cfg = AgentConfig(
        source=ImageFolderSourceConfig(path=str(frames), name="cam", max_fps=50.0, loop=True),
        model=ModelConfig(path=path, input_adapter="off"),
        publish=PublishConfig(endpoint=endpoint),
        metrics=MetricsConfig(enabled=False),
    )
    sub = Subscriber(endpoint, "det")
    agent = Agent(cfg)
    agent.build()
    with started(agent, sub):
        wait_until(lambda: len(sub.messages) >= 3, 20, message="three results")
    dets = sub.messages[-1]["detections"]
    # No names in the model: class0..class79; an id past them is published under its number.
    assert [(d["label"], d["class_id"]) for d in dets] == [("class1", 1), ("class3", 3), ("85", 85)]
    assert dets[1]["box_xyxy"] == pytest.approx([200, 40, 400, 200])


# -- TensorRT: the same decoders on the engine's tensors ----------------------------------------


def test_tensorrt_loads_an_efficient_nms_plugin_graph_and_decodes_its_int32_tensors(tmp_path, monkeypatch):
    path = efficient_nms_plugin_graph(tmp_path / "plugin.onnx")
    calls: list = []
    cuda = FakeCudaDriver(calls)
    trt = FakeTensorRT(calls=calls, cuda=cuda)
    swap_backend(monkeypatch, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=(trt, cuda)))
    loaded = load_model(ModelConfig(path=str(path)), TensorRTConfig(cache_dir=str(tmp_path / "engines")))
    names = [n for n, _ in calls]
    assert names.index("init_libnvinfer_plugins") < names.index("OnnxParser.parse_from_file"), "plugins first"
    dtypes = {t.name: t.dtype for t in loaded.backend.outputs}
    assert dtypes == {
        "num_dets": np.int32,
        "det_boxes": np.float32,
        "det_scores": np.float32,
        "det_classes": np.int32,
    }
    assert loaded.decode.name == "efficient_nms"
    io = loaded.backend.allocate()
    loaded.backend.infer(io)
    # What the plugin writes (the fake engine computes nothing): 2 detections, then padding.
    num, boxes, scores, classes = (io.outputs[i] for i in loaded.decode.outputs)
    assert num.dtype == classes.dtype == np.int32
    num[...] = 2
    boxes[0, :3] = [[1, 2, 11, 12], [3, 4, 13, 14], [5, 5, 6, 6]]
    scores[0, :3] = [0.5, 0.9, 0.95]
    classes[0, :3] = [3, 1, 0]
    xyxy, got, ids, _ = loaded.decode(io.outputs, loaded.params)
    assert ids.tolist() == [1, 3] and got.tolist() == pytest.approx([0.9, 0.5])
    np.testing.assert_array_equal(xyxy, [[3, 4, 13, 14], [1, 2, 11, 12]])
    loaded.backend.close()


def test_without_registered_plugins_the_parser_names_the_plugin(tmp_path):
    """The fake mirrors the real parser: a plugin op with no registered creator fails the
    parse (the backend registers the plugins first; this shows the fake would catch it)."""
    from fakes.fake_tensorrt import FakeOnnxParser

    trt = FakeTensorRT()
    parser = FakeOnnxParser(trt, trt.Builder(None).create_network(0), None)
    assert not parser.parse_from_file(str(efficient_nms_plugin_graph(tmp_path / "plugin.onnx")))
    assert "EfficientNMS_TRT" in parser.get_error(0).desc()


def test_onnx_runtime_refuses_the_efficient_nms_plugin_saying_which_backend_runs_it(tmp_path):
    path = efficient_nms_plugin_graph(tmp_path / "plugin.onnx")
    with pytest.raises(RuntimeError, match="EfficientNMS_TRT plugin, which only the tensorrt backend runs"):
        load_model(ModelConfig(path=str(path), input_adapter="off"), OnnxRuntimeConfig())
    assert resolve_model(str(path)).manifest.output.decoder == "efficient_nms"
    # Without a manifest the rules read the plugin graph with onnx, not ONNX Runtime.
    path.with_suffix(".yaml").unlink()
    assert resolve_model(str(path)).manifest.output.names() == (
        "num_dets",
        "det_boxes",
        "det_scores",
        "det_classes",
    )
    r = run_process(agent_command("models", "check", str(path)), 120)
    assert r.returncode == 2 and "refused:" in r.stdout and "only the tensorrt backend runs" in r.stdout


# -- edge-agent models check -----------------------------------------------------------------------


def test_models_check_prints_what_it_decided_runs_the_model_and_writes_the_manifest(tmp_path):
    path = brightness_detector(
        str(tmp_path / "yolo26.onnx"), {"output0": still(E2E)}, metadata={**META, "end2end": "True"}
    )
    r = run_process(agent_command("models", "check", path, "--frames", "3", "--write-manifest"), 120)
    assert r.returncode == 0, r.stderr
    said = dict(line.split(None, 1) for line in r.stdout.splitlines() if line.split(None, 1)[0] != "assumed")
    assert said["decoder"] == "end2end: reads output0 [None, 8, 6] float32"
    assert "chosen by metadata end2end=True" in r.stdout
    assert "3 synthetic frames: 1.0 detections per frame" in r.stdout
    written = tmp_path / "yolo26.yaml"
    assert f"manifest written: {written}" in r.stdout
    # The written manifest is what run reads from now on, and it says the same.
    resolved = resolve_model(path)
    assert resolved.manifest_path == str(written)
    assert resolved.manifest.output.decoder == "end2end" and len(resolved.manifest.labels) == 80
    assert "efficient_nms" not in yaml.safe_load(written.read_text())["output"]
    again = run_process(agent_command("models", "check", path, "--frames", "0", "--write-manifest"), 120)
    assert again.returncode == 2 and "exists: pass --force" in again.stderr


def test_models_check_refuses_a_classification_export_with_exit_2_and_runs_a_segmentation_one(tmp_path):
    path = brightness_detector(
        str(tmp_path / "cls.onnx"),
        {"output0": still(np.zeros((1, 1000), np.float32))},
        metadata={**META, "task": "classify"},
    )
    r = run_process(agent_command("models", "check", path), 120)
    assert r.returncode == 2
    assert (
        "refused:" in r.stdout
        and "a classification model" in r.stdout
        and "scores the whole image" in r.stdout
    )
    outputs = {
        "output0": still(np.zeros((1, 116, 2100), np.float32)),
        "output1": still(np.zeros((1, 32, 80, 80))),
    }
    path = brightness_detector(str(tmp_path / "seg.onnx"), outputs, metadata={**META, "task": "segment"})
    r = run_process(agent_command("models", "check", path, "--frames", "2"), 120)
    assert r.returncode == 0, r.stdout + r.stderr
    decoder = next(ln for ln in r.stdout.splitlines() if ln.startswith("decoder"))
    assert ("yolov8_seg" in decoder and "['output0', 'output1']" in decoder) or "output1" in decoder, decoder


def test_models_check_says_whether_the_model_fits_the_deadline(tmp_path):
    """The same verdict ``run`` logs at start: fits the config's budget, or the figures and
    the choices when it cannot (here a budget far below any inference)."""
    path = brightness_detector(
        str(tmp_path / "yolo26.onnx"), {"output0": still(E2E)}, metadata={**META, "end2end": "True"}
    )
    env = {**os.environ, "EDGE_AGENT__DEADLINE__BUDGET_MS": "0.001"}
    tight = run_process(agent_command("models", "check", path, "--frames", "3"), 120, env=env)
    assert tight.returncode == 0, tight.stderr
    line = next(ln for ln in tight.stdout.splitlines() if ln.startswith("deadline"))
    assert "this model: inference takes" in line and "over the 0.001 ms budget" in line, line
    assert "--budget-ms" in line and "deadline.ladder" in line
    assert tight.stdout.rstrip().endswith("runs this model, but not within the deadline (above)")
    roomy = run_process(agent_command("models", "check", path, "--frames", "3"), 120)
    said = [ln.split(None, 1) for ln in roomy.stdout.splitlines()]
    assert ["deadline", "fits the 50 ms budget"] in said, roomy.stdout
    assert roomy.stdout.rstrip().endswith("ok: the agent runs this model")
