"""Shared fixtures: free loopback ports and small real ONNX models."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from edge_agent.config import AgentConfig
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.runner import Agent

LABELS = ["circle", "square", "triangle", "cross"]


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
