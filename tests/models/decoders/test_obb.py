"""The oriented-box decoders: YOLOv8/YOLO11's classic head ``[B, 4+C+1, A]`` (angle last,
rotated NMS here) and the end-to-end head ``[B, N, 7]`` (models/decoders/obb.py), the rotated
geometry and NMS they share (models/decoders/rotated.py), and how an OBB ONNX is recognised."""

from __future__ import annotations

import math

import numpy as np
import pytest
from decoder_checks import P, check_types

from edge_agent.models import onnx_info
from edge_agent.models.decoders import registry
from edge_agent.models.decoders.base import DecodeParams, OutputMismatch
from edge_agent.models.decoders.nms import MAX_CANDIDATES
from edge_agent.models.decoders.obb import End2EndObb, YoloV8Obb
from edge_agent.models.decoders.recognition import Tensor
from edge_agent.models.decoders.rotated import CLASS_OFFSET, bounds, corners, probiou, rotated_nms


def classic(rows: list[tuple], classes: int, anchors: int = 64) -> np.ndarray:
    """[1, 4 + C + 1, A]: each row (cx, cy, w, h, {class: score}, angle) fills one anchor."""
    out = np.zeros((1, 4 + classes + 1, anchors), np.float32)
    for i, (cx, cy, w, h, cls, angle) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        for c, s in cls.items():
            out[0, 4 + c, i] = s
        out[0, -1, i] = angle
    return out


def fitted(t: np.ndarray, labels: int) -> YoloV8Obb:
    return YoloV8Obb().fit([t.shape], labels)


def ref_probiou(b1: np.ndarray, b2: np.ndarray, eps: float = 1e-7) -> np.ndarray:
    """Ultralytics' ``batch_probiou`` written out in float64, one pair at a time."""

    def cov(b):
        a, d = b[2] ** 2 / 12, b[3] ** 2 / 12
        c, s = math.cos(b[4]), math.sin(b[4])
        return a * c * c + d * s * s, a * s * s + d * c * c, (a - d) * c * s

    out = np.zeros((len(b1), len(b2)))
    for i, p in enumerate(b1.astype(np.float64)):
        for j, q in enumerate(b2.astype(np.float64)):
            a1, bb1, c1 = cov(p)
            a2, bb2, c2 = cov(q)
            den = (a1 + a2) * (bb1 + bb2) - (c1 + c2) ** 2
            t1 = ((a1 + a2) * (p[1] - q[1]) ** 2 + (bb1 + bb2) * (p[0] - q[0]) ** 2) / (den + eps) * 0.25
            t2 = ((c1 + c2) * (q[0] - p[0]) * (p[1] - q[1])) / (den + eps) * 0.5
            dets = max(a1 * bb1 - c1 * c1, 0) * max(a2 * bb2 - c2 * c2, 0)
            t3 = math.log(den / (4 * math.sqrt(dets) + eps) + eps) * 0.5
            bd = min(max(t1 + t2 + t3, eps), 100.0)
            out[i, j] = 1 - math.sqrt(1 - math.exp(-bd) + eps)
    return out


# -- the geometry -------------------------------------------------------------------------------


def random_boxes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack(
        [
            rng.uniform(0, 640, n),
            rng.uniform(0, 640, n),
            rng.uniform(2, 200, n),
            rng.uniform(2, 200, n),
            rng.uniform(-math.pi, math.pi, n),
        ],
        axis=1,
    ).astype(np.float32)


def test_corners_are_ultralytics_order_for_an_upright_box():
    c = corners(np.array([[100, 50, 40, 20, 0]], np.float32))
    np.testing.assert_allclose(c[0], [[120, 60], [120, 40], [80, 40], [80, 60]])


def test_corners_of_a_turned_box():
    c = corners(np.array([[0, 0, 4, 2, math.pi / 2]], np.float32))
    np.testing.assert_allclose(c[0], [[-1, 2], [1, 2], [1, -2], [-1, -2]], atol=1e-6)


def test_bounds_are_the_extremes_of_the_corners():
    boxes = random_boxes(200, 1)
    c = corners(boxes)
    want = np.concatenate((c.min(axis=1), c.max(axis=1)), axis=1)
    got = bounds(boxes)
    assert got.dtype == np.float32 and got.shape == (200, 4)
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_probiou_of_a_box_with_itself_is_one_and_of_far_boxes_zero():
    boxes = random_boxes(50, 2)
    same = probiou(boxes, boxes)
    assert same.dtype == np.float32 and same.shape == (50, 50)
    np.testing.assert_allclose(np.diag(same), 1.0, atol=1e-3)
    far = boxes.copy()
    far[:, :2] += 5000
    np.testing.assert_allclose(probiou(boxes, far), 0.0, atol=1e-6)


def test_probiou_is_symmetric_and_matches_ultralytics_formula():
    a, b = random_boxes(20, 3), random_boxes(30, 4)
    b[:10, :2] = a[:10, :2] + 5  # some near pairs
    got = probiou(a, b)
    np.testing.assert_allclose(got, probiou(b, a).T, atol=1e-5)
    np.testing.assert_allclose(got, ref_probiou(a, b), atol=2e-4)


def test_probiou_does_not_tell_a_box_from_itself_turned_a_quarter_with_sides_swapped():
    a = np.array([[100, 100, 60, 20, 0.3]], np.float32)
    b = np.array([[100, 100, 20, 60, 0.3 + math.pi / 2]], np.float32)
    c = np.array([[100, 100, 60, 20, 0.3 + math.pi]], np.float32)
    assert probiou(a, b)[0, 0] == pytest.approx(1.0, abs=1e-3)
    assert probiou(a, c)[0, 0] == pytest.approx(1.0, abs=1e-3)
    turned = np.array([[100, 100, 60, 20, 0.3 + math.pi / 2]], np.float32)
    assert probiou(a, turned)[0, 0] < 0.6


# -- rotated NMS: Ultralytics' fast rule --------------------------------------------------------

# 20x20 upright boxes 6 px apart overlap by probiou 0.64; 12 px apart by 0.35 (threshold 0.45).
A = (100, 100, 20, 20, 0.0)
B = (106, 100, 20, 20, 0.0)
C = (112, 100, 20, 20, 0.0)


def test_the_chain_is_what_the_rule_needs():
    iou = probiou(np.array([A, B, C], np.float32), np.array([A, B, C], np.float32))
    assert iou[0, 1] > 0.45 and iou[1, 2] > 0.45 and iou[0, 2] < 0.45


def test_fast_nms_drops_a_box_overlapping_a_dropped_one():
    """A > B > C; B overlaps A, C overlaps only B. Greedy NMS would keep A and C (B, the
    only one over C, was dropped); Ultralytics' fast NMS drops C too."""
    boxes = np.array([C, A, B], np.float32)
    scores = np.array([0.7, 0.9, 0.8], np.float32)
    keep = rotated_nms(boxes, scores, np.zeros(3, np.int64), 0.45)
    assert keep.tolist() == [1]


def test_fast_nms_keeps_boxes_under_the_threshold_best_first():
    boxes = np.array([C, A], np.float32)
    keep = rotated_nms(boxes, np.array([0.7, 0.9], np.float32), np.zeros(2, np.int64), 0.45)
    assert keep.tolist() == [1, 0]
    assert rotated_nms(boxes[:0], np.zeros(0, np.float32), np.zeros(0, np.int64), 0.45).tolist() == []


def test_fast_nms_is_class_aware():
    """B in another class drops nothing of A's and C's class, and A and C are under the
    threshold: all three are kept."""
    boxes = np.array([A, B, C], np.float32)
    scores = np.array([0.9, 0.8, 0.7], np.float32)
    assert rotated_nms(boxes, scores, np.array([0, 1, 0]), 0.45).tolist() == [0, 1, 2]
    same = np.array([A, A], np.float32)
    assert rotated_nms(same, scores[:2], np.array([3, 5]), 0.45).tolist() == [0, 1]
    assert rotated_nms(same, scores[:2], np.array([5, 5]), 0.45).tolist() == [0]
    assert CLASS_OFFSET == 7680.0


def test_fast_nms_threshold_is_read():
    boxes = np.array([A, C], np.float32)  # probiou 0.35
    scores = np.array([0.9, 0.8], np.float32)
    assert len(rotated_nms(boxes, scores, np.zeros(2, np.int64), 0.3)) == 1
    assert len(rotated_nms(boxes, scores, np.zeros(2, np.int64), 0.4)) == 2


# -- the classic head ---------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False])
def test_classic_reads_the_angle_after_the_class_scores(batched):
    t = classic(
        [
            (100, 80, 40, 20, {2: 0.9}, 0.5),
            (300, 200, 10, 30, {0: 0.3, 1: 0.6}, -0.25),
            (500, 500, 10, 10, {0: 0.1}, 1.0),  # under the threshold
        ],
        3,
    )
    d = fitted(t, 3)
    xyxy, scores, classes, extra = found = d.decode((t if batched else t[0],), P)
    check_types(found, 2)
    np.testing.assert_allclose(scores, [0.9, 0.6], rtol=1e-6)
    assert classes.tolist() == [2, 1]
    assert extra.dtype == np.float32 and extra.shape == (2, 5) == (2, d.extra_width())
    np.testing.assert_allclose(extra, [[100, 80, 40, 20, 0.5], [300, 200, 10, 30, -0.25]])
    np.testing.assert_allclose(xyxy, bounds(extra), atol=1e-4)


def test_classic_with_and_without_the_batch_axis_agree():
    t = classic([(100, 80, 40, 20, {0: 0.9}, 0.3), (50, 50, 8, 8, {0: 0.5}, 1.2)], 1)
    d = fitted(t, 1)
    for a, b in zip(d.decode((t,), P), d.decode((t[0],), P)):
        np.testing.assert_array_equal(a, b)


def test_classic_runs_the_fast_rule_per_class():
    rows = [(*C[:4], {0: 0.7}, 0.0), (*A[:4], {0: 0.9}, 0.0), (*B[:4], {0: 0.8}, 0.0)]
    d = fitted(classic(rows, 2), 2)
    _, scores, _, extra = d.decode((classic(rows, 2),), P)
    assert scores.tolist() == pytest.approx([0.9]) and extra[0, 0] == 100
    rows[2] = (*B[:4], {1: 0.8}, 0.0)  # B of the other class
    _, scores, classes, extra = d.decode((classic(rows, 2),), P)
    assert classes.tolist() == [0, 1, 0]
    np.testing.assert_allclose(extra[:, 0], [100, 106, 112])


def test_rotated_boxes_travel_with_their_detection_through_nms():
    rng = np.random.default_rng(5)
    n = 40
    scores = rng.permutation(np.linspace(0.3, 0.95, n)).astype(np.float32)
    rows = []
    for i in range(n):
        cluster = i % 4
        angle = 0.1 * i
        rows.append(
            (100 + 150 * cluster + (i % 7), 200 + (i % 5), 80 + i, 30, {cluster % 2: float(scores[i])}, angle)
        )
    t = classic(rows, 2)
    xyxy, got, classes, extra = fitted(t, 2).decode((t,), P)
    assert 0 < len(got) < n
    for box, s, c, e in zip(xyxy, got, classes, extra):
        i = int(np.flatnonzero(scores == s)[0])
        cx, cy, w, h, _, angle = rows[i]
        assert c == (i % 4) % 2
        np.testing.assert_allclose(e, [cx, cy, w, h, angle], rtol=1e-6)
        np.testing.assert_allclose(box, bounds(e[None])[0], atol=1e-4)


def test_classic_max_candidates_and_max_detections():
    n = MAX_CANDIDATES + 100
    rng = np.random.default_rng(9)
    scores = rng.permutation(np.linspace(0.3, 0.99, n)).astype(np.float32)
    rows = [(8 + 16 * (i % 64), 8 + 16 * (i // 64), 10, 10, {0: float(scores[i])}, i / n) for i in range(n)]
    t = classic(rows, 1, anchors=n + 10)
    d = fitted(t, 1)
    _, got, _, extra = d.decode((t,), DecodeParams(0.25, 0.45, 10_000))
    assert len(got) == MAX_CANDIDATES
    np.testing.assert_allclose(got, np.sort(scores)[::-1][:MAX_CANDIDATES], rtol=1e-6)
    for s, e in zip(got[:100], extra[:100]):
        i = int(np.flatnonzero(scores == s)[0])
        np.testing.assert_allclose(e, [8 + 16 * (i % 64), 8 + 16 * (i // 64), 10, 10, i / n], rtol=1e-6)
    _, got, _, _ = d.decode((t,), DecodeParams(0.25, 0.45, 7))
    np.testing.assert_allclose(got, np.sort(scores)[::-1][:7], rtol=1e-6)


@pytest.mark.parametrize(("score", "kept"), [(0.9, True), (0.26, True), (0.25, False), (0.1, False)])
def test_classic_score_threshold(score, kept):
    t = classic([(100, 100, 20, 20, {0: score}, 0.2)], 1)
    check_types(fitted(t, 1).decode((t,), P), 1 if kept else 0)


def test_classic_empty():
    t = classic([], 2)
    found = fitted(t, 2).decode((t,), P)
    check_types(found, 0)
    assert found.extra.shape == (0, 5)


# -- the end-to-end head ------------------------------------------------------------------------


def e2e(rows: list[tuple], n: int = 300) -> np.ndarray:
    out = np.zeros((1, n, 7), np.float32)
    if rows:
        out[0, : len(rows)] = rows
    return out


@pytest.mark.parametrize("batched", [True, False])
def test_end_to_end_reads_the_angle_from_column_six(batched):
    t = e2e(
        [
            (100, 80, 40, 20, 0.6, 2, 0.5),
            (102, 82, 40, 20, 0.9, 2, 0.45),  # overlaps the first: no NMS here, both stay
            (300, 300, 10, 10, 0.2, 0, 0.0),  # under the threshold
            (400, 200, 60, 10, 0.75, 7, -1.0),
        ]
    )
    d = End2EndObb().fit([t.shape], 8)
    xyxy, scores, classes, extra = found = d.decode((t if batched else t[0],), P)
    check_types(found, 3)
    np.testing.assert_allclose(scores, [0.9, 0.75, 0.6])
    assert classes.tolist() == [2, 7, 2]
    np.testing.assert_allclose(
        extra, [[102, 82, 40, 20, 0.45], [400, 200, 60, 10, -1.0], [100, 80, 40, 20, 0.5]], rtol=1e-6
    )
    np.testing.assert_allclose(xyxy, bounds(extra), atol=1e-4)
    assert extra.dtype == np.float32


def test_end_to_end_max_detections():
    rows = [(10 * i, 10, 5, 5, 0.3 + i / 1000, 0, i / 100) for i in range(50)]
    d = End2EndObb().fit([(1, 300, 7)], 1)
    _, scores, _, extra = d.decode((e2e(rows),), DecodeParams(0.25, 0.45, 4))
    np.testing.assert_allclose(scores, [0.349, 0.348, 0.347, 0.346], rtol=1e-6)
    np.testing.assert_allclose(extra[:, 4], [0.49, 0.48, 0.47, 0.46], rtol=1e-6)
    assert [len(a) for a in d.decode((e2e([]),), P)] == [0, 0, 0, 0]


# -- fit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decoder", "shape", "labels"),
    [
        (YoloV8Obb(), (1, 4 + 15 + 1, 21504), 15),  # DOTA
        (YoloV8Obb(), (None, 4 + 80 + 1, None), 80),
        (End2EndObb(), (1, 300, 7), 15),
        (End2EndObb(), (None, None, 7), 80),
    ],
)
def test_fit_reads_the_classes(decoder, shape, labels):
    d = decoder.fit([shape], labels)
    assert d.classes == labels and d.extra_width() == 5 and type(d) is type(decoder)


@pytest.mark.parametrize(
    ("decoder", "shape", "needs"),
    [
        (YoloV8Obb(), (1, 4 + 15 + 2, 21504), "1 angle value after the class scores, not 2"),
        (YoloV8Obb(), (1, 4 + 15, 21504), "4 \\+ 15 labels \\+ the obb values on axis 1"),
        (YoloV8Obb(), (20, 21504), "3 axes"),
        (End2EndObb(), (1, 300, 8), "1 angle value after score and class, not 2"),
        (End2EndObb(), (1, 300, 6), "6 \\+ the obb values on axis 2"),
    ],
)
def test_fit_refuses_other_shapes(decoder, shape, needs):
    with pytest.raises(OutputMismatch, match=needs):
        decoder.fit([shape], 15)


def test_both_are_registered_as_obb():
    assert registry.get("yolov8_obb").task == registry.get("end2end_obb").task == "obb"
    assert registry.get("yolov8_obb").nms_in_model is False
    assert registry.get("end2end_obb").nms_in_model is True


# -- recognising an OBB ONNX without a manifest -------------------------------------------------


def info(outputs: list[Tensor], size: int = 1024, **meta: str) -> onnx_info.OnnxInfo:
    return onnx_info.OnnxInfo(
        inputs=(Tensor("images", (1, 3, size, size), "float32"),),
        outputs=tuple(outputs),
        metadata=dict(meta),
        ops=frozenset({"Conv"}),
    )


def test_choose_picks_the_classic_obb_head():
    c = onnx_info.choose(info([Tensor("output0", (1, 20, 21504), "float32")], task="obb"), 15, 1024, 1024)
    assert (c.decoder, c.outputs) == ("yolov8_obb", ("output0",))
    assert "21504" in c.rule


def test_choose_picks_the_end_to_end_obb_head():
    out = Tensor("output0", (1, 300, 7), "float32")
    c = onnx_info.choose(info([out], task="obb", end2end="True"), 15, 1024, 1024)
    assert (c.decoder, c.outputs) == ("end2end_obb", ("output0",))
    assert "end2end" in c.rule


def test_choose_refuses_a_classic_obb_output_with_two_trailing_values():
    i = info([Tensor("output0", (1, 21, 21504), "float32")], task="obb")
    with pytest.raises(onnx_info.UnsupportedModel, match="fits no decoder of task 'obb'"):
        onnx_info.choose(i, 15, 1024, 1024)


def test_choose_refuses_a_classification_model_with_its_reason():
    i = info([Tensor("output0", (1, 1000), "float32")], 224, task="classify")
    with pytest.raises(onnx_info.UnsupportedModel, match=r"a classification model .*task='classify'"):
        onnx_info.choose(i, 1000, 224, 224)
