"""Detection accuracy: VOC-style mAP@IoU on held-out synthetic scenes, and agreement with a
reference model's detections on any frames (``agreement``: what ``edge-agent tune`` judges by).

The held-out set is fixed (seeds 1_000_000..1_000_009, frames 0, 7, ..., 343 of each:
500 frames); the bundled detector is trained on seeds below 1_000_000 only. Ground-truth
objects less than half visible are "difficult": matching one is neither a true nor a
false positive, and they are not in the recall denominator.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.model_config import BackendConfig, ModelConfig
from edge_agent.models.decoders.nms import box_iou
from edge_agent.pipelines.preprocess import Letterbox, boxes_to_source
from edge_agent.pipelines.sources.synthetic import CLASSES, SceneSpec, SyntheticScene

if TYPE_CHECKING:
    from edge_agent.pipelines.model import LoadedModel

HELDOUT_SEED = 1_000_000
HELDOUT_SEEDS = 10
HELDOUT_STEP = 7
MIN_VISIBILITY = 0.5


def heldout_frames(frames: int = 500) -> Iterator[tuple[int, int]]:
    """(seed, frame index) pairs of the held-out set, ``frames`` of them."""
    per_seed = max(1, -(-frames // HELDOUT_SEEDS))
    count = 0
    for k in range(HELDOUT_SEEDS):
        for j in range(per_seed):
            if count == frames:
                return
            yield HELDOUT_SEED + k, j * HELDOUT_STEP
            count += 1


@dataclass
class FrameResult:
    xyxy: np.ndarray  # (K, 4) detections, source pixels
    scores: np.ndarray  # (K,)
    class_ids: np.ndarray  # (K,)
    gt: np.ndarray  # (M, 6): class, x1, y1, x2, y2, visibility


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the precision-recall curve, all-point interpolated (VOC 2010+)."""
    r = np.concatenate([[0.0], recall, [1.0]])
    p = np.concatenate([[0.0], precision, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.flatnonzero(r[1:] != r[:-1])
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


def mean_average_precision(
    results: list[FrameResult], num_classes: int, iou_threshold: float = 0.5
) -> tuple[float, list[float]]:
    """mAP over classes that have ground truth, and AP per class (nan without truth)."""
    aps: list[float] = []
    for c in range(num_classes):
        scores: list[np.ndarray] = []
        hits: list[np.ndarray] = []
        n_pos = 0
        for r in results:
            gt = r.gt[r.gt[:, 0] == c]
            easy = gt[:, 5] >= MIN_VISIBILITY
            n_pos += int(easy.sum())
            sel = r.class_ids == c
            det, sc = r.xyxy[sel], r.scores[sel]
            order = np.argsort(-sc, kind="stable")
            det, sc = det[order], sc[order]
            outcome = np.zeros(len(sc), np.int8)  # 1 TP, 0 FP, -1 ignored (difficult)
            if len(gt) and len(det):
                iou = box_iou(det.astype(np.float64), gt[:, 1:5].astype(np.float64))
                taken = np.zeros(len(gt), bool)
                for i in range(len(det)):
                    j = int(np.argmax(iou[i]))
                    if iou[i, j] < iou_threshold:
                        continue
                    if not easy[j]:
                        outcome[i] = -1
                    elif not taken[j]:
                        taken[j] = True
                        outcome[i] = 1
            keep = outcome >= 0
            scores.append(sc[keep])
            hits.append(outcome[keep])
        if n_pos == 0:
            aps.append(float("nan"))
            continue
        all_scores = np.concatenate(scores) if scores else np.empty(0)
        all_hits = np.concatenate(hits) if hits else np.empty(0, np.int8)
        order = np.argsort(-all_scores, kind="stable")
        tp = np.cumsum(all_hits[order] == 1)
        fp = np.cumsum(all_hits[order] == 0)
        recall = tp / n_pos
        precision = tp / np.maximum(tp + fp, 1)
        aps.append(average_precision(recall, precision))
    valid = [a for a in aps if not np.isnan(a)]
    return (float(np.mean(valid)) if valid else 0.0), aps


def heldout_images(
    frames: int = 500, spec: SceneSpec | None = None
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The held-out set rendered: (image, ground truth) per frame, both valid until the
    next. ``spec``: the scene's size, objects and noise (its seed is the set's)."""
    spec = spec or SceneSpec()
    image = np.empty((spec.height, spec.width, 3), np.uint8)
    gt = np.zeros((spec.num_objects, 6), np.float32)
    scenes: dict[int, SyntheticScene] = {}
    for seed, index in heldout_frames(frames):
        scene = scenes.get(seed) or scenes.setdefault(seed, SyntheticScene(replace(spec, seed=seed)))
        scene.render(index, image, gt)
        yield image, gt


def evaluate(model: ModelConfig, backend: BackendConfig, frames: int = 500) -> dict:
    """Score a model on ``frames`` held-out synthetic frames; returns mAP@0.5 and details."""
    # AP integrates over all scores: nearly every candidate is kept (as for a judged model).
    loaded, _ = load_judged(model, backend, reference=False)
    truths: list[np.ndarray] = []
    times = LatencyHistogram()
    with loaded:
        labels = loaded.manifest.labels
        if tuple(labels) != CLASSES:
            raise ValueError(f"model labels {labels} are not the synthetic scene's classes {CLASSES}")

        def images() -> Iterator[np.ndarray]:
            for image, gt in heldout_images(frames):
                truths.append(gt.copy())
                yield image

        found = detect(loaded, images(), times)
    results = [FrameResult(xyxy, scores, cls, gt) for (xyxy, scores, cls), gt in zip(found, truths)]
    m_ap, per_class = mean_average_precision(results, len(labels))
    return {
        "model": loaded.resolved.path,
        "frames": len(results),
        "map50": round(m_ap, 4),
        "ap50_per_class": {name: round(ap, 4) for name, ap in zip(labels, per_class)},
        "mean_frame_ms": round(times.mean_ms(), 3),
    }


# -- agreement with a reference model -----------------------------------------------------
#
# On a user's own frames there is no ground truth; a configuration change (another model
# variant, TensorRT precision, a DLA core) is judged by how well its detections agree with
# the reference configuration's on the same frames: the reference's detections, at its
# operating thresholds, are the ground truth, and the candidate's mAP@0.5 against them is
# its agreement (1.0: it finds the same objects, boxes and classes, ranked above anything
# else it finds). A class the reference never detects has no truth: it counts (AP 0) only
# when the candidate reports it at its own operating threshold, so that confident boxes of
# a class the reference never sees lower the agreement.

#: The score threshold a judged model runs at: AP integrates over all scores, and a
#: detection just under the operating threshold still counts for it.
JUDGED_SCORE_THRESHOLD = 0.001
JUDGED_MAX_DETECTIONS = 300

#: One frame's boxes for judging: xyxy (K, 4) in source pixels, scores (K,), class ids (K,).
Boxes = tuple[np.ndarray, np.ndarray, np.ndarray]


def detect(
    loaded: LoadedModel, images: Iterable[np.ndarray], times: LatencyHistogram | None = None
) -> list[Boxes]:
    """Each image through the live path (``LoadedModel.run_one``: letterbox, infer,
    decode), its boxes mapped to source pixels. ``times``: each frame's preprocessing,
    inference and decoding recorded there."""
    io = loaded.backend.allocate()
    loaded.backend.warmup(io)
    geo = Letterbox()
    out: list[Boxes] = []
    for image in images:
        t = time.perf_counter_ns()
        xyxy, scores, classes, _ = loaded.run_one(image, io, geo)
        if times is not None:
            times.record(time.perf_counter_ns() - t)
        out.append((boxes_to_source(xyxy.astype(np.float32), geo), scores.copy(), classes.copy()))
    return out


def agreement(
    reference: list[Boxes],
    candidate: list[Boxes],
    num_classes: int,
    iou_threshold: float = 0.5,
    operating_threshold: float = 0.0,
) -> float | None:
    """The candidate's mAP@``iou_threshold`` with the reference's detections (frame by
    frame, the same frames) as ground truth; None when the reference detects nothing.

    The mean is over the classes the reference detects and those it never detects where
    the candidate reports a box scored ``operating_threshold`` (its own) or more: AP 0."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(candidate)} candidate frames for {len(reference)} reference frames")
    results = []
    for (ref_xyxy, _, ref_cls), (xyxy, scores, cls) in zip(reference, candidate):
        gt = np.zeros((len(ref_cls), 6), np.float32)
        gt[:, 0], gt[:, 1:5], gt[:, 5] = ref_cls, ref_xyxy, 1.0
        results.append(FrameResult(np.asarray(xyxy, np.float32), scores, cls, gt))
    if not any(len(r.gt) for r in results):
        return None
    _, aps = mean_average_precision(results, num_classes, iou_threshold)
    reported = {int(c) for r in results for c in r.class_ids[r.scores >= operating_threshold]}
    counted = [
        ap if not np.isnan(ap) else 0.0 for c, ap in enumerate(aps) if not np.isnan(ap) or c in reported
    ]
    return float(np.mean(counted))


def load_judged(model: ModelConfig, backend: BackendConfig, reference: bool) -> tuple[LoadedModel, float]:
    """The model loaded for an agreement check, and its operating score threshold: the
    reference at its operating thresholds (what it would publish), a candidate with
    nearly every detection kept."""
    from edge_agent.pipelines.model import load_model

    loaded = load_model(model, backend)
    operating = loaded.params.score_threshold
    if not reference:
        loaded.params = replace(
            loaded.params, score_threshold=JUDGED_SCORE_THRESHOLD, max_detections=JUDGED_MAX_DETECTIONS
        )
    return loaded, operating
