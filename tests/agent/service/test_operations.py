"""Operating a fleet: Prometheus over real HTTP, CURVE on the real socket, the client."""

from __future__ import annotations

import contextlib
import json
import stat
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import zmq
from conftest import REPO, agent_command, run_process, spawn, started, wait_until
from helpers import Subscriber, free_port, running_agent, scrape, value, write_video

from edge_agent.client import GapTracker, Result, connect, subscribe
from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig, VideoSourceConfig
from edge_agent.core.stream_frames import decode
from edge_agent.service.runner import Agent


def test_metrics_over_http_agree_with_the_health_stream(tmp_path, const_model, endpoint):
    port = free_port()
    video = write_video(tmp_path / "clip.avi", 60)
    cfg = AgentConfig(
        source=VideoSourceConfig(path=str(video), name="file"),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1),
        metrics=MetricsConfig(port=port),
    )
    health = Subscriber(endpoint, "health")

    def beat_after_the_last_frame() -> dict | None:
        beats = [m["counts"] for m in health.messages if not m.get("final")]
        return beats[-1] if beats and beats[-1]["captured"] == 60 and beats[-1]["in_flight"] == 0 else None

    with started(cfg, health) as agent:
        assert agent.pipeline.finished.wait(30)
        beat = wait_until(beat_after_the_last_frame, 30, message="a heartbeat after the last frame")
        families = scrape(port)
    assert (
        value(families, "edge_agent_frames_captured", "edge_agent_frames_captured_total", source="file")
        == beat["captured"]
        == 60
    )
    on_time = value(
        families, "edge_agent_frames_published", "edge_agent_frames_published_total", outcome="on_time"
    )
    assert on_time == beat["on_time"]
    e2e_count = value(
        families, "edge_agent_end_to_end_latency_seconds", "edge_agent_end_to_end_latency_seconds_count"
    )
    assert e2e_count == beat["on_time"] + beat["late"]
    buckets = [s for s in families["edge_agent_end_to_end_latency_seconds"] if s.name.endswith("_bucket")]
    counts = [s.value for s in buckets]
    assert counts == sorted(counts) and buckets[-1].labels["le"] == "+Inf", "cumulative buckets"
    assert "edge_agent_model_info" in families and "process_resident_memory_bytes" in families
    assert value(families, "edge_agent_ladder_step", "edge_agent_ladder_step", step="full") == 0


def keypairs(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name in ("server", "good", "bad"):
        r = run_process(
            agent_command("keys", "generate", name, "--dir", str(tmp_path / "keys")), timeout_s=30
        )
        assert r.returncode == 0, r.stderr
        out[name] = tmp_path / "keys" / name
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "good.key").write_bytes((tmp_path / "keys" / "good.key").read_bytes())
    out["allowed"] = allowed
    return out


def curve_agent(keys: dict[str, Path], const_model: Path, endpoint: str) -> Agent:
    """A started agent whose stream admits only the clients in ``keys["allowed"]``."""
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=50),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(
            endpoint=endpoint,
            curve_server_key=f"{keys['server']}.key_secret",
            curve_clients_dir=str(keys["allowed"]),
        ),
        metrics=MetricsConfig(enabled=False),
    )
    agent = Agent(cfg)
    agent.build()
    agent.start()
    return agent


def test_keys_are_written_with_safe_permissions(tmp_path):
    keys = keypairs(tmp_path)
    secret = Path(f"{keys['server']}.key_secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys").stat().st_mode) == 0o700


def test_curve_lets_only_allowed_clients_read(tmp_path, const_model, endpoint):
    keys = keypairs(tmp_path)
    agent = curve_agent(keys, const_model, endpoint)
    ctx = zmq.Context()
    server_pub = f"{keys['server']}.key"
    socks = {
        "good": connect(endpoint, ("det",), server_pub, f"{keys['good']}.key_secret", ctx),
        "bad": connect(endpoint, ("det",), server_pub, f"{keys['bad']}.key_secret", ctx),
        "plain": connect(endpoint, ("det",), None, None, ctx),
    }
    got = {name: 0 for name in socks}

    def received_enough() -> bool:
        for name, s in socks.items():
            with contextlib.suppress(zmq.Again):
                while True:
                    s.recv(zmq.NOBLOCK)
                    got[name] += 1
        return got["good"] > 20

    try:
        # All three are connected for as long as the allowed one takes to get 21 results.
        wait_until(received_enough, 30, message="results for the allowed client")
        running = agent.pipeline.published()
        wait_until(
            lambda: agent.pipeline.published() > running,
            10,
            message="the agent keeps publishing",
        )
    finally:
        for s in socks.values():
            s.close()
        ctx.term()
        agent.stop()
    assert got["good"] > 20, got
    assert got["bad"] == 0 and got["plain"] == 0, got


def test_a_client_key_added_before_a_reload_is_admitted(tmp_path, const_model, endpoint):
    keys = keypairs(tmp_path)
    agent = curve_agent(keys, const_model, endpoint)
    ctx = zmq.Context()
    server_pub, bad_secret = f"{keys['server']}.key", f"{keys['bad']}.key_secret"

    def received(want: int, seconds: float) -> int:
        """Results received until ``want`` arrived, or ``seconds`` passed."""
        s = connect(endpoint, ("det",), server_pub, bad_secret, ctx)
        s.rcvtimeo = 100
        n, end = 0, time.monotonic() + seconds
        try:
            while n < want and time.monotonic() < end:
                try:
                    s.recv()
                    n += 1
                except zmq.Again:
                    pass
        finally:
            s.close()
        return n

    try:
        # The test's input: a second in which the agent publishes some 50 results.
        assert received(1, 1.0) == 0, "not yet allowed"
        (keys["allowed"] / "bad.key").write_bytes((tmp_path / "keys" / "bad.key").read_bytes())
        assert agent.reload(agent.config) == [], "the config itself did not change"
        assert received(11, 30.0) > 10, "allowed after the reload, without a restart"
    finally:
        ctx.term()
        agent.stop()


def test_without_curve_a_public_bind_warns(const_model, caplog):
    from edge_agent.pipelines.publish import ZmqPublisher

    port = free_port()
    pub = ZmqPublisher(f"tcp://0.0.0.0:{port}")
    with caplog.at_level("WARNING"):
        pub.open()
    pub.close()
    assert "without CURVE" in caplog.text


def test_client_detects_an_injected_gap(endpoint):
    import threading

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(endpoint)
    got: list = []

    def consume() -> None:
        for m in subscribe(endpoint, ("det",), timeout_s=5.0):
            got.append(m)
            if len(got) >= 1 and got[-1].seq == 7:
                return

    t = threading.Thread(target=consume)
    t.start()
    try:

        def connected() -> bool:  # slow joiner: send until the client has one
            pub.send(b"det.cam " + json.dumps(_result(0)).encode())
            return bool(got)

        wait_until(connected, 5, interval_s=0.05, message="the client never received anything")
        for seq in (1, 2, 6, 7):  # 3, 4, 5 never sent
            pub.send(b"det.cam " + json.dumps(_result(seq)).encode())
        t.join(10)
        assert not t.is_alive(), f"the client did not get seq 7: {[m.seq for m in got]}"
    finally:
        pub.close(linger=0)
        ctx.term()
    assert isinstance(got[0], Result)
    tail = [(m.seq, m.gap) for m in got if m.seq != 0]
    assert tail == [(1, 0), (2, 0), (6, 3), (7, 0)], tail
    assert got[0].detections[0].label == "circle"


def _result(seq: int) -> dict:
    return {
        "schema": 1,
        "device": "d",
        "source": "cam",
        "seq": seq,
        "frame_id": seq,
        "capture_mono_ns": 1,
        "capture_unix_s": 1.0,
        "image_wh": [640, 480],
        "model": "m",
        "latency_ms": {"total": 1.0},
        "deadline_ms": 50.0,
        "deadline_missed": False,
        "throttled": False,
        "detections": [{"label": "circle", "class_id": 0, "score": 0.9, "box_xyxy": [1, 2, 3, 4]}],
    }


def test_gap_tracker_counts_per_topic():
    g = GapTracker()
    assert [g.update("a", s) for s in (0, 1, 4)] == [0, 0, 2]
    assert g.update("b", 10) == 0 and g.lost == {"a": 2}


def test_msgpack_encoding_round_trips_through_the_client(const_model, endpoint):
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=50),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, encoding="msgpack"),
        metrics=MetricsConfig(enabled=False),
    )
    sock = connect(endpoint, ("det",))
    sock.rcvtimeo = 5000
    with started(cfg, sock):
        raw = sock.recv()
    assert raw.split(b" ", 1)[1][:1] != b"{", "not JSON"
    topic, body = decode(raw)
    assert topic == "det.cam0" and body["schema"] == 2 and len(body["detections"]) == 2


def test_listen_stats_reports_rates_and_losses(const_model, endpoint, tmp_path):
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        f"source: {{type: synthetic, fps: 50}}\nmodel: {{path: '{const_model}'}}\n"
        f"publish: {{endpoint: '{endpoint}'}}\nmetrics: {{enabled: false}}\n"
    )
    agent = agent_command("run", "--config", str(cfg), "--quiet")
    with spawn(agent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        listen = agent_command("listen", endpoint, "--topic", "det", "--stats", "--count", "120")
        out = run_process(listen, timeout_s=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.splitlines()[0]
    assert line.startswith("cam0:") and "msg/s" in line and "p99" in line and "lost 0" in line, out.stdout


def test_default_metrics_bind_loopback_only():
    assert MetricsConfig().host == "127.0.0.1"


def test_grafana_dashboard_uses_only_metrics_the_agent_exports(tmp_path, const_model, endpoint):
    import re

    dashboard = json.loads((REPO / "tools" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {
        re.sub(r"_(bucket|count|sum)$", "", m)
        for e in exprs
        for m in re.findall(r"\b((?:edge_agent|process)_[a-z_]+)", e)
    }
    port = free_port()
    with running_agent(const_model, endpoint, port) as agent:
        wait_until(lambda: agent.pipeline.published() >= 5, 30, message="results before the scrape")
        exported = set(scrape(port))
    # Counters are exported as <name>_total; power gauges exist only on a Jetson.
    exported |= {f"{n}_total" for n in exported}
    power_only = {n for n in used if re.search(r"gpu|cpu_frequency|emc|temperature|power_watts|throttled", n)}
    missing = used - exported - power_only
    assert not missing, f"dashboard queries metrics the agent does not export: {missing}"
    from edge_agent.service import metrics

    for name in power_only:  # named in the module's list, where the power collector makes them
        assert name in metrics.__doc__, name


def test_a_reload_moves_the_metrics_server_to_its_new_port(const_model, endpoint):
    first, second = free_port(), free_port()
    with running_agent(const_model, endpoint, first) as agent:
        assert "edge_agent_frames_captured" in scrape(first)
        agent.reload(replace(agent.config, metrics=MetricsConfig(port=second)))
        assert "edge_agent_frames_captured" in scrape(second)
        with pytest.raises(OSError):
            scrape(first)


def test_a_message_sent_while_the_stream_is_closed_is_dropped_quietly(endpoint):
    from edge_agent.pipelines.publish import ZmqPublisher

    pub = ZmqPublisher(endpoint)
    pub.open()
    pub.send(b"det", b"{}")
    pub.close()
    pub.send(b"det", b"{}")  # a heartbeat racing a rebind or the stop: not an error
    assert pub.sent == 1
