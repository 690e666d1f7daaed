"""A first try needs no YAML: ``run --model/--source/--budget-ms``; and a model that cannot
fit the deadline is said at start, with the figures and the choices."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import agent_command, free_endpoint, run_process
from helpers import write_video

from edge_agent.cli import build_parser
from edge_agent.commands.run import _flags, _status_line
from edge_agent.core.budget_fit import BudgetFit
from edge_agent.core.config import AgentConfig
from edge_agent.core.effective.render import load_effective
from edge_agent.core.source_config import SyntheticSourceConfig, source_from_text
from edge_agent.service.assembly import budget_settings
from edge_agent.service.supervisor import status_text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("synthetic", {"type": "synthetic"}),
        ("rtsp://cam.local/stream1", {"type": "rtsp", "url": "rtsp://cam.local/stream1"}),
        ("rtsps://cam/s", {"type": "rtsp", "url": "rtsps://cam/s"}),
        ("/dev/video2", {"type": "v4l2", "device": "/dev/video2"}),
        ("/dev/v4l/by-id/usb-cam-index0", {"type": "v4l2", "device": "/dev/v4l/by-id/usb-cam-index0"}),
        ("1", {"type": "v4l2", "device": "/dev/video1"}),
        (
            "videotestsrc ! videoconvert ! appsink",
            {"type": "gstreamer", "pipeline": "videotestsrc ! videoconvert ! appsink"},
        ),
    ],
)
def test_a_source_word_names_its_kind(text: str, expected: dict) -> None:
    assert source_from_text(text) == expected


def test_a_folder_is_images_and_a_file_is_a_video_by_absolute_path(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "frames").mkdir()
    monkeypatch.chdir(tmp_path)
    assert source_from_text("frames") == {"type": "images", "path": str(tmp_path / "frames")}
    assert source_from_text("clip.mp4") == {"type": "video", "path": str(tmp_path / "clip.mp4")}


def test_a_url_no_source_reads_or_nothing_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="no source reads http://"):
        source_from_text("http://cam/stream.mjpg")
    with pytest.raises(ValueError, match="empty"):
        source_from_text("")


def _flag_config(tmp_path: Path, argv: list[str], config: str | None = None):
    args = build_parser().parse_args(["run", *argv])
    return load_effective(config, flags=_flags(args), env={}).config


def test_the_flags_are_the_last_layer_and_a_model_brings_no_other_models_manifest(
    tmp_path: Path, const_model: Path
) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "m.onnx").write_bytes(const_model.read_bytes())
    cfg = tmp_path / "agent.yaml"
    manifest = const_model.parent / "manifest.yaml"
    cfg.write_text(f"model: {{path: {const_model}, manifest: {manifest}, max_detections: 7}}\n")
    got = _flag_config(tmp_path, ["--model", str(other / "m.onnx"), "--budget-ms", "1e-05"], str(cfg))
    assert (got.model.path, got.model.manifest, got.model.max_detections) == (str(other / "m.onnx"), "", 7)
    assert got.deadline.budget_ms == 1e-05  # positional: YAML reads no "1e-05" as a number
    mine = _flag_config(tmp_path, ["--model", str(other / "m.onnx"), "--manifest", str(cfg)], str(cfg))
    assert mine.model.manifest == str(cfg)


def test_each_source_is_told_the_key_that_sets_its_budget() -> None:
    two = AgentConfig(sources=(SyntheticSourceConfig(name="a", budget_ms=2), SyntheticSourceConfig(name="b")))
    assert budget_settings(two) == {"a": "sources[0].budget_ms", "b": "deadline.budget_ms"}
    assert budget_settings(AgentConfig()) == {"cam0": "deadline.budget_ms"}
    one = AgentConfig(source=SyntheticSourceConfig(budget_ms=9))
    assert budget_settings(one) == {"cam0": "source.budget_ms"}
    # Only the deadline's budget is what --budget-ms sets.
    fit = BudgetFit(50, 20)
    assert "--budget-ms" not in (fit.advice("a", "sources[0].budget_ms") or "")
    assert f"--budget-ms {fit.suggested_budget_ms}" in (fit.advice("a") or "")


@pytest.mark.parametrize(
    ("infer_ms", "budget_ms", "period_ms", "needed_ms", "words"),
    [
        # A 30 fps camera faster than the model: the newest frame waits up to an interval.
        (35.0, 50.0, 1000 / 30, 1.1 * 35 + 1000 / 30 + 2, "waits up to 33 ms (a frame interval)"),
        (35.0, 80.0, 1000 / 30, 1.1 * 35 + 1000 / 30 + 2, None),
        # A camera slower than the model: the accelerator is idle when a frame comes.
        (5.0, 50.0, 1000 / 30, 1.1 * 5 + 2, None),
        (45.0, 48.0, 100.0, 1.1 * 45 + 2, "the accelerator is idle when a frame comes"),
        # A file: every frame waits for the one before, and is published late, never dropped.
        (20.0, 40.0, None, 1.1 * 20 + 20 + 2, "waits up to 20 ms for the one before"),
        (107.3, 50.0, 1000 / 30, 1.1 * 107.3 + 1000 / 30 + 2, "over the 50 ms budget"),
    ],
)
def test_the_budget_verdict(
    infer_ms: float, budget_ms: float, period_ms: float | None, needed_ms: float, words: str | None
) -> None:
    fit = BudgetFit(infer_ms, budget_ms, period_ms)
    assert fit.needed_ms == pytest.approx(needed_ms)
    assert fit.fits is (words is None)
    advice = fit.advice("source cam0, model m.onnx")
    if words is None:
        assert advice is None
        return
    assert advice is not None and words in advice, advice
    assert f"inference takes {infer_ms:.1f} ms a frame" in advice
    assert ("published late." if period_ms is None else "dropped as stale (or published late).") in advice
    # What a frame needs, with 25 % headroom, rounded up to 10 ms.
    suggested = fit.suggested_budget_ms
    assert suggested % 10 == 0 and needed_ms * 1.25 <= suggested < needed_ms * 1.25 + 10, suggested
    assert f"--budget-ms {suggested}" in advice and "deadline.admission: false" in advice


def _env(endpoint: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT__")}
    env["EDGE_AGENT__PUBLISH__ENDPOINT"] = endpoint
    env["EDGE_AGENT__PUBLISH__WAIT_FOR_SUBSCRIBERS"] = "0"
    env["EDGE_AGENT__METRICS__ENABLED"] = "false"
    return env


def _running_line(stderr: str) -> dict:
    line = next(ln for ln in stderr.splitlines() if "running: {" in ln)
    return json.loads(line.split("running: ", 1)[1])


def test_run_takes_a_model_a_source_and_a_budget_from_the_command_line(
    tmp_path: Path, const_model: Path
) -> None:
    video = write_video(tmp_path / "clip.avi", 12)
    args = ["run", "--model", str(const_model), "--source", str(video), "--budget-ms", "400", "--quiet"]
    done = run_process(agent_command(*args), 120, env=_env(free_endpoint()), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    running = _running_line(done.stderr)
    assert running["model"] == str(const_model)
    assert running["sources"][0]["type"] == "VideoFileSource"
    assert "frames: captured 12 = " in done.stderr, done.stderr
    assert "inference takes" not in done.stderr  # a constant model fits any budget


def test_a_model_that_cannot_fit_the_budget_is_said_at_start_with_figures_and_choices(
    tmp_path: Path,
) -> None:
    """The bundled detector takes milliseconds: a 0.05 ms budget cannot hold it."""
    args = ["run", "--budget-ms", "0.05", "--duration", "1", "--quiet"]
    done = run_process(agent_command(*args), 120, env=_env(free_endpoint()), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    warnings = [ln for ln in done.stderr.splitlines() if "WARNING" in ln and "inference takes" in ln]
    assert len(warnings) == 1, done.stderr
    line = warnings[0]
    m = re.search(r"source cam0, model model\.onnx: inference takes ([0-9.]+) ms a frame here", line)
    assert m and float(m.group(1)) > 0.05, line
    assert "over the 0.05 ms budget (deadline.budget_ms)" in line
    # The synthetic camera's 30 fps: its frame interval decides the wait.
    suggested = BudgetFit(float(m.group(1)), 0.05, 1000 / 30).suggested_budget_ms
    assert f"deadline.budget_ms: {suggested}, or run --budget-ms {suggested}" in line, line
    assert "imgsz=320" in line and "deadline.ladder" in line and "deadline.admission: false" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--source", "http://cam/x.mjpg"], "--source 'http://cam/x.mjpg': no source reads http://"),
        (["--model", "missing.onnx"], "command line --model: model.path: file not found"),
        (["--budget-ms", "-3"], "command line --budget-ms: deadline.budget_ms: must be within"),
        (["--source", ""], "--source '': empty"),
        (["--manifest", "m.yaml"], "--manifest goes with --model"),
    ],
)
def test_a_bad_flag_is_refused_by_name(tmp_path: Path, args: list[str], words: str) -> None:
    done = run_process(agent_command("run", *args), 60, env=_env(free_endpoint()), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert words in done.stderr, done.stderr


def _beat(count: int) -> dict:
    window = {"count": count, "p50": 4.25 if count else 0.0, "p99": 9.5 if count else 0.0}
    return {
        "uptime_s": 3.0,
        "source": "cam0",
        "fps": 30.0 if count else 0.0,
        "latency_ms": {"window": window},
        "counts": {"on_time": 90, "late": 0, "dropped": 0},
        "ladder": {"step": 0, "name": "full"},
    }


def test_a_second_without_frames_shows_no_latency_rather_than_zero() -> None:
    assert "e2e p50   4.25 ms p99   9.50 ms" in _status_line(_beat(30))
    quiet = _status_line(_beat(0))
    assert "0.00" not in quiet and "e2e p50      – ms p99      – ms" in quiet, quiet
    # systemd's STATUS= line says the same.
    assert "e2e p50 4.2 ms p99 9.5 ms" in status_text(_beat(30))
    assert "e2e p50 – ms p99 – ms" in status_text(_beat(0)), status_text(_beat(0))
