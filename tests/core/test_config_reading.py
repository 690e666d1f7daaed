"""Config files read once, bounded (issue 43, failure 8): a regular file, stdin (``-``), a
pipe (``/dev/stdin``, ``<(...)``) or a FIFO is read once into at most ``MAX_FILE_BYTES``
bytes, within ``READ_TIMEOUT_S`` for a pipe, and ``config validate`` and ``run`` parse those
same bytes; a document is composed only up to ``MAX_NODES`` nodes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import pytest
from conftest import agent_command, free_endpoint, run_process, spawn, wait_until
from helpers import NotifySocket
from test_yaml_bounds import MEASURE  # a loading process's peak RSS growth

from edge_agent.core import yamlnodes
from edge_agent.core.configload import ConfigError, Problem
from edge_agent.core.effective.parse import ConfigFile
from edge_agent.core.effective.render import load_effective
from edge_agent.core.yamlnodes import MAX_FILE_BYTES, MAX_NODES, READ_TIMEOUT_S, compose, read_file

#: The bounds as the docs state them.
assert (MAX_FILE_BYTES, MAX_NODES, READ_TIMEOUT_S) == (1 << 20, 100_000, 10.0)

BAD = "metrics: {enabled: false}\nsource: {type: synthetic, fps: -3}\n"
BAD_PROBLEM = ":2:32: source.fps: must be within 0..1000"


def good(endpoint: str) -> str:
    head = f"publish: {{endpoint: '{endpoint}'}}\nmetrics: {{enabled: false}}\n"
    return head + "source: {type: synthetic, fps: 30}\n"


def problems(fn, *args, **kwargs) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    return info.value.problems


def peak_mib(fn, *args, **kwargs) -> tuple[list[Problem], float]:
    """``fn``'s problems and the peak of what it allocated (tracemalloc), in MiB."""
    tracemalloc.start()
    try:
        found = problems(fn, *args, **kwargs)
        return found, tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


# -- a pipe: validate and run give one verdict --------------------------------------------


def on_a_pipe(way: str, command: list[str], text: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    """``edge-agent COMMAND PATH`` with ``text`` on a pipe named as ``way`` gives it: ``-``
    and ``/dev/stdin`` (stdin a pipe), ``/dev/fd/N`` (a shell's ``<(...)``)."""
    if way == "fd":
        read_end, write_end = os.pipe()
        args = agent_command(*[f"/dev/fd/{read_end}" if a == "PATH" else a for a in command])
        try:
            with spawn(
                args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, pass_fds=[read_end]
            ) as p:
                os.close(read_end)
                read_end = -1
                os.write(write_end, text.encode())  # a few hundred bytes: within the pipe's buffer
                os.close(write_end)
                write_end = -1
                out, err = p.communicate(timeout=timeout_s)
        finally:
            for fd in (read_end, write_end):
                if fd >= 0:
                    os.close(fd)
        return subprocess.CompletedProcess(args, p.returncode, out, err)
    args = agent_command(*[way if a == "PATH" else a for a in command])
    with spawn(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        out, err = p.communicate(text, timeout=timeout_s)
    return subprocess.CompletedProcess(args, p.returncode, out, err)


WAYS = ["-", "/dev/stdin", "fd"]


@pytest.mark.parametrize("way", WAYS)
def test_a_bad_config_on_a_pipe_is_refused_by_validate_and_run_alike(way):
    """It printed "OK (empty: the embedded default)": the fleet check read the pipe, and the
    load found it empty."""
    checked = on_a_pipe(way, ["config", "validate", "PATH"], BAD)
    ran = on_a_pipe(way, ["run", "--config", "PATH", "--frames", "3", "--quiet"], BAD)
    assert checked.returncode == ran.returncode == 2, (checked, ran)
    line = [ln for ln in checked.stderr.splitlines() if BAD_PROBLEM in ln]
    assert line and line[0] in ran.stderr, (checked.stderr, ran.stderr)
    assert "OK" not in checked.stdout and "Traceback" not in checked.stderr + ran.stderr


@pytest.mark.parametrize("way", ["/dev/stdin", "fd"])
def test_a_good_config_on_a_pipe_passes_validate_and_runs(way):
    text = good(free_endpoint())
    checked = on_a_pipe(way, ["config", "validate", "PATH"], text)
    assert checked.returncode == 0 and ": OK" in checked.stdout, checked
    assert "empty" not in checked.stdout, checked.stdout  # said of truly empty input only
    ran = on_a_pipe(way, ["run", "--config", "PATH", "--frames", "3", "--quiet"], text)
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert "is empty" not in ran.stderr, ran.stderr[-2000:]


def test_truly_empty_input_on_a_pipe_is_the_embedded_default():
    checked = on_a_pipe("-", ["config", "validate", "PATH"], "")
    assert checked.returncode == 0 and "OK (empty: the embedded default" in checked.stdout, checked


def test_a_reload_of_a_config_read_from_stdin_keeps_it(tmp_path):
    """A reload reads a regular file again; stdin has nothing more to give: it read as empty
    and replaced the running config with the embedded default."""
    endpoint = free_endpoint()
    sock = NotifySocket(tmp_path, abstract=True)
    env = {**os.environ, "NOTIFY_SOCKET": sock.address, "PYTHONUNBUFFERED": "1"}
    env.pop("WATCHDOG_USEC", None)
    args = agent_command("run", "--config", "/dev/stdin", "--quiet")
    statuses = lambda: [m["STATUS"] for _, m in sock.messages if "STATUS" in m]  # noqa: E731
    read_end, write_end = os.pipe()
    try:
        with spawn(
            args, stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        ) as p:
            os.close(read_end)
            read_end = -1
            os.write(write_end, good(endpoint).encode())
            os.close(write_end)
            write_end = -1
            wait_until(lambda: "READY" in sock.names() or p.poll() is not None, 60, message="READY=1")
            assert p.poll() is None
            p.send_signal(signal.SIGHUP)
            done = lambda: [s for s in statuses() if s.startswith(("reloaded", "reload refused"))]  # noqa: E731
            wait_until(lambda: done() or p.poll() is not None, 60, message="the reload's outcome")
            assert done() == ["reloaded (no change)"], statuses()
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=30)
        assert p.returncode == 0, err[-2000:]
    finally:
        sock.close()
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)


# -- a FIFO ---------------------------------------------------------------------------------


def _write_when_read(fifo: Path, data: bytes, proc: subprocess.Popen) -> None:
    """Open ``fifo`` for writing once a reader has it open (without one, a non-blocking open
    fails with ENXIO), write ``data`` and close it: a writer that never blocks the test."""
    fds: list[int] = []

    def opened() -> bool:
        try:
            fds.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            return proc.poll() is not None
        return True

    wait_until(opened, 60, message="the agent opens the FIFO")
    if fds:
        try:
            os.set_blocking(fds[0], True)
            os.write(fds[0], data)
        finally:
            os.close(fds[0])


def test_a_fifo_with_a_writer_is_read_once(tmp_path):
    """The fleet check read the FIFO, then the load opened it again and waited for a writer
    that had gone: forever."""
    fifo = tmp_path / "agent.yaml"
    os.mkfifo(fifo)
    args = agent_command("config", "validate", str(fifo))
    with spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        _write_when_read(fifo, BAD.encode(), p)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 2 and f"{fifo}{BAD_PROBLEM}" in err, (out, err)


def test_a_fifo_with_no_writer_is_refused_in_bounded_time(tmp_path):
    """It blocked in open() until a writer came: forever."""
    fifo = tmp_path / "agent.yaml"
    os.mkfifo(fifo)
    commands = [["config", "validate", str(fifo)], ["run", "--config", str(fifo), "--quiet"]]
    with contextlib.ExitStack() as stack:  # both wait at once
        procs = [
            stack.enter_context(
                spawn(agent_command(*c), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            )
            for c in commands
        ]
        for command, p in zip(commands, procs):
            out, err = p.communicate(timeout=READ_TIMEOUT_S + 50)
            assert p.returncode == 2, (command, out, err)
            assert f"{fifo}: nothing complete to read within 10 s" in err, (command, err)


def test_read_file_waits_a_bounded_time_for_a_fifo_writer(tmp_path):
    fifo = tmp_path / "agent.yaml"
    os.mkfifo(fifo)
    (p,) = problems(read_file, str(fifo), timeout_s=0.2)
    assert p.file == str(fifo) and "nothing complete to read within 0.2 s" in p.message, p
    # A writer that never closes is the same.
    keep = os.open(fifo, os.O_RDWR)  # a writer (and a reader) of its own
    try:
        os.write(keep, b"source: {fps: 5}\n")
        (p,) = problems(read_file, str(fifo), timeout_s=0.2)
        assert "nothing complete to read within 0.2 s" in p.message, p
    finally:
        os.close(keep)


# -- other kinds of file ----------------------------------------------------------------------


def test_read_file_reads_a_regular_file_a_pipe_and_refuses_what_is_no_config(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_bytes(b"source: {fps: 5}\n")
    assert read_file(str(path)) == b"source: {fps: 5}\n"
    read_end, write_end = os.pipe()
    try:
        writer = threading.Thread(target=lambda: (os.write(write_end, b"a: 1\n" * 1000), os.close(write_end)))
        writer.start()
        assert read_file(f"/dev/fd/{read_end}") == b"a: 1\n" * 1000
        writer.join(30)
    finally:
        os.close(read_end)
    (p,) = problems(read_file, str(tmp_path))
    assert (p.file, p.message) == (str(tmp_path), "is a directory, not a YAML file"), p
    (p,) = problems(read_file, str(tmp_path / "none.yaml"))
    assert p.message == "cannot read: No such file or directory", p
    (p,) = problems(read_file, "/dev/zero")  # endless: refused at the cap, not read to the end
    assert p.file == "/dev/zero" and "larger than 1 MiB" in p.message, p
    primary, secondary = os.openpty()
    try:
        (p,) = problems(read_file, os.ttyname(secondary))
        assert "a terminal" in p.message, p
    finally:
        os.close(primary)
        os.close(secondary)


def test_relative_paths_in_a_config_from_a_pipe_resolve_against_the_working_folder(tmp_path, monkeypatch):
    """Not against /dev (``/dev/stdin``) or /dev/fd."""
    monkeypatch.chdir(tmp_path)
    read_end, write_end = os.pipe()
    os.write(write_end, b"model: {path: models/m.onnx}\n")
    os.close(write_end)
    try:
        cfg = load_effective(ConfigFile.read(f"/dev/fd/{read_end}"), env={}).config
    finally:
        os.close(read_end)
    assert cfg.model.path == str(tmp_path / "models" / "m.onnx")


# -- bounds before composing ------------------------------------------------------------------


def test_a_4_mb_file_is_refused_by_its_size_naming_it(tmp_path):
    """4 MB took over 60 s and 1.4 GB before a verdict."""
    path = tmp_path / "agent.yaml"
    path.write_text("sources:\n" + "  - {type: synthetic, fps: 5}\n" * 140_000)
    assert path.stat().st_size > 4_000_000
    r = run_process(agent_command("config", "validate", str(path)), 60)
    assert r.returncode == 2 and f"{path}: larger than 1 MiB" in r.stderr, r.stderr[-2000:]
    r = on_a_pipe("-", ["config", "validate", "PATH"], path.read_text())  # read up to the first byte over
    assert r.returncode == 2 and "-: larger than 1 MiB" in r.stderr, r.stderr[-2000:]
    (p,), mib = peak_mib(load_effective, str(path), env={})
    assert p.file == str(path) and p.message.startswith("larger than 1 MiB"), p
    assert mib < 4, f"{mib:.1f} MiB at the peak"


def test_a_400_kb_list_is_refused_by_its_node_count_in_bounded_memory(tmp_path):
    """It took 10 s and 184 MB to reach the schema's refusal."""
    path = tmp_path / "agent.yaml"
    path.write_text("sources: [" + ", ".join(["1"] * 133_000) + "]\n")
    assert 390_000 < path.stat().st_size < MAX_FILE_BYTES
    out = run_process([sys.executable, "-c", MEASURE, str(path)], 120)
    *message, grown_kb = out.stdout.splitlines()
    refusal = f"{path}:1:{11 + 3 * (MAX_NODES - 3)}: more than {MAX_NODES} nodes in one document"
    assert len(message) == 1 and message[0].startswith(refusal), out  # the 100,001st node's column
    assert int(grown_kb) < 64 * 1024, f"peak RSS grew by {grown_kb} KB"


def test_10000_zones_are_refused_by_the_node_count_before_the_schema(tmp_path):
    """10,000 zones took 15 s before "at most 32 zones"."""
    path = tmp_path / "agent.yaml"
    zones = "".join(
        f"      - {{name: z{i}, points: [[0, 0], [9, 0], [9, 9], [0, 9]]}}\n" for i in range(10_000)
    )
    path.write_text("source:\n  type: synthetic\n  analytics:\n    zones:\n" + zones)
    out = run_process([sys.executable, "-c", MEASURE, str(path)], 120)
    *message, grown_kb = out.stdout.splitlines()
    # 9 nodes down to the zones' list (on line 4), then 17 a zone: a zone's line each
    line = 5 + (MAX_NODES - 9) // 17
    assert len(message) == 1 and message[0].startswith(f"{path}:{line}:"), out
    assert f"more than {MAX_NODES} nodes in one document" in message[0], out
    assert int(grown_kb) < 64 * 1024, f"peak RSS grew by {grown_kb} KB"


def test_a_document_may_have_max_nodes_and_no_more(monkeypatch):
    monkeypatch.setattr(yamlnodes, "MAX_NODES", 50)
    # the root mapping, a key and its list: 3 nodes, then the items; aliases count once
    assert len(compose("a: [" + ", ".join(["x"] * 47) + "]", "ok.yaml").value[0][1].value) == 47
    assert compose("a: &x [" + ", ".join(["x"] * 45) + "]\nb: *x", "ok.yaml") is not None
    (p,) = problems(compose, "a: [" + ", ".join(["x"] * 48) + "]", "over.yaml")
    assert (p.file, p.line, p.column) == ("over.yaml", 1, 5 + 3 * 47), p  # the 48th item
    assert p.message == "more than 50 nodes in one document (is it a config?)", p


def test_a_key_of_control_characters_or_a_megabyte_is_reported_escaped_and_cut(tmp_path):
    """The file's own text in an error (an unknown key here) is escaped and cut: an ESC
    sequence must not redraw the operator's terminal, a 1 MB key not make a 1 MB message."""
    from edge_agent.core.config import AgentConfig
    from edge_agent.core.configload import ConfigError, load_file

    for text, shown in (
        ('"\\e[31mred\\r\\n": 1\n', "\\x1b[31mred\\r\\n"),
        (f"? {'k' * 1_000_000}\n: 1\n", "kkk"),
    ):
        path = tmp_path / "agent.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as e:
            load_file(AgentConfig, str(path))
        text = str(e.value)
        assert shown in text and "unknown key" in text
        assert text.isprintable() and len(text) < 4000, text[:200]
