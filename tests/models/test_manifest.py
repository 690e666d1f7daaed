"""Model manifests, models without one, and models that do not match their manifest."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import LABELS, write_manifest
from onnx import TensorProto

from edge_agent.core.configload import ConfigError
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.models.manifest import ModelError, bundled_model_path, resolve_model
from edge_agent.models.testmodels import constant_detector, yolov5_output, yolov8_output
from edge_agent.pipelines.model import load_model


def test_bundled_model_has_a_valid_manifest():
    resolved = resolve_model("")
    assert resolved.path == bundled_model_path()
    m = resolved.manifest
    assert m.labels == tuple(LABELS)
    assert (m.input.layout, m.input.dtype, m.input.color) == ("NHWC", "uint8", "bgr")
    loaded = load_model(ModelConfig(), OnnxRuntimeConfig())
    assert loaded.input_name == "images"


def test_missing_model_file_is_named(tmp_path):
    with pytest.raises(ModelError, match=r"nope\.onnx"):
        resolve_model(str(tmp_path / "nope.onnx"))


def test_truncated_model_is_refused_with_its_name(tmp_path, const_model):
    bad = tmp_path / "trunc" / "model.onnx"
    bad.parent.mkdir()
    bad.write_bytes(const_model.read_bytes()[:200])
    write_manifest(bad.parent / "manifest.yaml")
    with pytest.raises(RuntimeError, match=r"trunc/model\.onnx"):
        load_model(ModelConfig(path=str(bad)), OnnxRuntimeConfig())


def test_bad_manifest_names_file_line_and_key(tmp_path, const_model):
    (const_model.parent / "manifest.yaml").write_text(
        "name: x\ninput:\n  height: 320\n  layout: NWHC\nlabels: [a]\n"
    )
    with pytest.raises(ConfigError) as e:
        resolve_model(str(const_model))
    (p,) = e.value.problems
    assert (p.line, p.path) == (4, "input.layout"), str(e.value)
    assert p.file.endswith("manifest.yaml")


def test_an_unknown_decoder_is_named_with_the_registered_ones(tmp_path, const_model):
    (const_model.parent / "manifest.yaml").write_text(
        "name: x\ninput: {height: 320, width: 320}\n"
        "output:\n  name: output0\n  decoder: yolov9\nlabels: [a]\n"
    )
    with pytest.raises(ConfigError) as e:
        resolve_model(str(const_model))
    (p,) = e.value.problems
    assert (p.line, p.path) == (5, "output.decoder"), str(e.value)
    assert "unknown decoder 'yolov9' (one of " in str(e.value) and "'yolov8'" in str(e.value)


def test_model_without_manifest_reads_ultralytics_metadata(tmp_path):
    out = yolov8_output([(320, 320, 64, 64)], [1], [0.9], 3, 8400)
    path = constant_detector(
        str(tmp_path / "yolo.onnx"),
        out,
        height=640,
        width=640,
        layout="NCHW",
        dtype=TensorProto.FLOAT,
        metadata={"names": "{0: 'person', 1: 'bicycle', 2: 'car'}", "imgsz": "[640, 640]", "stride": "32"},
    )
    resolved = resolve_model(path)
    m = resolved.manifest
    assert resolved.manifest_path == ""
    assert m.labels == ("person", "bicycle", "car")
    assert (m.input.height, m.input.width, m.input.layout, m.input.dtype) == (640, 640, "NCHW", "float32")
    assert m.output.decoder == "yolov8"
    assert any("labels from metadata" in n for n in resolved.assumptions)
    loaded = load_model(ModelConfig(path=path), OnnxRuntimeConfig())
    io = loaded.backend.allocate()
    from edge_agent.pipelines.preprocess import Letterbox

    xyxy, _, classes, _ = loaded.run_one(np.zeros((480, 640, 3), np.uint8), io, Letterbox())
    assert classes.tolist() == [1]
    np.testing.assert_allclose(xyxy[0], [288, 288, 352, 352])


def test_yolov5_layout_is_recognised_without_manifest(tmp_path):
    out = yolov5_output([(100, 100, 20, 20)], [0], [0.9], [0.9], 2, 6300)
    path = constant_detector(str(tmp_path / "v5.onnx"), out, layout="NCHW", dtype=TensorProto.FLOAT)
    resolved = resolve_model(path)
    assert resolved.manifest.output.decoder == "yolov5"
    assert resolved.manifest.labels == ("class0", "class1")


@pytest.mark.parametrize(
    "manifest, message",
    [
        ("input: {name: images, height: 640, width: 640, layout: NHWC, dtype: uint8, color: bgr}", "shape"),
        ("input: {name: images, height: 320, width: 320, layout: NHWC, dtype: float32}", "uint8"),
        ("input: {name: pixels, height: 320, width: 320, layout: NHWC, dtype: uint8}", "'pixels'"),
        ("input: {name: images, height: 320, width: 320, layout: NCHW, dtype: uint8}", "shape"),
    ],
)
def test_model_that_does_not_match_its_manifest_is_refused(const_model, manifest, message):
    (const_model.parent / "manifest.yaml").write_text(
        f"name: x\n{manifest}\noutput: {{name: output0, decoder: yolov8}}\nlabels: [{', '.join(LABELS)}]\n"
    )
    with pytest.raises(ModelError, match=message) as e:
        load_model(ModelConfig(path=str(const_model)), OnnxRuntimeConfig())
    assert str(const_model) in str(e.value)


def test_label_count_must_match_the_output(const_model):
    (const_model.parent / "manifest.yaml").write_text(
        "name: x\ninput: {name: images, height: 320, width: 320, layout: NHWC, dtype: uint8, color: bgr}\n"
        "output: {name: output0, decoder: yolov8}\nlabels: [a, b, c, d, e, f]\n"
    )
    with pytest.raises(ModelError, match="6 labels"):
        load_model(ModelConfig(path=str(const_model)), OnnxRuntimeConfig())


def test_missing_execution_provider_is_a_clear_error(const_model):
    cfg = OnnxRuntimeConfig(providers=("TensorrtExecutionProvider", "CPUExecutionProvider"))
    with pytest.raises(RuntimeError, match="TensorrtExecutionProvider"):
        load_model(ModelConfig(path=str(const_model)), cfg)
