"""The decoder of TensorRT's EfficientNMS outputs (models/decoders/efficient_nms.py)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checks import decode

from edge_agent.models.decoders.base import OutputMismatch
from edge_agent.models.decoders.efficient_nms import EfficientNms


def test_respects_num_dets_and_drops_the_padding():
    boxes = np.zeros((1, 100, 4), np.float32)
    boxes[0, :3] = [[0, 0, 10, 10], [5, 5, 20, 20], [30, 30, 40, 40]]
    boxes[0, 3] = [1, 1, 2, 2]  # padding past num_dets: never read as a box
    scores = np.zeros((1, 100), np.float32)
    scores[0, :4] = [0.9, 0.5, 0.3, 0.99]
    classes = np.zeros((1, 100), np.int32)
    classes[0, :4] = [3, 1, 4, 2]
    num = np.array([[3]], np.int32)
    xyxy, s, c, _ = decode("efficient_nms", num, boxes, scores, classes)
    np.testing.assert_allclose(s, [0.9, 0.5, 0.3])
    np.testing.assert_array_equal(c, [3, 1, 4])
    np.testing.assert_allclose(xyxy, boxes[0, :3])
    assert c.dtype == np.int32
    none = decode("efficient_nms", np.array([0], np.int32), boxes[0], scores[0], classes[0])
    assert [len(a) for a in none[:3]] == [0, 0, 0]


def test_its_outputs_are_named_by_role():
    d = EfficientNms()
    named = {"num_dets": "count", "boxes": "xyxy", "scores": "conf", "classes": "label"}
    assert d.output_names("ignored", named) == ("count", "xyxy", "conf", "label")
    assert d.output_section(("count", "xyxy", "conf", "label")) == ("count", named)


@pytest.mark.parametrize(
    ("shapes", "needs", "index"),
    [
        ([(1, 1), (1, 100, 4), (1, 100), (1, 100)], "", 0),
        ([(None,), (None, 100, 4), (None, 100), (None, 100)], "", 0),
        ([(1, 2), (1, 100, 4), (1, 100), (1, 100)], r"\[B, 1\]", 0),
        ([(1, 1), (1, 100, 5), (1, 100), (1, 100)], r"\[B, K, 4\]", 1),
        ([(1, 1), (1, 100, 4), (1, 99), (1, 100)], r"\[B, 100\]", 2),
        ([(1, 1), (1, 100, 4), (1, 100), (1, 100, 1)], r"\[B, 100\]", 3),
    ],
)
def test_fit_checks_all_four_and_says_which(shapes, needs, index):
    if not needs:
        assert EfficientNms().fit(shapes, 4) == EfficientNms()
        return
    with pytest.raises(OutputMismatch, match=needs) as e:
        EfficientNms().fit(shapes, 4)
    assert e.value.index == index
