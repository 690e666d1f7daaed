"""Throughput mode against latency mode under a 2x overload (``deadline.mode``).

    EDGE_AGENT_FAULTS=1 .venv/bin/python tools/overload.py
    EDGE_AGENT_FAULTS=1 .venv/bin/python tools/overload.py --fps 60 --delay-ms 33 --seconds 20 --runs 2

A synthetic camera at ``--fps`` (60) and the bundled detector made slower by the fault
injector's ``backend_delay_ms`` (33: about two frame intervals, so inference can take at
most every other frame). Each mode runs for ``--seconds`` (20), in turns, in-process
(results on a private loopback port, no subscriber). Prints per run: end to end p50 and
p99, the p50s of preprocess + inference + postprocess and their sum, the ratio
p99 / (pre + infer + post), the published frame rate, and the frame accounting.

The budget is ``--budget-ms`` (200 by default: far above the model, so neither the
admission control nor the ladder shapes the result; only the mode does). Prints only;
asserts nothing. Fault injection is for tests and measurements: the tool refuses to run
without EDGE_AGENT_FAULTS=1 in the environment, like the agent itself.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from edge_agent.core.config import AgentConfig
from edge_agent.core.deadline_config import DeadlineConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.resilience_config import FaultsConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.service.runner import Agent


def run_mode(mode: str, fps: float, delay_ms: float, seconds: float, budget_ms: float) -> dict:
    cfg = AgentConfig(
        device_id="overload",
        source=SyntheticSourceConfig(fps=fps),
        publish=PublishConfig(endpoint="tcp://127.0.0.1:*", wait_for_subscribers=0),
        metrics=MetricsConfig(enabled=False),
        deadline=DeadlineConfig(budget_ms=budget_ms, mode=mode),  # type: ignore[arg-type]
        faults=FaultsConfig(backend_delay_ms=delay_ms),
    )
    agent = Agent(cfg)
    agent.build()
    assert agent.pipeline is not None
    agent.start()
    t0 = time.monotonic()
    try:
        time.sleep(seconds)
    finally:
        agent.stop()
    elapsed = time.monotonic() - t0
    snap = agent.pipeline.figures()
    stats = snap.lanes[0]
    st = stats.stages
    parts = {k: st[k].percentile_ms(50) for k in ("preprocess", "infer", "postprocess")}
    work = sum(parts.values())
    p99 = stats.total.percentile_ms(99)
    return {
        "mode": mode,
        "p50": stats.total.percentile_ms(50),
        "p99": p99,
        "parts": parts,
        "work": work,
        "ratio": p99 / work if work else float("nan"),
        "fps": stats.published / elapsed,
        "wait_infer_p99": st["wait_infer"].percentile_ms(99),
        "stages": {k: (h.percentile_ms(50), h.percentile_ms(99)) for k, h in st.items()},
        "counts": stats.counts.as_dict(),
        "fallbacks": snap.batching.fresh_fallbacks,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fps", type=float, default=60.0)
    ap.add_argument("--delay-ms", type=float, default=33.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--budget-ms", type=float, default=200.0)
    ap.add_argument("--runs", type=int, default=1, help="rounds of both modes, in turns")
    ap.add_argument("--modes", default="throughput,latency")
    ap.add_argument("--stages", action="store_true", help="also print each stage's p50 and p99")
    a = ap.parse_args()
    if os.environ.get("EDGE_AGENT_FAULTS") != "1":
        sys.exit("fault injection needs EDGE_AGENT_FAULTS=1 in the environment")
    for r in range(a.runs):
        for mode in a.modes.split(","):
            x = run_mode(mode, a.fps, a.delay_ms, a.seconds, a.budget_ms)
            p = x["parts"]
            c = x["counts"]
            reasons = ", ".join(f"{k} {v}" for k, v in c["dropped_by_reason"].items() if v) or "none"
            print(
                f"run {r + 1} {mode:<10} end to end p50 {x['p50']:6.1f} p99 {x['p99']:6.1f} ms | "
                f"pre+infer+post p50 {x['work']:5.1f} ms ({p['preprocess']:.2f} + {p['infer']:.1f} + "
                f"{p['postprocess']:.2f}) | p99/(pre+infer+post) {x['ratio']:.2f} | "
                f"published {x['fps']:5.1f} fps | wait_infer p99 {x['wait_infer_p99']:5.1f} ms"
            )
            print(
                f"      captured {c['captured']}, published {c['on_time'] + c['late']} "
                f"({c['late']} late), dropped {c['dropped']}: {reasons}; "
                f"stale frames run as the next was overdue: {x['fallbacks']}"
            )
            if a.stages:
                print(
                    "      stages p50/p99 ms: "
                    + ", ".join(f"{k} {p50:.2f}/{p99:.2f}" for k, (p50, p99) in x["stages"].items())
                )
            sys.stdout.flush()


if __name__ == "__main__":
    main()
