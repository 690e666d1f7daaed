"""Accuracy as agreement: the reference configuration's detections on the judged frames are
the ground truth, and each candidate that could be chosen is scored against them (mAP@0.5)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from edge_agent.core.config import AgentConfig
from edge_agent.core.plan import onnxruntime_of
from edge_agent.tune.candidates import Candidate, TuneSettings, with_ort
from edge_agent.tune.workload import FramesError, FrameSet, judged_frames

if TYPE_CHECKING:
    from edge_agent.checks.evaluation import Boxes

log = logging.getLogger(__name__)


def _arithmetic(cfg: AgentConfig) -> tuple[Any, Any]:
    """What decides a configuration's detections: its model and backend, less ONNX
    Runtime's thread settings (threads, spinning, execution mode change the speed only)."""
    ort = onnxruntime_of(cfg.backend)
    if ort is None:
        return cfg.model, cfg.backend
    same = replace(
        ort, intra_op_threads=0, inter_op_threads=1, execution_mode="sequential", allow_spinning=False
    )
    return cfg.model, with_ort(cfg, same).backend


@dataclass
class Reference:
    """The reference configuration's detections on the judged frames: the ground truth
    every candidate's agreement is scored against; agreements are kept by arithmetic."""

    key: tuple[Any, Any]
    frames: FrameSet
    labels: tuple[str, ...] = ()
    detections: list[Boxes] | None = None
    error: str = ""  # why there are no detections
    scores: dict[Any, float | None] = field(default_factory=dict)

    def build(self, cfg: AgentConfig) -> None:
        """Run the reference (at its operating thresholds) over the frames."""
        from edge_agent.checks.evaluation import detect, load_judged

        loaded, _ = load_judged(cfg.model, cfg.backend, reference=True)
        with loaded:
            self.labels = tuple(loaded.manifest.labels)
            self.detections = detect(loaded, self.frames)
        if not self.detections:
            self.detections = None
            raise FramesError(f"no frame of {self.frames.what} could be read")

    def objects(self) -> int:
        return sum(len(d[2]) for d in self.detections or ())

    def describe(self, s: TuneSettings) -> str:
        if self.detections is None:
            return f"not judged: no reference detections ({self.error or 'the reference did not run'})"
        n = len(self.detections)
        if not self.objects():
            return (
                f"not judged: the reference detects nothing on {self.frames.what} ({n} frames); "
                "give frames that show what the model is meant to find"
            )
        return (
            f"agreement with the reference's detections (the first candidate, the config as given: "
            f"{self.objects()} objects on {n} frames, {self.frames.what}) as ground truth, mAP@0.5; "
            f"below {s.min_agreement:.2f} (1 - map_tolerance) is rejected. A class the reference never "
            "detects counts (AP 0) where a candidate reports it at its operating threshold. Only "
            "candidates that could be chosen are scored; those that run the same model with only "
            "ONNX Runtime's thread settings or the power state changed are not re-scored (their "
            "detections are the reference's)"
        )


def make_reference(base: AgentConfig, s: TuneSettings) -> Reference:
    """The reference for ``base`` (the first candidate) on its judged frames, not yet run
    (``Reference.build``); FramesError when those frames cannot be read."""
    return Reference(_arithmetic(base), judged_frames(base, s))


def _agreement_of(cfg: AgentConfig, ref: Reference) -> float | None:
    """The candidate's detections on the reference's frames, scored against the reference's
    (by label name, where its labels differ: a label the reference's model lacks is a class
    of its own, which the reference never detects)."""
    from edge_agent.checks.evaluation import agreement, detect, load_judged

    assert ref.detections is not None
    loaded, operating = load_judged(cfg.model, cfg.backend, reference=False)
    with loaded:
        labels = tuple(loaded.manifest.labels)
        dets = detect(loaded, ref.frames)
    names = list(ref.labels)
    if labels != ref.labels:
        names += [name for name in labels if name not in ref.labels]
        index = {name: i for i, name in enumerate(names)}
        remap = np.array([index[name] for name in labels], np.int64)
        dets = [(xyxy, scores, remap[cls]) for xyxy, scores, cls in dets]
    return agreement(ref.detections, dets, len(names), operating_threshold=operating)


def check_accuracy(c: Candidate, ref: Reference, s: TuneSettings) -> None:
    """Judge the candidate's agreement with the reference; a feasible one below the minimum
    is rejected. Only a feasible candidate is scored (the others cannot be chosen: their
    agreement is reported only when it is known already), and none when the reference
    detects nothing."""
    key = _arithmetic(c.config)
    if key == ref.key:
        c.agreement = 1.0 if ref.objects() else None
        c.judged = "same model and arithmetic as the reference: not re-scored"
        return
    if ref.detections is None:
        if c.status == "feasible":
            c.status, c.reason = "rejected", f"no reference detections to judge it against ({ref.error})"
        return
    if not ref.objects():
        c.judged = "not judged: the reference detects nothing on these frames"
        return
    if key in ref.scores:
        c.judged = "scored once for its model and arithmetic"
    elif c.status == "feasible":
        ref.scores[key] = _agreement_of(c.config, ref)
    else:
        c.judged = "not scored: it cannot be chosen"
        return
    c.agreement = ref.scores[key]
    if c.agreement is not None and c.agreement < s.min_agreement:
        why = (
            f"agreement {c.agreement:.3f} with the reference's detections < {s.min_agreement:.2f} "
            f"(mAP@0.5 on {len(ref.detections)} frames)"
        )
        if c.status == "feasible":
            c.status, c.reason = "rejected", why
        else:
            c.judged = f"also {why}"


def judge(c: Candidate, ref: Reference, s: TuneSettings) -> None:
    """``check_accuracy``; a candidate whose own detections fail cannot be chosen."""
    try:
        check_accuracy(c, ref, s)
    except Exception as e:
        why = f"its detections failed: {type(e).__name__}: {e}"
        if c.status == "feasible":
            c.status, c.reason = "failed", why
        else:
            c.judged = why


def judge_reference(c: Candidate, ref: Reference) -> None:
    """The reference's detections, whatever its own measurement gave (a failure to get them
    is the accuracy check's: the reference keeps its measured status)."""
    try:
        ref.build(c.config)
    except Exception as e:
        ref.error = f"{type(e).__name__}: {e}"
        c.judged = f"its detections failed: {ref.error}"
        return
    c.agreement = 1.0 if ref.objects() else None
    c.judged = "the reference" if ref.objects() else "the reference detects nothing on these frames"
