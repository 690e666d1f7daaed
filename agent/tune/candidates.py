"""The search space: the settings of a tuning run, the candidates (one config each) and the
axes this machine has (ONNX Runtime threads and options, model variants, TensorRT
precision and DLA, Jetson power modes and clocks)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import AutoBackendConfig, OnnxRuntimeConfig
from edge_agent.core.plan import onnxruntime_of
from edge_agent.core.power_config import PowerConfig

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
    # The measured window in equal parts, each's p99 (ms) and fps: the within-run noise.
    rounds: list[dict[str, float]] = field(default_factory=list)
    again: Candidate | None = None  # the same config measured once more, for the noise (see noise)


def with_ort(base: AgentConfig, ort: OnnxRuntimeConfig) -> AgentConfig:
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
                out.append(Candidate(name, with_ort(base, variant)))
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
