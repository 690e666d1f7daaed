"""The fleet commands as a user runs them: validate, render (--explain), diff, run --device."""

from __future__ import annotations

import subprocess
import textwrap

from conftest import agent_command, run_process

FLEET = textwrap.dedent(
    """\
    defaults:
      source: {type: synthetic, fps: 30}
      deadline: {budget_ms: 50}
    groups:
      - name: nanos
        match: {module: Orin Nano}
        config:
          deadline: {budget_ms: 40}
      - name: gate
        match: {hostname: "gate-*"}
        config:
          source: {fps: 15}
    devices:
      gate-01:
        module: Orin Nano
      lab-01:
        config:
          source: {seed: 7}
    """
)


def cli(*args: str, env=None) -> subprocess.CompletedProcess:
    return run_process(agent_command(*args), timeout_s=60, env=env)


def test_validate_render_explain_and_diff(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    ok = cli("config", "validate", str(fleet))
    assert ok.returncode == 0 and "OK (2 devices, 2 groups)" in ok.stdout, ok.stdout + ok.stderr
    explain = cli("config", "render", str(fleet), "--device", "gate-01", "--explain")
    assert explain.returncode == 0, explain.stderr
    lines = dict(line.split(": ", 1) for line in explain.stdout.splitlines())
    assert lines["deadline.budget_ms"].startswith('groups[0] "nanos"'), lines
    assert lines["source.fps"].startswith('groups[1] "gate"'), lines
    rendered = cli("config", "render", str(fleet), "--device", "gate-01")
    assert "fps: 15.0" in rendered.stdout and "budget_ms: 40.0" in rendered.stdout
    single = tmp_path / "single.yaml"
    single.write_text("source: {type: synthetic, fps: 30}\n")
    diff = cli("config", "diff", str(single), str(fleet), "--device", "gate-01")
    assert diff.returncode == 0, diff.stderr
    assert "source.fps: 30.0 -> 15.0" in diff.stdout and "deadline.budget_ms: 50.0 -> 40.0" in diff.stdout


def test_validate_reports_every_device_error_with_file_and_line(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        FLEET.replace("source: {seed: 7}", "source: {seed: seven}").replace("budget_ms: 40", "budget_ms: -1")
    )
    bad = cli("config", "validate", str(fleet))
    assert bad.returncode == 2
    assert f"{fleet}:18:" in bad.stderr and "source.seed" in bad.stderr, bad.stderr
    assert f"{fleet}:8:" in bad.stderr and "deadline.budget_ms" in bad.stderr, bad.stderr


def test_run_takes_a_fleet_and_a_device(tmp_path, endpoint):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET.replace("defaults:\n", f"defaults:\n  publish: {{endpoint: '{endpoint}'}}\n", 1))
    out = cli("run", "--config", str(fleet), "--device", "lab-01", "--frames", "5", "--quiet")
    assert out.returncode == 0, out.stderr
    assert "captured 5" in out.stderr
