"""Faults on the real pipeline: a camera that goes and comes back, a backend that fails
sometimes or for good (breaker → reload → fallback → exit), and a slow subscriber."""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
import time

import pytest
import zmq
from conftest import agent_command, run_process, started, wait_until, write_manifest
from helpers import Subscriber

from edge_agent.core import resources
from edge_agent.core.config import AgentConfig
from edge_agent.core.configfields import FieldError
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.resilience_config import FaultsConfig, ResilienceConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.service.runner import Agent


@pytest.fixture
def faults_allowed(monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_FAULTS", "1")


def agent_with(const_model, endpoint, fps: float, faults: FaultsConfig, frames: int = 0, **kw) -> Agent:
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=fps),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1, **kw),
        metrics=MetricsConfig(enabled=False),
        faults=faults,
    )
    agent = Agent(cfg, max_frames=frames)
    agent.build()
    return agent


def counts(agent: Agent) -> dict:
    return agent.pipeline.figures().lanes[0].counts.as_dict()


def test_fault_injection_is_refused_outside_tests(monkeypatch):
    monkeypatch.delenv("EDGE_AGENT_FAULTS", raising=False)
    with pytest.raises(FieldError, match="EDGE_AGENT_FAULTS"):
        FaultsConfig(backend_error_rate=0.1)
    assert not FaultsConfig().active()


def test_camera_loss_and_return_is_recovered_without_restart(faults_allowed, const_model, endpoint):
    faults = FaultsConfig(source_outage_after_frames=25, source_outage_s=0.6)
    sub = Subscriber(endpoint)
    agent = agent_with(const_model, endpoint, 50, faults)
    pipeline = agent.pipeline
    source = agent.sources["cam0"]  # the FaultySource around the camera
    agent.start()
    try:
        wait_until(
            lambda: source.failures == 1 and source.connected, 30, message="the camera goes and returns"
        )
        back_at = pipeline.published()
        wait_until(lambda: pipeline.published() >= back_at + 30, 30, message="frames flow again")
    finally:
        agent.stop()
        sub.close()
    assert agent.pipeline is pipeline, "recovered without restarting the pipeline"
    results = [m for m in sub.messages if "detections" in m]
    times = [m["capture_unix_s"] for m in results]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) >= 0.5, "the outage shows as a gap in capture times"
    assert len([t for t in times if t > times[0] + 0.6]) > 25, "frames flow again after the camera returns"
    states = [m["source_state"] for m in sub.messages if m.get("type") == "health"]
    assert any(not s["connected"] for s in states) and states[-1]["connected"] and states[-1]["failures"] == 1
    c = counts(agent)
    assert c["in_flight"] == 0 and c["captured"] == c["on_time"] + c["late"] + c["dropped"]


def test_backend_errors_on_one_percent_drop_only_those_frames(faults_allowed, const_model, endpoint):
    faults = FaultsConfig(backend_error_rate=0.01, seed=3)
    agent = agent_with(const_model, endpoint, 0, faults, frames=1500)
    agent.start()
    try:
        assert agent.pipeline.finished.wait(60)
    finally:
        agent.stop()
    backend = agent.primary_profile().model.backend
    c = counts(agent)
    reasons = c["dropped_by_reason"]
    injected, stale = reasons["error"], reasons["stale"]
    assert 3 <= injected <= 40, f"~1 % of 1500: {injected}"
    # Errors drop only the frames they hit. (A loaded machine may leave a frame too old to
    # run before inference: that one is counted as stale, and never reaches the backend.)
    assert {k for k, v in reasons.items() if v} <= {"error", "stale"}, reasons
    assert c["captured"] == 1500 and c["on_time"] + c["late"] == 1500 - injected - stale, c
    assert not agent.pipeline.breaker.is_set() and backend.calls >= 1500 - stale


def test_repeated_failures_trip_the_breaker_reload_fallback_then_exit_nonzero(
    tmp_path, endpoint, const_model
):
    cfg = tmp_path / "faulty.yaml"
    cfg.write_text(
        f"source: {{type: synthetic, fps: 100}}\nmodel: {{path: '{const_model}'}}\n"
        f"publish: {{endpoint: '{endpoint}'}}\nmetrics: {{enabled: false}}\n"
        "resilience: {max_consecutive_errors: 5}\nfaults: {backend_fail_after_frames: 20}\n"
    )
    env = {**os.environ, "EDGE_AGENT_FAULTS": "1"}
    proc = run_process(agent_command("run", "--config", str(cfg), "--quiet"), timeout_s=60, env=env)
    err = proc.stderr
    assert proc.returncode == 1, err
    steps = [
        "breaker: reloading the backend",
        "breaker: falling back to ONNX Runtime",
        "breaker: inference keeps failing",
    ]
    positions = [err.find(s) for s in steps]
    assert all(p >= 0 for p in positions) and positions == sorted(positions), err[-2000:]
    assert "giving up" in err.splitlines()[-1]


def test_a_backend_that_no_longer_loads_escalates_straight_to_the_fallback(tmp_path, const_model, endpoint):
    fb = tmp_path / "fallback"
    fb.mkdir()
    shutil.copy(const_model, fb / "model.onnx")
    write_manifest(fb / "manifest.yaml", name="fallback")
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=100),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint),
        metrics=MetricsConfig(enabled=False),
        resilience=ResilienceConfig(fallback_model=str(fb / "model.onnx")),
    )
    with started(cfg) as agent:
        const_model.unlink()  # the main model is gone: its reload must fail
        assert agent.recover() == "fell back to ONNX Runtime on the CPU"
        assert agent.config.model.path == str(fb / "model.onnx") and agent.config.model.manifest == ""
        assert isinstance(agent.config.backend, OnnxRuntimeConfig)
        assert agent.primary_profile().name == "fallback"
        before = agent.pipeline.published()
        wait_until(
            lambda: agent.pipeline.published() > before,
            30,
            message="frames flow on the fallback",
        )
        assert agent.pipeline.error is None


def test_a_slow_subscriber_never_slows_the_agent(const_model, endpoint):
    agent = agent_with(const_model, endpoint, 100, FaultsConfig(), send_hwm=10)
    ctx = zmq.Context()
    slow = ctx.socket(zmq.SUB)
    slow.rcvhwm = 10
    slow.subscribe("det")
    slow.connect(endpoint)
    stop = threading.Event()
    received = 0

    def read_slowly() -> None:
        nonlocal received
        while not stop.is_set():
            with contextlib.suppress(zmq.Again):
                slow.recv(zmq.NOBLOCK)
                received += 1
            time.sleep(0.1)  # the test's input: the reader takes 10 messages a second at most

    reader = threading.Thread(target=read_slowly)
    agent.start()
    reader.start()
    try:
        wait_until(lambda: received >= 1, 30, message="the slow reader is connected")
        rss_before = resources.rss_bytes()
        received_before, published_before = received, agent.pipeline.published()
        # Far more than the reader takes, and than both queues (10 + 10) hold.
        wait_until(
            lambda: agent.pipeline.published() - published_before >= 200, 60, message="200 results published"
        )
        rss_after = resources.rss_bytes()
        read = received - received_before
        published = agent.pipeline.published() - published_before
    finally:
        stop.set()
        reader.join()
        slow.close(linger=0)
        ctx.term()
        agent.stop()
    # Had sends waited for the reader, the agent could not have published more than the
    # reader took plus what the two queues hold (and a loaded machine only slows the agent
    # to the point where this margin shrinks, at under 18 results a second).
    assert published > 1.5 * (read + 20), f"{published} published while the reader took {read}"
    # A send never waits for a subscriber: it takes the time of encoding and a queue push
    # (the median: a loaded machine may preempt a few sends; waiting would make them all
    # as slow as the reader, 100 ms).
    send = agent.pipeline.figures().lanes[0].send
    assert send.percentile_ms(50) < 20, send.percentile_ms(50)
    # Drops, if any, come from the CPU (stale/overrun/source gap under load), never from
    # the subscriber: there is no drop reason for a subscriber, and sending fails nothing.
    assert counts(agent)["dropped_by_reason"]["error"] == 0
    if rss_before and rss_after:
        assert rss_after - rss_before < 20 * 2**20, "memory stays flat: the queue per subscriber is bounded"
