"""The search: every candidate measured (power state restored after each, and on any
interruption), judged, scored by the objective; the cheapest that holds the deadline wins,
if it beats the current config by more than the measured noise (see ``noise``)."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from edge_agent.core.config import AgentConfig
from edge_agent.pipelines.model import model_notes_once
from edge_agent.tune.accuracy import judge, judge_reference, make_reference
from edge_agent.tune.candidates import Candidate, TuneSettings, candidates, jetson_power_axes
from edge_agent.tune.measure import measure
from edge_agent.tune.noise import Verdict, compared, decide, figure, round_figures
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
        _starting(c, f"{i}/{len(grid)}", t_start, progress)
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
        _measured(c, progress)

    def again() -> Candidate:
        """The current config measured a second time, for the noise (see ``noise``)."""
        c = Candidate("current, measured again", base)
        _starting(c, "noise", t_start, progress)
        try:
            measure(c, s, work, None)
        except Exception as e:
            c.status, c.reason = "failed", f"{type(e).__name__}: {e}"
        _measured(c, progress)
        c.agreement, c.judged = grid[0].agreement, "the reference's config"
        grid[0].again = c  # reported under the current config's row, not a candidate itself
        return c

    chosen, verdict = choose(grid, s, again)
    if chosen is not None:
        chosen.status = "chosen"
    notes = {"measured": work.what, "judged": ref.describe(s)}
    if verdict is not None:
        notes["decision"] = verdict.reason
    paths = write_outputs(base, s, grid, chosen, out_dir, time.monotonic() - t_start, notes)
    return chosen, grid, paths


def choose(
    grid: list[Candidate], s: TuneSettings, again: Callable[[], Candidate]
) -> tuple[Candidate | None, Verdict | None]:
    """The best feasible candidate by the objective, unless it does not beat the current
    config (``grid[0]``) by more than the measured noise (see ``noise``): then the current
    config stays. ``again`` measures the current config once more; it is called only when
    a change is on the table. Returns the choice, and the verdict when one was needed.

    A current config whose one run went over the budget (or was stopped early) is measured
    again too: on a busy machine one run's p99 can be a spike. If the second run holds the
    budget, the current config is compared like a feasible one (both runs count, so the
    spike shows as noise); if not, it does not hold the budget and the best one is taken."""
    feasible = [c for c in grid if c.status == "feasible"]
    chosen = min(feasible, key=lambda c: _score(c, s.objective)) if feasible else None
    current = grid[0]
    if chosen is None or chosen is current or current.status not in ("feasible", "over budget", "early stop"):
        return chosen, None
    repeat = again()
    held = repeat.status == "feasible"
    if held:
        repeat.status = "measured again"  # a row of the report, never a choice itself
    if current.status != "feasible" and not held:
        return chosen, None
    objective = compared(s.objective, current, chosen, repeat)
    runs = [v for v in (figure(current, objective), figure(repeat, objective)) if v is not None]
    verdict = decide(
        objective,
        runs,
        round_figures(current, objective) + round_figures(repeat, objective),
        chosen.name,
        figure(chosen, objective) or 0.0,
        round_figures(chosen, objective),
        s.min_gain,
    )
    if current.status != "feasible":  # the verdict says why the current config was in it at all
        first = f"the current config's first run: {current.status}, {current.reason}"
        verdict = replace(verdict, reason=f"{first}; its second held the budget; {verdict.reason}")
    chosen.reason = verdict.short
    if not verdict.take:
        chosen, current.reason = current, verdict.reason
    return chosen, verdict


def _starting(c: Candidate, which: str, t_start: float, progress: TextIO) -> None:
    print(f"[{which} {time.monotonic() - t_start:5.1f}s] {c.name} ...", file=progress, end="", flush=True)


def _measured(c: Candidate, progress: TextIO) -> None:
    p99 = f"p99 {c.e2e['p99']:.2f} ms" if c.e2e else f"inference {c.pure_p50_ms:.1f} ms"
    agree = f", agreement {c.agreement:.3f}" if c.agreement is not None and c.status != "rejected" else ""
    print(
        f" {c.status} ({p99}{agree}{', ' + c.reason if c.reason and c.status != 'feasible' else ''})",
        file=progress,
    )
