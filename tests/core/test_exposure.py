"""What a config serves to other hosts without protection: warnings computed from the built
config (not errors: on a closed network an operator may mean it), printed by `config validate`
per device, which still exits 0.

(agent/core/exposure.py ``exposure_warnings``, ``on_loopback``; agent/commands/configs.py)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig, ViewConfig
from edge_agent.core.exposure import exposure_warnings, on_loopback
from edge_agent.core.publish_config import PublishConfig


def keys(cfg: AgentConfig) -> list[str]:
    return [w.split(":", 1)[0] for w in exposure_warnings(cfg)]


def validate(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_agent", "config", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("tcp://127.0.0.1:5556", True),
        ("tcp://127.3.0.1:*", True),
        ("tcp://localhost:5556", True),
        ("tcp://[::1]:5556", True),
        ("ipc:///run/edge-agent/results", True),
        ("inproc://results", True),
        ("127.0.0.1", True),
        ("::1", True),
        ("tcp://0.0.0.0:5556", False),
        ("tcp://*:5556", False),
        ("tcp://[::]:5556", False),
        ("tcp://eth0:5556", False),
        ("tcp://10.0.0.5:5556", False),
        ("0.0.0.0", False),
        ("", False),  # an HTTP server on "" listens on every interface
        ("jetson.local", False),
    ],
)
def test_on_loopback(address, loopback):
    assert on_loopback(address) is loopback


def test_the_defaults_expose_nothing():
    assert exposure_warnings(AgentConfig()) == []


def test_a_stream_on_the_network_without_curve_is_a_warning():
    open_stream = AgentConfig(publish=PublishConfig(endpoint="tcp://0.0.0.0:5556"))
    (warning,) = exposure_warnings(open_stream)
    assert warning.startswith("publish.endpoint: tcp://0.0.0.0:5556 is not loopback and has no CURVE")
    curve = PublishConfig(endpoint="tcp://*:5556", curve_server_key="s.key_secret", curve_clients_dir="c")
    assert exposure_warnings(AgentConfig(publish=curve)) == []


def test_metrics_on_the_network_is_a_warning_unless_they_are_off():
    assert keys(AgentConfig(metrics=MetricsConfig(host="0.0.0.0"))) == ["metrics.host"]
    assert "port 9200" in exposure_warnings(AgentConfig(metrics=MetricsConfig(host="", port=9200)))[0]
    assert keys(AgentConfig(metrics=MetricsConfig(host="0.0.0.0", enabled=False))) == []


def test_a_view_on_the_network_without_a_token_is_a_warning_when_it_runs():
    assert keys(AgentConfig(view=ViewConfig(enabled=True, host="0.0.0.0"))) == ["view.host"]
    assert keys(AgentConfig(view=ViewConfig(enabled=True, host="0.0.0.0", token="s3cret"))) == []
    assert keys(AgentConfig(view=ViewConfig(enabled=False, host="0.0.0.0"))) == [], "not served"
    assert keys(AgentConfig(view=ViewConfig(enabled=True))) == [], "loopback"


def test_validate_warns_about_a_file_and_still_passes(tmp_path: Path):
    path = tmp_path / "agent.yaml"
    path.write_text("publish: {endpoint: 'tcp://0.0.0.0:5556'}\nmetrics: {host: 0.0.0.0}\n")
    r = validate(path)
    assert r.returncode == 0 and r.stdout.strip() == f"{path}: OK", r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert [line.split(": warning: ")[1].split(":")[0] for line in lines] == [
        "publish.endpoint",
        "metrics.host",
    ]
    assert lines[0].startswith(f"{path}: warning: publish.endpoint: tcp://0.0.0.0:5556 ")
    assert lines[0].endswith(f"[set by file ({path}:1)]") and lines[1].endswith(f"[set by file ({path}:2)]")


def test_validate_warns_per_device_of_a_fleet(tmp_path: Path):
    """The README's fleet snippet bound tcp://0.0.0.0:5556 without CURVE and passed silently."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        "defaults:\n"
        "  publish: {endpoint: 'tcp://0.0.0.0:5556'}\n"
        "devices:\n"
        "  cam-001: {}\n"
        "  cam-002:\n"
        "    config: {publish: {endpoint: 'tcp://127.0.0.1:5556'}}\n"
    )
    r = validate(fleet)
    assert r.returncode == 0 and "OK (2 devices, 0 groups)" in r.stdout, r.stdout + r.stderr
    (line,) = r.stderr.splitlines()
    assert line.startswith(f"{fleet}: device cam-001: warning: publish.endpoint: tcp://0.0.0.0:5556 ")
    assert line.endswith(f"[set by defaults ({fleet}:2)]")


def test_validate_prints_nothing_more_for_a_config_that_exposes_nothing(tmp_path: Path):
    path = tmp_path / "agent.yaml"
    path.write_text("publish: {endpoint: 'tcp://127.0.0.1:5556'}\n")
    r = validate(path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
