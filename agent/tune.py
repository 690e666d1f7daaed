"""``edge-agent tune``: measure candidate configurations on this device, keep the cheapest
that holds the deadline, and write it as a config overlay with a report.

The axes are the ones this machine has: ONNX Runtime threads, graph optimisation level
and thread spinning everywhere; model variants (input size profiles) given with
``--model``; on a Jetson also TensorRT precision and DLA core, and GPU clock locks and
power modes through the power manager (restored after every candidate, and on any
interruption). Each candidate runs the real pipeline on the synthetic camera.

The search is cheap first: a candidate whose model alone (pure inference p50) cannot fit
the budget is pruned without a pipeline run; a pipeline run stops early once its running
median is past the budget; the accuracy of each survivor is checked against the
reference (the first candidate, normally the current config) on held-out synthetic
frames, and a candidate that loses more than ``map_tolerance`` is rejected.
"""

from __future__ import annotations

import datetime
import logging
import socket
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

import cv2
import numpy as np
import yaml

from edge_agent.config import (
    AgentConfig,
    AutoBackendConfig,
    OnnxRuntimeConfig,
    PowerConfig,
    SyntheticSourceConfig,
)
from edge_agent.configload import to_plain
from edge_agent.latency import LatencyHistogram
from edge_agent.pipelines.handoff import STAGES

log = logging.getLogger(__name__)

OBJECTIVES = ("latency", "throughput", "power")


@dataclass(frozen=True)
class TuneSettings:
    budget_ms: float = 50.0
    objective: str = "latency"
    margin: float = 0.1  # a candidate's p99 must stay under budget × (1 - margin)
    map_tolerance: float = 0.02  # mAP@0.5 a candidate may lose against the reference
    quick: bool = False
    models: tuple[str, ...] = ()  # extra model variants (input size profiles)
    source_fps: float = 0.0  # 0: the config's synthetic fps, else 30
    runtime_axes: bool = True  # ONNX Runtime threads / optimisation / spinning
    min_gain: float = 0.1  # a change must beat the current config by this much on the objective

    @property
    def warmup_s(self) -> float:
        return 0.3 if self.quick else 1.0

    @property
    def window_s(self) -> float:
        return 3.0 if self.quick else 8.0

    @property
    def eval_frames(self) -> int:
        return 60 if self.quick else 300


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
    map50: float | None = None
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
    models = [("", base.model.path)] + [(Path(m).parent.name or Path(m).stem, m) for m in s.models]
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


# -- measuring ---------------------------------------------------------------------------


def _private(cfg: AgentConfig, fps: float) -> AgentConfig:
    """The candidate's config on synthetic cameras (as many as it has sources), its own
    socket (see ``synthetic_config``), power read-only."""
    from edge_agent.bench import synthetic_config

    return replace(synthetic_config(cfg, fps), power=replace(cfg.power, manage=False))


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

    cfg = _private(c.config, fps)
    c.pure_p50_ms = _pure_p50_ms(_private(c.config, 0.0), 30 if s.quick else 100)
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


def check_accuracy(c: Candidate, reference: float | None, s: TuneSettings) -> float:
    from edge_agent.evaluation import evaluate

    result = evaluate(c.config.model, c.config.backend, s.eval_frames)
    c.map50 = result["map50"]
    if reference is not None and c.map50 < reference - s.map_tolerance:
        c.status = "rejected"
        c.reason = f"mAP@0.5 {c.map50:.3f} < reference {reference:.3f} - {s.map_tolerance}"
    return c.map50


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
    first = base.source_list()[0]
    fps = s.source_fps or (first.fps if isinstance(first, SyntheticSourceConfig) and first.fps else 30.0)
    tensorrt = not tensorrt_unavailable()
    grid = candidates(base, s, tensorrt, jetson_power_axes(base.power, s.quick))
    reference_map: float | None = None
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
            if c.status == "feasible" or i == 1:
                m = check_accuracy(c, reference_map, s)
                reference_map = m if i == 1 else reference_map
        except Exception as e:  # one broken candidate must not end the sweep
            c.status, c.reason = "failed", f"{type(e).__name__}: {e}"
        finally:
            if power is not None:
                power.close()
        p99 = f"p99 {c.e2e['p99']:.2f} ms" if c.e2e else f"inference {c.pure_p50_ms:.1f} ms"
        print(
            f" {c.status} ({p99}{', ' + c.reason if c.reason and c.status != 'feasible' else ''})",
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
    paths = write_outputs(base, s, grid, chosen, out_dir, time.monotonic() - t_start)
    return chosen, grid, paths


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
) -> dict[str, Path]:
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
            + (f", mAP@0.5 {chosen.map50:.3f}" if chosen.map50 is not None else ""),
            "# Load it as the local overlay: edge-agent run --config FLEET --overlay tuned.yaml",
        ]
        body = overlay_for(base, chosen)
        text = "\n".join(header) + "\n" + (yaml.safe_dump(body, sort_keys=False) if body else "{}\n")
        paths["overlay"].write_text(text)
    else:
        paths.pop("overlay")
    paths["report"].write_text(report_markdown(s, grid, chosen, host, model, now, took_s))
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
) -> str:
    lines = [
        f"# edge-agent tune: {host}, {now}",
        "",
        f"Model {model}; objective **{s.objective}**; budget {s.budget_ms:g} ms end to end, "
        f"a candidate's p99 must stay under {s.budget_ms * (1 - s.margin):.1f} ms; "
        f"accuracy tolerance {s.map_tolerance} mAP@0.5; "
        f"{'quick' if s.quick else 'full'} sweep of {len(grid)} candidates in {took_s:.0f} s.",
        "",
        f"**Chosen: {chosen.name}**" if chosen else "**No candidate holds the budget.**",
        "",
        "| candidate | result | inference p50 ms | e2e p50 ms | e2e p99 ms | max ms | fps | power mW "
        "| mAP@0.5 | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in grid:
        e = c.e2e
        lines.append(
            f"| {c.name} | {c.status} | {c.pure_p50_ms:.2f} | {e.get('p50', float('nan')):.2f} | "
            f"{e.get('p99', float('nan')):.2f} | {e.get('max', float('nan')):.2f} | {c.fps:.1f} | "
            f"{c.power_mw if c.power_mw is not None else '-'} | "
            f"{f'{c.map50:.3f}' if c.map50 is not None else '-'} | {c.reason} |"
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
