"""``edge-agent models check``: what the agent understood of a model, before deploying it.

The model is loaded exactly as ``run`` loads it (manifest or ONNX metadata, input adapter,
the config's backend), its decisions are printed with the rule behind each, and it runs
on a few synthetic frames through the same preprocessing, backend and decoder.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np
import yaml

from edge_agent.checks.evaluation import heldout_images
from edge_agent.core import configload
from edge_agent.core.budget_fit import BudgetFit
from edge_agent.core.files import atomic_write
from edge_agent.core.model_config import BackendConfig, ModelConfig
from edge_agent.core.text import printable
from edge_agent.models.decoders import registry as decoders
from edge_agent.models.manifest import ModelManifest
from edge_agent.pipelines.model import LoadedModel, load_model, model_notes_once
from edge_agent.pipelines.preprocess import Letterbox


@dataclass
class CheckReport:
    lines: list[tuple[str, str]] = field(default_factory=list)  # (what, decided)
    detections: list[int] = field(default_factory=list)  # per synthetic frame
    frame_ms: list[float] = field(default_factory=list)
    infer_ms: list[float] = field(default_factory=list)
    fits: bool = True  # its inference fits the deadline it was checked against

    def add(self, what: str, text: str) -> None:
        self.lines.append((what, text))

    def format(self) -> str:
        """The lines, each value escaped: labels, tensor names and notes are the model
        author's text (``core.text.printable``; a label is bounded where it is read)."""
        width = max(len(k) for k, _ in self.lines)
        return "\n".join(f"{k:<{width}}  {printable(v, None)}" for k, v in self.lines)


def check_model(
    model: ModelConfig, backend: BackendConfig, frames: int = 8, budget_ms: float = 0.0
) -> tuple[CheckReport, LoadedModel]:
    """Load ``model`` as ``run`` would and run it on ``frames`` synthetic frames; with
    ``budget_ms``, say whether its inference fits that deadline (as ``run`` does at start).
    Raises what loading raises (ModelError for a model the agent cannot run)."""
    with model_notes_once():
        loaded = load_model(model, backend)
    with loaded:
        report = _describe(loaded)
        _run(loaded, frames, report)
    if budget_ms and report.infer_ms:
        fit = BudgetFit(float(np.median(report.infer_ms)), budget_ms)
        report.fits = fit.fits
        report.add("deadline", fit.advice("this model") or f"fits the {budget_ms:g} ms budget")
    return report, loaded


def _describe(loaded: LoadedModel) -> CheckReport:
    r = CheckReport()
    resolved, m, p = loaded.resolved, loaded.manifest, loaded.params
    r.add("model", resolved.path)
    r.add("manifest", resolved.manifest_path or "none: read from the ONNX (the rules below)")
    i = m.input
    norm = "no scaling (in the graph)" if i.dtype == "uint8" else f"x{i.scale:.6g}"
    if any(i.mean) or any(s != 1.0 for s in i.std):
        norm += f", mean {list(i.mean)}, std {list(i.std)}"
    r.add(
        "input",
        f"{i.name or '(first)'} {i.layout} {i.dtype} {i.width}x{i.height}, {i.color.upper()}, {norm}, "
        f"{i.resize}" + (f" (pad {i.pad_value})" if i.resize == "letterbox" else ""),
    )
    if loaded.adapted_from:
        r.add("input adapter", "on: the host writes the resized uint8 BGR frame; the graph converts it")
    d = loaded.decode
    outs = loaded.backend.outputs
    read = ", ".join(f"{outs[k].name} {list(outs[k].shape)} {outs[k].dtype}" for k in d.outputs)
    r.add("decoder", f"{d.name}: reads {read}")
    setup = d.decoder.describe()
    if setup:
        r.add(f"{d.name} output", setup)
    for note in resolved.assumptions:
        r.add("assumed", note)
    names = ", ".join(m.labels[:6]) + (", ..." if len(m.labels) > 6 else "")
    r.add("labels", f"{len(m.labels)}: {names}")
    nms = f"NMS IoU {p.iou_threshold}"
    if d.decoder.nms_in_model:
        nms = "no NMS here (in the model, or not needed)"
    r.add("thresholds", f"score > {p.score_threshold}, {nms}, at most {p.max_detections} detections")
    described = loaded.backend.describe()
    r.add("backend", ", ".join(f"{k} {v}" for k, v in described.items()))
    return r


def _run(loaded: LoadedModel, frames: int, r: CheckReport) -> None:
    io = loaded.backend.allocate()
    loaded.backend.warmup(io, runs=1)
    geo = Letterbox()
    for image, _ in heldout_images(frames):
        t = time.perf_counter()
        loaded.preprocessor(image, io.inputs[loaded.input_name], geo)
        t_infer = time.perf_counter()
        loaded.backend.infer(io)
        r.infer_ms.append((time.perf_counter() - t_infer) * 1000)
        scores = loaded.decode(io.outputs, loaded.params).scores
        r.frame_ms.append((time.perf_counter() - t) * 1000)
        r.detections.append(len(scores))
    if frames:
        det = np.asarray(r.detections)
        r.add(
            "ran",
            f"{frames} synthetic frames: {det.mean():.1f} detections per frame (min {det.min()}, max "
            f"{det.max()}), {np.median(r.frame_ms):.1f} ms per frame (preprocess + infer + decode;"
            f" inference {np.median(r.infer_ms):.1f})",
        )


def write_manifest(m: ModelManifest, path: str, force: bool = False) -> str:
    """Write ``m`` as YAML to ``path`` (atomically); refuses to replace a file unless ``force``."""
    if os.path.exists(path) and not force:
        raise FileExistsError(f"{path} exists: pass --force to replace it")
    plain = configload.to_plain(m)
    if not decoders.get(m.output.decoder).roles:  # one output, named by output.name
        del plain["output"]["efficient_nms"]
    text = (
        "# Written by `edge-agent models check --write-manifest` from what the agent read in the model.\n"
        "# Edit it (labels, thresholds, input) and keep it beside the model: it is read instead of the\n"
        "# ONNX's metadata from now on.\n" + yaml.safe_dump(plain, sort_keys=False)
    )
    atomic_write(path, text.encode(), mode=0o644)  # beside the model, read by whoever runs it
    return path
