"""The end-to-end decoder, ``[B, K, 6]`` with NMS in the model (models/decoders/end2end.py)."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checks import P, decode

from edge_agent.models.decoders.base import DecodeParams, OutputMismatch
from edge_agent.models.decoders.end2end import End2End


def _e2e_rows(rows: list[tuple[float, ...]], k: int = 300) -> np.ndarray:
    """An end-to-end output (1, k, 6): the given rows first, the rest unused (zeros)."""
    out = np.zeros((1, k, 6), np.float32)
    if rows:
        out[0, : len(rows)] = rows
    return out


def test_keeps_rows_over_the_threshold_best_first_without_nms():
    out = _e2e_rows(
        [
            (10, 10, 50, 50, 0.60, 2),
            (12, 12, 52, 52, 0.90, 2),  # overlaps the first: no NMS here, both stay
            (100, 100, 140, 160, 0.20, 0),  # under the threshold
            (200, 50, 260, 90, 0.75, 7),
        ]
    )
    xyxy, scores, classes, _ = decode("end2end", out)
    np.testing.assert_allclose(scores, [0.90, 0.75, 0.60])
    np.testing.assert_array_equal(classes, [2, 7, 2])
    np.testing.assert_allclose(xyxy, [[12, 12, 52, 52], [200, 50, 260, 90], [10, 10, 50, 50]])
    assert xyxy.dtype == np.float32 and classes.dtype == np.int32
    a, b = decode("end2end", out), decode("end2end", out[0])  # with or without the batch axis
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_max_detections_and_an_empty_output():
    rows = [(i, i, i + 10, i + 10, 0.3 + i / 1000, i % 5) for i in range(50)]
    _, scores, _, _ = decode("end2end", _e2e_rows(rows), p=DecodeParams(0.25, 0.45, 10))
    assert len(scores) == 10 and np.all(np.diff(scores) <= 0) and scores[0] == pytest.approx(0.349)
    assert [len(a) for a in decode("end2end", _e2e_rows([]))[:3]] == [0, 0, 0]


def test_class_ids_are_kept_as_the_model_gives_them():
    """Whatever the labels: the message names an id without a label by its number."""
    rows = np.array([[0, 0, 4, 4, 0.9, 3], [0, 0, 4, 4, 0.8, 400], [0, 0, 4, 4, 0.7, -1]], np.float32)
    assert decode("end2end", rows, p=P)[2].tolist() == [3, 400, -1]


@pytest.mark.parametrize(
    ("shape", "needs"),
    [((1, 300, 6), ""), ((None, None, 6), ""), ((1, 300, 7), "6 on axis 2"), ((300, 6), "3 axes")],
)
def test_fit_needs_rows_of_six(shape, needs):
    if needs:
        with pytest.raises(OutputMismatch, match=needs):
            End2End().fit([shape], 80)
    else:
        assert End2End().fit([shape], 80) == End2End()
