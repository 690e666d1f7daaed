"""No result of a file is lost to a subscriber that was already waiting.

ZeroMQ's PUB drops every message sent before a subscriber's subscription has arrived; the
agent's XPUB socket sees subscriptions, and for file sources it waits for them before the
first frame is read (``publish.wait_for_subscribers``)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
import zmq
from conftest import agent_command, read_line, spawn, spawn_run, wait_until
from helpers import write_video

from edge_agent.client import GapTracker, connect
from edge_agent.core.config import AgentConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import (
    ImageFolderSourceConfig,
    SyntheticSourceConfig,
    V4L2SourceConfig,
    VideoSourceConfig,
)
from edge_agent.core.stream_frames import decode
from edge_agent.pipelines.publish import ZmqPublisher


def write_images(folder: Path, count: int) -> Path:
    folder.mkdir()
    for i in range(count):
        img = np.full((48, 64, 3), (i * 7) % 250, np.uint8)
        cv2.imwrite(str(folder / f"{i:04d}.png"), img)
    return folder


def run_agent_for_a_waiting_subscriber(cfg_path: Path, endpoint: str, frames: int) -> list[dict]:
    """Subscribe first, then run the agent to the end of its file; every result received."""
    sub = connect(endpoint, ("det", "health"))
    sub.rcvtimeo = 200
    results: list[dict] = []
    final = False
    try:
        with spawn_run(cfg_path) as agent:
            deadline = time.monotonic() + 120
            while not final and time.monotonic() < deadline:
                try:
                    topic, body = decode(sub.recv())
                except zmq.Again:
                    assert agent.poll() is None or final, agent.stderr.read()
                    continue
                if topic.startswith("det."):
                    results.append(body)
                final = bool(body.get("final"))
            assert final, f"no final heartbeat; {len(results)} of {frames} results"
            assert agent.wait(30) == 0, agent.stderr.read()
    finally:
        sub.close()
    return results


@pytest.mark.parametrize("kind", ["video", "images"])
def test_a_subscriber_that_waits_first_receives_every_result_of_a_file(tmp_path, endpoint, const_model, kind):
    n = 150 if kind == "video" else 120
    if kind == "video":
        source = f"{{type: video, path: {write_video(tmp_path / 'clip.avi', n)}}}"
    else:
        source = f"{{type: images, path: {write_images(tmp_path / 'frames', n)}}}"
    cfg = tmp_path / "agent.yaml"
    # The wait ends when the subscription arrives; the long timeout is for a loaded machine.
    cfg.write_text(
        f"source: {source}\nmodel: {{path: {const_model}}}\n"
        f"publish: {{endpoint: '{endpoint}', subscriber_timeout_s: 60}}\nmetrics: {{enabled: false}}\n"
    )
    results = run_agent_for_a_waiting_subscriber(cfg, endpoint, n)
    assert [r["seq"] for r in results] == list(range(n))
    assert [r["frame_id"] for r in results] == list(range(n))


def test_listen_started_before_the_agent_gets_every_result_from_seq_0(tmp_path, endpoint, const_model):
    n = 120
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"source: {{type: video, path: {write_video(tmp_path / 'clip.avi', n)}}}\n"
        f"model: {{path: {const_model}}}\n"
        f"publish: {{endpoint: '{endpoint}', subscriber_timeout_s: 60}}\nmetrics: {{enabled: false}}\n"
    )
    listen = agent_command("listen", endpoint, "--json", "--topic", "det.")
    with spawn(
        [*listen, "--count", str(n)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as listener:
        # The listener says so when it has been listening a while with nothing received:
        # from then on it is certainly subscribed, before the agent exists.
        notice = read_line(listener.stderr, 60)
        assert "nothing received yet" in notice, notice
        with spawn(agent_command("run", "-c", str(cfg), "--quiet"), stdout=subprocess.DEVNULL) as agent:
            out, _ = listener.communicate(timeout=120)
            assert agent.wait(60) == 0
    seqs = [json.loads(line)["seq"] for line in out.splitlines()]
    assert seqs == list(range(n))


# -- the parts ---------------------------------------------------------------------------------


def test_the_publisher_counts_subscriptions_and_stops_waiting_when_they_arrive(endpoint):
    pub = ZmqPublisher(endpoint)
    pub.open()
    ctx = zmq.Context()
    try:
        t0 = time.monotonic()
        assert pub.wait_for_subscribers(1, 0.3) == 0, "nobody there: the wait times out"
        assert time.monotonic() - t0 < 5
        # A heartbeat-only monitor receives no result: it does not count.
        monitor = connect(endpoint, ("health",), context=ctx)
        subs = [connect(endpoint, topics, context=ctx) for topics in (("det",), ("det.cam0", "health"))]
        assert pub.wait_for_subscribers(2, 60) == 2
        monitor.close()
        # Sent after the wait, the first message reaches both.
        pub.send(b"det.cam0", b'{"seq":0}')
        for s in subs:
            s.rcvtimeo = 10_000
            assert s.recv() == b'det.cam0 {"seq":0}'
            s.close()
        # Subscriptions are taken from the socket later too (XPUB would keep them unread).
        wait_until(lambda: pub.poll_subscriptions() == 0, 10, message="unsubscribed on close")
    finally:
        pub.close()
        ctx.term()


@pytest.mark.parametrize(
    ("sources", "publish", "expected"),
    [
        ((VideoSourceConfig(path="a.mp4"),), PublishConfig(), 1),
        ((VideoSourceConfig(path="a.mp4", realtime=True),), PublishConfig(), 0),
        ((ImageFolderSourceConfig(path="f"),), PublishConfig(), 1),
        ((SyntheticSourceConfig(fps=0),), PublishConfig(), 0),
        ((V4L2SourceConfig(),), PublishConfig(), 0),
        ((V4L2SourceConfig(name="c"), ImageFolderSourceConfig(name="f", path="f")), PublishConfig(), 1),
        ((VideoSourceConfig(path="a.mp4"),), PublishConfig(wait_for_subscribers=0), 0),
        ((V4L2SourceConfig(),), PublishConfig(wait_for_subscribers=3), 3),
    ],
    ids=["video", "realtime-video", "images", "synthetic", "camera", "camera+images", "off", "three"],
)
def test_who_waits_for_subscribers(sources, publish, expected):
    cfg = AgentConfig(sources=sources, publish=publish)
    assert cfg.subscribers_to_wait_for() == expected


def test_the_gap_tracker_keeps_the_seq_each_topic_was_joined_at():
    gaps = GapTracker()
    assert [gaps.update("det.a", s) for s in (14, 15, 17)] == [0, 0, 1]
    assert gaps.update("det.b", 0) == 0
    assert gaps.joined == {"det.a": 14, "det.b": 0} and gaps.lost == {"det.a": 1}


def test_sigterm_during_the_wait_for_subscribers_stops_the_agent(tmp_path, endpoint, const_model):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"source: {{type: images, path: {write_images(tmp_path / 'frames', 5)}}}\n"
        f"model: {{path: {const_model}}}\n"
        f"publish: {{endpoint: '{endpoint}', subscriber_timeout_s: 600}}\nmetrics: {{enabled: false}}\n"
    )
    with spawn_run(cfg) as agent:
        line = ""
        while "waiting up to 600.0 s for 1 subscriber" not in line:
            line = read_line(agent.stderr, 60)
            assert line, "the agent never said it waits for a subscriber"
        agent.send_signal(signal.SIGTERM)
        # Not the 600 s the wait would last: the signal ends it.
        assert agent.wait(30) == 0
