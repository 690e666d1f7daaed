"""A regular (non-editable) install carries everything the commands read at run time.

An editable install resolves files next to the repo's folders, so it hides files that are
not package data. This installs a copy of the repo's packaging inputs with pip into a
folder of its own and runs ``service install --dry-run`` from there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.service.supervisor import UNITS

REPO = Path(__file__).resolve().parent.parent
INPUTS = ("pyproject.toml", "README.md", "agent", "pipelines", "power", "models", "systemd")


def _builds_wheels_offline() -> bool:
    """Whether this venv's setuptools can build a wheel without pip's build isolation
    (bdist_wheel is in setuptools itself from 70.1, before that in the ``wheel`` package)."""
    import setuptools

    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A non-editable install of a copy of the repo, in a --target folder of its own."""
    tmp = tmp_path_factory.mktemp("packaging")
    src = tmp / "src"
    src.mkdir()
    for name in INPUTS:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    site = tmp / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-input", "--target", str(site)]
    if _builds_wheels_offline():
        cmd.append("--no-build-isolation")
    # else pip fetches the build-system requirements, as a user's `pip install .` does
    # (a fresh Python 3.10 venv has setuptools 65 and no `wheel`).
    out = subprocess.run([*cmd, str(src)], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return site


def run_installed(site: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = (
        "import sys, edge_agent\n"
        "print('edge_agent from', edge_agent.__file__, flush=True)\n"
        "from edge_agent.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, env=env, cwd=cwd
    )


def test_unit_files_are_in_the_installed_package(site):
    for unit in UNITS:
        assert (site / "edge_agent" / "systemd" / unit).is_file(), unit


def test_service_install_dry_run_from_a_regular_install(site, tmp_path):
    prefix, config = tmp_path / "units", tmp_path / "etc" / "agent.yaml"
    args = ["service", "install", "--dry-run", "--prefix", str(prefix), "--config", str(config)]
    out = run_installed(site, *args, cwd=tmp_path)
    first = out.stdout.splitlines()[0] if out.stdout else ""
    assert first.startswith("edge_agent from "), out.stdout + out.stderr
    assert Path(first.removeprefix("edge_agent from ")).is_relative_to(site), "not the editable tree"
    assert out.returncode == 0, out.stdout + out.stderr
    venv = Path(sys.executable).parent.parent  # the interpreter that ran it: its venv
    for unit in UNITS:
        assert f"write {prefix / unit}" in out.stdout
        assert not (prefix / unit).exists(), "a dry run writes nothing"
    text = out.stdout
    # Both units, rendered with this installation's paths.
    assert "Description=edge-agent real-time inference agent" in text
    assert "Description=edge-agent power profile" in text
    assert f"ExecStart={venv}/bin/edge-agent run --config {config} --quiet" in text
    assert f"ExecStart={venv}/bin/edge-agent power apply --config {config}" in text
    assert f"ExecStopPost={venv}/bin/edge-agent power restore --config {config}" in text
    assert "/opt/edge-agent/.venv" not in text and "/etc/edge-agent/agent.yaml" not in text
