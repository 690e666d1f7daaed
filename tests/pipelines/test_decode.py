"""YOLO decoders, NMS and IoU (pipelines/decode.py)."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest

from edge_agent.pipelines.decode import (
    DECODERS,
    MAX_CANDIDATES,
    DecodeParams,
    Decoder,
    batched_nms,
    box_iou,
    decode_efficient_nms,
    decode_end2end,
    decode_rtdetr,
    decode_yolov5,
    decode_yolov8,
    nms,
)

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


# -- decoders --------------------------------------------------------------------------------


def v8_tensor(rows: list[tuple], num_classes: int, anchors: int = 50) -> np.ndarray:
    """[1, 4 + C, N]: each row (cx, cy, w, h, {class: score}) fills one anchor, the rest zeros."""
    out = np.zeros((1, 4 + num_classes, anchors), np.float32)
    for i, (cx, cy, w, h, cls) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        for c, s in cls.items():
            out[0, 4 + c, i] = s
    return out


def v5_tensor(rows: list[tuple], num_classes: int, anchors: int = 50) -> np.ndarray:
    """[1, N, 5 + C]: each row (cx, cy, w, h, objectness, {class: prob})."""
    out = np.zeros((1, anchors, 5 + num_classes), np.float32)
    for i, (cx, cy, w, h, obj, cls) in enumerate(rows):
        out[0, i, :5] = (cx, cy, w, h, obj)
        for c, p in cls.items():
            out[0, i, 5 + c] = p
    return out


def check_types(decoded, k: int | None = None) -> None:
    xyxy, scores, class_ids = decoded
    assert xyxy.dtype == np.float32 and xyxy.ndim == 2 and xyxy.shape[1] == 4, xyxy.shape
    assert scores.dtype == np.float32 and scores.shape == (len(xyxy),)
    assert class_ids.dtype == np.int32 and class_ids.shape == (len(xyxy),)
    if k is not None:
        assert len(xyxy) == k, f"expected {k} detections, got {len(xyxy)}"
    assert np.all(np.diff(scores) <= 0), "detections must be best score first"


P = DecodeParams(score_threshold=0.25, iou_threshold=0.45, max_detections=100)


def test_yolov8_boxes_come_back_xyxy_with_scores_and_classes():
    t = v8_tensor([(100, 80, 40, 20, {2: 0.9}), (300, 200, 10, 30, {0: 0.3, 1: 0.6})], 3)
    decoded = decode_yolov8(t, P)
    check_types(decoded, 2)
    xyxy, scores, class_ids = decoded
    np.testing.assert_allclose(xyxy, [[80, 70, 120, 90], [295, 185, 305, 215]])
    np.testing.assert_allclose(scores, [0.9, 0.6], rtol=1e-6)
    assert class_ids.tolist() == [2, 1], "class is the argmax of the class rows"


def test_yolov8_accepts_unbatched_layout():
    t = v8_tensor([(100, 80, 40, 20, {1: 0.9})], 2)
    a, b = decode_yolov8(t, P), decode_yolov8(t[0], P)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(("score", "kept"), [(0.9, True), (0.26, True), (0.24, False), (0.0, False)])
def test_yolov8_score_threshold(score, kept):
    t = v8_tensor([(100, 100, 20, 20, {0: score})], 2)
    check_types(decode_yolov8(t, P), 1 if kept else 0)


def test_yolov8_nms_is_class_aware():
    same = v8_tensor([(100, 100, 40, 40, {0: 0.9}), (102, 100, 40, 40, {0: 0.8})], 2)
    _, scores, _ = decode_yolov8(same, P)
    assert scores.tolist() == pytest.approx([0.9]), "overlapping boxes of one class: one is suppressed"
    other = v8_tensor([(100, 100, 40, 40, {0: 0.9}), (102, 100, 40, 40, {1: 0.8})], 2)
    _, scores, class_ids = decode_yolov8(other, P)
    assert class_ids.tolist() == [0, 1], "overlapping boxes of different classes are both kept"


def test_yolov8_iou_threshold_from_params():
    t = v8_tensor([(100, 100, 40, 40, {0: 0.9}), (110, 100, 40, 40, {0: 0.8})], 1)  # IoU 0.6
    assert len(decode_yolov8(t, DecodeParams(0.25, 0.5, 100))[0]) == 1
    assert len(decode_yolov8(t, DecodeParams(0.25, 0.7, 100))[0]) == 2


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
    decoded = DECODERS[layout](t, DecodeParams(0.25, 0.45, max_detections))
    check_types(decoded, max_detections)
    np.testing.assert_allclose(decoded[1], np.sort(scores)[::-1][:max_detections], rtol=1e-6)


@pytest.mark.parametrize("layout", ["yolov8", "yolov5"])
def test_more_than_max_candidates_keeps_the_best_scoring(layout):
    n = MAX_CANDIDATES + 476
    rng = np.random.default_rng(3)
    scores = rng.permutation(np.linspace(0.3, 0.99, n)).astype(np.float32)
    build = v5_tensor if layout == "yolov5" else v8_tensor
    t = build(grid_rows(n, scores, layout == "yolov5"), 3, anchors=n + 100)
    xyxy, got, class_ids = DECODERS[layout](t, DecodeParams(0.25, 0.45, 10_000))
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
    decoded = DECODERS[layout](t if batched else t[0], P)
    check_types(decoded, 0)
    assert decoded[0].shape == (0, 4)


def test_yolov5_score_is_objectness_times_probability():
    t = v5_tensor(
        [
            (100, 80, 40, 20, 0.9, {1: 0.8}),  # 0.72 -> kept
            (300, 200, 10, 30, 0.5, {0: 0.6, 2: 0.9}),  # 0.45, class 2
            (500, 500, 10, 10, 0.2, {0: 1.0}),  # objectness below threshold: skipped
            (600, 600, 10, 10, 0.9, {0: 0.2}),  # 0.18 below threshold: skipped
        ],
        3,
    )
    decoded = decode_yolov5(t, P)
    check_types(decoded, 2)
    xyxy, scores, class_ids = decoded
    np.testing.assert_allclose(xyxy, [[80, 70, 120, 90], [295, 185, 305, 215]])
    np.testing.assert_allclose(scores, [0.72, 0.45], rtol=1e-6)
    assert class_ids.tolist() == [1, 2]


def test_yolov5_accepts_unbatched_layout_and_applies_class_aware_nms():
    t = v5_tensor(
        [
            (100, 100, 40, 40, 0.9, {0: 1.0}),
            (102, 100, 40, 40, 0.9, {0: 0.9}),  # same class, overlapping: suppressed
            (101, 100, 40, 40, 0.9, {1: 0.8}),  # other class: kept
        ],
        2,
    )
    for tensor in (t, t[0]):
        _, scores, class_ids = decode_yolov5(tensor, P)
        assert class_ids.tolist() == [0, 1]
        np.testing.assert_allclose(scores, [0.9, 0.72], rtol=1e-6)


def test_decoders_registry():
    assert {
        "yolov8": decode_yolov8,
        "yolov5": decode_yolov5,
        "end2end": decode_end2end,
        "rtdetr": decode_rtdetr,
        "efficient_nms": decode_efficient_nms,
    } == DECODERS


def test_a_bound_decoder_reads_its_outputs_by_index_in_role_order():
    """EfficientNMS' four outputs may come in any order from the backend: the decoder is
    bound to their indices (the manifest names them)."""
    classes = np.array([[2, 1, 0]], np.int32)
    scores = np.array([[0.9, 0.8, 0.7]], np.float32)
    boxes = np.array([[[0, 0, 10, 10], [5, 5, 20, 20], [1, 1, 2, 2]]], np.float32)
    num = np.array([[2]], np.int32)
    outputs = [classes, boxes, np.zeros(3), num, scores]  # a stray output at 2
    decoder = Decoder("efficient_nms", (3, 1, 4, 0))
    xyxy, got, ids = decoder(outputs, P)
    assert ids.tolist() == [2, 1] and got.tolist() == pytest.approx([0.9, 0.8])
    assert xyxy.tolist() == [[0, 0, 10, 10], [5, 5, 20, 20]]
    single = Decoder("end2end", (1,))
    rows = np.array([[[0, 0, 4, 4, 0.5, 3]]], np.float32)
    assert single([np.zeros(1), rows], P)[2].tolist() == [3]


def test_end_to_end_class_ids_are_kept_as_the_model_gives_them():
    """Whatever the labels: the message names an id without a label by its number."""
    rows = np.array([[0, 0, 4, 4, 0.9, 3], [0, 0, 4, 4, 0.8, 400], [0, 0, 4, 4, 0.7, -1]], np.float32)
    assert decode_end2end(rows, P)[2].tolist() == [3, 400, -1]


@pytest.mark.parametrize("seed", range(20))
def test_opencv_and_numpy_batched_nms_keep_the_same_boxes(seed):
    """Where OpenCV has NMSBoxesBatched it is used; the numpy pass (an OpenCV without dnn)
    must keep exactly the same boxes, in the same order, negative coordinates included."""
    from edge_agent.pipelines import decode

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    xy = rng.uniform(-100, 700, (n, 2))
    wh = rng.uniform(5, 200, (n, 2))
    xyxy = np.concatenate((xy, xy + wh), axis=1).astype(np.float32)
    scores = rng.choice(np.linspace(0.3, 1.0, 40), n).astype(np.float32)  # ties included
    classes = rng.integers(0, 5, n)
    assert decode._cv_batched_nms is not None, "this OpenCV has cv2.dnn.NMSBoxesBatched"
    fast = decode.batched_nms(xyxy, scores, classes, 0.45)
    plain = decode._numpy_batched_nms(xyxy, scores, classes, 0.45)
    assert fast.tolist() == plain.tolist()


# -- end-to-end exports (NMS inside the model), RT-DETR, TensorRT's EfficientNMS -------------


def _e2e_rows(rows: list[tuple[float, ...]], k: int = 300) -> np.ndarray:
    """An end-to-end output (1, k, 6): the given rows first, the rest unused (zeros)."""
    out = np.zeros((1, k, 6), np.float32)
    if rows:
        out[0, : len(rows)] = rows
    return out


def test_end2end_keeps_rows_over_the_threshold_best_first_without_nms():
    out = _e2e_rows(
        [
            (10, 10, 50, 50, 0.60, 2),
            (12, 12, 52, 52, 0.90, 2),  # overlaps the first: no NMS here, both stay
            (100, 100, 140, 160, 0.20, 0),  # under the threshold
            (200, 50, 260, 90, 0.75, 7),
        ]
    )
    xyxy, scores, classes = decode_end2end(out, P)
    np.testing.assert_allclose(scores, [0.90, 0.75, 0.60])
    np.testing.assert_array_equal(classes, [2, 7, 2])
    np.testing.assert_allclose(xyxy, [[12, 12, 52, 52], [200, 50, 260, 90], [10, 10, 50, 50]])
    assert xyxy.dtype == np.float32 and classes.dtype == np.int32
    a, b = decode_end2end(out, P), decode_end2end(out[0], P)  # with or without the batch axis
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_end2end_max_detections_and_an_empty_output():
    rows = [(i, i, i + 10, i + 10, 0.3 + i / 1000, i % 5) for i in range(50)]
    _, scores, _ = decode_end2end(_e2e_rows(rows), DecodeParams(0.25, 0.45, 10))
    assert len(scores) == 10 and np.all(np.diff(scores) <= 0) and scores[0] == pytest.approx(0.349)
    assert [len(a) for a in decode_end2end(_e2e_rows([]), P)] == [0, 0, 0]


def test_rtdetr_scales_normalised_centre_boxes_to_input_pixels():
    p = DecodeParams(0.25, 0.45, 100, input_w=640, input_h=320)
    scores = np.zeros((1, 300, 4 + 3), np.float32)
    scores[0, 0] = (0.5, 0.5, 0.25, 0.5, 0.1, 0.8, 0.3)  # class 1 at 0.8
    scores[0, 1] = (0.1, 0.2, 0.1, 0.1, 0.2, 0.1, 0.1)  # nothing over 0.25
    xyxy, s, c = decode_rtdetr(scores, p)
    np.testing.assert_allclose(xyxy, [[240, 80, 400, 240]])
    np.testing.assert_allclose(s, [0.8])
    np.testing.assert_array_equal(c, [1])
    topk = np.zeros((1, 300, 6), np.float32)  # Ultralytics 8.4: top-k in the graph
    topk[0, 0] = (0.5, 0.5, 0.25, 0.5, 0.8, 1)
    for x, y in zip(decode_rtdetr(topk, replace(p, rtdetr_topk=True)), (xyxy, s, c)):
        np.testing.assert_allclose(x, y)


def test_efficient_nms_respects_num_dets_and_drops_the_padding():
    from edge_agent.pipelines.decode import decode_efficient_nms

    boxes = np.zeros((1, 100, 4), np.float32)
    boxes[0, :3] = [[0, 0, 10, 10], [5, 5, 20, 20], [30, 30, 40, 40]]
    boxes[0, 3] = [1, 1, 2, 2]  # padding past num_dets: never read as a box
    scores = np.zeros((1, 100), np.float32)
    scores[0, :4] = [0.9, 0.5, 0.3, 0.99]
    classes = np.zeros((1, 100), np.int32)
    classes[0, :4] = [3, 1, 4, 2]
    num = np.array([[3]], np.int32)
    xyxy, s, c = decode_efficient_nms(num, boxes, scores, classes, P)
    np.testing.assert_allclose(s, [0.9, 0.5, 0.3])
    np.testing.assert_array_equal(c, [3, 1, 4])
    np.testing.assert_allclose(xyxy, boxes[0, :3])
    assert c.dtype == np.int32
    none = decode_efficient_nms(np.array([0], np.int32), boxes[0], scores[0], classes[0], P)
    assert [len(a) for a in none] == [0, 0, 0]
