"""Hand-off latencies of the live pipeline: how long a frame waits between stages.

    .venv/bin/python tools/handoffs.py                     # 10 fps, 15 s, bundled model
    .venv/bin/python tools/handoffs.py --fps 30 --seconds 20 --runs 3

Runs the agent in-process on a synthetic camera (results on a private loopback port,
no subscriber, no metrics endpoint) and prints, per run, the percentiles of every stage,
``wait_infer`` (preprocessed -> inference starts) and ``wait_post`` (inference ended ->
postprocessing starts) above all, and the end to end time. At a light load nothing is
queued: what those two show is the cost of the hand-offs themselves (thread wake-ups,
the scheduler's decision, bookkeeping between the stamps).

``--model`` takes another ONNX model (default: the config's, i.e. the bundled detector).
Prints only; asserts nothing (a busy machine moves every figure).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.core.stamps import STAGES
from edge_agent.service.runner import Agent


def run_once(fps: float, seconds: float, model: str | None) -> dict[str, tuple[float, float, float]]:
    cfg = AgentConfig(
        device_id="handoffs",
        source=SyntheticSourceConfig(fps=fps),
        publish=PublishConfig(endpoint="tcp://127.0.0.1:*", wait_for_subscribers=0),
        metrics=MetricsConfig(enabled=False),
    )
    if model:
        cfg = replace(cfg, model=ModelConfig(path=model))
    agent = Agent(cfg)
    agent.build()
    assert agent.pipeline is not None
    agent.start()
    try:
        time.sleep(seconds)
    finally:
        agent.stop()
    stats = agent.pipeline.figures().lanes[0]
    rows = {name: stats.stages[name] for name in STAGES}
    rows["end_to_end"] = stats.total
    out = {k: (h.percentile_ms(50), h.percentile_ms(90), h.percentile_ms(99)) for k, h in rows.items()}
    c = stats.counts
    print(f"  frames: published {c.published} of {c.captured}, dropped {dict(c.dropped_by_reason)}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fps", type=float, default=10.0)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--model", default=None)
    a = ap.parse_args()
    for r in range(a.runs):
        print(f"run {r + 1}/{a.runs}: {a.fps:g} fps for {a.seconds:g} s")
        table = run_once(a.fps, a.seconds, a.model)
        print(f"  {'stage':<12}{'p50 ms':>10}{'p90 ms':>10}{'p99 ms':>10}")
        for name, (p50, p90, p99) in table.items():
            print(f"  {name:<12}{p50:>10.3f}{p90:>10.3f}{p99:>10.3f}")


if __name__ == "__main__":
    main()
