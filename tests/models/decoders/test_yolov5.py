"""The YOLOv5 decoder, ``[B, N, 5+C]`` (models/decoders/yolov5.py)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checks import check_types, decode, v5_tensor

from edge_agent.models.decoders.base import OutputMismatch
from edge_agent.models.decoders.yolov5 import YoloV5


def test_score_is_objectness_times_probability():
    t = v5_tensor(
        [
            (100, 80, 40, 20, 0.9, {1: 0.8}),  # 0.72 -> kept
            (300, 200, 10, 30, 0.5, {0: 0.6, 2: 0.9}),  # 0.45, class 2
            (500, 500, 10, 10, 0.2, {0: 1.0}),  # objectness below threshold: skipped
            (600, 600, 10, 10, 0.9, {0: 0.2}),  # 0.18 below threshold: skipped
        ],
        3,
    )
    decoded = decode("yolov5", t)
    check_types(decoded, 2)
    xyxy, scores, class_ids, _ = decoded
    np.testing.assert_allclose(xyxy, [[80, 70, 120, 90], [295, 185, 305, 215]])
    np.testing.assert_allclose(scores, [0.72, 0.45], rtol=1e-6)
    assert class_ids.tolist() == [1, 2]


def test_accepts_unbatched_layout_and_applies_class_aware_nms():
    t = v5_tensor(
        [
            (100, 100, 40, 40, 0.9, {0: 1.0}),
            (102, 100, 40, 40, 0.9, {0: 0.9}),  # same class, overlapping: suppressed
            (101, 100, 40, 40, 0.9, {1: 0.8}),  # other class: kept
        ],
        2,
    )
    for tensor in (t, t[0]):
        _, scores, class_ids, _ = decode("yolov5", tensor)
        assert class_ids.tolist() == [0, 1]
        np.testing.assert_allclose(scores, [0.9, 0.72], rtol=1e-6)


@pytest.mark.parametrize(
    ("shape", "needs"),
    [((1, 25200, 85), ""), ((None, None, 85), ""), ((1, 25200, 84), "85 on axis 2"), ((25200, 85), "3 axes")],
)
def test_fit_checks_the_columns_against_the_labels(shape, needs):
    if needs:
        with pytest.raises(OutputMismatch, match=needs):
            YoloV5().fit([shape], 80)
    else:
        assert YoloV5().fit([shape], 80) == YoloV5()
