"""One candidate measured: its model alone first (pruned when that cannot fit the budget),
then its pipeline on the workload, stopped early once it cannot win."""

from __future__ import annotations

import logging
import time

import numpy as np

from edge_agent.bench.configs import BenchAgent, started
from edge_agent.bench.phases import pure_inference
from edge_agent.core.config import AgentConfig
from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.stamps import STAGES
from edge_agent.tune.candidates import Candidate, TuneSettings
from edge_agent.tune.noise import ROUNDS
from edge_agent.tune.workload import Workload, measured_config

log = logging.getLogger(__name__)


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

        def totals() -> LatencyHistogram:
            return _combined([x.total for x in pipeline.figures().lanes])

        c.sources = [dict(lane.source_state) for lane in pipeline.figures().lanes]
        t0, start_published = time.monotonic(), pipeline.published()
        window = LatencyHistogram()
        stats_total_before = totals().counts
        # Where the current round began: (time, histogram counts, frames published).
        mark = (t0, stats_total_before, start_published)
        while time.monotonic() - t0 < s.window_s:
            time.sleep(0.1)
            total = totals()
            window.counts[:] = total.counts - stats_total_before
            window.count = int(window.counts.sum())
            now = time.monotonic()
            if now - mark[0] >= s.window_s / ROUNDS and len(c.rounds) < ROUNDS - 1:
                c.rounds.append(_round(total, mark, now, pipeline.published()))
                mark = (now, total.counts, pipeline.published())
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
        if c.status == "pending":  # the last round ends with the window (not at an early stop)
            total = totals()
            c.rounds.append(_round(total, mark, time.monotonic(), pipeline.published()))
        lanes = pipeline.figures().lanes
        window.max_ns = max(x.total.max_ns for x in lanes)
        c.e2e = {
            "p50": round(window.percentile_ms(50), 3),
            "p99": round(window.percentile_ms(99), 3),
            "max": round(window.max_ns / 1e6, 3),
            "spread": round(window.percentile_ms(99) - window.percentile_ms(50), 3),
        }
        c.stages_p50_ms = {
            k: round(_combined([x.stages[k] for x in lanes]).percentile_ms(50), 3) for k in STAGES
        }
        c.samples_ms = _quantiles(window)
        if agent.power is not None and agent.power.latest is not None and agent.power.latest.total_mw:
            c.power_mw = agent.power.latest.total_mw
    if c.status == "pending" and not window.count:
        # Every frame dropped (stale, under a budget the model cannot hold): its p99 of 0
        # would otherwise read as the best candidate of all.
        c.status, c.reason = "over budget", "no frame published in the window (all dropped)"
    elif c.status == "pending":
        c.status = "over budget" if c.e2e["p99"] > limit else "feasible"
        if c.status == "over budget":
            c.reason = f"p99 {c.e2e['p99']:.1f} ms > {limit:.1f} ms (budget {s.budget_ms:g} - {s.margin:.0%})"


def _round(total: LatencyHistogram, mark: tuple[float, np.ndarray, int], now: float, published: int) -> dict:
    """One round's figures: the frames that ended since ``mark`` (its time, the histogram's
    counts and the frames published then)."""
    t, counts, before = mark
    part = LatencyHistogram()
    part.counts[:] = total.counts - counts
    part.count = int(part.counts.sum())
    part.max_ns = total.max_ns  # an upper bound: a percentile reads its bucket's edge below it
    return {
        "p99": round(part.percentile_ms(99), 3),
        "fps": round((published - before) / (now - t), 2) if now > t else 0.0,
        "frames": part.count,
    }


def _quantiles(h: LatencyHistogram) -> list[float]:
    return [round(h.percentile_ms(q), 3) for q in (1, 5, 10, 25, 50, 75, 90, 95, 99)]
