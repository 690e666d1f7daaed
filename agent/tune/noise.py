"""Whether the best candidate is better than the current config, or was only measured so.

Two runs of the same config on a busy machine differ, and a short window's p99 is a few
frames' worth: a candidate that measured 5 % faster may be no faster at all. So a change
must beat the current config by more than the noise measured on this machine, this time:
the spread between repeated measurements, which are

- the current config's runs: measured first (the reference) and again after the sweep,
  when a change is on the table (also when its first run went over the budget: a spike),
  so a drift of the machine's load shows as well;
- the rounds: each measured window is cut into ``ROUNDS`` equal parts and the objective's
  figure taken in each, for the current config's runs and the best candidate's.

The noise is the largest of these spreads (max - min). As the threshold it is a cautious
one (the range of three rounds is about two standard errors of the difference between two
three-round means, and the largest of several ranges more): keeping the config as it is
costs nothing, a change that is no improvement costs a redeploy. ``TuneSettings.min_gain``
stays as a floor on top: a change must also be worth making.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.tune.candidates import Candidate

ROUNDS = 3  # parts of each measured window whose figures give the within-run spread

# What each objective compares: (the figure's name, its unit, whether higher is better).
_FIGURES = {
    "latency": ("p99", "ms", False),
    "throughput": ("fps", "fps", True),
    "power": ("power", "mW", False),
}


def compared(objective: str, *cs: Candidate) -> str:
    """The objective actually compared: power only when every one has a power reading
    (the search scores by p99 otherwise, see ``search._score``)."""
    if objective == "power" and any(c.power_mw is None for c in cs):
        return "latency"
    return objective if objective in _FIGURES else "latency"


def figure(c: Candidate, objective: str) -> float | None:
    """``c``'s figure for the objective (p99 ms, fps or mW); None when it was not measured."""
    if not c.e2e:
        return None
    if objective == "throughput":
        return c.fps
    if objective == "power":
        return c.power_mw
    return c.e2e["p99"]


def round_figures(c: Candidate, objective: str) -> list[float]:
    """The objective's figure in each of ``c``'s rounds (none for power: read once a run)."""
    key = {"latency": "p99", "throughput": "fps"}.get(objective)
    # A round in which no frame ended has no p99 (0 would read as a huge spread).
    return [r[key] for r in c.rounds if key in r and (key == "fps" or r.get("frames", 1))] if key else []


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if len(values) > 1 else 0.0


@dataclass(frozen=True)
class Verdict:
    take: bool  # the best candidate beats the current config by more than is needed
    current: float  # the current config's figure: the mean of its runs
    best: float
    gain: float  # how much better the best one measured, in the unit (negative: worse)
    noise: float  # the largest spread of the repeated measurements
    needed: float  # what a change must gain: the noise, or min_gain of the current's figure
    reason: str  # the figures in words, for the report
    short: str  # why the best one was or was not taken, for its row in the report


def decide(
    objective: str,
    current_runs: list[float],
    current_rounds: list[float],
    best_name: str,
    best: float,
    best_rounds: list[float],
    min_gain: float,
) -> Verdict:
    """Take ``best_name`` (its figure ``best``) over the current config (its figure in each
    run, and in each round of those runs) only if it is better by more than the noise and
    by more than ``min_gain`` of the current's figure. Pure: tables in, a verdict out."""
    what, unit, higher = _FIGURES[objective]
    cur = sum(current_runs) / len(current_runs)
    gain = best - cur if higher else cur - best
    noise = max(_spread(current_runs), _spread(current_rounds), _spread(best_rounds))
    floor = min_gain * abs(cur)
    needed = max(noise, floor)
    take = gain > needed

    def f(v: float) -> str:
        return f"{v:.2f} {unit}"

    runs = " and ".join(f"{v:.2f}" for v in current_runs)
    runs = f"{len(current_runs)} runs: {runs} {unit}" if len(current_runs) > 1 else "one run"
    if noise >= floor:
        rule, noted = f"the noise of {f(noise)}", ""
    else:
        rule, noted = f"the minimum gain of {min_gain:.0%} ({f(floor)})", f"; the noise was {f(noise)}"
    noted += (
        " (the noise: the largest spread between repeated measurements, the current config's runs "
        f"and the {ROUNDS} rounds of each run)"
    )
    measured = f"{best_name} measured {what} {f(best)} against the current config's {f(cur)} ({runs})"
    better = f"{f(gain)} better" if gain > 0 else "no better"
    if take:
        reason = f"changed: {measured}, {better}, more than {rule}{noted}"
        short = f"{better} than the current config, more than {rule}"
    else:
        reason = f"kept the current config: {measured}, {better}, not more than {rule}{noted}"
        short = f"not taken: {better} than the current config, not more than {rule}"
    return Verdict(take, cur, best, gain, noise, needed, reason, short)
