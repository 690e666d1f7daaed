"""The command line as a new user meets it: help on every option, progress on a terminal,
a listener that says where it listens, and key files that are never overwritten by mistake."""

from __future__ import annotations

import argparse
import os
import pty
import select
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import spawn

from edge_agent.cli import build_parser


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


# -- keys generate ---------------------------------------------------------------------------


def test_keys_generate_refuses_to_overwrite_a_key_pair_without_force(tmp_path):
    first = cli("keys", "generate", "agent", "--dir", str(tmp_path))
    assert first.returncode == 0, first.stderr
    secret = tmp_path / "agent.key_secret"
    before = secret.read_bytes()
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    again = cli("keys", "generate", "agent", "--dir", str(tmp_path))
    assert again.returncode == 2
    assert str(secret) in again.stderr and "--force" in again.stderr, again.stderr
    assert secret.read_bytes() == before, "the secret key must be untouched"
    forced = cli("keys", "generate", "agent", "--dir", str(tmp_path), "--force")
    assert forced.returncode == 0, forced.stderr
    assert secret.read_bytes() != before
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["../evil", "sub/agent", "/tmp/agent", ".hidden", "..", ""])
def test_keys_generate_refuses_names_that_are_not_plain_file_names(tmp_path, name):
    inside = tmp_path / "keys"
    inside.mkdir()
    r = cli("keys", "generate", name, "--dir", str(inside))
    assert r.returncode == 2, r.stdout
    assert "plain file name" in r.stderr
    assert list(tmp_path.rglob("*.key*")) == [], "nothing written, inside --dir or outside it"


# -- help ------------------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser, path: str = "edge-agent"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{path} {name}")


def test_every_option_of_every_command_has_help():
    missing = []
    for path, parser in _parsers(build_parser()):
        assert parser.description, f"{path}: no description"
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{path} {action.option_strings or action.dest}")
    assert missing == []


def test_help_shows_the_defaults():
    parser = build_parser()
    run = dict(_parsers(parser))["edge-agent run"].format_help()
    assert "stop after N frames captured; 0: no limit (default: 0)" in " ".join(run.split())
    bench = " ".join(dict(_parsers(parser))["edge-agent bench"].format_help().split())
    assert "frames per phase (default: 1000)" in bench
    listen = " ".join(dict(_parsers(parser))["edge-agent listen"].format_help().split())
    assert "(default: tcp://127.0.0.1:5556)" in listen


def test_top_level_help_says_what_the_agent_is_and_lists_the_commands():
    r = cli("--help")
    assert r.returncode == 0
    assert "real-time inference agent" in r.stdout and "``" not in r.stdout
    for command in ("run", "listen", "config", "bench", "tune", "eval", "power", "engine", "keys"):
        assert f"\n    {command} " in r.stdout, command


# -- progress and notices ---------------------------------------------------------------------


def _run_on_a_terminal(cmd: list[str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``cmd`` with stderr on a pseudo-terminal (as in a shell); returns rc, stdout, stderr."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    err = b""
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(leader, 4096)
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                err += chunk
            elif proc.poll() is not None:
                break
        out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return proc.returncode, out, err.decode(errors="replace")


def test_bench_shows_its_phases_on_a_terminal_and_nothing_extra_with_json(const_model, endpoint, tmp_path):
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(f"model: {{path: {const_model}}}\npublish: {{endpoint: '{endpoint}'}}\n")
    base = [sys.executable, "-m", "edge_agent", "bench", "-c", str(cfg), "--frames", "40"]
    base += ["--source-fps", "50", "--live-seconds", "0.5"]
    rc, out, err = _run_on_a_terminal(base, 120)
    assert rc == 0, err
    phases = [line for line in err.splitlines() if line.startswith("bench: ")]
    assert [p.split()[1] for p in phases] == ["loading", "1-2/4", "3/4", "4/4"], err
    assert "pipelined" in out
    rc, out, err = _run_on_a_terminal([*base, "--json"], 120)
    assert rc == 0 and "bench:" not in err, err


def test_listen_without_an_agent_says_where_it_listens(endpoint):
    with spawn(
        [sys.executable, "-m", "edge_agent", "listen", endpoint],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as listener:
        ready, _, _ = select.select([listener.stderr], [], [], 60)
        assert ready, "listen said nothing within 60 s"
        notice = listener.stderr.readline().decode()
        assert notice.startswith(f"listen: nothing received yet from {endpoint}"), notice
        assert listener.poll() is None, "it goes on listening"
