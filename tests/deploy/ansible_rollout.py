"""What the Ansible role's tests share (test_ansible.py, test_ansible_hardening.py): a wheel of
the repo, a fleet, the playbook run for real (`ansible-playbook` against this machine,
connection local, into a temporary prefix, without systemd: not PID 1 here), and a device:
the test's own agent, which the role reloads with SIGHUP as `systemctl reload` would.

Each module is one test: one device, each distinct rollout run on it once, in order (a
rollout is the input of the next), and each run read by every behaviour it shows, checked
and reported on its own (``Checks``). A test per behaviour, sharing the runs through
module-scoped fixtures, would run the rollouts once per xdist worker its tests landed on:
pytest-xdist's ``--dist loadgroup``, which keeps such tests in one worker, groups nothing
on pytest 9.2 (pytest-dev/pytest-xdist#1386)."""

from __future__ import annotations

import fcntl
import grp
import json
import os
import re
import shutil
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REPO, agent_command, free_endpoint, run_process, spawn, wait_until
from helpers import Subscriber

from edge_agent import __version__
from edge_agent.core.config import AgentConfig, config_hash, load_config

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


def shared_wheel(factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once in the session, by whichever test asks first, in whichever
    xdist worker: the others wait for it (a lock in the folder the workers' temporary
    folders share; without xdist, the session's own)."""
    base = factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "edge-agent-wheel"
    with (root / "edge-agent-wheel.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        wheels = list(folder.glob("edge_agent-*.whl"))
        if wheels:
            return wheels[0]
        shutil.rmtree(folder, ignore_errors=True)  # what a failed build left
        return build_wheel(folder)


# A healthy fleet's budget is generous: the rollout's health check must pass on a test
# machine busy with other work (a 50 ms budget once missed 11 % of frames under load).
def fleet(
    folder: Path, endpoint: str, budget_ms: float = 1000, broken: bool = False, token: str = ""
) -> Path:
    """A one-device fleet in ``folder``; ``broken``: it names a model that is not there;
    ``token``: the view's token, a secret (the view itself stays off)."""
    folder.mkdir(exist_ok=True)
    (folder / "fleet.yaml").write_text(
        "defaults:\n"
        f"  publish: {{endpoint: '{endpoint}', health_interval_s: 0.5}}\n"
        "  metrics: {enabled: false}\n"
        + (f"  view: {{enabled: false, token: {token}}}\n" if token else "")
        + "  source: {type: synthetic, fps: 20}\n"
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
        # TMPDIR: what a module killed midway leaves (its unpacked payload) stays in the test's
        # folder, not in /tmp.
        (self.tmp / "tmp").mkdir(exist_ok=True)
        env = {
            **os.environ,
            "ANSIBLE_ROLES_PATH": str(ANSIBLE / "roles"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_LOCAL_TEMP": str(self.tmp / "ansible-tmp"),
            "ANSIBLE_HOME": str(self.tmp / "ansible-home"),
            "TMPDIR": str(self.tmp / "tmp"),
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


class Checks:
    """The behaviours one test checks, each by name: a failed one does not stop the test (the
    runs the others read are made already, or still to be made); the test fails at its end
    (``verdict``) with every failed behaviour and its assertion."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    @contextmanager
    def behaviour(self, name: str) -> Iterator[None]:
        try:
            yield
        except AssertionError as e:
            # Where it failed: the first line outside this module (the test's own).
            tb = [f for f in traceback.extract_tb(e.__traceback__) if f.filename != __file__]
            where = f" ({Path(tb[0].filename).name}:{tb[0].lineno})" if tb else ""
            self.failed.append(f"{name}{where}:\n{e}")

    def verdict(self) -> None:
        assert not self.failed, f"{len(self.failed)} behaviour(s) failed:\n\n" + "\n\n".join(self.failed)


def beats_hash(health: Subscriber) -> str:
    return health.messages[-1]["config_hash"] if health.messages else ""


def private(st: os.stat_result) -> bool:
    """Nothing for others; the group the agent's (here: the test's own)."""
    return st.st_mode & 0o007 == 0 and st.st_gid == os.getgid()


CONFIG_DIR = "etc/edge-agent"
VENV = "opt/edge-agent/.venv"


def device_files(prefix: Path) -> dict[str, os.stat_result]:
    """What the role manages on the device, by path under ``prefix``: every file and folder
    of the config folder, and the install's top (the venv, a kept ``.venv.prev``, the
    ``edge-agent`` command)."""
    etc, opt = prefix / CONFIG_DIR, prefix / VENV
    paths = [*etc.rglob("*"), *opt.parent.glob("*"), opt / "bin" / "edge-agent"]
    found = {}
    for p in paths:
        with suppress(FileNotFoundError):
            found[str(p.relative_to(prefix))] = p.stat()
    return found


@dataclass(frozen=True)
class Run:
    """One ``ansible-playbook`` run and what it left, read as it ended: its exit status, the
    recap's counts, its output (stdout and stderr), the device's files (``device_files``),
    the running config's text and what it loads to (None when it does not load), and the
    config hash of the agent's last heartbeat."""

    rc: int
    counts: dict[str, int]
    out: str
    files: dict[str, os.stat_result]
    config: str
    loaded: AgentConfig | None
    beat_hash: str

    @property
    def config_hash(self) -> str:
        return config_hash(self.loaded) if self.loaded is not None else ""

    @property
    def tail(self) -> str:
        return self.out[-4000:]

    def fleet_copy(self) -> list[str]:
        """The device's fleet copy: its paths under the fleet folder."""
        top = f"{CONFIG_DIR}/fleet/"
        return sorted(p.removeprefix(top) for p in self.files if p.startswith(top))


@dataclass
class Device:
    """The test's agent running ``config``, its result and health streams, and the playbook
    set up to roll out to it (and to reload the agent)."""

    tmp: Path
    rollout: Rollout
    endpoint: str
    results: Subscriber
    health: Subscriber
    config: Path  # the running config

    @property
    def etc(self) -> Path:
        return self.config.parent

    @property
    def venv(self) -> Path:
        return self.rollout.prefix / VENV

    def run(self, fleet_src: Path, *flags: str, **extra) -> Run:
        """The playbook once (see ``Rollout.command``), and what it left."""
        rc, counts, out = self.rollout.run(fleet_src, *flags, **extra)
        beat = beats_hash(self.health)
        text = self.config.read_text() if self.config.exists() else ""
        try:
            loaded: AgentConfig | None = load_config(str(self.config))
        except Exception:
            loaded = None
        return Run(rc, counts, out, device_files(self.rollout.prefix), text, loaded, beat)


@contextmanager
def running_device(tmp: Path, wheel: Path) -> Iterator[Device]:
    """An agent in ``tmp`` running what ran before the role (the fleet's stream, another frame
    rate), publishing results and health; ended with its streams when the block exits, also
    on a failure."""
    endpoint = free_endpoint()
    config = tmp / "root" / "etc" / "edge-agent" / "agent.yaml"
    config.parent.mkdir(parents=True)
    before = {
        "device_id": DEVICE,
        "publish": {"endpoint": endpoint, "health_interval_s": 0.5},
        "metrics": {"enabled": False},
        "source": {"type": "synthetic", "fps": 10},
    }
    config.write_text(json.dumps(before))
    results = Subscriber(endpoint, "det")
    try:
        health = Subscriber(endpoint, "health")
        try:
            with (
                (tmp / "agent.log").open("w") as log,
                spawn(
                    agent_command("run", "--config", str(config), "--quiet"),
                    stdout=subprocess.DEVNULL,
                    stderr=log,
                ) as agent,
            ):
                wait_until(
                    lambda: len(results.messages) >= 5 and health.messages, 60, message="the agent runs"
                )
                yield Device(tmp, Rollout(tmp, wheel, agent.pid), endpoint, results, health, config)
        finally:
            health.close()
    finally:
        results.close()
