"""Cameras per device (``bench/capacity.py``): the search always ends by itself, a trial
accounts every camera's frames, and the command refuses what it cannot measure.
Real parts: the bundled detector recorded with ONNX Runtime, replayed by the emulated
accelerator, cameras through the agent's own pipeline."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest
from conftest import agent_command, run_process
from helpers import write_frames

from edge_agent.bench.capacity import MAX_SOURCES, emulated_config, run_capacity, search
from edge_agent.bench.configs import BenchError
from edge_agent.bench.record import clip as read_clip
from edge_agent.bench.record import record_outputs
from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import EmulatedConfig, ModelConfig
from edge_agent.core.source_config import TrackerConfig
from edge_agent.models.testmodels import float_nchw_detector

_FIGURES = ("on_time_share", "throughput_fps", "host_cpu_us_per_frame", "cores_used", "gil")


def passing_up_to(limit: int, calls: list[int]):
    def trial(n: int) -> dict:
        calls.append(n)
        return {"sources": n, "passed": n <= limit, **dict.fromkeys(_FIGURES)}

    return trial


@pytest.mark.parametrize("limit", [0, 1, 5, 8, 13, 31, 64])
def test_the_search_finds_the_largest_passing_number(limit):
    calls: list[int] = []
    got = search(passing_up_to(limit, calls), 8, 64)
    assert got["cameras"] == limit
    assert got["stopped"] == ("found" if limit < 64 else "all 64 cameras passed (the most it tries)")
    assert len(calls) == len(set(calls)), "no number tried twice"
    assert len(calls) <= 8


def test_a_huge_bound_ends_by_the_trial_count():
    calls: list[int] = []
    got = search(passing_up_to(10**9, calls), 8, 10**12, max_trials=5)
    assert got["stopped"] == "5 trials made"
    assert calls == [8, 16, 32, 64, 128]
    assert got["cameras"] == 128 and got["first_failed"] is None


def test_the_search_ends_when_its_time_is_spent():
    calls: list[int] = []
    got = search(passing_up_to(10**9, calls), 8, 10**6, budget_s=0.0)
    assert len(calls) == 1 and got["stopped"] == "its 0 s were spent"


def test_the_search_needs_a_camera():
    with pytest.raises(BenchError, match="at least one camera"):
        search(passing_up_to(1, []), 8, 0)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("capacity")
    frames = root / "frames"
    write_frames(frames, 6)
    rec = root / "bundled.rec"
    record_outputs(ModelConfig(), str(frames), str(rec), 6)
    return frames, rec


def test_the_cameras_get_the_first_sources_lane_settings(recorded):
    frames, rec = recorded
    default = AgentConfig()
    base = replace(default, source=replace(default.source, tracker=TrackerConfig(type="none")))
    cfg = emulated_config(base, str(rec), 3.0, 4, str(frames), 30.0)
    assert [s.name for s in cfg.source_list()] == ["cam0", "cam1", "cam2", "cam3"]
    assert all(s.tracker.type == "none" and s.path == str(frames) for s in cfg.source_list())
    assert cfg.backend == EmulatedConfig(recording=str(rec), device_ms=3.0)
    assert cfg.metrics.enabled is False, "a measurement never takes the configured endpoints"


def test_a_trial_accounts_every_cameras_frames_and_names_the_emulation(recorded):
    frames, rec = recorded
    images = read_clip(str(frames), 6)
    r = run_capacity(AgentConfig(), str(rec), str(frames), images, device_ms=1.0, seconds=0.5, sources=3)
    assert r["mode"] == "emulated-accelerator" and r["emulated"]["recording"] == str(rec)
    t = r["trial"]
    assert t["sources"] == 3 and sorted(t["per_source"]) == ["cam0", "cam1", "cam2"]
    for cam in t["per_source"].values():
        assert cam["on_time"] + cam["late"] + cam["dropped"] > 0
    assert t["on_time"] + t["late"] + t["dropped"] == sum(
        c["on_time"] + c["late"] + c["dropped"] for c in t["per_source"].values()
    )
    assert set(t["host_cpu_us_per_frame"]) >= {"capture", "infer", "post", "other", "total"}
    assert t["gil"]["wakeups"] > 0
    assert "tracking" in t["steps_ms"]
    assert set(r["kernels"]["parts"]) >= {"decode", "tracker"}


def bench(*args: str) -> subprocess.CompletedProcess:
    return run_process(agent_command("bench", *args), 120)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--capacity", "100000"], f"--capacity 100000: must be within 1..{MAX_SOURCES}"),
        (["--sources", "0", "--capacity", "-3"], "--capacity -3: must be within"),
        (["--sources", "300"], f"--sources 300: must be within 1..{MAX_SOURCES}"),
        (["--device-ms", "-1"], "--device-ms must be within 0..1000"),
    ],
)
def test_the_command_refuses_what_it_cannot_measure(recorded, args, message):
    frames, rec = recorded
    out = bench("--emulate", str(rec), "--source", str(frames), *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr


def test_emulate_needs_the_frames_and_the_flags_need_emulate(recorded):
    _, rec = recorded
    out = bench("--emulate", str(rec))
    assert out.returncode == 2 and "--emulate needs --source" in out.stderr
    out = bench("--capacity", "8")
    assert out.returncode == 2 and "go with --emulate" in out.stderr


def test_a_recording_of_another_model_is_refused_by_the_command(recorded, tmp_path):
    frames, rec = recorded
    other = float_nchw_detector(str(tmp_path))
    out = bench("--emulate", str(rec), "--source", str(frames), "--model", str(other), "--sources", "1")
    assert out.returncode == 2, out.stderr
    assert f"bench: backend.recording: {rec}: recorded from another model" in out.stderr
