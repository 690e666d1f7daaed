"""``edge-agent tune``: measure candidate configurations on this device, keep the cheapest
that holds the deadline, and write it as a config overlay with a report.

The axes are the ones this machine has: ONNX Runtime threads, graph optimisation level
and thread spinning everywhere; model variants (input size profiles) given with
``--model``; on a Jetson also TensorRT precision and DLA core, and GPU clock locks and
power modes through the power manager (restored after every candidate, and on any
interruption). Each candidate runs the real pipeline on real work: the user's frames
(``--frames DIR``), else the config's own video file or image folder, decoded into memory
once and played, looped, as a camera at the camera rate (the same ``MemorySource`` bench
plays: no decoding during a measurement); else (a synthetic or a live camera) the
synthetic camera.

The search is cheap first: a candidate whose model alone (pure inference p50) cannot fit
the budget is pruned without a pipeline run; a pipeline run stops early once its running
median is past the budget. Accuracy is judged by agreement, so it works for any model:
the reference (the first candidate, the config as given) runs a fixed set of frames
(spread evenly over the same folder or video, or held-out synthetic ones for a synthetic
or live camera) through the live path, whatever its own measurement gave, and its
detections are the ground truth; each candidate that could be chosen (feasible: within
the budget) runs the same frames and scores mAP@0.5 against them, its agreement, and one
below ``1 - map_tolerance`` is rejected. Nothing is scored when the reference detects
nothing. Candidates whose detections cannot differ from the reference's (the same model
with only ONNX Runtime's thread settings, or the power state, changed) are not re-scored,
and each distinct model and arithmetic is scored once.
"""

from __future__ import annotations

import contextlib
import datetime
import itertools
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import cv2
import numpy as np
import yaml

from edge_agent.bench import BenchAgent, lane_settings, private_config, pure_inference, started
from edge_agent.core.config import (
    AgentConfig,
    AutoBackendConfig,
    ImageFolderSourceConfig,
    OnnxRuntimeConfig,
    PowerConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.core.configload import to_plain
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stages import STAGES
from edge_agent.pipelines.decode import Decoded
from edge_agent.pipelines.file_sources import (
    IMAGE_PATTERNS,
    PRELOAD_MIB,
    FileSourceConfig,
    file_frames,
    frame_count,
    list_images,
    preload,
)
from edge_agent.pipelines.model import model_notes_once
from edge_agent.pipelines.source_base import SourceError
from edge_agent.pipelines.sources import source_rate
from edge_agent.runner import onnxruntime_of

log = logging.getLogger(__name__)

OBJECTIVES = ("latency", "throughput", "power")


@dataclass(frozen=True)
class TuneSettings:
    budget_ms: float = 50.0
    objective: str = "latency"
    margin: float = 0.1  # a candidate's p99 must stay under budget × (1 - margin)
    # Agreement a candidate may lose: its mAP@0.5 against the reference's detections (on
    # the same frames) must be at least 1 - map_tolerance.
    map_tolerance: float = 0.02
    quick: bool = False
    models: tuple[str, ...] = ()  # extra model variants (input size profiles)
    source_fps: float = 0.0  # 0: the config's synthetic fps, else 30
    runtime_axes: bool = True  # ONNX Runtime threads / optimisation / spinning
    min_gain: float = 0.1  # a change must beat the current config by this much on the objective
    frames: str = ""  # a folder of the user's images to measure and judge on; empty: the config's source
    measure_s: float = 0.0  # each candidate's measured window; 0: 3 s quick, 8 s full
    judge_frames: int = 0  # frames the agreement is judged on; 0: 60 quick, 300 full

    @property
    def warmup_s(self) -> float:
        return 0.3 if self.quick else 1.0

    @property
    def window_s(self) -> float:
        return self.measure_s or (3.0 if self.quick else 8.0)

    @property
    def eval_frames(self) -> int:
        """Frames the agreement is judged on (spread over the folder or the video)."""
        return self.judge_frames or (60 if self.quick else 300)

    @property
    def min_agreement(self) -> float:
        return 1.0 - self.map_tolerance


@dataclass
class Candidate:
    name: str
    config: AgentConfig
    power: PowerConfig | None = None  # a profile to apply (Jetson) while this one runs
    status: str = "pending"  # chosen | feasible | over budget | pruned | early stop | rejected | failed
    reason: str = ""
    pure_p50_ms: float = 0.0
    e2e: dict[str, float] = field(default_factory=dict)
    stages_p50_ms: dict[str, float] = field(default_factory=dict)
    fps: float = 0.0
    power_mw: float | None = None
    agreement: float | None = None  # mAP@0.5 against the reference's detections
    judged: str = ""  # how the agreement was had, when it was not scored on its own
    sources: list[dict[str, Any]] = field(default_factory=list)  # what it was measured on
    samples_ms: list[float] = field(default_factory=list)  # for the chart (bounded)


# -- the candidates ------------------------------------------------------------------


def _with_ort(base: AgentConfig, ort: OnnxRuntimeConfig) -> AgentConfig:
    if isinstance(base.backend, AutoBackendConfig):
        return replace(base, backend=replace(base.backend, onnxruntime=ort))
    return replace(base, backend=ort)


def candidates(
    base: AgentConfig, s: TuneSettings, tensorrt: bool, jetson_power: list[PowerConfig]
) -> list[Candidate]:
    """The grid for this machine; the first is the reference (the config as it is)."""
    out = [Candidate("current", base)]
    # A variant is named by its file, or by its folder when the file is a bare model.onnx.
    models = [("", base.model.path)] + [
        (Path(m).parent.name if Path(m).stem == "model" and Path(m).parent.name else Path(m).stem, m)
        for m in s.models
    ]
    if tensorrt and not isinstance(base.backend, OnnxRuntimeConfig):
        trt = base.backend.tensorrt if isinstance(base.backend, AutoBackendConfig) else base.backend
        precisions = ["fp16"] + (["int8"] if trt.calibration_images else [])
        for p in precisions:
            for core in (-1, 0, 1):
                cfg = replace(base, backend=replace(trt, precision=p, dla_core=core))
                out.append(Candidate(f"trt {p} {'GPU' if core < 0 else f'DLA{core}'}", cfg))
    ort = onnxruntime_of(base.backend) or OnnxRuntimeConfig()
    threads = ((1, 2) if s.quick else (1, 2, 4)) if s.runtime_axes else ()
    levels = ("basic", "all") if s.quick else ("basic", "extended", "all")
    for t in threads:
        for level in levels:
            for spin in (False, True):
                variant = replace(ort, intra_op_threads=t, graph_optimization=level, allow_spinning=spin)
                if variant == ort:
                    continue
                name = f"ort threads={t} opt={level}{' spin' if spin else ''}"
                out.append(Candidate(name, _with_ort(base, variant)))
    for label, path in models[1:]:
        out.append(Candidate(f"model {label}", replace(base, model=replace(base.model, path=path))))
    for power in jetson_power:
        what = f"gpu {power.gpu_freq_mhz:g} MHz" if power.gpu_freq_mhz else f"nvpmodel {power.nvpmodel}"
        out.append(Candidate(f"power {what}", base, power=power))
    return out


def jetson_power_axes(cfg: PowerConfig, quick: bool) -> list[PowerConfig]:
    """GPU clock locks (and power modes) worth trying on this device; none off a Jetson."""
    from edge_agent.power import sysfs

    if not sysfs.detect(cfg.root).is_jetson:
        return []
    gpu = sysfs.find_gpu(cfg.root)
    axes: list[PowerConfig] = []
    if gpu is not None:
        avail = sysfs.parse_frequencies((gpu.devfreq / "available_frequencies").read_text())
        picks = sorted(
            {avail[-1], avail[len(avail) // 2]} if quick else {*avail[-3:], avail[len(avail) // 2]}
        )
        axes += [replace(cfg, manage=True, gpu_freq_mhz=f / 1e6) for f in picks]
    conf = Path(cfg.root, "etc/nvpmodel.conf")
    if not quick and conf.exists():  # a mode switch can take seconds: full sweeps only
        modes = sysfs.parse_nvpmodel_conf(conf.read_text())
        axes += [replace(cfg, manage=True, nvpmodel=str(mode)) for mode in modes]
    return axes


# -- what candidates run on ----------------------------------------------------------------


class FramesError(ValueError):
    """Frames to tune on that cannot be read; the message names the path."""


def image_files(
    folder: str, patterns: tuple[str, ...] = IMAGE_PATTERNS, what: str = "frames folder"
) -> list[str]:
    """The images of ``folder`` in name order (as the image-folder source plays them);
    FramesError naming the folder when it is missing, holds no image, or none reads."""
    if not os.path.isdir(folder):
        raise FramesError(
            f"{what} {folder} {'is not a folder' if os.path.exists(folder) else 'does not exist'}"
        )
    files = list_images(folder, patterns)
    if not files:
        raise FramesError(f"{what} {folder} holds no images (looked for {' '.join(patterns)})")
    if not any(cv2.imread(f, cv2.IMREAD_COLOR) is not None for f in files):
        raise FramesError(f"{what} {folder}: none of its {len(files)} images can be read")
    return files


@dataclass
class FrameSet:
    """The fixed frames every candidate's detections are compared on: up to ``wanted`` of
    the ``total`` (0: unknown) ``where``, read again for each candidate (none is held in
    memory; a yielded image is valid until the next one). ``count``: how many the last
    full pass gave."""

    where: str  # e.g. "images in DIR", "frames of VIDEO"
    total: int
    wanted: int
    read: Callable[[], Iterator[np.ndarray]]
    count: int | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        n = 0
        for image in self.read():
            n += 1
            yield image
        self.count = n

    @property
    def what(self) -> str:
        """The frames in words: the count a pass gave, once one did (else the count asked)."""
        n = self.count if self.count is not None else min(self.wanted, self.total or self.wanted)
        if not self.total:
            return f"the first {n} {self.where}"
        if n == self.total:
            return f"the {n} {self.where}"
        return f"{n} of the {self.total} {self.where}, spread evenly"


def _spread(total: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(total)`` (all of them when fewer)."""
    if total <= n:
        return list(range(total))
    return sorted({int(i) for i in np.linspace(0, total - 1, n).round()})


def _file_frames(src: FileSourceConfig, n: int, where: str) -> FrameSet:
    """``n`` frames spread evenly over a video file or an image folder (a video that
    declares no frame count: its first ``n``). FramesError when it cannot be read."""
    try:
        total = frame_count(src)
    except SourceError as e:
        raise FramesError(f"{e} (the config's source)") from None
    picks = _spread(total, n) if total else None

    def read() -> Iterator[np.ndarray]:
        with contextlib.closing(file_frames(src, picks)) as frames:
            yield from itertools.islice(frames, n)

    return FrameSet(where, total, n, read)


def _synthetic_frames(src: SyntheticSourceConfig | None, n: int) -> FrameSet:
    from edge_agent.evaluation import heldout_images
    from edge_agent.pipelines.synthetic import SceneSpec

    spec = SceneSpec()
    if src is not None:
        spec = replace(
            spec, width=src.width, height=src.height, num_objects=src.num_objects, noise_sigma=src.noise_sigma
        )

    def read() -> Iterator[np.ndarray]:
        for image, _ in heldout_images(n, spec):
            yield image

    return FrameSet("held-out synthetic frames", n, n, read)


def judged_frames(base: AgentConfig, s: TuneSettings) -> FrameSet:
    """The frames accuracy is judged on: ``s.frames``, else the config's first source when
    it is a file, else held-out synthetic scenes. Raises FramesError for a missing file."""
    n = s.eval_frames
    if s.frames:
        image_files(s.frames)
        return _file_frames(ImageFolderSourceConfig(path=s.frames), n, f"images in {s.frames}")
    src = base.source_list()[0]
    if isinstance(src, ImageFolderSourceConfig):
        image_files(src.path, src.patterns, "image folder")
        return _file_frames(src, n, f"images in {src.path}")
    if isinstance(src, VideoSourceConfig):
        return _file_frames(src, n, f"frames of {src.path}")
    return _synthetic_frames(src if isinstance(src, SyntheticSourceConfig) else None, n)


def measured_source(src: SourceConfig, fps: float, frames: str) -> SourceConfig:
    """What a source is measured on, with its name and lane settings: the ``frames``
    folder, else a file source itself (both played from memory, see ``Workload``), else
    the synthetic camera at ``fps`` (a live camera is in use by the agent, and its scene is
    not repeatable)."""
    if frames:
        return ImageFolderSourceConfig(path=frames, **lane_settings(src))
    if isinstance(src, SyntheticSourceConfig):
        return replace(src, fps=fps)
    if isinstance(src, (ImageFolderSourceConfig, VideoSourceConfig)):
        return src
    return SyntheticSourceConfig(fps=fps, **lane_settings(src))


@dataclass
class Workload:
    """What every candidate runs on: the camera rate, and the frames of each file source
    (by source name) decoded into memory once and played, looped, as a camera at that rate
    (``sources.MemorySource``, as bench plays them: nothing is decoded during a
    measurement, and a frame's capture time is when it was due). ``what``: in words."""

    fps: float
    played: dict[str, list[np.ndarray]]
    what: str


def make_workload(base: AgentConfig, s: TuneSettings) -> Workload:
    """Decode the frames the candidates are measured on (enough for a warm-up and a window
    at the camera rate, within ``PRELOAD_MIB`` in all); FramesError naming a file that
    cannot be read."""
    first = base.source_list()[0]
    fps = s.source_fps or source_rate(first)
    made = [measured_source(src, fps, s.frames) for src in base.source_list()]
    files = [src for src in made if isinstance(src, (ImageFolderSourceConfig, VideoSourceConfig))]
    wanted = math.ceil(fps * (s.warmup_s + s.window_s)) + 1
    budget_mib = PRELOAD_MIB / max(len({src.path for src in files}), 1)
    by_path: dict[str, list[np.ndarray]] = {}
    try:
        for src in files:
            if src.path not in by_path:
                by_path[src.path] = preload(src, wanted, budget_mib)
    except SourceError as e:
        raise FramesError(str(e)) from None
    played = {src.name: by_path[src.path] for src in files}
    each = f"{len(made)} sources, each on " if len(made) > 1 else ""
    src = made[0]
    if isinstance(src, (ImageFolderSourceConfig, VideoSourceConfig)):
        kind = "images in" if isinstance(src, ImageFolderSourceConfig) else "frames of"
        n, total = len(by_path[src.path]), frame_count(src)
        frames = f"the {n} {kind}" if n == total else f"the first {n} {kind}"
        what = f"{each}{frames} {src.path}, decoded into memory and played looped as a camera at {fps:g} fps"
    else:
        live = (
            ""
            if isinstance(first, SyntheticSourceConfig)
            else f" (the config's {first.type} camera: give --frames)"
        )
        what = f"{each}the synthetic camera at {fps:g} fps{live}"
    return Workload(fps, played, what)


# -- measuring ---------------------------------------------------------------------------


def measured_config(cfg: AgentConfig, s: TuneSettings, fps: float) -> AgentConfig:
    """The candidate's config as measured: each source as ``measured_source`` makes it, its
    results on a private loopback port and no metrics endpoint (it runs beside the agent
    on the same config; see ``bench.private_config``), power read-only."""
    made = tuple(measured_source(src, fps, s.frames) for src in cfg.source_list())
    power = replace(cfg.power, manage=False)
    if len(made) == 1:
        return private_config(replace(cfg, source=made[0], sources=(), power=power))
    return private_config(replace(cfg, source=SyntheticSourceConfig(), sources=made, power=power))


def _combined(hists: list[LatencyHistogram]) -> LatencyHistogram:
    """One histogram of every source's frames (a candidate must hold the deadline for all)."""
    out = LatencyHistogram()
    for h in hists:
        out.merge(h)
    return out


def _pure_p50_ms(cfg: AgentConfig, runs: int, played: dict[str, list[np.ndarray]]) -> float:
    with BenchAgent(cfg, played=played) as agent:
        return pure_inference(agent, runs).percentile_ms(50)


def measure(c: Candidate, s: TuneSettings, work: Workload, best_p99: float | None) -> None:
    """Run the candidate's pipeline: warm-up, then a measured window (or an early stop)."""
    cfg = measured_config(c.config, s, work.fps)
    unpaced = measured_config(c.config, s, 0.0)
    c.pure_p50_ms = _pure_p50_ms(unpaced, 30 if s.quick else 100, work.played)
    limit = s.budget_ms * (1 - s.margin)
    if c.pure_p50_ms > limit:
        c.status, c.reason = "pruned", f"inference alone takes {c.pure_p50_ms:.1f} ms > {limit:.1f} ms"
        return
    with BenchAgent(cfg, played=work.played, pace_fps=work.fps) as agent, started(agent):
        time.sleep(s.warmup_s)
        pipeline = agent.pipeline
        assert pipeline is not None
        lanes = pipeline.lanes
        c.sources = [lane.source.describe() for lane in lanes]
        t0, start_published = time.monotonic(), pipeline.published()
        window = LatencyHistogram()
        stats_total_before = _combined([x.stats.total for x in lanes]).counts
        while time.monotonic() - t0 < s.window_s:
            time.sleep(0.1)
            window.counts[:] = _combined([x.stats.total for x in lanes]).counts - stats_total_before
            window.count = int(window.counts.sum())
            median = window.percentile_ms(50) if window.count >= 20 else 0.0
            if median > s.budget_ms:
                c.status, c.reason = "early stop", f"running median {median:.1f} ms > budget"
                break
            if best_p99 and median > 2 * best_p99:
                # A clear loser: its typical frame already takes twice the best one's worst.
                c.status, c.reason = (
                    "early stop",
                    f"running median {median:.1f} ms > 2x best p99 {best_p99:.1f}",
                )
                break
        elapsed = time.monotonic() - t0
        c.fps = (pipeline.published() - start_published) / elapsed if elapsed > 0 else 0.0
        window.max_ns = max(x.stats.total.max_ns for x in lanes)
        c.e2e = {
            "p50": round(window.percentile_ms(50), 3),
            "p99": round(window.percentile_ms(99), 3),
            "max": round(window.max_ns / 1e6, 3),
            "spread": round(window.percentile_ms(99) - window.percentile_ms(50), 3),
        }
        c.stages_p50_ms = {
            k: round(_combined([x.stats.stages[k] for x in lanes]).percentile_ms(50), 3) for k in STAGES
        }
        c.samples_ms = _quantiles(window)
        if agent.power is not None and agent.power.latest is not None and agent.power.latest.total_mw:
            c.power_mw = agent.power.latest.total_mw
    if c.status == "pending":
        c.status = "over budget" if c.e2e["p99"] > limit else "feasible"
        if c.status == "over budget":
            c.reason = f"p99 {c.e2e['p99']:.1f} ms > {limit:.1f} ms (budget {s.budget_ms:g} - {s.margin:.0%})"


def _quantiles(h: LatencyHistogram) -> list[float]:
    return [round(h.percentile_ms(q), 3) for q in (1, 5, 10, 25, 50, 75, 90, 95, 99)]


def _arithmetic(cfg: AgentConfig) -> tuple[Any, Any]:
    """What decides a configuration's detections: its model and backend, less ONNX
    Runtime's thread settings (threads, spinning, execution mode change the speed only)."""
    ort = onnxruntime_of(cfg.backend)
    if ort is None:
        return cfg.model, cfg.backend
    same = replace(
        ort, intra_op_threads=0, inter_op_threads=1, execution_mode="sequential", allow_spinning=False
    )
    return cfg.model, _with_ort(cfg, same).backend


@dataclass
class Reference:
    """The reference configuration's detections on the judged frames: the ground truth
    every candidate's agreement is scored against; agreements are kept by arithmetic."""

    key: tuple[Any, Any]
    frames: FrameSet
    labels: tuple[str, ...] = ()
    detections: list[Decoded] | None = None
    error: str = ""  # why there are no detections
    scores: dict[Any, float | None] = field(default_factory=dict)

    def build(self, cfg: AgentConfig) -> None:
        """Run the reference (at its operating thresholds) over the frames."""
        from edge_agent.evaluation import detect, load_judged

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
    from edge_agent.evaluation import agreement, detect, load_judged

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


def _score(c: Candidate, objective: str) -> tuple[float, float]:
    """Lower is better: the objective, then the spread (variance) as the tie-breaker."""
    if objective == "throughput":
        return (-c.fps, c.e2e["spread"])
    if objective == "power" and c.power_mw is not None:
        return (c.power_mw, c.e2e["spread"])
    return (c.e2e["p99"], c.e2e["spread"])


# -- the sweep ---------------------------------------------------------------------------


def tune(
    base: AgentConfig, s: TuneSettings, out_dir: Path, progress: TextIO | None = None
) -> tuple[Candidate | None, list[Candidate], dict[str, Path]]:
    """Sweep, choose, and write the overlay, the report and the chart into ``out_dir``.
    Raises FramesError, before anything is measured, for frames that cannot be read."""
    with model_notes_once():  # each candidate loads its model: what it assumed, said once
        return _tune(base, s, out_dir, progress or sys.stderr)


def _tune(
    base: AgentConfig, s: TuneSettings, out_dir: Path, progress: TextIO
) -> tuple[Candidate | None, list[Candidate], dict[str, Path]]:
    from edge_agent.pipelines.backends.registry import tensorrt_unavailable
    from edge_agent.power.manager import PowerManager

    t_start = time.monotonic()
    ref = make_reference(base, s)  # FramesError before anything runs
    work = make_workload(base, s)
    tensorrt = not tensorrt_unavailable()
    grid = candidates(base, s, tensorrt, jetson_power_axes(base.power, s.quick))
    print(f"measuring on {work.what}; judging on {ref.frames.what}", file=progress)
    for i, c in enumerate(grid, 1):
        print(
            f"[{i}/{len(grid)} {time.monotonic() - t_start:5.1f}s] {c.name} ...",
            file=progress,
            end="",
            flush=True,
        )
        power = PowerManager(c.power) if c.power is not None else None
        try:
            best = min((x.e2e["p99"] for x in grid[: i - 1] if x.status == "feasible"), default=None)
            try:
                if power is not None:
                    power.start()  # saves the state first; restored in finally, whatever happens
                measure(c, s, work, best)
            except Exception as e:  # one broken candidate must not end the sweep
                c.status, c.reason = "failed", f"{type(e).__name__}: {e}"
            if i == 1:
                _judge_reference(c, ref)  # whatever its measurement gave
            else:
                _judge(c, ref, s)
        finally:
            if power is not None:
                power.close()
        p99 = f"p99 {c.e2e['p99']:.2f} ms" if c.e2e else f"inference {c.pure_p50_ms:.1f} ms"
        agree = f", agreement {c.agreement:.3f}" if c.agreement is not None and c.status != "rejected" else ""
        print(
            f" {c.status} ({p99}{agree}{', ' + c.reason if c.reason and c.status != 'feasible' else ''})",
            file=progress,
        )
    feasible = [c for c in grid if c.status == "feasible"]
    chosen = min(feasible, key=lambda c: _score(c, s.objective)) if feasible else None
    current = grid[0]
    if chosen is not None and chosen is not current and current.status == "feasible":
        # Measured differences within run-to-run noise are not worth a change: the
        # current config stays unless the best beats it by min_gain on the objective.
        best, cur = _score(chosen, s.objective)[0], _score(current, s.objective)[0]
        if abs(best - cur) < s.min_gain * abs(cur):
            chosen.reason = f"within {s.min_gain:.0%} of the current config: not worth a change"
            chosen = current
    if chosen is not None:
        chosen.status = "chosen"
    notes = {"measured": work.what, "judged": ref.describe(s)}
    paths = write_outputs(base, s, grid, chosen, out_dir, time.monotonic() - t_start, notes)
    return chosen, grid, paths


def _judge(c: Candidate, ref: Reference, s: TuneSettings) -> None:
    """``check_accuracy``; a candidate whose own detections fail cannot be chosen."""
    try:
        check_accuracy(c, ref, s)
    except Exception as e:
        why = f"its detections failed: {type(e).__name__}: {e}"
        if c.status == "feasible":
            c.status, c.reason = "failed", why
        else:
            c.judged = why


def no_choice(grid: list[Candidate], budget_ms: float | None = None) -> str:
    """Why nothing was chosen, in words (``budget_ms``: named when given)."""
    budget = f"the {budget_ms:g} ms budget" if budget_ms else "the budget"
    disagreed = [c.name for c in grid if c.status == "rejected" and c.agreement is not None]
    unjudged = [c.name for c in grid if c.status == "rejected" and c.agreement is None]
    if not disagreed and not unjudged:
        return f"No candidate holds {budget}"
    why = []
    if disagreed:
        why.append(
            f"{len(disagreed)} held it but disagreed with the reference's detections ({', '.join(disagreed)})"
        )
    if unjudged:
        why.append(
            f"{len(unjudged)} held it but could not be judged: the reference's detections failed "
            f"({', '.join(unjudged)})"
        )
    return f"No candidate holds {budget} with the reference's accuracy: {'; '.join(why)}"


def _judge_reference(c: Candidate, ref: Reference) -> None:
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


# -- outputs -------------------------------------------------------------------------------


def _diff(base: Any, new: Any) -> Any:
    """The part of ``new`` that differs from ``base`` (plain dicts), or None if equal."""
    if isinstance(base, dict) and isinstance(new, dict):
        out = {k: d for k in new if (d := _diff(base.get(k), new[k])) is not None}
        return out or None
    return None if base == new else new


def overlay_for(base: AgentConfig, chosen: Candidate) -> dict[str, Any]:
    plain = _diff(to_plain(base), to_plain(chosen.config)) or {}
    if chosen.power is not None:
        p = to_plain(chosen.power)
        plain["power"] = {k: v for k, v in p.items() if k in ("gpu_freq_mhz", "nvpmodel") and v}
    return plain


def write_outputs(
    base: AgentConfig,
    s: TuneSettings,
    grid: list[Candidate],
    chosen: Candidate | None,
    out: Path,
    took_s: float,
    notes: dict[str, str] | None = None,
) -> dict[str, Path]:
    """``notes``: ``measured`` (the frames measured on) and ``judged`` (how accuracy was
    judged), in words, for the report."""
    out.mkdir(parents=True, exist_ok=True)
    host = socket.gethostname()
    model = base.model.path or "bundled shapes-det"
    now = datetime.datetime.now().isoformat(timespec="seconds")
    paths = {"overlay": out / "tuned.yaml", "report": out / "tune-report.md", "chart": out / "tune-chart.png"}
    if chosen is not None:
        header = [
            f"# Written by `edge-agent tune` on {host}, {now}",
            f"# model: {model}; objective: {s.objective}; budget {s.budget_ms:g} ms (margin {s.margin:.0%})",
            f"# chosen: {chosen.name}: e2e p50 {chosen.e2e['p50']:.2f} ms, p99 {chosen.e2e['p99']:.2f} ms, "
            f"max {chosen.e2e['max']:.2f} ms, {chosen.fps:.1f} fps"
            + (f", {chosen.power_mw:.0f} mW" if chosen.power_mw else "")
            + (f", agreement {chosen.agreement:.3f}" if chosen.agreement is not None else ""),
            "# Load it as the local overlay: edge-agent run --config FLEET --overlay tuned.yaml",
        ]
        body = overlay_for(base, chosen)
        text = "\n".join(header) + "\n" + (yaml.safe_dump(body, sort_keys=False) if body else "{}\n")
        paths["overlay"].write_text(text)
    else:
        paths.pop("overlay")
    paths["report"].write_text(report_markdown(s, grid, chosen, host, model, now, took_s, notes or {}))
    write_chart(grid, s.budget_ms, paths["chart"])
    return paths


def report_markdown(
    s: TuneSettings,
    grid: list[Candidate],
    chosen: Candidate | None,
    host: str,
    model: str,
    now: str,
    took_s: float,
    notes: dict[str, str] | None = None,
) -> str:
    notes = notes or {}
    lines = [
        f"# edge-agent tune: {host}, {now}",
        "",
        f"Model {model}; objective **{s.objective}**; budget {s.budget_ms:g} ms end to end, "
        f"a candidate's p99 must stay under {s.budget_ms * (1 - s.margin):.1f} ms; "
        f"minimum agreement {s.min_agreement:.2f}; "
        f"{'quick' if s.quick else 'full'} sweep of {len(grid)} candidates in {took_s:.0f} s.",
        "",
    ]
    if notes.get("measured"):
        lines += [f"Measured on {notes['measured']}.", ""]
    if notes.get("judged"):
        lines += [f"Accuracy: {notes['judged']}.", ""]
    lines += [
        f"**Chosen: {chosen.name}**" if chosen else f"**{no_choice(grid, s.budget_ms)}.**",
        "",
        "| candidate | result | inference p50 ms | e2e p50 ms | e2e p99 ms | max ms | fps | power mW "
        "| agreement | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in grid:
        e = c.e2e
        lines.append(
            f"| {c.name} | {c.status} | {c.pure_p50_ms:.2f} | {e.get('p50', float('nan')):.2f} | "
            f"{e.get('p99', float('nan')):.2f} | {e.get('max', float('nan')):.2f} | {c.fps:.1f} | "
            f"{c.power_mw if c.power_mw is not None else '-'} | "
            f"{f'{c.agreement:.3f}' if c.agreement is not None else '-'} | "
            f"{'; '.join(x for x in (c.reason, c.judged) if x)} |"
        )
    if chosen is not None:
        lines += [
            "",
            "Stage p50 (ms) of the chosen candidate: "
            + ", ".join(f"{k} {v}" for k, v in chosen.stages_p50_ms.items()),
        ]
    lines += ["", "![latency per candidate](tune-chart.png)", ""]
    return "\n".join(lines)


def write_chart(grid: list[Candidate], budget_ms: float, path: Path) -> None:
    """Latency distribution per candidate (p1–p99 bar, p25–p75 box, p50 tick) against the
    budget, drawn with OpenCV (no plotting dependency); a second panel plots latency
    against power where telemetry measured it."""
    measured = [c for c in grid if c.samples_ms]
    row_h, left, width = 26, 260, 900
    height = 60 + row_h * max(len(measured), 1) + 40
    powered = [c for c in measured if c.power_mw]
    img = np.full((height + (260 if powered else 0), width, 3), 255, np.uint8)
    top = max([budget_ms * 1.2] + [c.e2e.get("max", 0.0) for c in measured])
    x_of = lambda ms: int(left + (width - left - 20) * min(ms, top) / top)  # noqa: E731
    font = cv2.FONT_HERSHEY_SIMPLEX
    cv2.putText(
        img, "end-to-end latency per candidate (ms): p1-p99, p25-p75, p50", (10, 24), font, 0.55, (0, 0, 0), 1
    )
    for i, c in enumerate(measured):
        y = 50 + i * row_h
        q = dict(zip((1, 5, 10, 25, 50, 75, 90, 95, 99), c.samples_ms))
        color = (40, 160, 40) if c.status in ("chosen", "feasible") else (60, 60, 200)
        cv2.putText(img, c.name[:34], (10, y + 5), font, 0.42, (0, 0, 0), 1)
        cv2.line(img, (x_of(q[1]), y), (x_of(q[99]), y), color, 2)
        cv2.rectangle(img, (x_of(q[25]), y - 7), (x_of(q[75]), y + 7), color, -1)
        cv2.line(img, (x_of(q[50]), y - 10), (x_of(q[50]), y + 10), (0, 0, 0), 2)
        if c.status == "chosen":
            cv2.putText(img, "chosen", (x_of(q[99]) + 6, y + 5), font, 0.42, (0, 120, 0), 1)
    xb = x_of(budget_ms)
    cv2.line(img, (xb, 35), (xb, height - 30), (0, 0, 220), 1)
    cv2.putText(
        img, f"budget {budget_ms:g} ms", (max(xb - 60, left), height - 12), font, 0.45, (0, 0, 220), 1
    )
    for tick in np.linspace(0, top, 6):
        cv2.putText(img, f"{tick:.0f}", (x_of(tick) - 8, height - 30), font, 0.38, (90, 90, 90), 1)
    if powered:
        y0, h = height + 20, 200
        cv2.putText(img, "p99 latency (ms) vs total power (mW)", (10, y0), font, 0.5, (0, 0, 0), 1)
        pmin = min(c.power_mw for c in powered)
        pmax = max(c.power_mw for c in powered) or 1.0
        for c in powered:
            x = int(left + (width - left - 40) * ((c.power_mw - pmin) / max(pmax - pmin, 1.0)))
            y = int(y0 + 20 + h - h * min(c.e2e["p99"], top) / top)
            cv2.circle(img, (x, y), 5, (200, 80, 0), -1)
            cv2.putText(img, c.name[:20], (x + 6, y), font, 0.35, (0, 0, 0), 1)
    if not cv2.imwrite(str(path), img):
        raise OSError(f"cannot write {path}")
