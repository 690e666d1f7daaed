"""The config a command runs, loaded one way everywhere: environment overrides on every
config, relative paths resolved against the file that wrote them, files checked with their
line, and bad files (binary, garbage, empty) answered clearly with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError
from edge_agent.core.effective.render import load_effective
from edge_agent.core.source_config import ImageFolderSourceConfig, VideoSourceConfig


def cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None):
    """``edge-agent ARGS`` as a subprocess, with only the ``EDGE_AGENT__`` variables given."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EDGE_AGENT__")}
    return subprocess.run(
        [sys.executable, "-m", "edge_agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, **(env or {})},
        cwd=cwd,
    )


def problems(excinfo: pytest.ExceptionInfo[ConfigError]) -> list[tuple[str, int, str, str]]:
    return [(p.file, p.line, p.path, p.message) for p in excinfo.value.problems]


# -- environment overrides: one rule for every config ----------------------------------------


@pytest.mark.parametrize("kind", ["file", "default", "fleet"])
def test_an_override_applies_to_every_kind_of_config(tmp_path, kind):
    path = {
        "file": tmp_path / "port.yaml",
        "default": None,
        "fleet": tmp_path / "fleet.yaml",
    }[kind]
    if kind == "file":
        path.write_text("source: {type: synthetic, fps: 30}\n")
    elif kind == "fleet":
        path.write_text("defaults:\n  source: {type: synthetic, fps: 30}\n")
    env = {"EDGE_AGENT__SOURCE__FPS": "10", "EDGE_AGENT__DEADLINE__BUDGET_MS": "40"}
    cfg = load_effective(str(path) if path else None, device="cam-1", env=env).config
    assert cfg.source.fps == 10.0 and cfg.deadline.budget_ms == 40.0


def test_config_show_applies_the_override_to_a_plain_file(tmp_path):
    path = tmp_path / "port.yaml"
    path.write_text("source: {type: synthetic, fps: 30}\n")
    shown = cli("config", "show", str(path), env={"EDGE_AGENT__SOURCE__FPS": "10"})
    assert shown.returncode == 0, shown.stderr
    assert "  fps: 10.0" in shown.stdout.splitlines()


@pytest.mark.parametrize("with_file", [True, False])
def test_a_misspelled_variable_is_an_error_naming_it(tmp_path, with_file):
    path = tmp_path / "port.yaml"
    path.write_text("source: {type: synthetic, fps: 30}\n")
    args = ["config", "show", str(path)] if with_file else ["config", "show"]
    r = cli(*args, env={"EDGE_AGENT__SOURCE__FSP": "10"})
    assert r.returncode == 2, r.stdout
    assert "env EDGE_AGENT__SOURCE__FSP: source.fsp: unknown key" in r.stderr
    run = cli("run", "--frames", "1", env={"EDGE_AGENT__SOURCE__FSP": "10"})
    assert run.returncode == 2 and "EDGE_AGENT__SOURCE__FSP" in run.stderr


def test_a_sources_variable_replaces_a_single_source(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("defaults:\n  source: {type: synthetic, fps: 30}\n")
    env = {"EDGE_AGENT__SOURCES": "[{name: x}, {name: y, fps: 5}]"}
    for path in (fleet, None):
        cfg = load_effective(str(path) if path else None, device="cam-1", env=env).config
        assert [s.name for s in cfg.source_list()] == ["x", "y"]


def test_an_override_of_source_does_not_silently_replace_a_sources_list(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("sources:\n  - {name: a, fps: 30}\n  - {name: b, fps: 30}\n")
    with pytest.raises(ConfigError) as info:
        load_effective(str(path), env={"EDGE_AGENT__SOURCE__FPS": "10"})
    [(file, _line, key, message)] = problems(info)
    assert file == "env EDGE_AGENT__SOURCE__FPS" and key == "source" and "not both" in message


# -- relative paths: against the file that wrote them ---------------------------------------


def test_relative_paths_resolve_against_the_config_file_not_the_working_dir(tmp_path):
    conf = tmp_path / "site" / "conf"
    conf.mkdir(parents=True)
    (conf / "clip.mp4").write_bytes(b"")
    (tmp_path / "site" / "models").mkdir()
    (tmp_path / "site" / "models" / "det.onnx").write_bytes(b"")
    (conf / "agent.yaml").write_text(
        "source: {type: video, path: clip.mp4}\n"
        "model: {path: ../models/det.onnx}\n"
        "power: {state_file: state/power.json}\n"
        "backend: {type: tensorrt, cache_dir: ~/engines}\n"
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = cli("config", "show", str(conf / "agent.yaml"), cwd=elsewhere)
    assert shown.returncode == 0, shown.stderr
    assert f"  path: {conf / 'clip.mp4'}" in shown.stdout.splitlines()
    assert f"  path: {tmp_path / 'site' / 'models' / 'det.onnx'}" in shown.stdout.splitlines()
    assert f"  state_file: {conf / 'state' / 'power.json'}" in shown.stdout.splitlines()
    home = os.path.expanduser("~")
    assert f"    cache_dir: {home}/engines" in shown.stdout.splitlines(), "~ is the home folder"
    ok = cli("config", "validate", str(conf / "agent.yaml"), cwd=elsewhere)
    assert ok.returncode == 0, ok.stderr


def test_fleet_layers_and_overlays_resolve_against_their_own_files(tmp_path, monkeypatch):
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "fleet.yaml").write_text(
        "defaults:\n  model: {path: models/a.onnx}\n"
        "devices:\n  cam-1:\n    config:\n      source: {type: images, path: frames}\n"
    )
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "tuned.yaml").write_text("resilience: {fallback_model: small.onnx}\n")
    monkeypatch.chdir(tmp_path)
    env = {"EDGE_AGENT__MODEL__MANIFEST": "m.yaml"}
    cfg = load_effective("fleet", device="cam-1", overlay="local/tuned.yaml", env=env).config
    assert cfg.model.path == str(tmp_path / "fleet" / "models" / "a.onnx")
    assert isinstance(cfg.source, ImageFolderSourceConfig)
    assert cfg.source.path == str(tmp_path / "fleet" / "frames")
    assert cfg.resilience.fallback_model == str(tmp_path / "local" / "small.onnx")
    assert cfg.model.manifest == str(tmp_path / "m.yaml"), "a variable's path: the working folder"


def test_home_paths_are_expanded_for_the_check_and_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.onnx").write_bytes(b"")
    path = tmp_path / "conf" / "agent.yaml"
    path.parent.mkdir()
    path.write_text("model: {path: ~/m.onnx}\n")
    cfg = load_effective(str(path), env={}, check_files=True).config
    assert cfg.model.path == str(tmp_path / "m.onnx")


def test_files_a_run_does_not_read_are_not_required(tmp_path):
    """An INT8 calibration folder matters only where an INT8 engine is built; the auto
    backend on a machine without TensorRT never reads it."""
    path = tmp_path / "agent.yaml"
    path.write_text("backend: {type: auto, tensorrt: {precision: fp16, calibration_images: calib}}\n")
    cfg = load_effective(str(path), env={}, check_files=True).config
    assert cfg.backend.tensorrt.calibration_images == str(tmp_path / "calib")


def test_two_checkouts_of_one_fleet_do_not_differ_by_where_they_lie(tmp_path):
    for name in ("v1", "v2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "agent.yaml").write_text("source: {type: video, path: clip.mp4}\n")
    r = cli("config", "diff", str(tmp_path / "v1" / "agent.yaml"), str(tmp_path / "v2" / "agent.yaml"))
    assert r.returncode == 0 and r.stdout.strip() == "no differences", r.stdout + r.stderr


def test_run_warns_that_an_empty_config_is_the_embedded_default(tmp_path, endpoint):
    path = tmp_path / "agent.yaml"
    path.write_text("# truncated\n")
    r = cli(
        "run",
        "-c",
        str(path),
        "--frames",
        "1",
        "--quiet",
        env={"EDGE_AGENT__PUBLISH__ENDPOINT": endpoint, "EDGE_AGENT__METRICS__ENABLED": "false"},
    )
    assert r.returncode == 0, r.stderr
    assert f"{path} is empty: running the embedded default" in r.stderr


def test_validate_reports_a_missing_file_with_its_resolved_path_and_line(tmp_path):
    path = tmp_path / "vid.yaml"
    path.write_text("log_level: info\nsource:\n  type: video\n  path: clip.mp4\n")
    r = cli("config", "validate", str(path))
    assert r.returncode == 2, r.stdout
    assert r.stderr.strip() == f"{path}:4:9: source.path: file not found: {tmp_path / 'clip.mp4'}"
    run = cli("run", "-c", str(path), "--frames", "1")
    assert run.returncode == 2 and f"{path}:4:9: source.path: file not found" in run.stderr


def test_missing_inputs_of_every_kind_are_reported_at_once(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(
        "source: {type: images, path: frames}\n"
        "model: {path: det.onnx, manifest: det.yaml}\n"
        "publish: {curve_server_key: keys/agent.key_secret, curve_clients_dir: clients}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_effective(str(path), env={}, check_files=True)
    found = {key: message for _f, _l, key, message in problems(info)}
    assert found == {
        "source.path": f"folder not found: {tmp_path / 'frames'}",
        "model.path": f"file not found: {tmp_path / 'det.onnx'}",
        "model.manifest": f"file not found: {tmp_path / 'det.yaml'}",
        "publish.curve_server_key": f"file not found: {tmp_path / 'keys' / 'agent.key_secret'}",
        "publish.curve_clients_dir": f"folder not found: {tmp_path / 'clients'}",
    }
    # Shown (not run), the same config loads: its paths are only checked for a run.
    assert load_effective(str(path), env={}).config.model.path == str(tmp_path / "det.onnx")


def test_a_fleet_is_validated_without_the_devices_files(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("defaults:\n  model: {path: /opt/models/det.onnx}\ndevices:\n  cam-1: {}\n")
    r = cli("config", "validate", str(fleet))
    assert r.returncode == 0, r.stderr
    assert "checked on the device" in r.stdout


# -- bad files: named, short, exit 2 ---------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (bytes(range(256)) * 4, "not text (a binary file?)"),
        (b"\x8f\xa0garbage\xff", "not text (a binary file?): byte 0 is not UTF-8"),
        (b"x" * 4000 + b"\n", "expected an agent config mapping, got a scalar 'xxx"),
        (b"source: [unclosed\n", "YAML syntax:"),
        (b"- just\n- a list\n", "expected an agent config mapping, got a list"),
        (b"[a]: 1\n", "a key must be a name, got a list"),
        (b"source: &x {fps: *x}\n", "an alias refers to a mapping or list that contains it"),
    ],
    ids=["binary", "latin1", "4KB-scalar", "syntax", "list", "list-key", "alias-loop"],
)
def test_a_bad_config_file_is_named_in_a_short_error_and_exits_2(tmp_path, content, expected):
    path = tmp_path / "agent.yaml"
    path.write_bytes(content)
    for args in (["config", "validate", str(path)], ["run", "-c", str(path)], ["config", "show", str(path)]):
        r = cli(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert str(path) in r.stderr and expected in r.stderr, r.stderr
        assert len(r.stderr) < 400 and len(r.stderr.splitlines()) <= 3, r.stderr
        assert "Traceback" not in r.stderr


def test_an_empty_config_says_it_means_the_defaults(tmp_path):
    for text in ("", "# every line commented out\n", "---\n"):
        path = tmp_path / "empty.yaml"
        path.write_text(text)
        r = cli("config", "validate", str(path))
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"{path}: OK (empty: the embedded default, every key at its default)"
    cfg = load_effective(str(path), env={}).config
    assert cfg.source == AgentConfig().source and cfg.model == AgentConfig().model


def test_many_problems_are_cut_to_a_few_lines(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("".join(f"key{i}: {i}\n" for i in range(40)))
    r = cli("run", "-c", str(path))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert lines[0] == "edge-agent: error: invalid config:"
    assert len(lines) <= 13 and lines[-1] == "... and 29 more problems", lines


def test_a_video_path_from_a_file_reaches_the_source_resolved(tmp_path):
    """The source gets the resolved path: a file deleted after the check is reported by its
    full path, not by the name written in the config."""
    path = tmp_path / "vid.yaml"
    path.write_text("source: {type: video, path: clip.mp4}\n")
    cfg = load_effective(str(path), env={}).config
    assert isinstance(cfg.source, VideoSourceConfig) and cfg.source.path == str(tmp_path / "clip.mp4")
    r = cli("run", "-c", str(path), "--frames", "1")
    assert r.returncode == 2 and str(tmp_path / "clip.mp4") in r.stderr
