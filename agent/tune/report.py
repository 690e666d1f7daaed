"""What a tuning run leaves: the chosen candidate as a config overlay, a Markdown report and
a chart of every candidate."""

from __future__ import annotations

import datetime
import logging
import socket
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import to_plain
from edge_agent.core.files import atomic_write
from edge_agent.tune.candidates import Candidate, TuneSettings

log = logging.getLogger(__name__)


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
    """``notes``: ``measured`` (the frames measured on), ``judged`` (how accuracy was
    judged) and ``decision`` (the best candidate against the current config, with the
    noise), in words, for the report."""
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
        atomic_write(paths["overlay"], text.encode(), mode=0o644)
    else:
        paths.pop("overlay")
    report = report_markdown(s, grid, chosen, host, model, now, took_s, notes or {})
    atomic_write(paths["report"], report.encode(), mode=0o644)
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
    lines += [f"**Chosen: {chosen.name}**" if chosen else f"**{no_choice(grid, s.budget_ms)}.**", ""]
    if notes.get("decision"):  # the best one against the current config, and the noise
        lines += [f"{notes['decision'][0].upper()}{notes['decision'][1:]}.", ""]
    lines += [
        "| candidate | result | inference p50 ms | e2e p50 ms | e2e p99 ms | max ms | fps | power mW "
        "| agreement | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in rows(grid):
        e = c.e2e
        # The kept current config's reason is the decision, already written out above.
        reason = "kept: see above" if c.reason and c.reason == notes.get("decision") else c.reason
        lines.append(
            f"| {c.name} | {c.status} | {c.pure_p50_ms:.2f} | {e.get('p50', float('nan')):.2f} | "
            f"{e.get('p99', float('nan')):.2f} | {e.get('max', float('nan')):.2f} | {c.fps:.1f} | "
            f"{c.power_mw if c.power_mw is not None else '-'} | "
            f"{f'{c.agreement:.3f}' if c.agreement is not None else '-'} | "
            f"{'; '.join(x for x in (reason, c.judged) if x)} |"
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
    measured = [c for c in rows(grid) if c.samples_ms]
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
        color = (40, 160, 40) if c.status in ("chosen", "feasible", "measured again") else (60, 60, 200)
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
    ok, png = cv2.imencode(".png", img)
    if not ok:
        raise OSError(f"cannot encode {path}")
    atomic_write(path, png.tobytes(), mode=0o644)


def rows(grid: list[Candidate]) -> list[Candidate]:
    """The candidates, each followed by its second measurement where it had one."""
    return [x for c in grid for x in (c, c.again) if x is not None]


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
