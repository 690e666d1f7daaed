"""YAML aliases, bounded: every YAML input the agent reads (config files, fleet files and
folders, overlays, model manifests, ``EDGE_AGENT__`` values, a reload's config) goes through
one composer that counts the nodes each alias adds while composing and refuses a document
past ``MAX_ALIAS_NODES``, or an alias inside what it names (a loop), naming the file, the
line and, for a variable, the variable (issue 30, item 7)."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
from conftest import agent_command, read_line, run_process, spawn, wait_until
from helpers import Subscriber

from edge_agent.core import configload
from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError, Problem
from edge_agent.core.effective.render import load_effective, load_fleet
from edge_agent.core.yamlnodes import compose
from edge_agent.models.manifest import resolve_model


def bomb(levels: int, indent: str = "") -> str:
    """``levels`` lines below a list of ten scalars, each a list of ten aliases to the line
    above: 11 · 10^levels nodes after expansion, in a few hundred bytes."""
    lines = [f"{indent}a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"{indent}a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def flow_bomb(levels: int) -> str:
    """The same as one flow list, for a variable's value."""
    items = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "[" + ", ".join(items) + "]"


#: The bound (``yamlnodes.MAX_ALIAS_NODES``), as the docs state it.
MAX_ALIAS_NODES = 100_000

# Four levels: aliases add 123,320 nodes, past the bound; the alias that crosses it is on
# the last line (a3's aliases add 11,110 each).
BOMB = bomb(4)


def problems(fn, *args, **kwargs) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value.problems


def is_bomb(p: Problem) -> bool:
    return f"expand this document by more than {MAX_ALIAS_NODES} nodes" in p.message


def aliased(count: int) -> str:
    """A block of 1000 nodes, then ``count`` aliases to it (each adds all 1000)."""
    return f"b: &b [{', '.join(['x'] * 999)}]\nc: [{', '.join(['*b'] * count)}]\n"


def test_aliases_may_add_up_to_the_bound_and_no_more():
    at_bound = MAX_ALIAS_NODES // 1000
    node = compose(aliased(at_bound), "ok.yaml")
    assert len(node.value[1][1].value) == at_bound  # composed, the aliases kept as shared nodes
    (p,) = problems(compose, aliased(at_bound + 1), "over.yaml")
    assert is_bomb(p) and (p.file, p.line) == ("over.yaml", 2), p


def test_shared_blocks_within_the_bound_load_as_written(tmp_path):
    fleet = tmp_path / "fleet.yaml"
    devices = "\n".join(f"  cam-{i}: {{config: {{source: *cam}}}}" for i in range(200))
    fleet.write_text(
        f"defaults:\n  source: &cam {{type: synthetic, fps: 12, width: 320}}\ndevices:\n{devices}\n"
    )
    cfg = load_fleet(str(fleet)).render("cam-199", env={}).config
    assert (cfg.source.fps, cfg.source.width) == (12.0, 320)


def _config(tmp_path: Path) -> list[Problem]:
    path = tmp_path / "agent.yaml"
    path.write_text(BOMB)
    return problems(load_effective, str(path), env={})


def _text(tmp_path: Path) -> list[Problem]:
    return problems(configload.load, AgentConfig, BOMB, str(tmp_path / "agent.yaml"))


def _fleet_file(tmp_path: Path) -> list[Problem]:
    path = tmp_path / "agent.yaml"
    path.write_text("devices:\n  cam-1: {}\ndefaults:\n" + bomb(4, "  "))
    return problems(load_effective, str(path), device="cam-1", env={})


def _fleet_folder(tmp_path: Path) -> list[Problem]:
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "a.yaml").write_text("devices:\n  cam-1: {}\n")
    (tmp_path / "fleet" / "agent.yaml").write_text("defaults:\n" + bomb(4, "  ") + "groups: []\n")
    return problems(load_effective, str(tmp_path / "fleet"), device="cam-1", env={})


def _overlay(tmp_path: Path) -> list[Problem]:  # a tuning run's overlay is read this way
    path = tmp_path / "agent.yaml"
    path.write_text(BOMB)
    return problems(load_effective, None, overlay=str(path), env={})


def _manifest(tmp_path: Path) -> list[Problem]:
    model = tmp_path / "model.onnx"
    model.write_bytes(b"not read: the manifest is")
    path = tmp_path / "agent.yaml"
    path.write_text(BOMB)
    return problems(resolve_model, str(model), str(path))


@pytest.mark.parametrize(
    "read, file, line",  # the line of a4, whose aliases cross the bound
    [
        (_config, "agent.yaml", 5),
        (_text, "agent.yaml", 5),
        (_fleet_file, "agent.yaml", 8),
        (_fleet_folder, "fleet/agent.yaml", 6),
        (_overlay, "agent.yaml", 5),
        (_manifest, "agent.yaml", 5),
    ],
)
def test_an_alias_bomb_is_refused_in_every_yaml_file_naming_the_file_and_line(tmp_path, read, file, line):
    found = read(tmp_path)
    assert len(found) == 1 and is_bomb(found[0]), found
    assert found[0].file == str(tmp_path / file) and found[0].line == line, found


def test_an_alias_bomb_in_a_variable_is_refused_naming_it():
    found = problems(load_effective, None, env={"EDGE_AGENT__SOURCES": flow_bomb(4)})
    assert [p.file for p in found] == ["env EDGE_AGENT__SOURCES"] and is_bomb(found[0]), found


def test_an_alias_loop_in_a_variable_is_refused_naming_it():
    found = problems(load_effective, None, env={"EDGE_AGENT__SOURCES": "[&a [*a]]"})
    assert [(p.file, p.path) for p in found] == [("env EDGE_AGENT__SOURCES", "sources")], found
    assert "an alias refers to a mapping or list that contains it (a loop)" in found[0].message


def test_an_alias_loop_in_a_file_names_the_alias(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("source:\n  type: synthetic\n  labels: &x {a: *x}\n")
    (p,) = problems(load_effective, str(path), env={})
    assert (p.file, p.line, p.column) == (str(path), 3, 18) and "(a loop)" in p.message


# The bomb: seven levels, 11 · 10^7 nodes after expansion (42.6 s and 446 MB before).
SEVEN = bomb(7)
# Peak RSS growth (VmHWM: ru_maxrss keeps the peak of the pytest process the child was
# forked from across exec, which hid any growth below it).
MEASURE = textwrap.dedent(
    """
    import sys
    from edge_agent.core.configload import ConfigError
    from edge_agent.core.effective.render import load_effective
    def peak_kb():
        with open("/proc/self/status") as f:
            return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])
    before = peak_kb()
    try:
        load_effective(sys.argv[1], env={})
    except ConfigError as e:
        print(e)
    print(peak_kb() - before)
    """
)


def test_the_seven_level_bomb_is_refused_at_once_in_bounded_memory(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(SEVEN)
    # The bound is on work, not time: 60 s is what a refusal must not come near.
    out = run_process([sys.executable, "-c", MEASURE, str(path)], 60)
    message, grown_kb = out.stdout.splitlines()
    assert message.startswith(f"{path}:5:") and "more than 100000 nodes" in message, out.stdout
    assert int(grown_kb) < 20_000, f"peak RSS grew by {grown_kb} KB"
    r = run_process(agent_command("config", "validate", str(path)), 60)
    assert r.returncode == 2 and f"{path}:5:" in r.stderr and "alias bomb" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_a_reload_with_an_alias_bomb_is_refused_and_the_agent_runs_on(tmp_path, endpoint):
    cfg = tmp_path / "agent.yaml"
    head = f"publish: {{endpoint: '{endpoint}', health_interval_s: 0.25}}\nmetrics: {{enabled: false}}\n"
    cfg.write_text(head + "source: {type: synthetic, fps: 10}\n")
    health = Subscriber(endpoint, "health")
    try:
        command = agent_command("run", "--config", str(cfg), "--quiet")
        with spawn(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
            wait_until(lambda: health.messages or proc.poll() is not None, 60, message="a heartbeat")
            assert proc.poll() is None
            cfg.write_text(head + "source:\n  type: synthetic\n  labels:\n" + bomb(7, "    "))
            proc.send_signal(signal.SIGHUP)
            refused, end = "", time.monotonic() + 60  # the log lines up to the refusal, bounded
            while "reload refused" not in refused and (left := end - time.monotonic()) > 0:
                refused = read_line(proc.stderr, left)
            assert "reload refused" in refused and f"{cfg}:10:" in refused and "alias bomb" in refused
            seen = len(health.messages)
            wait_until(lambda: len(health.messages) > seen + 2, 30, message="heartbeats after the refusal")
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=30)
        assert proc.returncode == 0
    finally:
        health.close()


def test_nesting_past_the_bound_is_refused_not_a_recursion_error(tmp_path):
    """Thousands of ``[`` overflowed the stack ("maximum recursion depth exceeded")."""
    path = tmp_path / "agent.yaml"
    path.write_text("source:\n  labels: " + "[" * 5000 + "]" * 5000 + "\n")
    (p,) = problems(load_effective, str(path), env={})
    assert (p.file, p.line) == (str(path), 2) and "nested more than 100 deep" in p.message, p
    (p,) = problems(load_effective, None, env={"EDGE_AGENT__SOURCES": "[" * 5000 + "]" * 5000})
    assert p.file == "env EDGE_AGENT__SOURCES" and "nested more than 100 deep" in p.message, p
    path.write_text("source:\n  type: synthetic\n  labels: " + "{a: " * 90 + "b" + "}" * 90 + "\n")
    assert "nested more than" not in "\n".join(p.message for p in problems(load_effective, str(path), env={}))


# -- tags and scalars (found by tests/fuzz/test_fuzz_config.py) ---------------------------------


@pytest.mark.parametrize(
    "value, message",
    [
        ("!custom 1", "unknown tag '!custom' (a config takes YAML's own tags only)"),
        ("!!python/object:os.system x", "unknown tag 'tag:yaml.org,2002:python/object:os.system'"),
        ("!!int x", "not a valid int: 'x' (invalid literal for int() with base 10: 'x')"),
        ("2001-13-45", "not a valid timestamp: '2001-13-45' (month must be in 1..12)"),
        ("!!bool maybe", "not a valid bool: 'maybe'"),
    ],
)
def test_a_scalar_no_constructor_takes_is_refused_with_its_line(tmp_path, value, message):
    """A ConstructorError, ValueError or KeyError escaped the loader (a traceback from
    ``config validate``), raised where a message described the value."""
    path = tmp_path / "agent.yaml"
    path.write_text(f"source:\n  type: synthetic\n  fps: {value}\n")
    (p,) = problems(load_effective, str(path), env={})
    assert (p.file, p.line, p.column) == (str(path), 3, 8) and p.message.startswith(message), p


def test_loading_a_config_keeps_nothing_of_it(tmp_path):
    """The shared scalar constructors cached every node they constructed, and through its
    marks the whole text: each reload of a config kept it for the process's life."""
    path = tmp_path / "agent.yaml"
    path.write_text("source: {type: synthetic, fps: 5, width: 320}\n# " + "x" * 50_000 + "\n")
    load_effective(str(path), env={})  # first-time imports and caches
    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(10):
            load_effective(str(path), env={})
        gc.collect()  # what only a cycle holds is not kept
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 50_000, f"{kept} bytes kept after 10 loads of a 50 kB file"
