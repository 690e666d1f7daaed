"""VOC-style AP / mAP and the held-out frame set (agent/evaluation.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.checks.evaluation import (
    HELDOUT_SEED,
    FrameResult,
    agreement,
    average_precision,
    heldout_frames,
    mean_average_precision,
)

A = (10, 10, 50, 50)  # ground-truth boxes used below (pairwise disjoint)
B = (100, 10, 140, 50)
C = (10, 100, 50, 140)
NOWHERE = (300, 300, 340, 340)


def frame(dets: list[tuple], gts: list[tuple]) -> FrameResult:
    """dets: (class, box, score); gts: (class, box) or (class, box, visibility)."""
    xyxy = np.array([d[1] for d in dets], np.float32).reshape(-1, 4)
    scores = np.array([d[2] for d in dets], np.float32)
    class_ids = np.array([d[0] for d in dets], np.int32)
    gt = np.array([[g[0], *g[1], g[2] if len(g) > 2 else 1.0] for g in gts], np.float32).reshape(-1, 6)
    return FrameResult(xyxy, scores, class_ids, gt)


def shifted(box: tuple, dx: float) -> tuple:
    return (box[0] + dx, box[1], box[2] + dx, box[3])


# -- average_precision -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("recall", "precision", "ap"),
    [
        pytest.param([1.0], [1.0], 1.0, id="perfect"),
        pytest.param([], [], 0.0, id="no-detections"),
        pytest.param([0.5, 1.0], [1.0, 1.0], 1.0, id="two-tp"),
        pytest.param([0.5, 1.0], [1.0, 0.5], 0.75, id="tp-fp-tp"),
        pytest.param([0.0, 0.5, 1.0], [0.0, 0.5, 2 / 3], 2 / 3, id="fp-first"),
        pytest.param([0.5], [1.0], 0.5, id="half-recall"),
        # Precision is interpolated: the envelope from the right lifts the 0.5 dip to 0.75.
        pytest.param([0.25, 0.5, 0.75], [1.0, 0.5, 0.75], 0.625, id="interpolated"),
        pytest.param([0.5, 0.5, 1.0], [1.0, 0.5, 2 / 3], 0.5 + 0.5 * 2 / 3, id="repeated-recall"),
    ],
)
def test_average_precision(recall, precision, ap):
    got = average_precision(np.array(recall, float), np.array(precision, float))
    assert got == pytest.approx(ap)
    assert isinstance(got, float)


# -- mean_average_precision ------------------------------------------------------------------


def ap_of(results: list[FrameResult], num_classes: int = 1, **kw) -> float:
    _, aps = mean_average_precision(results, num_classes, **kw)
    return aps[0]


CASES = [
    pytest.param([frame([(0, A, 0.9), (0, B, 0.8)], [(0, A), (0, B)])], 1.0, id="perfect"),
    pytest.param(
        [frame([(0, shifted(A, 2), 0.9)], [(0, A)]), frame([(0, B, 0.7)], [(0, B)])],
        1.0,
        id="perfect-two-frames",
    ),
    pytest.param(
        [frame([(0, NOWHERE, 0.95), (0, A, 0.9), (0, B, 0.8)], [(0, A), (0, B)])], 2 / 3, id="fp-ranked-first"
    ),
    pytest.param(
        [frame([(0, A, 0.9)], [(0, A)]), frame([(0, NOWHERE, 0.95), (0, B, 0.5)], [(0, B)])],
        2 / 3,
        id="fp-ranked-first-across-frames",
    ),
    pytest.param([frame([(0, A, 0.9)], [(0, A), (0, B)])], 0.5, id="missed-object"),
    pytest.param([frame([], [(0, A)])], 0.0, id="no-detections"),
    pytest.param([frame([(0, NOWHERE, 0.9)], [(0, A)])], 0.0, id="only-fp"),
    # The duplicate of A (rank 2) is a false positive: AP = 0.5 * 1 + 0.5 * 2/3.
    pytest.param(
        [frame([(0, A, 0.9), (0, shifted(A, 1), 0.8), (0, B, 0.7)], [(0, A), (0, B)])],
        5 / 6,
        id="duplicate-is-fp",
    ),
    # Of two detections of A, the higher-scoring one claims it (even listed second and fitting
    # worse); the other is the duplicate, ranked below: AP 1.
    pytest.param(
        [frame([(0, shifted(A, 1), 0.5), (0, shifted(A, 10), 0.9)], [(0, A)])],
        1.0,
        id="best-score-claims-object",
    ),
    # Detections of another class do not count for this one.
    pytest.param([frame([(0, A, 0.9), (1, B, 0.95)], [(0, A)])], 1.0, id="other-class-ignored"),
    # IoU 0.6 with A: a match at 0.5, not at 0.7.
    pytest.param([frame([(0, shifted(A, 10), 0.9)], [(0, A)])], 1.0, id="iou-0.6-matches"),
    pytest.param([frame([(0, shifted(A, 20), 0.9)], [(0, A)])], 0.0, id="iou-0.33-misses"),
]


@pytest.mark.parametrize(("results", "ap"), CASES)
def test_ap_cases(results, ap):
    assert ap_of(results, 2) == pytest.approx(ap)


@pytest.mark.parametrize(("iou_threshold", "ap"), [(0.3, 1.0), (0.5, 1.0), (0.7, 0.0)])
def test_iou_threshold_parameter(iou_threshold, ap):
    results = [frame([(0, shifted(A, 10), 0.9)], [(0, A)])]  # IoU 0.6
    assert ap_of(results, iou_threshold=iou_threshold) == pytest.approx(ap)


def test_ranking_uses_scores_not_input_order():
    # Same detections as "fp-ranked-first", listed in a different order.
    results = [frame([(0, B, 0.8), (0, A, 0.9), (0, NOWHERE, 0.95)], [(0, A), (0, B)])]
    assert ap_of(results) == pytest.approx(2 / 3)
    results = [frame([(0, NOWHERE, 0.1), (0, B, 0.8), (0, A, 0.9)], [(0, A), (0, B)])]
    assert ap_of(results) == pytest.approx(1.0), "a false positive ranked last costs nothing"


DIFFICULT = 0.3  # visibility below 0.5


@pytest.mark.parametrize(
    ("results", "ap"),
    [
        # A detection on a difficult object ranked first: not a false positive ...
        pytest.param(
            [frame([(0, C, 0.99), (0, A, 0.9), (0, B, 0.8)], [(0, A), (0, B), (0, C, DIFFICULT)])],
            1.0,
            id="matched-difficult-not-fp",
        ),
        # ... and not a true positive: recall stays at 1/2 with A found and B missed.
        pytest.param(
            [frame([(0, C, 0.99), (0, A, 0.9)], [(0, A), (0, B), (0, C, DIFFICULT)])],
            0.5,
            id="matched-difficult-not-tp",
        ),
        # A missed difficult object is not in the recall denominator.
        pytest.param(
            [frame([(0, A, 0.9), (0, B, 0.8)], [(0, A), (0, B), (0, C, DIFFICULT)])],
            1.0,
            id="missed-difficult-free",
        ),
        # Two detections of one difficult object: both ignored (neither is a duplicate FP).
        pytest.param(
            [frame([(0, C, 0.99), (0, shifted(C, 1), 0.98), (0, A, 0.9)], [(0, A), (0, C, DIFFICULT)])],
            1.0,
            id="difficult-duplicates-ignored",
        ),
        # Visibility exactly 0.5 is not difficult: missing it costs recall.
        pytest.param([frame([(0, A, 0.9)], [(0, A), (0, B, 0.5)])], 0.5, id="visibility-0.5-counts"),
    ],
)
def test_difficult_objects_neither_help_nor_hurt(results, ap):
    assert ap_of(results) == pytest.approx(ap)


def test_only_difficult_ground_truth_gives_no_ap():
    m, aps = mean_average_precision([frame([(0, A, 0.9)], [(0, A, DIFFICULT)])], 1)
    assert math.isnan(aps[0])
    assert m == 0.0


def test_class_without_ground_truth_is_excluded_from_the_mean():
    results = [
        frame([(0, A, 0.9), (1, NOWHERE, 0.8), (2, B, 0.7), (2, C, 0.95)], [(0, A), (2, B)]),
    ]
    m, aps = mean_average_precision(results, 4)
    assert len(aps) == 4
    assert aps[0] == pytest.approx(1.0)
    assert math.isnan(aps[1]), "class 1 has detections but no ground truth: no AP"
    assert aps[2] == pytest.approx(0.5)  # FP (C) first, then B
    assert math.isnan(aps[3]), "class 3 has neither detections nor ground truth"
    assert m == pytest.approx(0.75), f"mean over classes 0 and 2 only, got {m} from {aps}"


def test_no_results_at_all():
    m, aps = mean_average_precision([], 3)
    assert m == 0.0 and len(aps) == 3 and all(math.isnan(a) for a in aps)


def test_frames_without_ground_truth_count_their_false_positives():
    results = [frame([(0, A, 0.9)], [(0, A)]), frame([(0, B, 0.95)], [])]
    assert ap_of(results) == pytest.approx(0.5)


# -- held-out set ----------------------------------------------------------------------------


def test_heldout_500_frames_are_distinct_and_unseen():
    frames = list(heldout_frames(500))
    assert len(frames) == 500
    assert len(set(frames)) == 500, "held-out frames repeat"
    seeds = {s for s, _ in frames}
    assert min(seeds) >= 1_000_000 == HELDOUT_SEED, "held-out seeds overlap the training seeds"
    assert all(isinstance(s, int) and isinstance(i, int) and i >= 0 for s, i in frames)
    assert len(seeds) == 10
    # As documented: seeds 1_000_000..1_000_009, frames 0, 7, ..., 343 of each.
    assert set(frames) == {(HELDOUT_SEED + k, 7 * j) for k in range(10) for j in range(50)}


def test_heldout_default_is_500():
    assert list(heldout_frames()) == list(heldout_frames(500))


@pytest.mark.parametrize("n", [0, 1, 9, 10, 11, 123, 501, 2_000])
def test_heldout_frames_any_count(n):
    frames = list(heldout_frames(n))
    assert len(frames) == n and len(set(frames)) == n
    assert all(s >= 1_000_000 for s, _ in frames)


def test_heldout_frames_is_a_prefix_stable_set():
    """The first frames of a smaller evaluation come from the same fixed set (deterministic)."""
    assert list(heldout_frames(500)) == list(heldout_frames(500))
    assert set(heldout_frames(100)) <= set(heldout_frames(1_000))


# -- agreement with a reference's detections -------------------------------------------------


def dets(*items: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class, box, score) items as a decoder's (xyxy, scores, class ids)."""
    xyxy = np.array([i[1] for i in items], np.float32).reshape(-1, 4)
    return xyxy, np.array([i[2] for i in items], np.float32), np.array([i[0] for i in items], np.int64)


REFERENCE = [dets((0, A, 0.9), (1, B, 0.8)), dets((0, C, 0.7)), dets()]


def test_agreement_of_the_same_detections_is_one():
    assert agreement(REFERENCE, REFERENCE, 2) == pytest.approx(1.0)
    # Scores may differ, boxes move a little, and extra detections ranked last cost nothing.
    moved = [dets((0, shifted(A, 2), 0.5), (1, B, 0.99), (1, NOWHERE, 0.01)), dets((0, C, 0.3)), dets()]
    assert agreement(REFERENCE, moved, 2) == pytest.approx(1.0)


def test_agreement_falls_with_what_the_candidate_misses_or_confuses():
    missed = [dets((0, A, 0.9), (1, B, 0.8)), dets(), dets()]  # C not found: class 0 AP 0.5
    assert agreement(REFERENCE, missed, 2) == pytest.approx(0.75)
    swapped = [dets((1, A, 0.9), (0, B, 0.8)), dets((1, C, 0.7)), dets()]  # every class wrong
    assert agreement(REFERENCE, swapped, 2) == 0.0
    # A confident false positive on an empty frame ranks above both true ones of its class:
    # precision 1/2, 2/3 at recall 1/2, 1 (interpolated: 2/3 throughout), class 1 untouched.
    invented = [*REFERENCE[:2], dets((0, NOWHERE, 0.99))]
    assert agreement(REFERENCE, invented, 2) == pytest.approx((2 / 3 + 1) / 2)


def test_agreement_needs_reference_detections_and_the_same_frames():
    assert agreement([dets(), dets()], [dets((0, A, 0.9)), dets()], 2) is None
    with pytest.raises(ValueError, match="2 candidate frames for 3 reference frames"):
        agreement(REFERENCE, REFERENCE[:2], 2)


def test_a_class_the_reference_never_detects_counts_when_the_candidate_reports_it():
    # Confident boxes of class 2, which the reference never detects: that class counts,
    # with AP 0, beside classes 0 and 1 (AP 1 each).
    invents = [dets((0, A, 0.9), (1, B, 0.8), (2, NOWHERE, 0.9)), dets((0, C, 0.7)), dets()]
    assert agreement(REFERENCE, invents, 3, operating_threshold=0.25) == pytest.approx(2 / 3)
    # Below the candidate's operating threshold it would not report them: no class of its own.
    faint = [dets((0, A, 0.9), (1, B, 0.8), (2, NOWHERE, 0.1)), dets((0, C, 0.7)), dets()]
    assert agreement(REFERENCE, faint, 3, operating_threshold=0.25) == pytest.approx(1.0)
    assert agreement(REFERENCE, REFERENCE, 3, operating_threshold=0.25) == pytest.approx(1.0)


def test_heldout_images_render_the_heldout_set():
    from edge_agent.checks.evaluation import heldout_images
    from edge_agent.pipelines.sources.synthetic import SceneSpec, SyntheticScene

    spec = SceneSpec(width=64, height=48, num_objects=2)
    got = [(image.copy(), gt.copy()) for image, gt in heldout_images(12, spec)]
    assert len(got) == 12
    for (image, gt), (seed, index) in zip(got, heldout_frames(12)):
        scene = SyntheticScene(SceneSpec(width=64, height=48, num_objects=2, seed=seed))
        want_image, want_gt = np.empty_like(image), np.zeros_like(gt)
        scene.render(index, want_image, want_gt)
        assert np.array_equal(image, want_image) and np.array_equal(gt, want_gt)
