"""`edge-agent health`: the verdict on the frames counted between heartbeats, on a stream of
heartbeats published here (the real format and publisher), and the command against a
real agent."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import agent_command, free_endpoint, run_process, started

from edge_agent.checks.healthcheck import Judge, Window, check, judge
from edge_agent.core.config import AgentConfig, config_hash
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.resilience_config import FaultsConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.pipelines.deadline import DROP_REASONS
from edge_agent.pipelines.heartbeat import HEALTH_TOPIC
from edge_agent.pipelines.publish import ZmqPublisher

FPS = 15
# A camera at 15 fps whose frames 0 and 10 of every 50 are late: 4 % in the long run,
# under the 5 % allowed; but a 2 s window (30 frames) holds two of them (6.7 %) at some
# heartbeats and one or none at others, so a verdict on that window flips.
PERIOD, LATE_AT = 50, (0, 10)


def late_before(frame: int) -> int:
    """Late frames among frames 0 .. frame - 1."""
    full, rest = divmod(frame, PERIOD)
    return full * len(LATE_AT) + sum(1 for i in LATE_AT if i < rest)


def beat(
    frame: int,
    source: str = "cam0",
    config: str = "abc",
    error: str | None = None,
    dropped: dict[str, int] | None = None,
) -> dict:
    """The heartbeat after ``frame`` frames of the camera above, as the agent sends it (its
    fields that health reads), with its own 2 s miss window."""
    late = late_before(frame)
    window = min(frame, 2 * FPS)
    window_late = late - late_before(frame - window)
    by_reason = {r: 0 for r in DROP_REASONS} | (dropped or {})
    return {
        "type": "health",
        "source": source,
        "config_hash": config,
        "uptime_s": frame / FPS,
        "fps": float(FPS),
        "counts": {
            "captured": frame + sum(by_reason.values()),
            "on_time": frame - late,
            "late": late,
            "dropped": sum(by_reason.values()),
            "in_flight": 0,
            "dropped_by_reason": by_reason,
        },
        "miss_rate": round(window_late / window, 4) if window else 0.0,
        "miss_window_frames": window,
        "source_state": {"error": error},
    }


@contextmanager
def heartbeats(endpoint: str, first_frame: int) -> Iterator[None]:
    """The camera's heartbeats, one a second of its time, on a real publisher, from the
    first one after the check subscribed (that is the first it receives) on."""
    # Subscriptions to "health" count as the publisher's own topic's: it can wait for one.
    pub = ZmqPublisher(endpoint, topic=HEALTH_TOPIC.decode())
    pub.open()
    stop = threading.Event()

    def serve() -> None:
        if pub.wait_for_subscribers(1, 60, stop) < 1:
            return
        frame = first_frame
        while not stop.wait(0.02):  # the pace of the beats, not a wait for anything
            pub.send(HEALTH_TOPIC, pub.encode(beat(frame)))
            frame += FPS

    thread = threading.Thread(target=serve, name="beats")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        pub.close()


def test_a_few_late_frames_give_the_same_verdict_whenever_the_check_starts():
    # Judged on the heartbeat's 2 s window, the check from frame 15 saw 2 late of 30
    # (6.7 %: unhealthy) and the one from frame 30 saw none (healthy).
    for first in (15, 30, 45, 60):
        endpoint = free_endpoint()
        with heartbeats(endpoint, first):
            verdict = check(endpoint, 60, max_miss_rate=0.05)
        (source,) = verdict.sources
        # The first heartbeat with 100 frames after the first one heard: 7 beats later.
        last = first + 7 * FPS
        misses = late_before(last) - late_before(first)
        assert verdict.healthy, (first, verdict)
        assert (source.frames, source.misses, source.span_s) == (105, misses, 7.0), source
        assert source.counts == {
            "on_time": 105 - misses,
            "late": misses,
            "dropped": 0,
            "dropped_by_reason": {},
        }
        assert f"miss rate {100 * misses / 105:.1f} % ({misses} of 105 frames in 7.0 s)" in source.reason


def test_misses_are_late_frames_and_stale_or_error_drops_only():
    start = beat(0, dropped={"stale": 0, "error": 0, "overrun": 0})
    end = beat(150, dropped={"stale": 3, "error": 1, "overrun": 40, "ladder": 20, "not_fresh": 5})
    w = Window.between(start, end)
    late = late_before(150)
    assert (w.published, w.misses, w.frames) == (150, late + 4, 150 + 4), w
    assert w.counts()["dropped_by_reason"] == {
        "stale": 3,
        "error": 1,
        "overrun": 40,
        "ladder": 20,
        "not_fresh": 5,
    }


@pytest.mark.parametrize(
    "end, expect, ok, reason",
    [
        (beat(150), "", True, "15.0 fps, miss rate 4.0 % (6 of 150 frames in 10.0 s)"),
        (
            beat(150, dropped={"stale": 10}),
            "",
            False,
            "miss rate 10.0 % > 5.0 % (16 of 160 frames in 10.0 s)",
        ),
        (
            beat(0, dropped={"stale": 100}),
            "",
            False,
            "no results published: 100 of 100 frames in 0.0 s missed",
        ),
    ],
)
def test_a_window_is_judged_on_its_counts(end, expect, ok, reason):
    v = judge(Window.between(beat(0), end), end, 0.05)
    assert v.ok is ok and reason in v.reason, v


def feed(j: Judge, beats: list[dict]) -> Judge:
    for b in beats:
        j.add(b)
    return j


def test_too_few_frames_are_said_not_judged():
    # A camera at 2 fps: 8 frames in 4 s, one of them late.
    slow = [{**beat(i * 2), "uptime_s": float(i)} for i in range(5)]
    j = feed(Judge(0.05), slow)
    assert not j.done()
    (v,) = j.verdict().sources
    assert not v.ok and "too few frames to judge: 8 ended in 4.0 s, at least 100 needed" in v.reason, v
    assert "miss rate so far 12.5 % (1 of 8 frames in 4.0 s)" in v.reason, v
    assert "only one heartbeat" in feed(Judge(0.05), slow[:1]).verdict().reason


def test_waiting_judges_the_frames_after_a_bad_verdict_and_after_the_expected_config_runs():
    # The old config first: its frames do not count.
    old = [beat(f, config="old") for f in (0, 15, 30)]
    # Then the new one: stale drops while it warms up (a bad first window), then clean.
    warming = [beat(f, config="new", dropped={"stale": 0 if f == 45 else 20}) for f in range(45, 165, 15)]
    clean = [beat(f, config="new", dropped={"stale": 20}) for f in range(165, 300, 15)]
    j = feed(Judge(0.05, expect_hash="new", wait=True), old + warming)
    assert not j.done() and "runs config" not in j.verdict().reason and "miss rate" in j.verdict().reason
    v = feed(j, clean).verdict()
    (s,) = v.sources
    assert v.healthy and s.counts["dropped"] == 0 and s.frames >= 100, v
    # Without wait the first verdict is final: here the old config.
    assert (
        "runs config old, not new"
        in feed(Judge(0.05, expect_hash="new"), old + warming + clean).verdict().reason
    )


def test_counts_that_start_again_start_the_window_again():
    j = feed(Judge(0.1, wait=True), [beat(300), beat(315), beat(0), beat(60), beat(120)])
    (s,) = j.verdict().sources
    assert (s.frames, s.span_s) == (120, 8.0) and j.done(), s


def beating_agent(model: Path, endpoint: str, **extra) -> AgentConfig:
    """A synthetic camera at 30 fps on ``model``, a heartbeat every 0.25 s on ``endpoint``."""
    return AgentConfig(
        source=SyntheticSourceConfig(fps=30),
        model=ModelConfig(path=str(model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.25),
        metrics=MetricsConfig(enabled=False),
        **extra,
    )


def test_health_of_a_running_agent_and_of_none(const_model, tmp_path):
    endpoint = free_endpoint()
    cfg = beating_agent(const_model, endpoint)
    file = tmp_path / "agent.yaml"
    file.write_text(json.dumps({"publish": {"endpoint": endpoint}}))
    with started(cfg):
        out = run_process(agent_command("health", "--endpoint", endpoint, "--wait-ready", "--json"), 60)
        assert out.returncode == 0, out.stdout + out.stderr
        verdict = json.loads(out.stdout)
        (source,) = verdict["sources"]
        assert verdict["healthy"] and source["config_hash"] == config_hash(cfg)
        c = source["counts"]
        assert source["frames"] >= verdict["min_frames"] == 100, source
        assert source["frames"] == c["on_time"] + source["misses"], source
        # Another config than the one running: not healthy, and why.
        out = run_process(
            agent_command("health", "--endpoint", endpoint, "--expect-config", str(file), "--timeout", "3"),
            60,
        )
        assert out.returncode == 1 and "not reloaded yet?" in out.stdout, out.stdout
    out = run_process(agent_command("health", "--endpoint", endpoint, "--timeout", "1"), 60)
    assert out.returncode == 1 and "no heartbeat" in out.stdout and "is the agent running?" in out.stdout


def test_an_agent_with_a_few_failed_inferences_is_judged_alike_twice_with_its_counts(
    const_model, monkeypatch
):
    monkeypatch.setenv("EDGE_AGENT_FAULTS", "1")
    endpoint = free_endpoint()
    # dropped as "error": misses
    cfg = beating_agent(const_model, endpoint, faults=FaultsConfig(backend_error_rate=0.1, seed=7))
    command = agent_command("health", "--endpoint", endpoint, "--max-miss-rate", "0.3")
    with started(cfg):
        outs = [run_process(command, 60) for _ in range(2)]
    for out in outs:
        assert out.returncode == 0 and out.stdout.startswith("healthy: "), out.stdout + out.stderr
        line = out.stdout.splitlines()[1]
        assert " of " in line and " frames in " in line, out.stdout  # the counts beside the rate
        counts = out.stdout.splitlines()[2]
        assert counts.strip().startswith("frames judged: on time ") and "error " in counts, out.stdout


@pytest.mark.parametrize(
    "option, value",
    [("--timeout", "inf"), ("--timeout", "nan"), ("--max-miss-rate", "nan"), ("--max-miss-rate", "2")],
)
def test_a_check_that_could_not_end_or_fail_is_a_usage_error(option, value):
    out = run_process(agent_command("health", "--endpoint", free_endpoint(), option, value), 60)
    assert out.returncode == 2 and f"{option} {value}" in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    "endpoint",
    [
        "garbage",
        "tcp://nohost",
        "tcp://127.0.0.1:99999",
        "tcp://127.0.0.1:abc",
        "foo://127.0.0.1:5",
        "ipc://",
    ],
)
def test_an_endpoint_that_cannot_be_connected_to_is_a_usage_error(endpoint):
    out = run_process(agent_command("health", "--endpoint", endpoint, "--timeout", "1"), 60)
    assert out.returncode == 2 and f"--endpoint {endpoint}: expected " in out.stderr, out.stdout + out.stderr
    assert "Traceback" not in out.stderr


def test_a_config_endpoint_that_cannot_be_connected_to_is_named(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text("publish: {endpoint: 'foo://x'}\n")  # passes the config's own check ("://")
    out = run_process(agent_command("health", "--config", str(path), "--timeout", "1"), 60)
    assert out.returncode == 2 and "publish.endpoint foo://x: expected " in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_an_address_zeromq_refuses_after_the_check_is_named_not_a_traceback():
    endpoint = "tcp://bad host:5556"
    out = run_process(agent_command("health", "--endpoint", endpoint, "--timeout", "1"), 60)
    assert out.returncode == 2 and f"{endpoint}: ZeroMQ cannot connect to it" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
