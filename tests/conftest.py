"""Shared fixtures: free loopback ports, small real ONNX models, waiting for a condition
and subprocesses that are always ended."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from edge_agent.core.config import AgentConfig
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.service.runner import Agent

#: The repository's root (tests live in folders that mirror its packages).
REPO = Path(__file__).resolve().parent.parent

LABELS = ["circle", "square", "triangle", "cross"]

T = TypeVar("T")


def wait_until(
    condition: Callable[[], T], timeout_s: float, interval_s: float = 0.02, message: str | None = None
) -> T:
    """Poll ``condition`` until it returns something truthy and return that; raise
    AssertionError with ``message`` when ``timeout_s`` passes first.

    For waiting on something another thread or process does: the timeout is the most a
    loaded machine may take, not how long the test expects it to take.
    """
    end = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= end:
            what = message or f"{getattr(condition, '__qualname__', condition)} never became true"
            raise AssertionError(f"timed out after {timeout_s} s: {what}")
        time.sleep(interval_s)


def end_process(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """End ``proc`` and, when it leads its own process group (``spawn`` starts it so), every
    process in that group: SIGTERM, up to ``grace_s`` to exit, then SIGKILL. Drains and
    closes its pipes. Harmless on a process that already ended."""
    group = proc.pid if _leads_group(proc) else None

    def signal_all(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group is not None:
                os.killpg(group, sig)
            elif proc.poll() is None:
                proc.send_signal(sig)

    if proc.poll() is None:
        signal_all(signal.SIGTERM)
        try:
            _drain(proc, grace_s)
        except subprocess.TimeoutExpired:
            signal_all(signal.SIGKILL)
            _drain(proc, None)
    # Children left behind by a leader that exited (or was killed) go too.
    if group is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()


def _leads_group(proc: subprocess.Popen) -> bool:
    return getattr(proc, "_edge_agent_group", False)


def _drain(proc: subprocess.Popen, timeout_s: float | None) -> None:
    """Wait for ``proc``, reading what it writes to pipes nobody reads (a full pipe would
    block it before it could exit)."""
    readable = [p for p in (proc.stdout, proc.stderr) if p is not None and not p.closed]
    if readable:
        try:
            proc.communicate(timeout=timeout_s)
            return
        except ValueError:  # the test already read (part of) them itself
            pass
    proc.wait(timeout_s)


@contextmanager
def spawn(args: list[str], **popen_kw: Any) -> Iterator[subprocess.Popen]:
    """``subprocess.Popen(args, **popen_kw)`` in its own session (so its children can be
    found), ended with its whole process group when the block exits, also when the test
    failed (see ``end_process``)."""
    proc = subprocess.Popen(args, start_new_session=True, **popen_kw)
    proc._edge_agent_group = True  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        end_process(proc)


def run_process(args: list[str], timeout_s: float, **popen_kw: Any) -> subprocess.CompletedProcess:
    """Like ``subprocess.run(args, capture_output=True, text=True, timeout=timeout_s)``, but
    in its own session, and on a timeout (or any failure) its whole process group ends."""
    with spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kw) as proc:
        out, err = proc.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def read_line(pipe: Any, timeout_s: float) -> str:
    """The next line of a child's pipe, or "" at its end or when none comes within
    ``timeout_s``. Read from the file descriptor a byte at a time: a buffered readline may
    take several lines at once, and select() then never sees those left in the buffer."""
    fd, line = pipe.fileno(), bytearray()
    end = time.monotonic() + timeout_s
    while not line.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        byte = os.read(fd, 1) if ready else b""
        if not byte:
            return ""
        line += byte
    return line.decode(errors="replace")


def agent_command(*args: str) -> list[str]:
    """``edge-agent ARGS`` as this interpreter runs it."""
    return [sys.executable, "-m", "edge_agent", *args]


def spawn_run(cfg: Path | str, *args: str) -> Any:
    """``edge-agent run --config CFG --quiet ARGS`` as a subprocess, its output on text pipes;
    a context manager that ends it (and its children) on exit, as ``spawn``."""
    command = agent_command("run", "--config", str(cfg), "--quiet", *args)
    return spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def endpoint() -> str:
    return free_endpoint()


def write_manifest(path: Path, name: str = "const", decoder: str = "yolov8", extra: str = "") -> Path:
    path.write_text(
        f"name: {name}\n"
        "input: {name: images, height: 320, width: 320, layout: NHWC, dtype: uint8, color: bgr}\n"
        f"output: {{name: output0, decoder: {decoder}}}\n"
        f"labels: [{', '.join(LABELS)}]\n{extra}"
    )
    return path


@pytest.fixture
def const_model(tmp_path: Path) -> Path:
    """A real ONNX model (with manifest) that always reports two known boxes."""
    out = yolov8_output([(160, 160, 40, 40), (100, 100, 30, 30)], [0, 2], [0.9, 0.8], 4, 2100)
    model = constant_detector(str(tmp_path / "model.onnx"), out)
    write_manifest(tmp_path / "manifest.yaml")
    return Path(model)


@contextmanager
def started(agent: Agent | AgentConfig, *closing: Any, clean: bool = False) -> Iterator[Agent]:
    """An agent (built here when given its config) running for the block; stopped after,
    then ``closing`` (subscribers, sockets) closed. ``clean``: assert every thread ended."""
    if not isinstance(agent, Agent):
        agent = Agent(agent)
    if agent.pipeline is None:
        agent.build()
    agent.start()
    try:
        yield agent
    finally:
        try:
            stopped = agent.stop()
        finally:
            for c in closing:
                c.close()
        assert stopped or not clean, "every pipeline thread must end"


@pytest.fixture
def many_fds() -> Iterator[None]:
    """Room for about 1,200 more descriptors in this process (connection floods): the soft
    RLIMIT_NOFILE raised for the test, restored after; skipped when the hard limit is lower."""
    import resource  # Unix only: imported where it is needed

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = len(os.listdir("/proc/self/fd")) + 1200
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is below {need}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
