"""The deadline on the real pipeline: real ONNX Runtime made slow, real ZeroMQ health.

A model is made slow with a wrapper that sleeps before each real inference; its delay
can be changed while the agent runs, to stage an overload and its recovery.
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

from conftest import wait_until, write_manifest
from helpers import Subscriber

from edge_agent.core.config import AgentConfig
from edge_agent.core.deadline_config import DeadlineConfig, LadderStep
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.service.runner import Agent


class DelayedBackend:
    """A real backend that sleeps ``delay_s`` before each inference and counts calls."""

    def __init__(self, inner, delay_s: float) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.calls = 0

    def infer(self, io) -> None:
        time.sleep(self.delay_s)
        self.inner.infer(io)
        self.calls += 1

    def __getattr__(self, name):
        return getattr(self.inner, name)


def build(model: Path, endpoint: str, deadline: DeadlineConfig, fps: float, delay_s: float) -> Agent:
    cfg = AgentConfig(
        device_id="dl",
        source=SyntheticSourceConfig(fps=fps, seed=2),
        model=ModelConfig(path=str(model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1),
        deadline=deadline,
        metrics=MetricsConfig(port=0),  # any free port: never a running agent's
    )
    agent = Agent(cfg)
    agent.build()
    primary = agent.primary_profile().model
    primary.backend = DelayedBackend(primary.backend, delay_s)
    return agent


def counts(agent: Agent) -> dict:
    return agent.pipeline.figures().lanes[0].counts.as_dict()


def ladder(agent: Agent):
    """The source's deadline and ladder, now."""
    return agent.pipeline.figures().lanes[0].deadline


def light_model(tmp_path: Path) -> Path:
    d = tmp_path / "light"
    d.mkdir()
    out = yolov8_output([(160, 160, 40, 40)], [1], [0.9], 4, 2100)
    constant_detector(str(d / "model.onnx"), out)
    write_manifest(d / "manifest.yaml", name="light")
    return d / "model.onnx"


def run_until(agent: Agent, condition, message: str, timeout_s: float = 60.0) -> float:
    """Run the agent until ``condition(counts)`` holds; returns the seconds it ran."""
    t0 = time.monotonic()
    agent.start()
    try:
        wait_until(
            lambda: condition(counts(agent)),
            timeout_s,
            interval_s=0.05,
            message=message,
        )
    finally:
        assert agent.stop()
    return time.monotonic() - t0


def assert_accounted(agent: Agent) -> dict:
    c = counts(agent)
    assert c["in_flight"] == 0, c
    assert c["captured"] == c["on_time"] + c["late"] + c["dropped"], c
    return c


def test_late_frames_are_published_as_misses_never_as_on_time(const_model, endpoint):
    sub = Subscriber(endpoint, "det")
    agent = build(const_model, endpoint, DeadlineConfig(budget_ms=20, admission=False), fps=10, delay_s=0.03)
    try:
        run_until(agent, lambda c: c["late"] >= 5, "5 late frames")
    finally:
        sub.close()
    c = assert_accounted(agent)
    assert c["late"] >= 5 and c["on_time"] == 0, c  # 30 ms of inference alone is over 20
    assert sub.messages, "results must still be published"
    for m in sub.messages:
        assert m["latency_ms"]["total"] > 20
        assert m["deadline_missed"] is True, m["latency_ms"]


def test_stale_frames_are_dropped_before_inference(const_model, endpoint):
    deadline = DeadlineConfig(budget_ms=20, miss_window_s=1.0)
    agent = build(const_model, endpoint, deadline, fps=20, delay_s=0.04)
    backend = agent.primary_profile().model.backend
    elapsed = run_until(agent, lambda c: c["dropped_by_reason"]["stale"] >= 10, "10 stale frames")
    c = assert_accounted(agent)
    assert c["dropped_by_reason"]["stale"] >= 10, c
    # Once the estimate knows inference takes 40 ms of a 20 ms budget, only the probe
    # frame of each window (1 s) reaches the model; the stale ones never do. (The first
    # frames run before any estimate exists: up to three.)
    assert backend.calls <= 3 + elapsed / deadline.miss_window_s, (
        f"{backend.calls} inferences in {elapsed:.1f} s"
    )
    assert c["on_time"] == 0


def test_ladder_switches_to_the_light_model_under_overload_and_back_after_recovery(
    const_model, endpoint, tmp_path
):
    light = light_model(tmp_path)
    deadline = DeadlineConfig(
        budget_ms=50,
        miss_window_s=0.5,
        step_down_miss_rate=0.3,
        step_up_miss_rate=0.05,
        step_up_after_s=1.0,
        ladder=(LadderStep("full"), LadderStep("light", model=str(light))),
    )
    health = Subscriber(endpoint, "health")
    results = Subscriber(endpoint, "det")
    agent = build(const_model, endpoint, deadline, fps=20, delay_s=0.08)
    agent.start()
    try:
        wait_until(
            lambda: ladder(agent).step_name == "light", 30, message="sustained misses step the ladder down"
        )

        def light_results() -> list[dict]:
            light = [m for m in results.messages if m["model"] == "light"]
            return light if len(light) >= 5 else []

        on_light = wait_until(light_results, 30, message="5 results of the light model")
        on_full = [m["latency_ms"]["total"] for m in results.messages if m["model"] == "const"]
        # The light model spares the 80 ms the slow one sleeps: its frames are faster than
        # any frame of the slow one (how fast, and so how many are on time, is the machine's).
        assert on_full and statistics.median(m["latency_ms"]["total"] for m in on_light) < min(on_full), (
            [m["latency_ms"]["total"] for m in on_light],
            on_full,
        )
        agent.primary_profile().model.backend.delay_s = 0.0  # the main model recovers
        wait_until(
            lambda: ladder(agent).step_name == "full", 30, message="a healthy period steps the ladder up"
        )
        time.sleep(1.5)  # the test's input: 1.5 s healthy on full, in which nothing may change
    finally:
        try:
            assert agent.stop()
        finally:
            health.close()
            results.close()
    history = ladder(agent).history
    moves = [(h["from"], h["to"]) for h in history]
    assert moves == [("full", "light"), ("light", "full")], (history, counts(agent))
    events = [m["event"] for m in health.messages if "event" in m]
    assert [(e["from"], e["to"]) for e in events] == [("full", "light"), ("light", "full")]
    assert health.messages[-1]["ladder"]["name"] == "full"
    assert_accounted(agent)


def test_health_heartbeats_arrive_with_consistent_counts(const_model, endpoint):
    health = Subscriber(endpoint, "health")
    agent = build(const_model, endpoint, DeadlineConfig(), fps=30, delay_s=0.0)
    try:
        run_until(agent, lambda c: len(health.messages) >= 5 and c["on_time"] + c["late"] > 0, "5 heartbeats")
    finally:
        health.close()
    beats = health.messages
    assert len(beats) >= 5, f"{len(beats)} heartbeats"
    assert set(health.topics) == {"health"}
    for b in beats:
        c = b["counts"]
        # Consistent figures: what is neither published nor dropped is in a frame slot.
        assert 0 <= c["in_flight"] <= 5, c
        assert b["ladder"]["name"] == "full" and b["deadline"]["budget_ms"] == 50
        assert set(b["latency_ms"]["window"]) >= {"p50", "p90", "p99", "p99.9", "max"}
    last = beats[-1]["counts"]
    assert last["on_time"] + last["late"] > 0
    # fps is each beat's published frames over its interval: accounting, not speed (a busy
    # machine may publish nothing in one interval, so no single beat's fps is asserted > 0).
    # (The subscriber may join after the first beats, so each beat is checked against the one before.)
    def published(b):
        return b["counts"]["on_time"] + b["counts"]["late"]

    for a, b in itertools.pairwise(beats):
        dt, frames = b["uptime_s"] - a["uptime_s"], published(b) - published(a)
        assert b["fps"] >= 0 and abs(b["fps"] * dt - frames) <= 0.5 + 0.002 * b["fps"], (a, b)
    assert [b["uptime_s"] for b in beats] == sorted(b["uptime_s"] for b in beats)
    for key in ("captured", "on_time", "dropped"):
        series = [b["counts"][key] for b in beats]
        assert series == sorted(series), (key, series)


def test_overload_keeps_no_queue_newest_frame_wins(const_model, endpoint):
    """A 100 fps camera and a 30 ms model: frames in between are dropped as overrun."""
    sub = Subscriber(endpoint, "det")
    agent = build(const_model, endpoint, DeadlineConfig(budget_ms=200), fps=100, delay_s=0.03)
    try:
        run_until(
            agent, lambda c: c["captured"] >= 60 and c["on_time"] + c["late"] >= 5, "60 frames captured"
        )
    finally:
        sub.close()
    c = assert_accounted(agent)
    # At most one frame per 30 ms inference is published while the camera makes one every
    # 10 ms: most frames are skipped (a loaded machine skips more), none waits in a queue.
    assert (
        c["dropped_by_reason"]["overrun"] + c["dropped_by_reason"]["source_gap"] > c["on_time"] + c["late"]
    ), c
    ids = [m["frame_id"] for m in sub.messages]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    assert max(b - a for a, b in itertools.pairwise(ids)) >= 2, (
        "published frames must skip the ones it had no time for"
    )
