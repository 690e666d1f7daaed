"""`edge-agent tune` on a small real grid: real models, real pipeline runs, real files."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import cv2
import pytest
from conftest import agent_command, run_process
from jetson_tree import make_tree

from edge_agent.config import AgentConfig, ModelConfig, PowerConfig, SyntheticSourceConfig
from edge_agent.models.testmodels import write_load_model
from edge_agent.power import sysfs
from edge_agent.tune import TuneSettings, tune


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> Path:
    # A model ~10x the cost of the constant one: the ordering, not the absolute times,
    # decides the test.
    return write_load_model(str(tmp_path_factory.mktemp("slow")), size=320, channels=32)


def settings(**kw) -> TuneSettings:
    base = dict(quick=True, runtime_axes=False, margin=0.0)
    base.update(kw)
    return TuneSettings(**base)


def base_config(model: Path) -> AgentConfig:
    return AgentConfig(source=SyntheticSourceConfig(fps=30), model=ModelConfig(path=str(model)))


def test_picks_the_candidate_under_a_budget_between_two_measured_ones(tmp_path, const_model, slow_model):
    cfg = base_config(slow_model)
    _, grid, _ = tune(cfg, settings(budget_ms=1000.0, models=(str(const_model),)), tmp_path / "probe")
    slow, fast = grid
    assert {slow.status, fast.status} <= {"feasible", "chosen"}, [(c.name, c.status, c.reason) for c in grid]
    # Between the two, nearer the slow one: the fast one's p99 is a tail of few samples,
    # which a loaded machine stretches most (measured 3.5 ms p50, 17 ms p99 under two CPU
    # hogs, against the slow one's 46 ms); the slow one's p99 is never under its p50.
    budget = 0.8 * slow.e2e["p50"]
    assert fast.e2e["p99"] < budget < slow.e2e["p99"], (fast.e2e, slow.e2e)
    chosen, grid, paths = tune(cfg, settings(budget_ms=budget, models=(str(const_model),)), tmp_path / "run")
    slow, fast = grid
    assert chosen is fast and fast.status == "chosen"
    assert slow.status in ("over budget", "pruned", "early stop"), (slow.status, slow.reason)
    # The overlay holds only what differs (the model), and round-trips through the fleet
    # layering as the local overlay.
    overlay = paths["overlay"].read_text()
    assert overlay.startswith("# Written by `edge-agent tune`") and str(const_model) in overlay
    assert "source:" not in overlay, "keys that did not change stay out of the overlay"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(f"defaults:\n  model: {{path: {slow_model}}}\ndevices:\n  cam-1: {{}}\n")
    render = (
        "config",
        "render",
        str(fleet),
        "--device",
        "cam-1",
        "--overlay",
        str(paths["overlay"]),
        "--explain",
    )
    out = run_process(agent_command(*render), timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert "model.path: overlay" in out.stdout, out.stdout
    # Report and chart.
    report = paths["report"].read_text()
    assert ("**Chosen: model" in report and "over budget" in report) or "pruned" in report
    assert paths["chart"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert cv2.imread(str(paths["chart"])) is not None


def test_no_candidate_under_an_impossible_budget(tmp_path, const_model):
    chosen, grid, paths = tune(base_config(const_model), settings(budget_ms=0.01), tmp_path)
    assert chosen is None and grid[0].status == "pruned"
    assert "overlay" not in paths and "No candidate holds the budget" in paths["report"].read_text()


def jetson_config(tmp_path: Path, model: Path) -> tuple[AgentConfig, Path]:
    root = make_tree(tmp_path / "root", "orin-nano")
    power = PowerConfig(root=str(root), state_file=str(tmp_path / "state.json"))
    return replace(base_config(model), power=power), root


def gpu_range(root: Path) -> tuple[str, str]:
    d = sysfs.find_gpu(str(root)).devfreq
    return (d / "min_freq").read_text(), (d / "max_freq").read_text()


def test_power_settings_are_restored_after_a_sweep(tmp_path, const_model):
    cfg, root = jetson_config(tmp_path, const_model)
    before = gpu_range(root)
    _, grid, _ = tune(cfg, settings(budget_ms=1000.0), tmp_path / "out")
    locks = [c for c in grid if c.power is not None]
    assert len(locks) >= 2 and all(c.status in ("feasible", "chosen") for c in locks), [
        (c.name, c.status, c.reason) for c in grid
    ]
    assert gpu_range(root) == before and not (tmp_path / "state.json").exists()


def test_power_settings_are_restored_after_an_interrupted_sweep(tmp_path, const_model, monkeypatch):
    import edge_agent.tune as tune_module

    cfg, root = jetson_config(tmp_path, const_model)
    before = gpu_range(root)
    real = tune_module.measure
    seen = []

    def interrupted(c, s, fps, best):
        if c.power is not None:
            seen.append(gpu_range(root))
            raise KeyboardInterrupt  # Ctrl-C in the middle of a locked-clock candidate
        return real(c, s, fps, best)

    monkeypatch.setattr(tune_module, "measure", interrupted)
    with pytest.raises(KeyboardInterrupt):
        tune(cfg, settings(budget_ms=1000.0), tmp_path / "out")
    assert seen and seen[0][0] == seen[0][1] and seen[0] != before, "the clock was locked when interrupted"
    assert gpu_range(root) == before and not (tmp_path / "state.json").exists()


def test_a_config_with_several_sources_is_tuned_on_all_of_them(tmp_path, const_model):
    sources = tuple(SyntheticSourceConfig(name=f"cam{i}", fps=30, seed=i) for i in range(3))
    cfg = AgentConfig(sources=sources, model=ModelConfig(path=str(const_model)))
    chosen, grid, _ = tune(cfg, settings(budget_ms=1000.0), tmp_path)
    assert chosen is grid[0] and chosen.status == "chosen", [(c.name, c.status, c.reason) for c in grid]
    # Three cameras at 30 fps: the measured rate is all of them together, more than any one
    # camera gives (how near 90 it comes is the machine's).
    assert chosen.fps > 30, chosen.fps
