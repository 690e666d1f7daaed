"""The input adapter: a float NCHW model's copy that takes the letterboxed uint8 BGR frame.

The model under test is the bundled (trained) detector re-exported the way Ultralytics
exports models (float RGB 0..1, NCHW), so its detections on the synthetic scenes are real.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.models import adapter
from edge_agent.models.testmodels import float_nchw_detector
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.preprocess import Letterbox, Preprocessor
from edge_agent.pipelines.sources.synthetic import SceneSpec, SyntheticScene

BACKEND = OnnxRuntimeConfig(intra_op_threads=1, allow_spinning=False)


@pytest.fixture(scope="module")
def float_model(tmp_path_factory) -> Path:
    return float_nchw_detector(str(tmp_path_factory.mktemp("float-det")))


def _scenes(n: int) -> list[np.ndarray]:
    spec = SceneSpec(seed=1234)
    scene = SyntheticScene(spec)
    gt = np.zeros((spec.num_objects, 6), np.float32)
    frames = []
    for i in range(n):
        img = np.empty((spec.height, spec.width, 3), np.uint8)
        scene.render(i * 5, img, gt)
        frames.append(img)
    return frames


def _sha(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def test_the_adapted_graph_computes_what_the_original_does(float_model, tmp_path):
    from edge_agent.models.manifest import resolve_model

    fmt = resolve_model(str(float_model)).manifest.input.format()
    before = _sha(float_model)
    adapted = adapter.adapt(str(float_model), fmt, str(tmp_path / "cache"))
    assert _sha(float_model) == before, "the original model must never be modified"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    original = ort.InferenceSession(str(float_model), opts, providers=["CPUExecutionProvider"])
    copy = ort.InferenceSession(adapted, opts, providers=["CPUExecutionProvider"])
    (inp,) = copy.get_inputs()
    assert inp.type == "tensor(uint8)" and inp.shape[1:] == [320, 320, 3]
    numpy_pre = Preprocessor(fmt)
    direct_pre = Preprocessor(adapter.host_format(fmt))
    assert direct_pre.direct, "the adapted model must take the letterboxed frame as it is"
    x_float = np.zeros((1, 3, 320, 320), np.float32)
    x_u8 = np.zeros((1, 320, 320, 3), np.uint8)
    geo = Letterbox()
    for frame in _scenes(4):
        numpy_pre(frame, x_float, geo)
        direct_pre(frame, x_u8, geo)
        want = original.run(None, {"images": x_float})[0]
        got = copy.run(None, {"images": x_u8})[0]
        assert want.shape == got.shape
        assert want[0, 4:].max() > 0.5, "the scene must give the detector something to find"
        np.testing.assert_allclose(got[0, :4], want[0, :4], atol=0.05)  # boxes, input pixels
        np.testing.assert_allclose(got[0, 4:], want[0, 4:], atol=1e-4)  # class scores


def test_the_agent_detects_the_same_with_and_without_the_adapter(float_model, tmp_path):
    model = ModelConfig(path=str(float_model), cache_dir=str(tmp_path / "cache"))
    on = load_model(model, BACKEND)
    off = load_model(replace(model, input_adapter="off"), BACKEND)
    try:
        assert on.adapted_from == str(float_model) and off.adapted_from == ""
        assert on.preprocessor.direct and not off.preprocessor.direct
        io_on, io_off = on.backend.allocate(), off.backend.allocate()
        geo = Letterbox()
        total = 0
        for frame in _scenes(12):
            a = [x.copy() for x in on.run_one(frame, io_on, geo)[:3]]
            b = [x.copy() for x in off.run_one(frame, io_off, geo)[:3]]
            assert len(a[0]) == len(b[0])
            total += len(a[0])
            np.testing.assert_array_equal(a[2], b[2])
            np.testing.assert_allclose(a[1], b[1], atol=1e-3)
            for box_a, box_b in zip(a[0], b[0]):
                assert _iou(box_a, box_b) >= 0.99
        assert total >= 12, "the scenes hold objects: the detector must find them"
    finally:
        on.backend.close()
        off.backend.close()


def test_the_copy_is_cached_by_model_hash_and_rebuilt_when_the_model_changes(float_model, tmp_path):
    cache = tmp_path / "cache"
    model = ModelConfig(path=str(float_model), cache_dir=str(cache))
    first = load_model(model, BACKEND)
    first.backend.close()
    (copy,) = cache.iterdir()
    stamp = copy.stat().st_mtime_ns
    again = load_model(model, BACKEND)
    again.backend.close()
    assert list(cache.iterdir()) == [copy] and copy.stat().st_mtime_ns == stamp, "reused, not rewritten"

    changed = tmp_path / "changed" / "model.onnx"
    changed.parent.mkdir()
    m = onnx.load(str(float_model))
    m.doc_string = "another export"
    onnx.save(m, str(changed))
    (changed.parent / "manifest.yaml").write_text((float_model.parent / "manifest.yaml").read_text())
    other = load_model(replace(model, path=str(changed)), BACKEND)
    other.backend.close()
    assert len(list(cache.iterdir())) == 2, "a changed model gets its own copy"
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_off_and_uint8_models_run_unchanged(float_model, tmp_path):
    cache = tmp_path / "cache"
    off = load_model(ModelConfig(path=str(float_model), cache_dir=str(cache), input_adapter="off"), BACKEND)
    bundled = load_model(ModelConfig(cache_dir=str(cache)), BACKEND)
    off.backend.close()
    bundled.backend.close()
    assert off.adapted_from == "" and bundled.adapted_from == ""
    assert not cache.exists(), "nothing is written when nothing is adapted"


def test_a_mean_subtracting_model_keeps_the_numpy_path(float_model, tmp_path, caplog):
    d = tmp_path / "mean"
    d.mkdir()
    (d / "model.onnx").write_bytes(float_model.read_bytes())
    manifest = (float_model.parent / "manifest.yaml").read_text()
    with_mean = manifest.replace("  pad_value: 114", "  pad_value: 114\n  mean: [0.4, 0.4, 0.4]")
    (d / "manifest.yaml").write_text(with_mean)
    with caplog.at_level(logging.INFO, logger="edge_agent.models.adapter"):
        loaded = load_model(ModelConfig(path=str(d / "model.onnx"), cache_dir=str(tmp_path / "c")), BACKEND)
    loaded.backend.close()
    assert loaded.adapted_from == ""
    assert "subtracts a mean" in caplog.text


def test_a_graph_whose_input_feeds_more_than_a_convolution_is_left_alone(float_model, tmp_path, caplog):
    m = onnx.load(str(float_model))
    g = m.graph
    # A second reader of the input: its ReduceMean times zero is added to the output.
    g.node.append(onnx.helper.make_node("ReduceMean", ["images"], ["extra"], keepdims=0))
    g.node.append(onnx.helper.make_node("Mul", ["extra", "zero__t"], ["extra0"]))
    g.initializer.append(onnx.numpy_helper.from_array(np.zeros((1,), np.float32), "zero__t"))
    out = g.output[0].name
    last = next(n for n in g.node if out in n.output)
    last.output[list(last.output).index(out)] = "pre_out"
    g.node.append(onnx.helper.make_node("Add", ["pre_out", "extra0"], [out]))
    d = tmp_path / "two"
    d.mkdir()
    onnx.save(m, str(d / "model.onnx"))
    (d / "manifest.yaml").write_text((float_model.parent / "manifest.yaml").read_text())
    with caplog.at_level(logging.INFO, logger="edge_agent.models.adapter"):
        loaded = load_model(ModelConfig(path=str(d / "model.onnx"), cache_dir=str(tmp_path / "c")), BACKEND)
    loaded.backend.close()
    assert loaded.adapted_from == ""
    assert "not one convolution" in caplog.text


def test_an_unwritable_cache_falls_back_to_the_original(float_model, tmp_path, caplog):
    cache = tmp_path / "not-a-folder"
    cache.write_text("a file where the cache folder should be\n")  # fails for root too
    with caplog.at_level(logging.WARNING, logger="edge_agent.models.adapter"):
        loaded = load_model(ModelConfig(path=str(float_model), cache_dir=str(cache)), BACKEND)
    loaded.backend.close()
    assert loaded.adapted_from == ""
    assert str(cache) in caplog.text and "runs unchanged" in caplog.text
