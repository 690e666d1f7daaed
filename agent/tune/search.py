"""The search: every candidate measured (power state restored after each, and on any
interruption), judged, scored by the objective; the cheapest that holds the deadline wins."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from edge_agent.core.config import AgentConfig
from edge_agent.pipelines.model import model_notes_once
from edge_agent.tune.accuracy import judge, judge_reference, make_reference
from edge_agent.tune.candidates import Candidate, TuneSettings, candidates, jetson_power_axes
from edge_agent.tune.measure import measure
from edge_agent.tune.report import write_outputs
from edge_agent.tune.workload import make_workload

log = logging.getLogger(__name__)


def _score(c: Candidate, objective: str) -> tuple[float, float]:
    """Lower is better: the objective, then the spread (variance) as the tie-breaker."""
    if objective == "throughput":
        return (-c.fps, c.e2e["spread"])
    if objective == "power" and c.power_mw is not None:
        return (c.power_mw, c.e2e["spread"])
    return (c.e2e["p99"], c.e2e["spread"])


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
                judge_reference(c, ref)  # whatever its measurement gave
            else:
                judge(c, ref, s)
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
