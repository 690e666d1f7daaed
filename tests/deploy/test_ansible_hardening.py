"""The Ansible role against what went wrong in issue 30: a fleet file deleted on the controller
stays on the device; the view token leaks into logs and world-readable files; a failed package
upgrade is not rolled back; an interrupted run is never rolled back.

One device (the test's own agent, reloaded by SIGHUP; see ansible_rollout.py), each scenario's
rollout once, in order: a first rollout, verbose and with diffs, onto a device whose fleet copy
holds a file since deleted on the controller (the deleted file and the token read this one
run); a rollout killed during its health check, and the run after it; then a package upgrade
whose health check fails. The integration tier, as test_ansible.py."""

from __future__ import annotations

import base64
import hashlib
import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_rollout import (
    CONFIG_DIR,
    VENV,
    Checks,
    Device,
    beats_hash,
    fleet,
    private,
    running_device,
    shared_wheel,
)
from conftest import run_process, spawn, wait_until

from edge_agent import __version__
from edge_agent.core.config import config_hash, load_config

pytestmark = pytest.mark.integration

TOKEN = "s3cret-view-token_for_issue30"
CANARY = "groups:\n  - {name: canary, match: {labels: {site: berlin}}, config: {deadline: {budget_ms: 5}}}\n"


@pytest.fixture
def device(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    with running_device(tmp_path, shared_wheel(tmp_path_factory)) as dev:
        yield dev


def test_issue30_deleted_fleet_files_the_token_an_interrupted_rollout_and_a_failed_upgrade(device: Device):
    checks = Checks()
    # A one-device fleet whose view token is a secret (generous budget: see ansible_rollout).
    controller = fleet(device.tmp / "fleet", device.endpoint, token=TOKEN)
    # What an earlier rollout left: the same fleet plus a canary override since deleted.
    copy = device.etc / "fleet"
    copy.mkdir()
    (copy / "fleet.yaml").write_text((controller / "fleet.yaml").read_text())
    (copy / "zz-canary.yaml").write_text(CANARY)
    (copy / "old").mkdir()
    (copy / "old" / "notes.yaml").write_text("{}\n")

    first = device.run(controller, "-vvv", "--diff")  # all the output Ansible gives
    with checks.behaviour("a fleet file deleted on the controller is deleted on the device"):
        assert first.rc == 0, first.tail
        assert first.fleet_copy() == ["fleet.yaml"], "the device's copy is the fleet"
        assert first.loaded is not None, first.tail
        assert first.loaded.deadline.budget_ms == 1000, "the controller's config, not the deleted canary's"
    with checks.behaviour("the view token stays out of the log and of world-readable files"):
        assert first.rc == 0, first.tail
        assert TOKEN in first.config, "the token is deployed"
        assert TOKEN not in first.out, [line for line in first.out.splitlines() if TOKEN in line][:5]
        names = [f"{CONFIG_DIR}/{n}" for n in ("agent.yaml", "agent.yaml.new", "agent.yaml.prev", "fleet")]
        names += [f"{CONFIG_DIR}/fleet/{p}" for p in first.fleet_copy()]
        assert [n for n in names if n not in first.files] == [], sorted(first.files)
        assert [n for n in names if not private(first.files[n])] == []

    with checks.behaviour("an interrupted rollout is checked and rolled back by the next run"):
        interrupted_rollout_is_rolled_back(device)

    with checks.behaviour("a package upgrade that fails its health check is rolled back"):
        # The device runs the fleet's config (the first rollout's) with the current release:
        # the config stays as it is, the package changes.
        upgrade = device.run(
            controller,
            edge_agent_package=str(broken_wheel(device.tmp / "next")),
            edge_agent_version="99.0",
            edge_agent_health_timeout_s=6,
        )
        assert upgrade.rc != 0 and "unhealthy: this build is broken" in upgrade.out, upgrade.tail
        version = run_process([str(device.venv / "bin" / "edge-agent"), "--version"], 60)
        assert version.stdout.strip() == f"edge-agent {__version__}", upgrade.tail
        assert "the previous package is back" in upgrade.out, upgrade.tail
        assert f"{CONFIG_DIR}/rollout.pending" not in upgrade.files and f"{VENV}.prev" not in upgrade.files
    checks.verdict()


def interrupted_rollout_is_rolled_back(device: Device) -> None:
    good = device.config.read_text()
    good_hash = config_hash(load_config(str(device.config)))
    # Valid, but no frame can meet a 1 ms budget: unhealthy at a miss rate of 0.
    tight = fleet(device.tmp / "tight", device.endpoint, budget_ms=1, token=TOKEN)
    strict = {"edge_agent_health_max_miss_rate": 0.0}
    args, env = device.rollout.command(tight, edge_agent_health_timeout_s=60, **strict)
    log = device.tmp / "interrupted.log"
    with log.open("w") as sink, spawn(args, env=env, stdout=sink, stderr=subprocess.STDOUT) as run:
        # The connection drops while the health check waits: the rescue never runs.
        wait_until(
            lambda: "TASK [edge_agent : Wait until" in log.read_text() or run.poll() is not None,
            180,
            message="the playbook reaches the health check",
        )
        wait_until(lambda: beats_hash(device.health) != good_hash, 30, message="the new config is live")
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)
    assert device.config.read_text() != good, log.read_text()[-4000:]

    after = device.run(tight, edge_agent_health_timeout_s=6, **strict)
    assert after.rc != 0 and "the previous config is back" in after.out, after.tail
    assert after.config == good and f"{CONFIG_DIR}/rollout.pending" not in after.files
    wait_until(lambda: beats_hash(device.health) == good_hash, 30, message="the agent back on its config")


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
