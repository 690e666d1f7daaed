"""IoU and NMS, against OpenCV's (models/decoders/nms.py)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from edge_agent.models.decoders import nms as nms_module
from edge_agent.models.decoders.nms import batched_nms, box_iou, nms

# -- box_iou ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "iou"),
    [
        pytest.param([0, 0, 10, 10], [0, 0, 10, 10], 1.0, id="identical"),
        pytest.param([0, 0, 10, 10], [20, 20, 30, 30], 0.0, id="disjoint"),
        pytest.param([0, 0, 10, 10], [10, 0, 20, 10], 0.0, id="touching-edge"),
        pytest.param([0, 0, 10, 10], [10, 10, 20, 20], 0.0, id="touching-corner"),
        pytest.param([0, 0, 4, 4], [1, 1, 3, 3], 0.25, id="contained"),
        pytest.param([1, 1, 3, 3], [0, 0, 4, 4], 0.25, id="containing"),
        pytest.param([0, 0, 2, 2], [1, 0, 3, 2], 1 / 3, id="half-overlap"),
        pytest.param([0, 0, 10, 10], [5, 5, 15, 15], 25 / 175, id="quarter-overlap"),
        pytest.param([0, 0, 10, 10], [0, 0, 10, 5], 0.5, id="half-of-a"),
        pytest.param([-5, -5, 5, 5], [0, 0, 10, 10], 25 / 175, id="negative-coordinates"),
        pytest.param([0, 0, 0, 0], [0, 0, 0, 0], 0.0, id="both-empty"),
        pytest.param([5, 5, 5, 5], [0, 0, 10, 10], 0.0, id="point-inside"),
    ],
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_box_iou_table(a, b, iou, dtype):
    got = box_iou(np.array([a], dtype), np.array([b], dtype))
    assert got.shape == (1, 1)
    assert got[0, 0] == pytest.approx(iou, abs=1e-6)


def test_box_iou_is_pairwise_and_symmetric():
    rng = np.random.default_rng(0)
    a = random_boxes(rng, 7, 100)
    b = random_boxes(rng, 5, 100)
    ab, ba = box_iou(a, b), box_iou(b, a)
    assert ab.shape == (7, 5)
    np.testing.assert_allclose(ab, ba.T)
    for i in range(7):
        for j in range(5):
            assert ab[i, j] == pytest.approx(box_iou(a[i : i + 1], b[j : j + 1])[0, 0])
    assert np.all((ab >= 0) & (ab <= 1))
    np.testing.assert_allclose(np.diag(box_iou(a, a)), 1.0)


def test_box_iou_empty_inputs():
    a = np.zeros((0, 4), np.float32)
    b = np.array([[0, 0, 1, 1]], np.float32)
    assert box_iou(a, b).shape == (0, 1)
    assert box_iou(b, a).shape == (1, 0)


# -- nms against OpenCV ---------------------------------------------------------------------


def random_boxes(rng: np.random.Generator, n: int, extent: float, min_size=5.0, max_size=80.0) -> np.ndarray:
    """xyxy boxes clustered in an ``extent`` square so that many overlap."""
    centre = rng.uniform(0, extent, (n, 2))
    size = rng.uniform(min_size, max_size, (n, 2))
    return np.concatenate([centre - size / 2, centre + size / 2], axis=1)


def cv2_nms(xyxy: np.ndarray, scores: np.ndarray, iou_threshold: float) -> np.ndarray:
    keep = scores > 0  # NMSBoxes drops scores <= score_threshold; prefilter explicitly
    idx = np.flatnonzero(keep)
    xywh = np.concatenate([xyxy[idx, :2], xyxy[idx, 2:] - xyxy[idx, :2]], axis=1)
    kept = cv2.dnn.NMSBoxes(xywh.tolist(), scores[idx].tolist(), 0.0, float(iou_threshold))
    return idx[np.asarray(kept, np.int64).reshape(-1)]


THRESHOLDS = [0.0, 0.1, 0.3, 0.45, 0.5, 0.7, 0.9, 1.0]


@pytest.mark.parametrize("iou_threshold", THRESHOLDS)
@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("ties", [False, True], ids=["distinct-scores", "tied-scores"])
def test_nms_agrees_with_opencv(seed, iou_threshold, ties):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 80))
    xyxy = random_boxes(rng, n, 150)
    # Tied scores check the tie rule too: equal scores keep input order (as cv2's stable sort).
    scores = rng.integers(1, 5, n) / 4 if ties else rng.uniform(0.01, 1.0, n)
    got = nms(xyxy, scores, iou_threshold)
    expected = cv2_nms(xyxy, scores, iou_threshold)
    assert got.dtype == np.int64
    assert set(got.tolist()) == set(expected.tolist()), (
        f"kept sets differ: only ours {sorted(set(got) - set(expected))}, "
        f"only cv2 {sorted(set(expected) - set(got))}"
    )
    assert got.tolist() == expected.tolist(), f"order differs: {got.tolist()} vs cv2 {expected.tolist()}"


@pytest.mark.parametrize("seed", range(4))
def test_nms_agrees_with_opencv_float32(seed):
    rng = np.random.default_rng(100 + seed)
    xyxy = random_boxes(rng, 60, 300).astype(np.float32)
    scores = rng.uniform(0.01, 1, 60).astype(np.float32)
    got = nms(xyxy, scores, 0.45)
    assert got.tolist() == cv2_nms(xyxy.astype(np.float64), scores.astype(np.float64), 0.45).tolist()


def test_nms_kept_boxes_do_not_overlap_above_threshold_and_suppressed_ones_do():
    rng = np.random.default_rng(7)
    xyxy = random_boxes(rng, 100, 200)
    scores = rng.uniform(0.01, 1, 100)
    keep = nms(xyxy, scores, 0.5)
    iou = box_iou(xyxy[keep], xyxy[keep])
    np.fill_diagonal(iou, 0)
    assert iou.max() <= 0.5
    assert np.all(np.diff(scores[keep]) <= 0), "kept indices must be best score first"
    for i in set(range(100)) - set(keep.tolist()):
        better = keep[scores[keep] >= scores[i]]
        assert box_iou(xyxy[i : i + 1], xyxy[better]).max() > 0.5, f"box {i} suppressed by nothing"


@pytest.mark.parametrize(
    ("xyxy", "scores", "thr", "expected"),
    [
        pytest.param([[0, 0, 10, 10], [1, 0, 11, 10]], [0.5, 0.9], 0.5, [1], id="better-second-wins"),
        pytest.param([[0, 0, 10, 10], [1, 0, 11, 10]], [0.9, 0.5], 0.9, [0, 1], id="below-threshold-kept"),
        # IoU exactly 1/3: suppressed only when strictly above the threshold.
        pytest.param([[0, 0, 2, 2], [1, 0, 3, 2]], [0.9, 0.8], 1 / 3, [0, 1], id="equal-to-threshold-kept"),
        pytest.param([[0, 0, 10, 10], [0, 0, 10, 10]], [0.7, 0.7], 0.5, [0], id="tie-keeps-first"),
        # Chain: 0 suppresses 1, so 2 (overlapping only 1) survives.
        pytest.param(
            [[0, 0, 10, 10], [5, 0, 15, 10], [10, 0, 20, 10]], [0.9, 0.8, 0.7], 0.3, [0, 2], id="chain"
        ),
    ],
)
def test_nms_cases(xyxy, scores, thr, expected):
    assert nms(np.array(xyxy, float), np.array(scores), thr).tolist() == expected


def test_nms_empty():
    got = nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), 0.5)
    assert got.shape == (0,) and got.dtype == np.int64


# -- batched_nms -----------------------------------------------------------------------------


def per_class_nms(xyxy, scores, class_ids, thr) -> list[int]:
    kept: list[int] = []
    for c in np.unique(class_ids):
        idx = np.flatnonzero(class_ids == c)
        kept += idx[nms(xyxy[idx], scores[idx], thr)].tolist()
    return sorted(kept, key=lambda i: (-scores[i], i))


@pytest.mark.parametrize("iou_threshold", [0.3, 0.45, 0.7])
@pytest.mark.parametrize("seed", range(10))
def test_batched_nms_equals_per_class_nms(seed, iou_threshold):
    rng = np.random.default_rng(1000 + seed)
    n = int(rng.integers(1, 200))
    classes = int(rng.integers(1, 81))
    xyxy = random_boxes(rng, n, 640, 1, 200).astype(np.float32)
    if seed % 3 == 0:
        xyxy -= 100  # negative coordinates, as boxes leaving the frame decode to
    scores = rng.uniform(0.01, 1, n).astype(np.float32)
    class_ids = rng.integers(0, classes, n)
    got = batched_nms(xyxy, scores, class_ids, iou_threshold)
    assert got.tolist() == per_class_nms(xyxy, scores, class_ids, iou_threshold)


def test_batched_nms_never_suppresses_across_classes():
    box = [[10, 10, 50, 50]] * 6
    xyxy = np.array(box, np.float32)
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4], np.float32)
    class_ids = np.array([0, 1, 2, 3, 0, 79])
    got = batched_nms(xyxy, scores, class_ids, 0.5)
    assert got.tolist() == [0, 1, 2, 3, 5], "only the second class-0 box may be suppressed"


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_batched_nms_class_offsets_allow_negative_coordinates(dtype):
    # Class 1's box sits exactly one "max coordinate + 1" left/up of class 0's box: an offset
    # that ignored negative coordinates would move it onto class 0's box.
    m = 600.0
    xyxy = np.array(
        [[400, 400, 440, 440], [400 - m - 1, 400 - m - 1, 440 - m - 1, 440 - m - 1], [560, 560, m, m]], dtype
    )
    got = batched_nms(xyxy, np.array([0.9, 0.8, 0.1], dtype), np.array([0, 1, 0]), 0.5)
    assert got.tolist() == [0, 1, 2]


def test_batched_nms_does_not_modify_its_inputs():
    xyxy = np.array([[0, 0, 10, 10], [1, 1, 11, 11]], np.float32)
    before = xyxy.copy()
    batched_nms(xyxy, np.array([0.9, 0.8], np.float32), np.array([0, 1]), 0.5)
    np.testing.assert_array_equal(xyxy, before)


def test_batched_nms_empty():
    got = batched_nms(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), 0.5)
    assert got.shape == (0,)


@pytest.mark.parametrize("seed", range(20))
def test_opencv_and_numpy_batched_nms_keep_the_same_boxes(seed):
    """Where OpenCV has NMSBoxesBatched it is used; the numpy pass (an OpenCV without dnn)
    must keep exactly the same boxes, in the same order, negative coordinates included."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    xy = rng.uniform(-100, 700, (n, 2))
    wh = rng.uniform(5, 200, (n, 2))
    xyxy = np.concatenate((xy, xy + wh), axis=1).astype(np.float32)
    scores = rng.choice(np.linspace(0.3, 1.0, 40), n).astype(np.float32)  # ties included
    classes = rng.integers(0, 5, n)
    assert nms_module._cv_batched_nms is not None, "this OpenCV has cv2.dnn.NMSBoxesBatched"
    fast = batched_nms(xyxy, scores, classes, 0.45)
    plain = nms_module._numpy_batched_nms(xyxy, scores, classes, 0.45)
    assert fast.tolist() == plain.tolist()
