"""The Ansible role, run for real: `ansible-playbook` against this machine (connection
local) into a temporary prefix, without systemd (not PID 1 here): the test runs the agent
itself and the role reloads it with SIGHUP, as `systemctl reload` would."""

from __future__ import annotations

import grp
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO, agent_command, free_endpoint, run_process, spawn, wait_until
from helpers import Subscriber

from edge_agent import __version__
from edge_agent.core.config import config_hash, load_config

ANSIBLE = REPO / "deploy" / "ansible"
DEVICE = "cam-001"
INPUTS = ("pyproject.toml", "README.md", "agent", "pipelines", "power", "models", "systemd")


def build_wheel(tmp: Path) -> Path:
    """A wheel of a copy of the repo, built offline (as test_packaging builds its install)."""
    src = tmp / "src"
    src.mkdir(parents=True)
    for name in INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    out = run_process(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp), str(src)],
        timeout_s=180,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (wheel,) = tmp.glob("edge_agent-*.whl")
    return wheel


# A healthy fleet's budget is generous: the rollout's health check must pass on a test
# machine busy with other work (a 50 ms budget once missed 11 % of frames under load).
def fleet(folder: Path, endpoint: str, budget_ms: float = 1000, broken: bool = False) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "fleet.yaml").write_text(
        "defaults:\n"
        f"  publish: {{endpoint: '{endpoint}', health_interval_s: 0.5}}\n"
        "  metrics: {enabled: false}\n"
        "  source: {type: synthetic, fps: 20}\n"
        f"  deadline: {{budget_ms: {budget_ms}}}\n"
        + ("  model: {path: /nonexistent/model.onnx}\n" if broken else "")
        + f"devices:\n  {DEVICE}: {{labels: {{site: berlin}}}}\n"
    )
    return folder


class Rollout:
    """The playbook with a localhost inventory into ``prefix``; the agent is ``pid``."""

    def __init__(self, tmp: Path, wheel: Path, pid: int) -> None:
        self.tmp, self.prefix = tmp, tmp / "root"
        venv = self.prefix / "opt" / "edge-agent" / ".venv"
        # The role makes the venv; its dependencies come from the test's own environment
        # (as JetPack's come from the system's site packages on a Jetson).
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        site = next((venv / "lib").glob("python3*/site-packages"))
        deps = next(p for p in map(Path, sys.path) if p.name == "site-packages" and (p / "zmq").is_dir())
        (site / "zz_test_deps.pth").write_text(f"{deps}\n")
        self.inventory = tmp / "inventory.yml"
        host = {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "edge_agent_device_id": DEVICE,
            "edge_agent_labels": {"site": "berlin"},
        }
        self.inventory.write_text(
            json.dumps({"all": {"children": {"edge_agents": {"hosts": {"this-jetson": host}}}}})
        )
        self.vars = {
            "edge_agent_become": False,
            "edge_agent_prefix": str(self.prefix),
            "edge_agent_python": sys.executable,
            "edge_agent_system_site_packages": False,
            "edge_agent_package": str(wheel),
            "edge_agent_version": __version__,
            "edge_agent_pip_args": "--no-deps --no-index",
            "edge_agent_manage_systemd": False,
            "edge_agent_reload_command": f"kill -HUP {pid}",
            "edge_agent_restart_command": f"kill -HUP {pid}",  # the test's agent stays in its process
            "edge_agent_health_timeout_s": 20,
            # The configs hold secrets: readable by the agent's group only (here: the test's).
            "edge_agent_group": grp.getgrgid(os.getgid()).gr_name,
        }

    @property
    def config(self) -> Path:
        return self.prefix / "etc" / "edge-agent" / "agent.yaml"

    def command(self, fleet_src: Path, *flags: str, **extra) -> tuple[list[str], dict[str, str]]:
        """The ``ansible-playbook`` command line (``flags``: more options, e.g. ``-vvv``) and its
        environment."""
        extra_vars = {**self.vars, "edge_agent_fleet_src": str(fleet_src), **extra}
        env = {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(self.tmp / "ansible-tmp"),
            "ANSIBLE_HOME": str(self.tmp / "ansible-home"),
        }
        args = [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(self.inventory),
            *flags,
            "-e",
            json.dumps(extra_vars),
            str(ANSIBLE / "site.yml"),
        ]
        return args, env

    def run(self, fleet_src: Path, *flags: str, **extra) -> tuple[int, dict[str, int], str]:
        args, env = self.command(fleet_src, *flags, **extra)
        out = run_process(args, timeout_s=240, env=env)
        recap = re.search(r"this-jetson\s*:\s*(.*)", out.stdout.split("PLAY RECAP")[-1])
        counts = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))} if recap else {}
        return out.returncode, counts, out.stdout + out.stderr


def beats_hash(health: Subscriber) -> str:
    return health.messages[-1]["config_hash"] if health.messages else ""


def test_a_rollout_installs_is_idempotent_refuses_a_broken_fleet_and_rolls_back_an_unhealthy_config(tmp_path):
    endpoint = free_endpoint()
    wheel = build_wheel(tmp_path / "wheel")
    config = tmp_path / "root" / "etc" / "edge-agent" / "agent.yaml"
    config.parent.mkdir(parents=True)
    # What ran before the role: the same stream, another frame rate.
    config.write_text(
        json.dumps(
            {
                "device_id": DEVICE,
                "publish": {"endpoint": endpoint, "health_interval_s": 0.5},
                "metrics": {"enabled": False},
                "source": {"type": "synthetic", "fps": 10},
            }
        )
    )
    results, health = Subscriber(endpoint, "det"), Subscriber(endpoint, "health")
    with spawn(
        agent_command("run", "--config", str(config), "--quiet"),
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "agent.log").open("w"),
    ) as agent:
        try:
            wait_until(lambda: len(results.messages) >= 5, 60, message="the agent runs")
            rollout = Rollout(tmp_path, wheel, agent.pid)
            good = fleet(tmp_path / "fleet", endpoint)

            rc, counts, out = rollout.run(good)  # installs, renders, reloads, checks health
            assert rc == 0, out[-4000:]
            assert counts["changed"] > 0 and counts["failed"] == 0
            assert (rollout.prefix / "opt/edge-agent/.venv/bin/edge-agent").is_file()
            assert (config.parent / "agent.yaml.prev").is_file()
            deployed = config_hash(load_config(str(config)))
            wait_until(lambda: beats_hash(health) == deployed, 30, message="the agent runs the new config")

            rc, counts, out = rollout.run(good)  # nothing to do
            assert rc == 0 and counts["changed"] == 0, out[-4000:]

            before = config.read_text()
            rc, counts, out = rollout.run(fleet(tmp_path / "broken", endpoint, broken=True))
            # It renders, but names a model that is not there: `config validate` stops it.
            assert rc != 0 and "model.path: file not found" in out, out[-4000:]
            failed_task = re.findall(r"TASK \[(.*?)\]", out.split("fatal:")[0])[-1]
            assert "Validate it" in failed_task, failed_task
            assert config.read_text() == before and beats_hash(health) == deployed

            # Valid, but no frame can meet a 1 ms budget: health fails, the config goes back.
            rc, counts, out = rollout.run(
                fleet(tmp_path / "tight", endpoint, budget_ms=1),
                edge_agent_health_timeout_s=6,
                edge_agent_health_max_miss_rate=0.0,
            )
            assert rc != 0 and "the previous config is back" in out, out[-4000:]
            assert config.read_text() == before
            wait_until(
                lambda: beats_hash(health) == deployed, 30, message="the agent back on the good config"
            )
            seq_now = len(results.messages)
            wait_until(lambda: len(results.messages) > seq_now + 5, 30, message="results after the rollback")
        finally:
            results.close()
            health.close()
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    seqs = [m["seq"] for m in results.messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "one stream throughout: no gap, no restart"


def test_the_role_and_playbook_pass_ansible_lint(tmp_path):
    env = {**os.environ, "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"), "ANSIBLE_HOME": str(tmp_path)}
    lint = Path(sys.executable).parent / "ansible-lint"
    out = run_process([str(lint), "--offline", "--nocolor"], timeout_s=180, env=env, cwd=ANSIBLE)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
