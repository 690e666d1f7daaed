"""``edge-agent tune``: measure candidate configurations on this device, keep the cheapest
that holds the deadline, and write it as a config overlay with a report.

The axes are the ones this machine has: ONNX Runtime threads, graph optimisation level
and thread spinning everywhere; model variants (input size profiles) given with
``--model``; on a Jetson also TensorRT precision and DLA core, and GPU clock locks and
power modes through the power manager (restored after every candidate, and on any
interruption). Each candidate runs the real pipeline on real work: the user's frames
(``--frames DIR``, looping at the camera rate), else the config's own video file or image
folder replayed the same way, else (a synthetic or a live camera) the synthetic camera.

The search is cheap first: a candidate whose model alone (pure inference p50) cannot fit
the budget is pruned without a pipeline run; a pipeline run stops early once its running
median is past the budget. Accuracy is judged by agreement, so it works for any model:
the reference (the first candidate, the config as given) runs a fixed set of frames (the
same frames, or held-out synthetic ones for a synthetic or live camera) through the live
path, and its detections are the ground truth; each measured candidate (not the pruned
ones) runs the same frames and scores mAP@0.5 against them, its agreement, and a feasible
one below ``1 - map_tolerance`` is rejected.
Candidates whose detections cannot differ from the reference's (the same model with only
ONNX Runtime's thread settings, or the power state, changed) are not re-scored, and each
distinct model and arithmetic is scored once.
"""

from __future__ import annotations

import datetime
import glob
import logging
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TextIO

import cv2
import numpy as np
import yaml

from edge_agent.config import (
    AgentConfig,
    AutoBackendConfig,
    ImageFolderSourceConfig,
    OnnxRuntimeConfig,
    PowerConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.configload import to_plain
from edge_agent.latency import LatencyHistogram
from edge_agent.pipelines.decode import Decoded
from edge_agent.pipelines.handoff import STAGES

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

    @property
    def warmup_s(self) -> float:
        return 0.3 if self.quick else 1.0

    @property
    def window_s(self) -> float:
        return 3.0 if self.quick else 8.0

    @property
    def eval_frames(self) -> int:
        """Frames the agreement is judged on (spread over the folder or the video)."""
        return 60 if self.quick else 300

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


def _ort_of(backend: Any) -> OnnxRuntimeConfig | None:
    if isinstance(backend, OnnxRuntimeConfig):
        return backend
    if isinstance(backend, AutoBackendConfig):
        return backend.onnxruntime
    return None


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
    ort = _ort_of(base.backend) or OnnxRuntimeConfig()
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


IMAGE_PATTERNS: tuple[str, ...] = next(
    f.default for f in fields(ImageFolderSourceConfig) if f.name == "patterns"
)


def image_files(
    folder: str, patterns: tuple[str, ...] = IMAGE_PATTERNS, what: str = "frames folder"
) -> list[str]:
    """The images of ``folder`` in name order (as the image-folder source plays them);
    FramesError naming the folder when it is missing, holds no image, or none reads."""
    if not os.path.isdir(folder):
        raise FramesError(
            f"{what} {folder} {'is not a folder' if os.path.exists(folder) else 'does not exist'}"
        )
    files = sorted({f for p in patterns for f in glob.glob(os.path.join(glob.escape(folder), p))})
    if not files:
        raise FramesError(f"{what} {folder} holds no images (looked for {' '.join(patterns)})")
    if not any(cv2.imread(f, cv2.IMREAD_COLOR) is not None for f in files):
        raise FramesError(f"{what} {folder}: none of its {len(files)} images can be read")
    return files


@dataclass
class FrameSet:
    """The fixed frames every candidate's detections are compared on, read again for each
    candidate (none is held in memory; a yielded image is valid until the next one)."""

    what: str
    read: Callable[[], Iterator[np.ndarray]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return self.read()


def _spread(total: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(total)`` (all of them when fewer)."""
    if total <= n:
        return list(range(total))
    return sorted({int(i) for i in np.linspace(0, total - 1, n).round()})


def _image_frames(files: list[str], n: int, folder: str) -> FrameSet:
    picked = [files[i] for i in _spread(len(files), n)]

    def read() -> Iterator[np.ndarray]:
        for f in picked:
            img = cv2.imread(f, cv2.IMREAD_COLOR)
            if img is not None:  # unreadable files are skipped, as the source skips them
                yield img

    of = f"{len(picked)} of the {len(files)}" if len(picked) < len(files) else f"the {len(files)}"
    return FrameSet(f"{of} images in {folder}", read)


def _video_frames(path: str, n: int) -> FrameSet:
    if not os.path.isfile(path):
        raise FramesError(f"video file {path} (the config's source) does not exist")
    cap = cv2.VideoCapture(path)
    opened, count = cap.isOpened(), int(cap.get(cv2.CAP_PROP_FRAME_COUNT) or 0)
    cap.release()
    if not opened:
        raise FramesError(f"cannot decode video file {path} (the config's source)")
    stride = max(1, count // n) if count > 0 else 1

    def read() -> Iterator[np.ndarray]:
        cap = cv2.VideoCapture(path)
        try:
            index = taken = 0
            while taken < n:
                if index % stride:
                    if not cap.grab():
                        return
                else:
                    ok, img = cap.read()
                    if not ok:
                        return
                    taken += 1
                    yield img
                index += 1
        finally:
            cap.release()

    return FrameSet(f"{n} frames of {path}" + (f", one in {stride}" if stride > 1 else ""), read)


def _synthetic_frames(src: SyntheticSourceConfig | None, n: int) -> FrameSet:
    from edge_agent.evaluation import heldout_frames
    from edge_agent.pipelines.synthetic import SceneSpec, SyntheticScene

    spec = SceneSpec()
    if src is not None:
        spec = replace(
            spec, width=src.width, height=src.height, num_objects=src.num_objects, noise_sigma=src.noise_sigma
        )

    def read() -> Iterator[np.ndarray]:
        image = np.empty((spec.height, spec.width, 3), np.uint8)
        gt = np.zeros((spec.num_objects, 6), np.float32)
        scenes: dict[int, SyntheticScene] = {}
        for seed, index in heldout_frames(n):
            scene = scenes.get(seed) or scenes.setdefault(seed, SyntheticScene(replace(spec, seed=seed)))
            scene.render(index, image, gt)
            yield image

    return FrameSet(f"{n} held-out synthetic frames", read)


def judged_frames(base: AgentConfig, s: TuneSettings) -> FrameSet:
    """The frames accuracy is judged on: ``s.frames``, else the config's first source when
    it is a file, else held-out synthetic scenes. Raises FramesError for a missing file."""
    n = s.eval_frames
    if s.frames:
        return _image_frames(image_files(s.frames), n, s.frames)
    src = base.source_list()[0]
    if isinstance(src, ImageFolderSourceConfig):
        return _image_frames(image_files(src.path, src.patterns, "image folder"), n, src.path)
    if isinstance(src, VideoSourceConfig):
        return _video_frames(src.path, n)
    return _synthetic_frames(src if isinstance(src, SyntheticSourceConfig) else None, n)


def source_rate(src: SourceConfig) -> float:
    """The rate the config's source is played at: a synthetic camera's fps, else a source's
    frame-rate cap, else a video file's own rate; 30 otherwise."""
    if isinstance(src, SyntheticSourceConfig):
        return src.fps or 30.0
    if src.max_fps:
        return src.max_fps
    if isinstance(src, VideoSourceConfig) and os.path.isfile(src.path):
        cap = cv2.VideoCapture(src.path)
        fps = cap.get(cv2.CAP_PROP_FPS) or 0.0
        cap.release()
        if 0 < fps <= 1000:
            return float(fps)
    return 30.0


_KEEP = ("name", "priority", "budget_ms", "model", "manifest")


def measured_source(src: SourceConfig, fps: float, frames: str) -> SourceConfig:
    """What a source is measured on, at ``fps`` (0: unpaced): the ``frames`` folder, else a
    file source itself, looping, else the synthetic camera (a live camera is in use by the
    agent, and its scene is not repeatable)."""
    keep = {k: getattr(src, k) for k in _KEEP}
    if frames:
        return ImageFolderSourceConfig(path=frames, loop=True, max_fps=fps, **keep)
    if isinstance(src, SyntheticSourceConfig):
        return replace(src, fps=fps)
    if isinstance(src, ImageFolderSourceConfig):
        return replace(src, loop=True, max_fps=fps)
    if isinstance(src, VideoSourceConfig):
        return replace(src, loop=True, realtime=False, max_fps=fps)
    return SyntheticSourceConfig(fps=fps, max_fps=src.max_fps, **keep)


def measured_on(base: AgentConfig, s: TuneSettings, fps: float) -> str:
    """The measurement's frames, in words, for the report."""
    sources = base.source_list()
    first = sources[0]
    src = measured_source(first, fps, s.frames)
    each = f"{len(sources)} sources, each on " if len(sources) > 1 else ""
    if isinstance(src, ImageFolderSourceConfig):
        return f"{each}the images in {src.path}, looping at {fps:g} fps"
    if isinstance(src, VideoSourceConfig):
        return f"{each}the video {src.path}, looping at {fps:g} fps"
    live = (
        ""
        if isinstance(first, SyntheticSourceConfig)
        else f" (the config's {first.type} camera: give --frames)"
    )
    return f"{each}the synthetic camera at {fps:g} fps{live}"


# -- measuring ---------------------------------------------------------------------------


def measured_config(cfg: AgentConfig, s: TuneSettings, fps: float) -> AgentConfig:
    """The candidate's config as measured: each source as ``measured_source`` makes it, its
    results on a private loopback port and no metrics endpoint (it runs beside the agent
    on the same config; see ``bench.synthetic_config``), power read-only."""
    from edge_agent.bench import PRIVATE_ENDPOINT

    made = tuple(measured_source(src, fps, s.frames) for src in cfg.source_list())
    kw: dict[str, Any] = {
        "metrics": replace(cfg.metrics, enabled=False),
        "publish": replace(cfg.publish, endpoint=PRIVATE_ENDPOINT, wait_for_subscribers=0),
        "power": replace(cfg.power, manage=False),
    }
    if len(made) == 1:
        return replace(cfg, source=made[0], sources=(), **kw)
    return replace(cfg, source=SyntheticSourceConfig(), sources=made, **kw)


def _combined(hists: list[LatencyHistogram]) -> LatencyHistogram:
    """One histogram of every source's frames (a candidate must hold the deadline for all)."""
    out = LatencyHistogram()
    for h in hists:
        out.merge(h)
    return out


def _pure_p50_ms(cfg: AgentConfig, runs: int) -> float:
    from edge_agent.bench import pure_inference
    from edge_agent.runner import Agent

    agent = Agent(cfg)
    agent.build()
    try:
        return pure_inference(agent, runs).percentile_ms(50)
    finally:
        for m in agent.models.values():
            m.backend.close()


def measure(c: Candidate, s: TuneSettings, fps: float, best_p99: float | None) -> None:
    """Run the candidate's pipeline: warm-up, then a measured window (or an early stop)."""
    from edge_agent.runner import Agent

    cfg = measured_config(c.config, s, fps)
    c.pure_p50_ms = _pure_p50_ms(measured_config(c.config, s, 0.0), 30 if s.quick else 100)
    limit = s.budget_ms * (1 - s.margin)
    if c.pure_p50_ms > limit:
        c.status, c.reason = "pruned", f"inference alone takes {c.pure_p50_ms:.1f} ms > {limit:.1f} ms"
        return
    agent = Agent(cfg)
    agent.build()
    agent.start()
    try:
        time.sleep(s.warmup_s)
        pipeline = agent.pipeline
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
    finally:
        agent.stop()
        for m in agent.models.values():
            m.backend.close()
    if c.status == "pending":
        c.status = "over budget" if c.e2e["p99"] > limit else "feasible"
        if c.status == "over budget":
            c.reason = f"p99 {c.e2e['p99']:.1f} ms > {limit:.1f} ms (budget {s.budget_ms:g} - {s.margin:.0%})"


def _quantiles(h: LatencyHistogram) -> list[float]:
    return [round(h.percentile_ms(q), 3) for q in (1, 5, 10, 25, 50, 75, 90, 95, 99)]


def _arithmetic(cfg: AgentConfig) -> tuple[Any, Any]:
    """What decides a configuration's detections: its model and backend, less ONNX
    Runtime's thread settings (threads, spinning, execution mode change the speed only)."""
    ort = _ort_of(cfg.backend)
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

        loaded = load_judged(cfg.model, cfg.backend, reference=True)
        try:
            self.labels = tuple(loaded.manifest.labels)
            self.detections = detect(loaded, self.frames)
        finally:
            loaded.backend.close()
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
            f"below {s.min_agreement:.2f} (1 - map_tolerance) is rejected. Candidates that run the "
            "same model with only ONNX Runtime's thread settings or the power state changed are not "
            "re-scored (their detections are the reference's)"
        )


def make_reference(base: AgentConfig, s: TuneSettings) -> Reference:
    """The reference for ``base`` (the first candidate) on its judged frames, not yet run
    (``Reference.build``); FramesError when those frames cannot be read."""
    return Reference(_arithmetic(base), judged_frames(base, s))


def _agreement_of(cfg: AgentConfig, ref: Reference) -> float | None:
    """The candidate's detections on the reference's frames, scored against the reference's
    (by label name, where its labels differ)."""
    from edge_agent.evaluation import agreement, detect, load_judged

    assert ref.detections is not None
    loaded = load_judged(cfg.model, cfg.backend, reference=False)
    try:
        labels = tuple(loaded.manifest.labels)
        dets = detect(loaded, ref.frames)
    finally:
        loaded.backend.close()
    if labels != ref.labels:
        index = {name: i for i, name in enumerate(ref.labels)}
        remap = np.array([index.get(name, -1) for name in labels], np.int64)  # -1 matches nothing
        dets = [(xyxy, scores, remap[cls]) for xyxy, scores, cls in dets]
    return agreement(ref.detections, dets, len(ref.labels))


def check_accuracy(c: Candidate, ref: Reference, s: TuneSettings, score: bool = True) -> None:
    """Score the candidate's agreement with the reference; a feasible one below the minimum
    is rejected. ``score`` false (a pruned or failed candidate, whose inference alone is too
    slow to spend on it): only what is known without running it."""
    key = _arithmetic(c.config)
    if key == ref.key:
        c.agreement = 1.0 if ref.objects() else None
        c.judged = "same model and arithmetic as the reference: not re-scored"
        return
    if not score or (ref.detections is None and c.status != "feasible"):
        c.agreement = ref.scores.get(key)
        return
    if ref.detections is None:
        c.status, c.reason = "rejected", f"no reference detections to judge it against ({ref.error})"
        return
    if key not in ref.scores:
        ref.scores[key] = _agreement_of(c.config, ref)
    else:
        c.judged = "scored once for its model and arithmetic"
    c.agreement = ref.scores[key]
    if c.agreement is None:
        c.judged = "not judged: the reference detects nothing on these frames"
    elif c.agreement < s.min_agreement:
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
    """Sweep, choose, and write the overlay, the report and the chart into ``out_dir``."""
    from edge_agent.pipelines.backends.registry import tensorrt_unavailable
    from edge_agent.power.manager import PowerManager

    progress = progress or sys.stderr
    t_start = time.monotonic()
    fps = s.source_fps or source_rate(base.source_list()[0])
    ref = make_reference(base, s)  # FramesError before anything runs
    tensorrt = not tensorrt_unavailable()
    grid = candidates(base, s, tensorrt, jetson_power_axes(base.power, s.quick))
    print(f"measuring on {measured_on(base, s, fps)}; judging on {ref.frames.what}", file=progress)
    for i, c in enumerate(grid, 1):
        print(
            f"[{i}/{len(grid)} {time.monotonic() - t_start:5.1f}s] {c.name} ...",
            file=progress,
            end="",
            flush=True,
        )
        power = PowerManager(c.power) if c.power is not None else None
        try:
            if power is not None:
                power.start()  # saves the state first; restored in finally, whatever happens
            best = min((x.e2e["p99"] for x in grid[: i - 1] if x.status == "feasible"), default=None)
            measure(c, s, fps, best)
            if i == 1:
                _judge_reference(c, ref)
            else:  # every measured candidate is scored (only a feasible one can be rejected)
                check_accuracy(c, ref, s, score=c.status in ("feasible", "over budget", "early stop"))
        except Exception as e:  # one broken candidate must not end the sweep
            c.status, c.reason = "failed", f"{type(e).__name__}: {e}"
            if i == 1 and not ref.error:
                ref.error = f"the reference failed: {c.reason}"
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
    notes = {"measured": measured_on(base, s, fps), "judged": ref.describe(s)}
    paths = write_outputs(base, s, grid, chosen, out_dir, time.monotonic() - t_start, notes)
    return chosen, grid, paths


def no_choice(grid: list[Candidate]) -> str:
    """Why nothing was chosen, in words."""
    rejected = [c.name for c in grid if c.status == "rejected"]
    if not rejected:
        return "No candidate holds the budget"
    return (
        f"No candidate holds the budget with the reference's accuracy: {len(rejected)} held it but "
        f"disagreed with the reference's detections ({', '.join(rejected)})"
    )


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
        f"**Chosen: {chosen.name}**" if chosen else f"**{no_choice(grid)}.**",
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
