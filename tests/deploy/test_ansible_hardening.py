"""The Ansible role against what went wrong in issue 30: a fleet file deleted on the controller
stays on the device; the view token leaks into logs and world-readable files; a failed package
upgrade is not rolled back; an interrupted run is never rolled back. Each scenario: the test's
own agent (reloaded by SIGHUP), one or two playbook runs (see test_ansible.py)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import agent_command, free_endpoint, run_process, spawn, wait_until
from helpers import Subscriber
from test_ansible import DEVICE, Rollout, beats_hash, build_wheel

from edge_agent import __version__
from edge_agent.core.config import config_hash, load_config

TOKEN = "s3cret-view-token_for_issue30"
CANARY = "groups:\n  - {name: canary, match: {labels: {site: berlin}}, config: {deadline: {budget_ms: 5}}}\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def fleet(folder: Path, endpoint: str, budget_ms: float = 1000) -> Path:  # generous: see test_ansible
    """A one-device fleet whose view token is a secret (the view itself stays off)."""
    folder.mkdir(exist_ok=True)
    (folder / "fleet.yaml").write_text(
        "defaults:\n"
        f"  publish: {{endpoint: '{endpoint}', health_interval_s: 0.5}}\n"
        "  metrics: {enabled: false}\n"
        f"  view: {{enabled: false, token: {TOKEN}}}\n"
        "  source: {type: synthetic, fps: 20}\n"
        f"  deadline: {{budget_ms: {budget_ms}}}\n"
        f"devices:\n  {DEVICE}: {{labels: {{site: berlin}}}}\n"
    )
    return folder


@dataclass
class Device:
    rollout: Rollout
    endpoint: str
    health: Subscriber
    config: Path  # the running config

    @property
    def etc(self) -> Path:
        return self.config.parent

    @property
    def venv(self) -> Path:
        return self.rollout.prefix / "opt" / "edge-agent" / ".venv"


@contextmanager
def device(tmp: Path, wheel: Path, initial: Callable[[str], str] | None = None) -> Iterator[Device]:
    """An agent running ``initial(endpoint)`` (default: the same stream at another frame
    rate), the playbook set up to roll out to it, as in test_ansible.py."""
    endpoint = free_endpoint()
    config = tmp / "root" / "etc" / "edge-agent" / "agent.yaml"
    config.parent.mkdir(parents=True)
    before = {
        "device_id": DEVICE,
        "publish": {"endpoint": endpoint, "health_interval_s": 0.5},
        "metrics": {"enabled": False},
        "source": {"type": "synthetic", "fps": 10},
    }
    config.write_text(initial(endpoint) if initial else json.dumps(before))
    health = Subscriber(endpoint, "health")
    try:
        with spawn(
            agent_command("run", "--config", str(config), "--quiet"),
            stdout=subprocess.DEVNULL,
            stderr=(tmp / "agent.log").open("w"),
        ) as agent:
            wait_until(lambda: health.messages, 60, message="the agent runs")
            yield Device(Rollout(tmp, wheel, agent.pid), endpoint, health, config)
    finally:
        health.close()


def private(path: Path) -> bool:
    """Nothing for others; the group the agent's (here: the test's own)."""
    st = path.stat()
    return st.st_mode & 0o007 == 0 and st.st_gid == os.getgid()


def test_a_fleet_file_deleted_on_the_controller_is_deleted_on_the_device(tmp_path, wheel):
    with device(tmp_path, wheel) as dev:
        controller = fleet(tmp_path / "fleet", dev.endpoint)
        # What an earlier rollout left: the same fleet plus a canary override since deleted.
        copy = dev.etc / "fleet"
        copy.mkdir()
        (copy / "fleet.yaml").write_text((controller / "fleet.yaml").read_text())
        (copy / "zz-canary.yaml").write_text(CANARY)
        (copy / "old").mkdir()
        (copy / "old" / "notes.yaml").write_text("{}\n")

        rc, _, out = dev.rollout.run(controller)
        assert rc == 0, out[-4000:]
        assert sorted(p.name for p in copy.iterdir()) == ["fleet.yaml"], "the device's copy is the fleet"
        budget = load_config(str(dev.config)).deadline.budget_ms
        assert budget == 1000, "the controller's config, not the deleted canary's"


def test_the_view_token_stays_out_of_the_log_and_of_world_readable_files(tmp_path, wheel):
    with device(tmp_path, wheel) as dev:
        rc, _, out = dev.rollout.run(fleet(tmp_path / "fleet", dev.endpoint), "-vvv", "--diff")
        assert rc == 0, out[-4000:]
        assert TOKEN in dev.config.read_text(), "the token is deployed"
        assert TOKEN not in out, [line for line in out.splitlines() if TOKEN in line][:5]
        files = [dev.etc / n for n in ("agent.yaml", "agent.yaml.new", "agent.yaml.prev")]
        files += [dev.etc / "fleet", *(dev.etc / "fleet").rglob("*")]
        assert [str(p) for p in files if not private(p)] == []


def test_an_interrupted_rollout_is_checked_and_rolled_back_by_the_next_run(tmp_path, wheel):
    with device(tmp_path, wheel) as dev:
        good = dev.config.read_text()
        good_hash = config_hash(load_config(str(dev.config)))
        # Valid, but no frame can meet a 1 ms budget: unhealthy at a miss rate of 0.
        tight = fleet(tmp_path / "tight", dev.endpoint, budget_ms=1)
        strict = {"edge_agent_health_max_miss_rate": 0.0}
        args, env = dev.rollout.command(tight, edge_agent_health_timeout_s=60, **strict)
        log = tmp_path / "interrupted.log"
        with log.open("w") as sink, spawn(args, env=env, stdout=sink, stderr=subprocess.STDOUT) as run:
            # The connection drops while the health check waits: the rescue never runs.
            wait_until(
                lambda: "TASK [edge_agent : Wait until" in log.read_text() or run.poll() is not None,
                180,
                message="the playbook reaches the health check",
            )
            wait_until(lambda: beats_hash(dev.health) != good_hash, 30, message="the new config is live")
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(30)
        assert dev.config.read_text() != good, log.read_text()[-4000:]

        rc, _, out = dev.rollout.run(tight, edge_agent_health_timeout_s=6, **strict)
        assert rc != 0 and "the previous config is back" in out, out[-4000:]
        assert dev.config.read_text() == good and not (dev.etc / "rollout.pending").exists()
        wait_until(lambda: beats_hash(dev.health) == good_hash, 30, message="the agent back on its config")


def broken_wheel(folder: Path, version: str = "99.0") -> Path:
    """An ``edge-agent`` release that installs, reports its version and renders configs (the
    test's own edge-agent does that), but whose health check always fails."""
    folder.mkdir()
    script = (
        "import os, sys\n"
        "def main():\n"
        "    args = sys.argv[1:]\n"
        f"    if args == ['--version']:\n        print('edge-agent {version}')\n        return 0\n"
        "    if args[:1] == ['health']:\n        print('unhealthy: this build is broken')\n        return 1\n"
        f"    os.execv({sys.executable!r}, [{sys.executable!r}, '-m', 'edge_agent', *args])\n"
    )
    info = f"edge_agent-{version}.dist-info"
    files = {
        "edge_agent_broken.py": script,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: edge-agent\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{info}/entry_points.txt": "[console_scripts]\nedge-agent = edge_agent_broken:main\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"edge_agent-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, text in files.items():
            whl.writestr(name, text)
    return path


def test_a_package_upgrade_that_fails_its_health_check_is_rolled_back(tmp_path, wheel):
    controller = tmp_path / "fleet"

    def rendered(endpoint: str) -> str:  # what the role renders: the config stays as it is
        render = agent_command("config", "render", str(fleet(controller, endpoint)), "--device", DEVICE)
        out = run_process(render, 60)
        assert out.returncode == 0, out.stderr
        return out.stdout

    with device(tmp_path, wheel, rendered) as dev:
        # The device runs the fleet's config with the current release.
        pip = [str(dev.venv / "bin" / "python"), "-m", "pip", "install", "--no-deps", "--no-index"]
        assert run_process([*pip, str(wheel)], 180).returncode == 0

        rc, _, out = dev.rollout.run(
            controller,
            edge_agent_package=str(broken_wheel(tmp_path / "next")),
            edge_agent_version="99.0",
            edge_agent_health_timeout_s=6,
        )
        assert rc != 0 and "unhealthy: this build is broken" in out, out[-4000:]
        version = run_process([str(dev.venv / "bin" / "edge-agent"), "--version"], 60)
        assert version.stdout.strip() == f"edge-agent {__version__}", out[-4000:]
        assert "the previous package is back" in out, out[-4000:]
        assert not (dev.etc / "rollout.pending").exists() and not Path(f"{dev.venv}.prev").exists()
