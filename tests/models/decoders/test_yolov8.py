"""The YOLOv8 decoder, ``[B, 4+C, N]`` (models/decoders/yolov8.py)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checks import check_types, decode, v8_tensor

from edge_agent.models.decoders.base import DecodeParams, OutputMismatch
from edge_agent.models.decoders.yolov8 import YoloV8


def test_boxes_come_back_xyxy_with_scores_and_classes():
    t = v8_tensor([(100, 80, 40, 20, {2: 0.9}), (300, 200, 10, 30, {0: 0.3, 1: 0.6})], 3)
    decoded = decode("yolov8", t)
    check_types(decoded, 2)
    xyxy, scores, class_ids, _ = decoded
    np.testing.assert_allclose(xyxy, [[80, 70, 120, 90], [295, 185, 305, 215]])
    np.testing.assert_allclose(scores, [0.9, 0.6], rtol=1e-6)
    assert class_ids.tolist() == [2, 1], "class is the argmax of the class rows"


def test_accepts_unbatched_layout():
    t = v8_tensor([(100, 80, 40, 20, {1: 0.9})], 2)
    a, b = decode("yolov8", t), decode("yolov8", t[0])
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(("score", "kept"), [(0.9, True), (0.26, True), (0.24, False), (0.0, False)])
def test_score_threshold(score, kept):
    t = v8_tensor([(100, 100, 20, 20, {0: score})], 2)
    check_types(decode("yolov8", t), 1 if kept else 0)


def test_nms_is_class_aware():
    same = v8_tensor([(100, 100, 40, 40, {0: 0.9}), (102, 100, 40, 40, {0: 0.8})], 2)
    _, scores, _, _ = decode("yolov8", same)
    assert scores.tolist() == pytest.approx([0.9]), "overlapping boxes of one class: one is suppressed"
    other = v8_tensor([(100, 100, 40, 40, {0: 0.9}), (102, 100, 40, 40, {1: 0.8})], 2)
    _, scores, class_ids, _ = decode("yolov8", other)
    assert class_ids.tolist() == [0, 1], "overlapping boxes of different classes are both kept"


def test_iou_threshold_from_params():
    t = v8_tensor([(100, 100, 40, 40, {0: 0.9}), (110, 100, 40, 40, {0: 0.8})], 1)  # IoU 0.6
    assert len(decode("yolov8", t, p=DecodeParams(0.25, 0.5, 100))[0]) == 1
    assert len(decode("yolov8", t, p=DecodeParams(0.25, 0.7, 100))[0]) == 2


@pytest.mark.parametrize(
    ("shape", "needs"),
    [
        ((1, 84, 8400), ""),
        ((None, 84, None), ""),
        ((None, None, 8400), ""),
        ((1, 85, 8400), "84 on axis 1"),
        ((84, 8400), "3 axes"),
    ],
)
def test_fit_checks_the_rows_against_the_labels(shape, needs):
    if needs:
        with pytest.raises(OutputMismatch, match=needs):
            YoloV8().fit([shape], 80)
    else:
        assert YoloV8().fit([shape], 80) == YoloV8()
