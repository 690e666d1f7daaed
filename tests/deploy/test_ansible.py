"""The Ansible role, run for real: `ansible-playbook` against this machine (connection
local) into a temporary prefix, without systemd (not PID 1 here): the test runs the agent
itself and the role reloads it with SIGHUP, as `systemctl reload` would (ansible_rollout.py).

The integration tier (pyproject's `integration` marker): it tests the role, which runs the
same on any Python; CI runs it once, on 3.10 (docs/testing.md)."""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from ansible_rollout import (
    ANSIBLE,
    CONFIG_DIR,
    VENV,
    Checks,
    Device,
    beats_hash,
    fleet,
    running_device,
    shared_wheel,
)
from conftest import run_process, wait_until

pytestmark = pytest.mark.integration


def test_the_role_and_playbook_pass_ansible_lint(tmp_path):
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"), "ANSIBLE_HOME": str(tmp_path)}
    lint = Path(sys.executable).parent / "ansible-lint"
    out = run_process([str(lint), "--offline", "--nocolor"], timeout_s=180, env=env, cwd=ANSIBLE)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]


@pytest.fixture
def device(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Device]:
    with running_device(tmp_path, shared_wheel(tmp_path_factory)) as dev:
        yield dev


def test_a_rollout_installs_is_idempotent_refuses_a_broken_fleet_and_rolls_back_an_unhealthy_config(
    device: Device,
):
    """Four rollouts on one device, in order, each the input of its behaviour."""
    checks = Checks()
    good = fleet(device.tmp / "fleet", device.endpoint)

    first = device.run(good)  # installs, renders, reloads, checks health
    with checks.behaviour("the first rollout installs, renders, reloads and checks health"):
        assert first.rc == 0, first.tail
        assert first.counts["changed"] > 0 and first.counts["failed"] == 0, first.counts
        assert stat.S_ISREG(first.files[f"{VENV}/bin/edge-agent"].st_mode), sorted(first.files)
        assert f"{CONFIG_DIR}/agent.yaml.prev" in first.files, "the config it replaced is kept"
        assert first.config_hash, first.tail
        wait_until(
            lambda: beats_hash(device.health) == first.config_hash,
            30,
            message="the agent runs the new config",
        )

    again = device.run(good)
    with checks.behaviour("a second rollout of the same fleet has nothing to do"):
        assert again.rc == 0 and again.counts["changed"] == 0, again.tail

    before = again.config
    broken = device.run(fleet(device.tmp / "broken", device.endpoint, broken=True))
    with checks.behaviour("a fleet that renders but names a missing model is refused"):
        # It renders, but names a model that is not there: `config validate` stops it.
        assert broken.rc != 0 and "model.path: file not found" in broken.out, broken.tail
        failed_task = re.findall(r"TASK \[(.*?)\]", broken.out.split("fatal:")[0])[-1]
        assert "Validate it" in failed_task, failed_task
        assert broken.config == before and broken.beat_hash == first.config_hash

    # Valid, but no frame can meet a 1 ms budget: health fails, the config goes back.
    unhealthy = device.run(
        fleet(device.tmp / "tight", device.endpoint, budget_ms=1),
        edge_agent_health_timeout_s=6,
        edge_agent_health_max_miss_rate=0.0,
    )
    with checks.behaviour("a config that fails health is rolled back"):
        assert unhealthy.rc != 0 and "the previous config is back" in unhealthy.out, unhealthy.tail
        assert unhealthy.config == before
        wait_until(
            lambda: beats_hash(device.health) == first.config_hash,
            30,
            message="the agent back on the good config",
        )
        seq_now = len(device.results.messages)
        wait_until(
            lambda: len(device.results.messages) > seq_now + 5, 30, message="results after the rollback"
        )

    with checks.behaviour("the agent kept one stream throughout"):
        seqs = [m["seq"] for m in list(device.results.messages)]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "one stream throughout: no gap, no restart"
    checks.verdict()
