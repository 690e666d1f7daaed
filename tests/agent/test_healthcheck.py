"""`edge-agent health`: the verdict on two heartbeats, and the command against a real agent."""

from __future__ import annotations

import json

import pytest
from conftest import agent_command, free_endpoint, run_process, started

from edge_agent.core.config import AgentConfig, MetricsConfig, ModelConfig, PublishConfig, config_hash
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.healthcheck import judge


def beat(published: int, miss_rate: float = 0.0, error: str | None = None, config: str = "abc") -> dict:
    return {
        "source": "cam0",
        "fps": 20.0,
        "miss_rate": miss_rate,
        "config_hash": config,
        "counts": {"on_time": published, "late": 0},
        "source_state": {"error": error},
    }


@pytest.mark.parametrize(
    "after, expect, ok, reason",
    [
        (beat(20), "", True, "20.0 fps"),
        (beat(20), "abc", True, "miss rate 0.0%"),
        (beat(20), "xyz", False, "runs config abc, not xyz"),
        (beat(10), "", False, "no results published"),
        (beat(20, miss_rate=0.3), "", False, "miss rate 30.0% > 5.0%"),
        (beat(20, error="camera gone"), "", False, "source failed: camera gone"),
    ],
)
def test_a_source_is_judged_on_two_heartbeats(after, expect, ok, reason):
    v = judge(beat(10), after, 0.05, expect)
    assert v.ok is ok and reason in v.reason, v


def test_health_of_a_running_agent_and_of_none(const_model, tmp_path):
    endpoint = free_endpoint()
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=20),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.25),
        metrics=MetricsConfig(enabled=False),
    )
    file = tmp_path / "agent.yaml"
    file.write_text(json.dumps({"publish": {"endpoint": endpoint}}))
    with started(cfg):
        out = run_process(agent_command("health", "--endpoint", endpoint, "--wait-ready", "--json"), 60)
        assert out.returncode == 0, out.stdout + out.stderr
        verdict = json.loads(out.stdout)
        assert verdict["healthy"] and verdict["sources"][0]["config_hash"] == config_hash(cfg)
        # Another config than the one running: not healthy, and why.
        out = run_process(
            agent_command("health", "--endpoint", endpoint, "--expect-config", str(file), "--timeout", "3"),
            60,
        )
        assert out.returncode == 1 and "not reloaded yet?" in out.stdout, out.stdout
    out = run_process(agent_command("health", "--endpoint", endpoint, "--timeout", "1"), 60)
    assert out.returncode == 1 and "no heartbeat" in out.stdout and "is the agent running?" in out.stdout
