"""The pose decoders: YOLOv8/YOLO11's classic head ``[B, 4+C+K*D, A]`` and the end-to-end
head ``[B, N, 6+K*D]`` (models/decoders/pose.py), and how a pose ONNX is recognised."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from decoder_checks import P, check_types, e2e_tensor

from edge_agent.models import onnx_info
from edge_agent.models.decoders import registry
from edge_agent.models.decoders.base import DecodeParams, OutputMismatch
from edge_agent.models.decoders.nms import MAX_CANDIDATES
from edge_agent.models.decoders.pose import End2EndPose, YoloV8Pose
from edge_agent.models.decoders.recognition import Tensor


def kpts_for(i: int, k: int = 17, d: int = 3) -> np.ndarray:
    """Keypoint values unique to detection ``i``: a mix-up of rows shows."""
    return (1000.0 * (i + 1) + np.arange(k * d)).astype(np.float32)


def classic(rows: list[tuple], classes: int, k: int = 17, d: int = 3, anchors: int = 64) -> np.ndarray:
    """[1, 4 + C + K*D, A]: each row (cx, cy, w, h, {class: score}, keypoint values) fills one
    anchor, the rest zeros."""
    out = np.zeros((1, 4 + classes + k * d, anchors), np.float32)
    for i, (cx, cy, w, h, cls, kp) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        for c, s in cls.items():
            out[0, 4 + c, i] = s
        out[0, 4 + classes :, i] = kp
    return out


def fitted(shape: tuple, labels: int) -> YoloV8Pose:
    return YoloV8Pose().fit([shape], labels)


# -- the classic head ---------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False])
def test_classic_gives_boxes_scores_classes_and_each_ones_keypoints(batched):
    t = classic(
        [
            (100, 80, 40, 20, {1: 0.9}, kpts_for(0)),
            (300, 200, 10, 30, {0: 0.3, 1: 0.6}, kpts_for(1)),
            (500, 500, 10, 10, {0: 0.1}, kpts_for(2)),  # under the threshold
        ],
        2,
    )
    dec = fitted(t.shape, 2)
    xyxy, scores, classes, extra = found = dec.decode((t if batched else t[0],), P)
    check_types(found, 2)
    np.testing.assert_allclose(xyxy, [[80, 70, 120, 90], [295, 185, 305, 215]])
    np.testing.assert_allclose(scores, [0.9, 0.6], rtol=1e-6)
    assert classes.tolist() == [1, 1]
    assert extra.dtype == np.float32 and extra.shape == (2, 51) == (2, dec.extra_width())
    np.testing.assert_array_equal(extra, [kpts_for(0), kpts_for(1)])


def test_classic_with_and_without_the_batch_axis_agree():
    t = classic([(100, 80, 40, 20, {0: 0.9}, kpts_for(0)), (50, 50, 8, 8, {0: 0.5}, kpts_for(1))], 1)
    dec = fitted(t.shape, 1)
    for a, b in zip(dec.decode((t,), P), dec.decode((t[0],), P)):
        np.testing.assert_array_equal(a, b)


def test_keypoints_travel_with_their_detection_through_nms():
    """Overlapping boxes in a shuffled order: the survivors keep their own keypoints, and the
    suppressed ones' keypoints are nowhere."""
    rng = np.random.default_rng(7)
    scores = rng.permutation(np.linspace(0.3, 0.95, 12)).astype(np.float32)
    rows = []
    for i in range(12):
        cluster = i % 3  # three clusters of four overlapping boxes, one class each
        rows.append((100 + 200 * cluster + i, 100 + i, 60, 60, {cluster: float(scores[i])}, kpts_for(i)))
    t = classic(rows, 3)
    xyxy, got, classes, extra = fitted(t.shape, 3).decode((t,), P)
    assert len(got) == 3, "one survivor per cluster"
    for box, s, c, kp in zip(xyxy, got, classes, extra):
        i = int(np.flatnonzero(scores == s)[0])
        assert scores[i] == max(scores[j] for j in range(12) if j % 3 == i % 3), "the best of its cluster"
        assert c == i % 3
        np.testing.assert_allclose(box, [70 + 200 * (i % 3) + i, 70 + i, 130 + 200 * (i % 3) + i, 130 + i])
        np.testing.assert_array_equal(kp, kpts_for(i))


def test_keypoints_travel_with_their_detection_past_the_candidate_cap():
    """More candidates than MAX_CANDIDATES: the cut keeps each one's keypoints with it."""
    n = MAX_CANDIDATES + 200
    rng = np.random.default_rng(11)
    scores = rng.permutation(np.linspace(0.3, 0.99, n)).astype(np.float32)
    rows = [
        (8 + 16 * (i % 64), 8 + 16 * (i // 64), 10, 10, {0: float(scores[i])}, kpts_for(i, 2, 3))
        for i in range(n)
    ]
    t = classic(rows, 1, k=2, d=3, anchors=n + 10)
    xyxy, got, _, extra = fitted(t.shape, 1).decode((t,), DecodeParams(0.25, 0.45, 10_000))
    assert len(got) == MAX_CANDIDATES
    np.testing.assert_allclose(got, np.sort(scores)[::-1][:MAX_CANDIDATES], rtol=1e-6)
    for s, kp, box in zip(got, extra, xyxy):
        i = int(np.flatnonzero(scores == s)[0])
        np.testing.assert_array_equal(kp, kpts_for(i, 2, 3))
        assert box[0] == 3 + 16 * (i % 64) and box[1] == 3 + 16 * (i // 64)


@pytest.mark.parametrize(("score", "kept"), [(0.9, True), (0.26, True), (0.25, False), (0.24, False)])
def test_classic_score_threshold(score, kept):
    t = classic([(100, 100, 20, 20, {0: score}, kpts_for(0))], 2)
    check_types(fitted(t.shape, 2).decode((t,), P), 1 if kept else 0)


def test_classic_iou_threshold_and_class_awareness():
    t = classic(
        [(100, 100, 40, 40, {0: 0.9}, kpts_for(0)), (110, 100, 40, 40, {0: 0.8}, kpts_for(1))], 2
    )  # IoU 0.6
    dec = fitted(t.shape, 2)
    assert len(dec.decode((t,), DecodeParams(0.25, 0.5, 100)).scores) == 1
    assert len(dec.decode((t,), DecodeParams(0.25, 0.7, 100)).scores) == 2
    other = classic([(100, 100, 40, 40, {0: 0.9}, kpts_for(0)), (100, 100, 40, 40, {1: 0.8}, kpts_for(1))], 2)
    _, _, classes, extra = dec.decode((other,), P)
    assert classes.tolist() == [0, 1], "the same box under two classes: both kept"
    np.testing.assert_array_equal(extra, [kpts_for(0), kpts_for(1)])


@pytest.mark.parametrize("max_detections", [1, 5])
def test_classic_max_detections_keeps_the_best_with_their_keypoints(max_detections):
    scores = [0.3, 0.9, 0.5, 0.7, 0.4, 0.8, 0.6]
    rows = [(20 + 40 * i, 50, 10, 10, {0: s}, kpts_for(i)) for i, s in enumerate(scores)]
    t = classic(rows, 1)
    _, got, _, extra = fitted(t.shape, 1).decode((t,), DecodeParams(0.25, 0.45, max_detections))
    best = sorted(range(7), key=lambda i: -scores[i])[:max_detections]
    np.testing.assert_allclose(got, [scores[i] for i in best], rtol=1e-6)
    np.testing.assert_array_equal(extra, [kpts_for(i) for i in best])


def test_classic_empty():
    t = classic([], 1)
    _, _, _, extra = found = fitted(t.shape, 1).decode((t,), P)
    check_types(found, 0)
    assert extra.shape == (0, 51)


# -- fit and refine -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decoder", "shape", "labels", "keypoints", "dims"),
    [
        (YoloV8Pose(), (1, 56, 8400), 1, 17, 3),  # COCO person pose
        (YoloV8Pose(), (None, 56, None), 1, 17, 3),
        (YoloV8Pose(), (1, 4 + 2 + 34, 8400), 2, 17, 2),  # 34 values: not a multiple of 3
        (YoloV8Pose(), (1, 4 + 3 + 12, 8400), 3, 4, 3),  # 12: both; 3 values assumed
        (End2EndPose(), (1, 300, 57), 1, 17, 3),
        (End2EndPose(), (None, None, 6 + 10), 80, 5, 2),
    ],
)
def test_fit_reads_classes_and_keypoints_from_the_shape(decoder, shape, labels, keypoints, dims):
    d = decoder.fit([shape], labels)
    assert (d.classes, d.keypoints, d.dims, d.extra_width()) == (labels, keypoints, dims, keypoints * dims)
    assert type(d) is type(decoder)


@pytest.mark.parametrize(
    ("decoder", "shape", "labels", "needs"),
    [
        (YoloV8Pose(), (56, 8400), 1, "3 axes"),
        (YoloV8Pose(), (1, 5, 8400), 1, "4 \\+ 1 labels \\+ the pose values on axis 1"),
        (YoloV8Pose(), (1, 84, 8400), 80, "on axis 1"),  # no keypoint values at all
        (YoloV8Pose(), (1, None, 8400), 1, "on axis 1"),
        (YoloV8Pose(), (1, 4 + 1 + 5, 8400), 1, "whole number of keypoints"),  # 5: neither 2 nor 3 divide
        (End2EndPose(), (1, 300, 6), 1, "6 \\+ the pose values on axis 2"),
        (End2EndPose(), (1, 300, None), 1, "on axis 2"),
        (End2EndPose(), (300, 57), 1, "3 axes"),
    ],
)
def test_fit_refuses_other_shapes(decoder, shape, labels, needs):
    with pytest.raises(OutputMismatch, match=needs) as e:
        decoder.fit([shape], labels)
    assert e.value.index == 0


@pytest.mark.parametrize("decoder", [YoloV8Pose(), End2EndPose()], ids=lambda d: d.name)
def test_refine_takes_the_manifests_kpt_shape_and_refuses_a_contradicting_one(decoder):
    shape = (1, 4 + 1 + 12, 8400) if not decoder.end_to_end else (1, 300, 6 + 12)
    d = decoder.fit([shape], 1)
    assert (d.keypoints, d.dims) == (4, 3), "12 values: 3 per keypoint unless told"
    six_by_two = d.refine(SimpleNamespace(kpt_shape=(6, 2)))
    assert (six_by_two.keypoints, six_by_two.dims, six_by_two.extra_width()) == (6, 2, 12)
    assert d.refine(SimpleNamespace(kpt_shape=())) == d
    assert d.refine(SimpleNamespace()) == d
    with pytest.raises(OutputMismatch, match=r"kpt_shape \[17, 3\]: 51 keypoint values, not 12"):
        d.refine(SimpleNamespace(kpt_shape=(17, 3)))


def test_refine_refuses_17x3_for_a_17x2_output():
    d = YoloV8Pose().fit([(1, 4 + 1 + 34, 8400)], 1)
    with pytest.raises(OutputMismatch, match="51 keypoint values, not 34"):
        d.refine(SimpleNamespace(kpt_shape=(17, 3)))
    assert d.refine(SimpleNamespace(kpt_shape=(17, 2))) == d


def test_dims_two_keypoints_decode_as_pairs():
    t = classic([(100, 100, 20, 20, {0: 0.9}, kpts_for(0, 17, 2))], 1, k=17, d=2)
    d = fitted(t.shape, 1)
    assert (d.keypoints, d.dims) == (17, 2)
    _, _, _, extra = d.decode((t,), P)
    np.testing.assert_array_equal(extra, [kpts_for(0, 17, 2)])


# -- the end-to-end head ------------------------------------------------------------------------


def e2e(rows: list[tuple], k: int = 17, d: int = 3) -> np.ndarray:
    """[1, 300, 6 + K*D]: rows (x1, y1, x2, y2, score, class, keypoint values)."""
    return e2e_tensor(rows, k * d)


@pytest.mark.parametrize("batched", [True, False])
def test_end_to_end_ranks_rows_with_their_keypoints_without_nms(batched):
    t = e2e(
        [
            (10, 10, 50, 50, 0.60, 2, kpts_for(0)),
            (12, 12, 52, 52, 0.90, 2, kpts_for(1)),  # overlaps the first: no NMS here, both stay
            (100, 100, 140, 160, 0.20, 0, kpts_for(2)),  # under the threshold
            (200, 50, 260, 90, 0.75, 7, kpts_for(3)),
        ]
    )
    d = End2EndPose().fit([t.shape], 8)
    xyxy, scores, classes, extra = found = d.decode((t if batched else t[0],), P)
    check_types(found, 3)
    np.testing.assert_allclose(scores, [0.90, 0.75, 0.60])
    assert classes.tolist() == [2, 7, 2]
    np.testing.assert_allclose(xyxy, [[12, 12, 52, 52], [200, 50, 260, 90], [10, 10, 50, 50]])
    assert extra.dtype == np.float32
    np.testing.assert_array_equal(extra, [kpts_for(1), kpts_for(3), kpts_for(0)])


def test_end_to_end_max_detections_and_threshold():
    rows = [(i, i, i + 10, i + 10, 0.3 + i / 1000, 0, kpts_for(i, 2, 2)) for i in range(50)]
    t = e2e(rows, 2, 2)
    d = End2EndPose().fit([t.shape], 1)
    _, scores, _, extra = d.decode((t,), DecodeParams(0.25, 0.45, 10))
    assert len(scores) == 10 and scores[0] == pytest.approx(0.349)
    np.testing.assert_array_equal(extra, [kpts_for(i, 2, 2) for i in range(49, 39, -1)])
    _, scores, _, _ = d.decode((t,), DecodeParams(0.34, 0.45, 100))
    assert len(scores) == 9, "score > threshold, strictly"
    assert [len(a) for a in d.decode((e2e([], 2, 2),), P)] == [0, 0, 0, 0]


def test_both_are_registered_as_pose():
    assert registry.get("yolov8_pose").task == registry.get("end2end_pose").task == "pose"
    assert registry.get("yolov8_pose").nms_in_model is False
    assert registry.get("end2end_pose").nms_in_model is True


# -- recognising a pose ONNX without a manifest -------------------------------------------------


def info(outputs: list[Tensor], **meta: str) -> onnx_info.OnnxInfo:
    return onnx_info.OnnxInfo(
        inputs=(Tensor("images", (1, 3, 640, 640), "float32"),),
        outputs=tuple(outputs),
        metadata=dict(meta),
        ops=frozenset({"Conv"}),
    )


def test_choose_picks_the_classic_pose_head():
    i = info([Tensor("output0", (1, 56, 8400), "float32")], task="pose", kpt_shape="[17, 3]")
    c = onnx_info.choose(i, 1, 640, 640)
    assert (c.decoder, c.outputs) == ("yolov8_pose", ("output0",))
    assert "8400" in c.rule


def test_choose_picks_the_end_to_end_pose_head_from_its_metadata():
    out = Tensor("output0", (1, 300, 57), "float32")
    c = onnx_info.choose(info([out], task="pose", kpt_shape="[17, 3]", end2end="True"), 1, 640, 640)
    assert (c.decoder, c.outputs) == ("end2end_pose", ("output0",))
    assert "end2end" in c.rule
    c = onnx_info.choose(info([out], task="pose", kpt_shape="[17, 3]", args="{'nms': True}"), 1, 640, 640)
    assert c.decoder == "end2end_pose" and "nms" in c.rule
    c = onnx_info.choose(info([out], task="pose", kpt_shape="[17, 3]"), 1, 640, 640)
    assert c.decoder == "end2end_pose", "300 rows of 6 + 51: no anchor count"


def test_choose_refuses_a_pose_output_that_contradicts_kpt_shape():
    i = info([Tensor("output0", (1, 56, 8400), "float32")], task="pose", kpt_shape="[17, 2]")
    with pytest.raises(onnx_info.UnsupportedModel, match="fits no decoder of task 'pose'"):
        onnx_info.choose(i, 1, 640, 640)


def test_choose_refuses_a_classification_model_with_its_reason():
    i = info([Tensor("output0", (1, 1000), "float32")], task="classify")
    with pytest.raises(onnx_info.UnsupportedModel, match=r"classification model .*no boxes to publish"):
        onnx_info.choose(i, 1000, 224, 224)
