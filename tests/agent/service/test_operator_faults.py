"""An operator's fault trial, on the real command: a camera outage under systemd's
watchdog, a hung backend at shutdown, a file read under an impossible budget, signals
at every phase of the start, the process's real thread count.

Each test runs ``edge-agent run`` as a subprocess under a real notify socket (the one
tests/agent/service/test_service.py binds where systemd's would be) with the faults injected through
the config (``faults:``, allowed by EDGE_AGENT_FAULTS=1).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from conftest import agent_command, spawn, wait_until
from helpers import FRAMES, NotifySocket, Subscriber, damage, write_numbered_video

from edge_agent.core import resources


def write_config(path: Path, endpoint: str, body: str) -> Path:
    path.write_text(
        f"publish: {{endpoint: '{endpoint}', health_interval_s: 0.25}}\nmetrics: {{enabled: false}}\n{body}"
    )
    return path


def start_agent(cfg: Path | str, notify: str, watchdog_usec: int, *args: str):
    """``edge-agent run`` under a fake systemd, with fault injection allowed."""
    env = {
        **os.environ,
        "NOTIFY_SOCKET": notify,
        "WATCHDOG_USEC": str(watchdog_usec),
        "EDGE_AGENT_FAULTS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("WATCHDOG_PID", None)
    command = agent_command("run", "--config", str(cfg), "--quiet", *args)
    return spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@contextlib.contextmanager
def watched(tmp_path: Path, endpoint: str):
    """A notify socket where systemd's would be and a heartbeat subscriber, both closed."""
    sock = NotifySocket(tmp_path, abstract=True)
    health = Subscriber(endpoint, "health")
    try:
        yield sock, health
    finally:
        sock.close()
        health.close()


def _down(beat: dict) -> bool:
    return beat["source_state"]["connected"] is False


def camera_back(health: Subscriber) -> bool:
    """Heartbeats showed the camera down, then up again."""
    return any(_down(a) and not _down(b) for a, b in itertools.pairwise(health.messages))


def times_of(sock: NotifySocket, key: str) -> list[float]:
    return [t for t, m in sock.messages if key in m]


def counts_line(err: str) -> tuple[int, int, int, int]:
    """(captured, on time, late, dropped) from the run summary."""
    m = re.search(r"frames: captured (\d+) = (\d+) on time \+ (\d+) late \+ (\d+) dropped", err)
    assert m, err[-2000:]
    return tuple(int(g) for g in m.groups())  # type: ignore[return-value]


def test_a_camera_outage_longer_than_the_watchdog_keeps_the_pings_flowing(tmp_path, endpoint):
    cfg = write_config(
        tmp_path / "a.yaml",
        endpoint,
        "source: {type: synthetic, fps: 30}\nfaults: {source_outage_after_frames: 30, source_outage_s: 6}\n",
    )
    with watched(tmp_path, endpoint) as (sock, health):
        with start_agent(cfg, sock.address, 2_000_000) as proc:
            wait_until(lambda: any(_down(m) for m in health.messages), 60, message="the outage")
            wait_until(lambda: camera_back(health), 60, message="the camera back")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
        wait_until(lambda: "STOPPING" in sock.names(), 10, message="STOPPING=1")
    assert proc.returncode == 0, err[-2000:]
    ready = times_of(sock, "READY")[0]
    pings = [ready, *(t for t in times_of(sock, "WATCHDOG") if t > ready), times_of(sock, "STOPPING")[-1]]
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    # The 6 s outage (three watchdog periods) lies inside: systemd (WatchdogSec 2 s) would
    # never have killed it.
    assert pings[-1] - pings[0] > 6 and max(gaps) < 2.0, f"ping gaps {[round(g, 2) for g in gaps]}"
    statuses = [m["STATUS"] for _, m in sock.messages if "STATUS" in m]
    assert any("cam0 down" in s for s in statuses), "STATUS= names the camera that is down"


def test_stall_watchdog_withholds_the_pings_while_no_source_delivers(tmp_path, endpoint):
    cfg = write_config(
        tmp_path / "a.yaml",
        endpoint,
        "source: {type: synthetic, fps: 30}\n"
        "service: {stall_watchdog_s: 1}\n"
        "faults: {source_outage_after_frames: 30, source_outage_s: 4}\n",
    )
    with watched(tmp_path, endpoint) as (sock, health), start_agent(cfg, sock.address, 1_000_000) as proc:
        wait_until(lambda: camera_back(health), 60, message="an outage and the camera back")
        back = len(times_of(sock, "WATCHDOG"))
        wait_until(lambda: len(times_of(sock, "WATCHDOG")) >= back + 3, 30, message="pings again")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    gaps = [b - a for a, b in itertools.pairwise(times_of(sock, "WATCHDOG"))]
    # Pings every third of a second, but none for most of the 4 s outage: systemd (1 s)
    # would restart it.
    assert max(gaps) > 2.0, f"pings went on through the outage: {[round(g, 2) for g in gaps]}"
    assert "pings withheld" in err and "stall_watchdog_s" in err


def test_a_hung_backend_is_abandoned_at_stop_with_every_frame_accounted(tmp_path, endpoint):
    # Every inference takes a minute: the first frame's never returns while the test runs.
    cfg = write_config(
        tmp_path / "a.yaml",
        endpoint,
        "source: {type: synthetic, fps: 30}\n"
        "service: {stage_timeout_s: 1}\n"
        "faults: {backend_delay_ms: 60000}\n",
    )
    with watched(tmp_path, endpoint) as (sock, health):
        with start_agent(cfg, sock.address, 2_000_000) as proc:
            wait_until(lambda: "READY" in sock.names(), 60, message="READY=1")
            # The stuck inference outlasts stage_timeout_s: the pings stop.
            wait_until(
                lambda: time.monotonic() - max(times_of(sock, "WATCHDOG") or times_of(sock, "READY")) > 2.5,
                30,
                message="pings withheld",
            )
            proc.send_signal(signal.SIGTERM)
            stopped_at = time.monotonic()
            _, err = proc.communicate(timeout=30)  # not the minute the inference would take
            took = time.monotonic() - stopped_at
        wait_until(lambda: any(m.get("final") for m in health.messages), 10, message="the final heartbeat")
    assert took < 30 and proc.returncode != 0, err[-2000:]
    assert "did not return" in err and "pings withheld" in err
    captured, on_time, late, dropped = counts_line(err)
    assert captured == on_time + late + dropped and captured > 0, err[-2000:]
    final = next(m for m in health.messages if m.get("final"))["counts"]
    assert final["in_flight"] == 0 and final["captured"] == captured, final
    assert final["dropped_by_reason"]["shutdown"] >= 1, final


def test_a_file_is_processed_whole_under_an_impossible_budget(tmp_path, endpoint):
    video = write_numbered_video(tmp_path / "clip.avi", "MJPG", frames=200)
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        f"source: {{type: video, path: '{video}'}}\n"
        f"publish: {{endpoint: '{endpoint}', wait_for_subscribers: 0}}\n"
        "metrics: {enabled: false}\n"
        # Every frame misses 0.5 ms; for a camera the ladder would halve the frame rate.
        "deadline: {budget_ms: 0.5, miss_window_s: 0.5, step_up_after_s: 60,"
        " ladder: [{name: full}, {name: half, frame_stride: 2}]}\n"
    )
    command = agent_command("run", "--config", str(cfg), "--quiet")
    with spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-2000:]
    captured, on_time, late, dropped = counts_line(err)
    assert (captured, dropped) == (200, 0), err[-2000:]
    assert late == 200 - on_time and late > 0


def test_a_damaged_video_is_reported_and_fails_the_run(tmp_path, endpoint):
    video = damage(write_numbered_video(tmp_path / "clip.avi", "MJPG"), tmp_path / "damaged.avi", 0.40, 0.45)
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        f"source: {{type: video, path: '{video}'}}\n"
        f"publish: {{endpoint: '{endpoint}', health_interval_s: 0.25}}\n"
        "metrics: {enabled: false}\n"
    )
    health = Subscriber(endpoint, "health")  # also the subscriber the file waits for
    try:
        command = agent_command("run", "--config", str(cfg), "--quiet")
        with spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
            _, err = proc.communicate(timeout=120)
        wait_until(lambda: any(m.get("final") for m in health.messages), 10, message="the final heartbeat")
    finally:
        health.close()
    assert proc.returncode == 1, err[-2000:]
    assert "frames were lost to damaged input" in err and "source cam0: damaged:" in err
    captured, *_ = counts_line(err)
    state = next(m for m in health.messages if m.get("final"))["source_state"]
    assert state["lost"] > 0 and state["lost"] + captured == FRAMES, (state, captured)


def _sig_caught(pid: int, *signums: int) -> bool:
    """Whether the process has handlers installed for every one of ``signums``."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.M).group(1), 16)
    return all(mask >> (s - 1) & 1 for s in signums)


def test_sighup_while_the_config_is_still_being_read_is_not_fatal(tmp_path, endpoint):
    # The config is a FIFO: the agent blocks reading it until the test writes, which
    # holds it at its very first step for as long as the test needs.
    fifo = tmp_path / "agent.yaml"
    os.mkfifo(fifo)
    sock = NotifySocket(tmp_path, abstract=True)
    try:
        with start_agent(fifo, sock.address, 0) as proc:
            wait_until(
                lambda: _sig_caught(proc.pid, signal.SIGHUP, signal.SIGTERM) or proc.poll() is not None,
                60,
                message="handlers installed before the config is read",
            )
            assert proc.poll() is None
            proc.send_signal(signal.SIGHUP)
            body = f"publish: {{endpoint: '{endpoint}'}}\nmetrics: {{enabled: false}}\n"
            writer = threading.Thread(target=lambda: fifo.write_text(body), daemon=True)
            writer.start()
            writer.join(30)
            # A config from a FIFO is read once: the reload the SIGHUP asked for takes that same
            # document, not this plain file put in its place.
            (tmp_path / "next.yaml").write_text(body)
            os.replace(tmp_path / "next.yaml", fifo)
            wait_until(lambda: "READY" in sock.names() or proc.poll() is not None, 60, message="READY=1")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=30)
    finally:
        sock.close()
    assert proc.returncode == 0, err[-2000:]


def test_sigterm_while_the_model_loads_stops_at_once(tmp_path, endpoint):
    cfg = write_config(
        tmp_path / "a.yaml", endpoint, "source: {type: synthetic}\nfaults: {model_load_delay_s: 60}\n"
    )
    sock = NotifySocket(tmp_path, abstract=True)
    try:
        with start_agent(cfg, sock.address, 0) as proc:
            wait_until(lambda: "EXTEND_TIMEOUT_USEC" in sock.names(), 60, message="loading the model")
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)  # not the minute the load takes
        wait_until(lambda: "STOPPING" in sock.names(), 10, message="STOPPING=1")
    finally:
        sock.close()
    assert proc.returncode == 0, err[-2000:]
    assert "READY" not in sock.names()


def test_the_footprint_counts_every_thread_of_the_process(const_model):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 3  # a pool of native threads that Python does not know
    session = ort.InferenceSession(str(const_model), opts, providers=["CPUExecutionProvider"])
    try:
        snap = resources.snapshot()
        tasks = len(os.listdir("/proc/self/task"))
    finally:
        del session
    assert snap["threads"] == tasks and snap["threads"] > snap["python_threads"], snap


@pytest.fixture(autouse=True)
def _faults_allowed(monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_FAULTS", "1")


def test_a_pipeline_a_reload_left_stuck_keeps_the_stop_unclean(const_model, endpoint):
    """The old pipeline's inference never returned when a reload swapped it out: the new
    pipeline runs on, but the agent's stop must still say a thread is stuck (the CLI then
    exits at once instead of the interpreter joining that thread for ever)."""
    from dataclasses import replace

    from edge_agent.core.config import AgentConfig
    from edge_agent.core.deadline_config import DeadlineConfig
    from edge_agent.core.model_config import ModelConfig
    from edge_agent.core.publish_config import PublishConfig
    from edge_agent.core.source_config import SyntheticSourceConfig
    from edge_agent.service.runner import Agent

    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=30),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint),
        metrics=replace(AgentConfig().metrics, enabled=False),
    )
    agent = Agent(cfg)
    agent.build()
    backend = agent.model.backend
    real, calls, unblock = backend.infer, [0], threading.Event()

    def first_call_hangs(io):  # fault injection: the first inference never returns
        calls[0] += 1
        if calls[0] == 1:
            unblock.wait(60)
        return real(io)

    backend.infer = first_call_hangs
    agent.start()
    try:
        wait_until(lambda: calls[0] >= 1, 30, message="the first inference")
        agent.reload(replace(cfg, deadline=DeadlineConfig(budget_ms=80)))
        published = agent.pipeline.published()
        wait_until(lambda: agent.pipeline.published() > published + 5, 30, message="the new pipeline runs")
        assert agent.stop() is False, "the old pipeline's stuck inference is still running"
    finally:
        unblock.set()
        agent.stop()


def test_frames_that_reach_an_abandoned_inference_thread_are_counted_once(const_model, endpoint):
    """stop() gave up on the inference thread (``InferStage.abandon``) just as it took a
    batch from the scheduler, or just as its backend returned: those frames are counted
    (shutdown), once, and never handed on."""
    from edge_agent.core.config import AgentConfig
    from edge_agent.core.endpoint_config import MetricsConfig
    from edge_agent.core.model_config import ModelConfig
    from edge_agent.core.publish_config import PublishConfig
    from edge_agent.core.source_config import SyntheticSourceConfig
    from edge_agent.pipelines.stages import FrameQueue
    from edge_agent.service.runner import Agent

    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=0),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint),
        metrics=MetricsConfig(enabled=False),
    )
    agent = Agent(cfg)
    agent.build()
    pipeline = agent.pipeline
    agent.sources["cam0"].open()
    try:
        slots = [pipeline.take_one() for _ in range(2)]
        # White-box: the stage that stop() abandons (the thread was not inside the backend:
        # nothing in flight yet).
        pipeline._infer.abandon()
        assert not pipeline.run_one(slots[0]), "a batch taken after the abandon never runs"
        c = pipeline.figures().lanes[0].counts
        assert c.dropped_by_reason["shutdown"] == 1 and c.in_flight == 1, c
    finally:
        agent.sources["cam0"].close()
    queue = FrameQueue("post")
    queue.close()
    assert queue.put(slots[1]) is False, "a closed hand-off refuses a frame (the caller drops it)"
