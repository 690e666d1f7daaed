"""Issue 30: the uplink and `fleet status` against a hostile local process. A process that
publishes on the agent's endpoint while the agent is down, or retains junk on the broker,
must cost at most its own messages: real ZeroMQ, a real Mosquitto, the real uplink and CLI."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import zmq
from broker import Mosquitto, Recorder
from conftest import agent_command, run_process, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from test_uplink import DEVICE, metric, uplink, write_config

from edge_agent.core.config import load_config
from edge_agent.core.configload import ConfigError
from edge_agent.core.uplink_config import UplinkConfig
from edge_agent.service.uplink.forward import Summarize
from edge_agent.service.uplink.link import make_client
from edge_agent.service.uplink.spool import Spool, SpoolError

STAGES = ("capture", "preprocess", "wait_infer", "infer", "wait_post", "postprocess", "publish")


def result(source: str, seq: int, total: Any = 1.0) -> dict[str, Any]:
    """A result as the agent publishes it (message-v2)."""
    latency = dict.fromkeys(STAGES, 0.1) | {"total": total}
    return {
        "schema": 1,
        "device": DEVICE,
        "source": source,
        "seq": seq,
        "frame_id": seq,
        "capture_mono_ns": 1,
        "capture_unix_s": time.time(),
        "image_wh": [64, 48],
        "model": "const",
        "latency_ms": latency,
        "deadline_ms": 50.0,
        "deadline_missed": False,
        "throttled": False,
        "detections": [{"label": "circle", "class_id": 0, "score": 0.9, "box_xyxy": [1, 2, 3, 4]}],
    }


def frame(topic: str, body: dict[str, Any]) -> bytes:
    return topic.encode("utf-8", "surrogatepass") + b" " + json.dumps(body).encode()


@pytest.fixture
def broker(tmp_path):
    with Mosquitto(tmp_path) as b:
        yield b


@contextlib.contextmanager
def impostor(endpoint: str):
    """A PUB socket bound where the agent would be (the agent is down, CURVE is off)."""
    sock = zmq.Context.instance().socket(zmq.PUB)
    sock.linger = 0
    sock.bind(endpoint)
    try:
        yield sock
    finally:
        sock.close()


def _flood_until(sock: zmq.Socket, bad: list[bytes], good_source: str, done: Any, timeout_s: float) -> int:
    """Publish every bad message, then a good result, about 20 times a second until
    ``done()`` or ``timeout_s`` (bounded: at most 20 * timeout_s rounds). The last good seq."""
    seq = 0
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not done(seq):
        for b in bad:
            sock.send(b)
        seq += 1
        sock.send(frame(f"det.{good_source}", result(good_source, seq)))
        time.sleep(0.05)
    return seq


BAD_SOURCES = ["a#b", "x" * 70_000, "nul\x00here", "plus+", "esc\x1b[31m", "\ud800"]


def test_a_bad_source_name_is_rejected_and_counted_and_never_blocks_the_rest(
    tmp_path, broker, const_model, endpoint
):
    cfg, port = write_config(tmp_path, broker, const_model, endpoint)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/det/#")
    log = tmp_path / "uplink.log"
    bad = [frame(f"det.{s}", result(s, 1)) for s in BAD_SOURCES]
    bad.append(b"det.cam0 " + json.dumps({"source": "cam0", "seq": "x"}).encode())  # wrong types
    bad.append(b"det.big " + b"{" + b" " * (2 << 20) + b"}")  # over the frame bound
    try:
        with impostor(endpoint) as sock, uplink(cfg, log):

            def good_after_bad(_seq: int) -> bool:
                seqs = [b["seq"] for b in recorder.bodies("/det/cam0") if b.get("seq")]
                return metric(port, "rejected") >= len(bad) and len(seqs) >= 20

            _flood_until(sock, bad, "cam0", good_after_bad, 30)
            assert good_after_bad(0), "the good results behind the bad ones arrive"
            assert metric(port, "spool_messages") < 50, "nothing is stuck in the spool"
            topics = {t for t, _, _ in recorder.messages}
            assert topics == {f"edge-agent/{DEVICE}/det/cam0"}, topics
    finally:
        recorder.close()
    text = log.read_text()
    assert "Traceback" not in text
    assert text.count("stream message rejected") <= 2, "logged once a minute, not per message"


def test_a_bad_latency_in_summary_mode_costs_only_that_message(tmp_path, broker, const_model, endpoint):
    cfg, port = write_config(tmp_path, broker, const_model, endpoint, forward="summary", interval_s=0.2)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/summary/#")
    bad = [frame("det.cam0", result("cam0", 0, total="x")), frame("det.cam1", result("cam1", 0, total=None))]
    try:
        with impostor(endpoint) as sock, uplink(cfg, tmp_path / "uplink.log"):

            def summaries(_seq: int) -> bool:
                got = [b for b in recorder.bodies("/summary/cam0") if b["frames"]]
                return len(got) >= 3 and metric(port, "rejected") >= 2

            _flood_until(sock, bad, "cam0", summaries, 30)
            assert summaries(0), "summaries keep coming after a result with a bad latency"
    finally:
        recorder.close()
    assert "Traceback" not in (tmp_path / "uplink.log").read_text()


# -- fleet status -------------------------------------------------------------------------


def _retain(broker: Mosquitto, messages: dict[str, bytes]) -> None:
    client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", broker.port)
    client.loop_start()
    try:
        infos = [client.publish(t, p, qos=1, retain=True) for t, p in messages.items()]
        for info in infos:
            info.wait_for_publish(10)
    finally:
        client.disconnect()
        client.loop_stop()


def good_health(now: float) -> dict[str, Any]:
    return {
        "device": "good",
        "ts_unix_s": now,
        "health_interval_s": 5.0,
        "agent_silent_s": 0.1,
        "agent_silent_after_s": 2.0,
        "last_heartbeat_unix_s": now,
        "version": "1.0",
        "config_hash": "abc",
        "model": "const",
        "throttled": False,
        "power_mode": "",
        "sources": {"cam0": {"fps": 30.0, "e2e_p50_ms": 5.0, "e2e_p99_ms": 9.0, "miss_rate": 0.0}},
    }


def test_one_malformed_health_shows_as_invalid_and_the_rest_of_the_fleet_prints(broker):
    now = time.time()
    bad = {
        "list": b"[1,2]",
        "source-str": json.dumps({"sources": {"a": "x"}}).encode(),
        "ts-str": json.dumps({"ts_unix_s": "soon"}).encode(),
        "interval-null": json.dumps(good_health(now) | {"health_interval_s": None}).encode(),
        "future": json.dumps(good_health(now) | {"ts_unix_s": 1e18, "last_heartbeat_unix_s": 1e18}).encode(),
        "nested": b"[" * 100_000 + b"]" * 100_000,
        "fps-str": json.dumps(good_health(now) | {"sources": {"c": {"fps": "fast"}}}).encode(),
        "events-str": json.dumps(
            good_health(now) | {"sources": {"c": {"fps": 1.0, "events": "many"}}}
        ).encode(),
    }
    messages = {f"edge-agent/{d}/health": p for d, p in bad.items()}
    messages["edge-agent/good/health"] = json.dumps(good_health(now)).encode()
    messages["edge-agent/ansi/health"] = json.dumps(
        good_health(now) | {"model": "\x1b[2J\x1b[31mpwned\x07"}
    ).encode()
    for device in [*bad, "good", "ansi"]:
        messages[f"edge-agent/{device}/status"] = b"online"
    _retain(broker, messages)
    out = run_process(agent_command("fleet", "status", "--broker", broker.url), 60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines()[1:] if line.strip()}
    for device in bad:
        assert rows[device].split()[1] == "invalid", rows[device]
    assert rows["good"].split()[1] == "online" and "30.0" in rows["good"]
    assert "\x1b" not in out.stdout and "\x07" not in out.stdout
    assert "\\x1b[31mpwned" in rows["ansi"] or "\\x1b" in rows["ansi"]
    js = run_process(agent_command("fleet", "status", "--broker", broker.url, "--json"), 60)
    assert js.returncode == 0, js.stderr
    found = {r["device"]: r for r in json.loads(js.stdout.splitlines()[-1])}
    assert {found[d]["status"] for d in bad} == {"invalid"} and found["good"]["status"] == "online"


# -- smaller items --------------------------------------------------------------------------


@pytest.mark.parametrize("device_id", ["a\x00b", "cam\x1b[2J", "x\x7f", "ok\u0085"])
def test_a_device_id_with_control_characters_is_refused_naming_the_key(tmp_path, device_id):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(json.dumps({"device_id": device_id}))  # JSON is YAML; escapes keep it text
    with pytest.raises(ConfigError, match="device_id"):
        load_config(str(cfg))


def test_a_spool_that_cannot_be_written_fails_at_start_naming_the_path(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    Spool(path, 10_000).close()
    if os.geteuid() == 0:  # root writes through modes: make the file immutable instead
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o444)
    try:
        with pytest.raises(SpoolError, match=str(path)) as e:
            Spool(path, 10_000).close()
        assert "read" in str(e.value) or "writ" in str(e.value)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)


def test_the_uplink_exits_2_on_an_unwritable_spool(tmp_path, broker, const_model, endpoint):
    cfg, _ = write_config(tmp_path, broker, const_model, endpoint)
    spool = tmp_path / "agent-spool.sqlite"
    Spool(spool, 10_000).close()
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(spool)], check=True)
    else:
        spool.chmod(0o444)
    try:
        out = run_process(agent_command("uplink", "--config", str(cfg)), 60)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(spool)], check=True)
    assert out.returncode == 2, out.stderr[-2000:]
    assert str(spool) in out.stderr and "Traceback" not in out.stderr


def test_spool_files_are_private_and_a_symlink_is_refused(tmp_path: Path):
    path = tmp_path / "spool.sqlite"
    old = os.umask(0o022)
    try:
        with Spool(path, 10_000) as spool:
            spool.put_many([("t", b"x", 1, False)])
            for f in tmp_path.iterdir():
                assert f.stat().st_mode & 0o077 == 0, f"{f.name}: {oct(f.stat().st_mode)}"
    finally:
        os.umask(old)
    target = tmp_path / "elsewhere.sqlite"
    link = tmp_path / "link.sqlite"
    link.symlink_to(target)
    with pytest.raises(SpoolError, match="symlink"):
        Spool(link, 10_000)
    assert not target.exists(), "nothing written through the link"
    lock_target = tmp_path / "victim"
    lock_target.write_text("keep")
    (tmp_path / "l2.sqlite.lock").symlink_to(lock_target)
    with pytest.raises(SpoolError, match="symlink"):
        Spool(tmp_path / "l2.sqlite", 10_000)
    assert lock_target.read_text() == "keep"


def test_a_shared_password_file_and_a_clear_text_user_name_are_warned_about(tmp_path, caplog):
    pw = tmp_path / "pw"
    pw.write_text("secret\n")
    pw.chmod(0o644)
    cfg = UplinkConfig(broker="mqtt://127.0.0.1:1883", username="cam", password_file=str(pw))
    with caplog.at_level(logging.WARNING, logger="edge_agent.service.uplink.link"):
        make_client(cfg, "x")
    text = caplog.text
    assert "uplink.password_file" in text and str(pw) in text and "0o644" in text
    assert "uplink.username" in text and "mqtts://" in text
    caplog.clear()
    pw.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="edge_agent.service.uplink.link"):
        make_client(UplinkConfig(broker="mqtts://127.0.0.1:8883", username="cam", password_file=str(pw)), "x")
    assert not caplog.records, caplog.text


def test_summaries_are_stamped_with_the_wall_clock_at_send_time_after_a_clock_step():
    fwd = Summarize(1.0)
    mono, wall = 100.0, 1_700_000_000.0
    out = []
    for i in range(40):  # 4 s at 10 results a second; the wall clock steps 1 h forward at 2 s
        t = mono + i * 0.1
        w = wall + i * 0.1 + (3600.0 if i >= 20 else 0.0)
        out += fwd.offer("det.cam0", result("cam0", i), t, wall_s=w)
        out += fwd.flush(t, wall_s=w)
    sums = [b for _, b in out]
    assert [s["frames"] for s in sums] == [10, 10, 10], "intervals follow the monotonic clock"
    last = sums[-1]
    assert abs(last["end_unix_s"] - (wall + 3600 + 3.0)) < 0.2, last
    assert abs(last["end_unix_s"] - last["start_unix_s"] - 1.0) < 1e-6


def test_a_latency_that_is_not_a_number_never_breaks_a_summary():
    """The policy's own guard, behind the uplink's check: the summary still comes."""
    fwd = Summarize(1.0)
    fwd.offer("det.cam0", result("cam0", 0, total="x"), 0.0)
    fwd.offer("det.cam0", result("cam0", 1, total=2.0), 0.5)
    ((_, body),) = fwd.flush(1.0)
    assert body["frames"] == 2 and body["latency_ms"]["max"] == 2.0


def test_a_spool_already_holding_unsendable_messages_drains_past_them(
    tmp_path, broker, const_model, endpoint
):
    """A spool written before messages were checked (an older uplink) must not block either."""
    cfg, port = write_config(tmp_path, broker, const_model, endpoint)
    root = f"edge-agent/{DEVICE}/det"
    poisoned = [f"{root}/a#b", f"{root}/nul\x00", f"{root}/" + "x" * 70_000, f"{root}/esc\x1b"]
    good = json.dumps(result("cam0", 7)).encode()
    with Spool(tmp_path / "agent-spool.sqlite", 10 << 20) as spool:
        spool.put_many([(t, b"{}", 1, False) for t in poisoned] + [(f"{root}/cam0", good, 1, False)])
    recorder = Recorder(broker, f"{root}/#")
    try:
        with uplink(cfg, tmp_path / "uplink.log"):
            wait_until(lambda: recorder.bodies("/cam0"), 30, message="the good message behind the bad ones")
            wait_until(lambda: metric(port, "rejected") >= len(poisoned), 10, message="the bad ones counted")
            assert metric(port, "spool_messages") == 0
    finally:
        recorder.close()
