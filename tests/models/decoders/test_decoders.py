"""The decoder registry, a decoder bound to a model's outputs, and what the NMS decoders
share (models/decoders/registry.py, base.py, nms.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from decoder_checks import P, check_types, decode, v5_tensor, v8_tensor

from edge_agent.models.decoders import registry
from edge_agent.models.decoders.base import BoundDecoder, DecodeParams
from edge_agent.models.decoders.nms import MAX_CANDIDATES
from edge_agent.models.decoders.yolov8 import YoloV8

# -- the registry ------------------------------------------------------------------------------


def test_each_module_registers_its_decoder_by_name():
    found = {d.name: type(d).__module__ for d in registry.registered()}
    for name in ("yolov8", "yolov5", "end2end", "rtdetr", "efficient_nms"):
        assert found[name] == f"edge_agent.models.decoders.{name}"
    assert registry.names() == list(found)
    assert registry.get("rtdetr") is registry.registered()[registry.names().index("rtdetr")]


def test_a_name_registered_twice_is_refused_and_an_unknown_one_is_named():
    with pytest.raises(ValueError, match="'yolov8' is already registered"):
        registry.register(YoloV8())
    with pytest.raises(LookupError, match=r"unknown decoder 'yolo9000' \(one of .*'yolov8'"):
        registry.get("yolo9000")


@pytest.mark.parametrize("decoder", registry.registered(), ids=lambda d: d.name)
def test_every_decoder_says_what_it_reads_and_has_its_own_test(decoder):
    """Adding a decoder is its module and its test: nothing else lists it."""
    assert decoder.layout and isinstance(decoder.nms_in_model, bool)
    assert decoder.resize == "letterbox" or (decoder.resize == "stretch" and decoder.resize_why)
    module = type(decoder).__module__.rsplit(".", 1)[1]
    assert (Path(__file__).parent / f"test_{module}.py").is_file(), f"tests/models/decoders/test_{module}.py"


# -- a decoder bound to the model's outputs ----------------------------------------------------


def test_a_bound_decoder_reads_its_outputs_by_index_in_role_order():
    """EfficientNMS' four outputs may come in any order from the backend: the decoder is
    bound to their indices (the manifest names them)."""
    classes = np.array([[2, 1, 0]], np.int32)
    scores = np.array([[0.9, 0.8, 0.7]], np.float32)
    boxes = np.array([[[0, 0, 10, 10], [5, 5, 20, 20], [1, 1, 2, 2]]], np.float32)
    num = np.array([[2]], np.int32)
    outputs = [classes, boxes, np.zeros(3), num, scores]  # a stray output at 2
    bound = BoundDecoder(registry.get("efficient_nms"), (3, 1, 4, 0))
    xyxy, got, ids, _ = bound(outputs, P)
    assert bound.name == "efficient_nms"
    assert ids.tolist() == [2, 1] and got.tolist() == pytest.approx([0.9, 0.8])
    assert xyxy.tolist() == [[0, 0, 10, 10], [5, 5, 20, 20]]
    single = BoundDecoder(registry.get("end2end"), (1,))
    rows = np.array([[[0, 0, 4, 4, 0.5, 3]]], np.float32)
    assert single([np.zeros(1), rows], P)[2].tolist() == [3]


# -- what the decoders that run NMS here share -------------------------------------------------


def grid_rows(n: int, scores: np.ndarray, v5: bool) -> list[tuple]:
    """n non-overlapping 10x10 boxes on a 16 px grid."""
    rows = []
    for i in range(n):
        cx, cy = 8 + 16 * (i % 64), 8 + 16 * (i // 64)
        rows.append((cx, cy, 10, 10, 1.0, {i % 3: scores[i]}) if v5 else (cx, cy, 10, 10, {i % 3: scores[i]}))
    return rows


@pytest.mark.parametrize("layout", ["yolov8", "yolov5"])
@pytest.mark.parametrize("max_detections", [1, 7, 100])
def test_max_detections_keeps_the_best(layout, max_detections):
    rng = np.random.default_rng(max_detections)
    scores = rng.permutation(np.linspace(0.3, 0.99, 150)).astype(np.float32)
    build = v5_tensor if layout == "yolov5" else v8_tensor
    t = build(grid_rows(150, scores, layout == "yolov5"), 3, anchors=200)
    decoded = decode(layout, t, p=DecodeParams(0.25, 0.45, max_detections))
    check_types(decoded, max_detections)
    np.testing.assert_allclose(decoded[1], np.sort(scores)[::-1][:max_detections], rtol=1e-6)


@pytest.mark.parametrize("layout", ["yolov8", "yolov5"])
def test_more_than_max_candidates_keeps_the_best_scoring(layout):
    n = MAX_CANDIDATES + 476
    rng = np.random.default_rng(3)
    scores = rng.permutation(np.linspace(0.3, 0.99, n)).astype(np.float32)
    build = v5_tensor if layout == "yolov5" else v8_tensor
    t = build(grid_rows(n, scores, layout == "yolov5"), 3, anchors=n + 100)
    xyxy, got, class_ids, _ = decode(layout, t, p=DecodeParams(0.25, 0.45, 10_000))
    assert len(got) == MAX_CANDIDATES
    np.testing.assert_allclose(got, np.sort(scores)[::-1][:MAX_CANDIDATES], rtol=1e-6)
    # Each kept score still carries its own box and class.
    index = {float(s): i for i, s in enumerate(scores)}
    for box, s, c in zip(xyxy[:50], got[:50], class_ids[:50]):
        i = index[float(s)]
        assert c == i % 3
        np.testing.assert_allclose(
            box, [3 + 16 * (i % 64), 3 + 16 * (i // 64), 13 + 16 * (i % 64), 13 + 16 * (i // 64)]
        )


@pytest.mark.parametrize("layout", ["yolov8", "yolov5"])
@pytest.mark.parametrize("batched", [True, False])
def test_no_candidates_gives_empty_arrays(layout, batched):
    t = np.zeros((1, 84, 300), np.float32) if layout == "yolov8" else np.zeros((1, 300, 85), np.float32)
    t[...] = 0.1  # everything below the 0.25 threshold
    decoded = decode(layout, t if batched else t[0])
    check_types(decoded, 0)
    assert decoded[0].shape == (0, 4)
