"""The RT-DETR decoder: normalised boxes, top-k rows or per-class scores (models/decoders/rtdetr.py)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checks import decode

from edge_agent.models.decoders.base import DecodeParams, OutputMismatch
from edge_agent.models.decoders.rtdetr import RtDetr


def test_scales_normalised_centre_boxes_to_input_pixels():
    p = DecodeParams(0.25, 0.45, 100, input_w=640, input_h=320)
    scores = np.zeros((1, 300, 4 + 3), np.float32)
    scores[0, 0] = (0.5, 0.5, 0.25, 0.5, 0.1, 0.8, 0.3)  # class 1 at 0.8
    scores[0, 1] = (0.1, 0.2, 0.1, 0.1, 0.2, 0.1, 0.1)  # nothing over 0.25
    xyxy, s, c, _ = decode("rtdetr", scores, p=p)
    np.testing.assert_allclose(xyxy, [[240, 80, 400, 240]])
    np.testing.assert_allclose(s, [0.8])
    np.testing.assert_array_equal(c, [1])
    topk = np.zeros((1, 300, 6), np.float32)  # Ultralytics 8.4: top-k in the graph
    topk[0, 0] = (0.5, 0.5, 0.25, 0.5, 0.8, 1)
    for x, y in zip(RtDetr(topk=True).decode((topk,), p), (xyxy, s, c)):
        np.testing.assert_allclose(x, y)


@pytest.mark.parametrize(
    ("shape", "labels", "topk"),
    [
        pytest.param((1, 300, 6), 80, True, id="top-k-rows"),
        pytest.param((1, 300, 84), 80, False, id="class-scores"),
        pytest.param((1, 300, 6), 2, True, id="two-labels-means-the-current-export"),
    ],
)
def test_fit_reads_top_k_rows_or_class_scores_from_the_width(shape, labels, topk):
    fitted = RtDetr().fit([shape], labels)
    assert fitted.topk is topk
    assert fitted.describe() == ("top-k rows (box, score, class id)" if topk else "box + per-class scores")


@pytest.mark.parametrize(("shape", "needs"), [((1, 300, 7), "84 on axis 2"), ((300, 6), "3 axes")])
def test_fit_refuses_other_widths(shape, needs):
    with pytest.raises(OutputMismatch, match=needs):
        RtDetr().fit([shape], 80)
