"""The uplink end to end, with real parts only: an agent on the synthetic camera, the
`edge-agent uplink` process, a real Mosquitto broker (stopped and started for outages) and
real paho subscribers."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import signal
import sqlite3
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from broker import Mosquitto, Recorder, gaps, make_tls, seqs_in_order
from conftest import agent_command, run_process, spawn, started, wait_until
from helpers import Subscriber, free_port, scrape

from edge_agent.core.config import load_config
from edge_agent.core.uplink_config import UplinkConfig
from edge_agent.service.uplink.status import FleetView

DEVICE = "cam-site-1"


def write_config(
    tmp_path: Path, mosquitto: Mosquitto, const_model: Path, endpoint: str, name: str = "agent", **uplink
) -> tuple[Path, int]:
    """An agent config with an uplink section; returns it and the uplink's metrics port."""
    port = free_port()
    up = {
        "broker": mosquitto.url,
        "forward": "all",
        "spool_path": str(tmp_path / f"{name}-spool.sqlite"),
        "health_interval_s": 0.5,
        "keepalive_s": 2,
        "metrics": {"port": port},
        **uplink,
    }
    device = up.pop("device", DEVICE)
    fps = up.pop("fps", 30)
    budget = up.pop("budget_ms", 50)
    cfg = {
        "device_id": device,
        "source": {"type": "synthetic", "fps": fps},
        "model": {"path": str(const_model)},
        "publish": {"endpoint": endpoint, "health_interval_s": 0.5},
        "metrics": {"enabled": False},
        "deadline": {"budget_ms": budget},
        "uplink": up,
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path, port


def uplink(cfg: Path, log: Path):
    """`edge-agent uplink` as a subprocess (ended with its group when the block exits)."""
    return spawn(
        agent_command("uplink", "--config", str(cfg)), stdout=subprocess.DEVNULL, stderr=log.open("ab")
    )


def metric(port: int, name: str) -> float:
    """One of the uplink's own metrics, scraped from its endpoint; NaN (false in every
    comparison) while the endpoint is not up yet."""
    try:
        samples = scrape(port)[f"edge_agent_uplink_{name}"]
    except OSError:
        return math.nan
    return samples[0].value  # one sample: a counter's _total, or a gauge


def spool_empty(port: int) -> bool:
    return metric(port, "spool_messages") == 0


def seq(agent) -> int:
    """The next sequence number of the agent's (one) source."""
    return agent.pipeline.figures().lanes[0].seq


def det(recorder: Recorder) -> list[dict]:
    return [b for b in recorder.bodies() if "frame_id" in b]


@pytest.fixture
def broker(tmp_path):
    with Mosquitto(tmp_path) as b:
        yield b


def _outage(tmp_path, broker, const_model, endpoint, outage_s: float) -> None:
    cfg, port = write_config(tmp_path, broker, const_model, endpoint)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/#")
    with started(load_config(str(cfg)), recorder) as agent, uplink(cfg, tmp_path / "uplink.log"):
        wait_until(lambda: len(det(recorder)) >= 30, 30, message="results on MQTT before the outage")
        broker.stop()
        during = seq(agent)
        wait_until(lambda: seq(agent) >= during + int(outage_s * 30), outage_s * 10 + 30)
        wait_until(lambda: metric(port, "spool_messages") > 0, 10, message="the outage is spooled")
        broker.start()
        target = seq(agent)
        wait_until(lambda: max(seqs_in_order(det(recorder))) >= target, 60, message="the backlog arrives")
        wait_until(lambda: spool_empty(port), 30, message="the spool empties")
        assert metric(port, "reconnects") >= 1 and metric(port, "dropped") == 0
        status = f"edge-agent/{DEVICE}/status"
        wait_until(lambda: recorder.payloads(status)[-1:] == [b"online"], 10, message="online again")

        def reconnected_health():
            found = [h for h in recorder.bodies("/health") if h["uplink"]["reconnects"] and h["config_hash"]]
            return found[-1] if found else None

        health = wait_until(reconnected_health, 20, message="the health after the outage")
    # A clean stop says offline itself (no Last Will is sent for it).
    wait_until(lambda: recorder.payloads(status)[-1:] == [b"offline"], 10, message="offline at the stop")
    seqs = seqs_in_order(det(recorder))
    assert seqs == sorted(seqs), "in order"
    assert gaps(seqs) == 0, f"every result produced during the outage arrives: {seqs}"
    assert seqs[-1] - seqs[0] + 1 == len(seqs) and seqs[-1] >= target
    # The device's health, retained on the broker: the agent's heartbeats and the uplink's own counts.
    assert health["device"] == DEVICE and health["version"] and health["sources"]["cam0"]["fps"] >= 0
    cam0 = health["sources"]["cam0"]["counts"]
    assert cam0["on_time"] + cam0["late"] > 0, "the heartbeat carries the agent's published count"
    assert health["uplink"]["reconnects"] >= 1 and health["uplink"]["received"] > 0


def test_every_result_reaches_mqtt_in_order_across_a_broker_outage(tmp_path, broker, const_model, endpoint):
    _outage(tmp_path, broker, const_model, endpoint, outage_s=3.0)


@pytest.mark.slow
def test_a_ten_second_outage_at_30_fps_loses_nothing(tmp_path, broker, const_model, endpoint):
    _outage(tmp_path, broker, const_model, endpoint, outage_s=10.0)


def test_a_full_spool_drops_the_oldest_and_counts_exactly_what_is_missing(
    tmp_path, broker, const_model, endpoint
):
    # ~900 B a message: the 16 KiB bound holds about 18 of the 60+ an outage makes.
    cfg, port = write_config(tmp_path, broker, const_model, endpoint, spool_max_mib=1 / 64)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/det/#")
    with started(load_config(str(cfg)), recorder) as agent, uplink(cfg, tmp_path / "uplink.log"):
        wait_until(lambda: len(det(recorder)) >= 10, 30, message="results before the outage")
        broker.stop()
        wait_until(lambda: metric(port, "dropped") >= 20, 60, message="the spool overflows")
        broker.start()
        target = seq(agent)
        wait_until(lambda: max(seqs_in_order(det(recorder))) >= target, 60, message="delivery resumes")
        wait_until(lambda: spool_empty(port), 30, message="the spool empties")
        dropped, not_read = metric(port, "dropped"), metric(port, "stream_gaps")
    seqs = seqs_in_order(det(recorder))
    assert seqs == sorted(seqs)
    # What a subscriber misses is what the spool dropped, plus any result the agent's
    # socket dropped before the uplink read it (a stalled uplink on a loaded machine).
    assert gaps(seqs) == dropped + not_read and dropped > 0, (dropped, not_read, seqs)


def test_spool_survives_kill_9_and_the_last_will_marks_the_device_offline(
    tmp_path, broker, const_model, endpoint
):
    cfg, port = write_config(tmp_path, broker, const_model, endpoint)
    log = tmp_path / "uplink.log"
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/#")
    status = f"edge-agent/{DEVICE}/status"
    with started(load_config(str(cfg)), recorder):
        with uplink(cfg, log) as first:
            wait_until(lambda: recorder.payloads(status)[-1:] == [b"online"], 30, message="online")
            wait_until(
                lambda: any(h["config_hash"] for h in recorder.bodies("/health")), 30, message="health"
            )
            first.send_signal(signal.SIGKILL)
            # The broker sends the Last Will after 1.5 keep-alives (3 s) without a word.
            wait_until(lambda: recorder.payloads(status)[-1:] == [b"offline"], 20, message="the Last Will")
            out = run_process(
                agent_command("fleet", "status", "--broker", broker.url, "--json"), timeout_s=60
            )
            assert out.returncode == 0, out.stderr
            (row,) = json.loads(out.stdout.splitlines()[-1])
            assert row["device"] == DEVICE and row["status"] == "offline" and row["config_hash"]
        with uplink(cfg, log) as second:
            wait_until(lambda: recorder.payloads(status)[-1:] == [b"online"], 30, message="online again")
            broker.stop()
            wait_until(lambda: metric(port, "spool_messages") >= 20, 30, message="20 messages spooled")
            second.send_signal(signal.SIGKILL)
            second.wait(10)
        with sqlite3.connect(tmp_path / "agent-spool.sqlite") as db:
            spooled = [
                json.loads(p)["seq"] for (p,) in db.execute("SELECT payload FROM messages ORDER BY id")
            ]
        assert len(spooled) >= 20
        # A third uplink starts while the broker is still down: it says so, and retries.
        before = len(log.read_text())
        with uplink(cfg, log):
            wait_until(
                lambda: "unreachable" in log.read_text()[before:], 30, message="the start without a broker"
            )
            broker.start()
            wait_until(lambda: set(spooled) <= set(seqs_in_order(det(recorder))), 60, message="spool sent")
            wait_until(lambda: recorder.payloads(status)[-1:] == [b"online"], 30, message="online at last")
    assert "Traceback" not in log.read_text()


def test_summary_counts_equal_the_agents_results(tmp_path, broker, const_model, endpoint):
    cfg, _ = write_config(tmp_path, broker, const_model, endpoint, forward="summary", interval_s=0.5)
    text = json.loads(cfg.read_text())
    text["publish"]["topic"] = "vision"  # the uplink follows the agent's topic
    cfg.write_text(json.dumps(text))
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/summary/#")
    results = Subscriber(endpoint, "vision")
    with started(load_config(str(cfg)), recorder, results), uplink(cfg, tmp_path / "uplink.log"):
        wait_until(lambda: len(recorder.bodies()) >= 5, 30, message="5 summaries")
    summaries = recorder.bodies()
    assert [s["seq"] for s in summaries] == list(range(len(summaries))), "one per interval, none lost"
    by_seq = {m["seq"]: m for m in results.messages}
    full = [
        s
        for s in summaries
        if s["frames"] and all(q in by_seq for q in range(s["first_seq"], s["last_seq"] + 1))
    ]
    assert len(full) >= 3, summaries
    for s in full:
        mine = [by_seq[q] for q in range(s["first_seq"], s["last_seq"] + 1)]
        assert s["frames"] == len(mine)
        labels = Counter(d["label"] for m in mine for d in m["detections"])
        assert s["detections_by_label"] == dict(labels)
        assert s["deadline_missed"] == sum(m["deadline_missed"] for m in mine)
    ranges = [(s["first_seq"], s["last_seq"]) for s in summaries if s["frames"]]
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(ranges)), "the intervals tile the results"


def test_fleet_status_shows_every_device_and_the_odd_config(tmp_path, broker, const_model):
    from conftest import free_endpoint

    configs = [
        write_config(
            tmp_path,
            broker,
            const_model,
            free_endpoint(),
            name=f"d{i}",
            device=f"dev-{i}",
            fps=5,
            budget_ms=40 if i == 2 else 50,
        )[0]
        for i in range(3)
    ]
    with contextlib.ExitStack() as running, contextlib.ExitStack() as agent_1:
        for i, c in enumerate(configs):
            (agent_1 if i == 1 else running).enter_context(started(load_config(str(c))))
            running.enter_context(uplink(c, tmp_path / f"u{i}.log"))
        view = FleetView(UplinkConfig(broker=broker.url))
        view.start(30)
        running.callback(view.stop)

        def statuses() -> dict[str, str]:
            return {r["device"]: r["status"] for r in view.rows() if r["config_hash"]}

        online = dict.fromkeys(("dev-0", "dev-1", "dev-2"), "online")
        wait_until(
            lambda: statuses() == online, 60, interval_s=0.2, message="three devices online with health"
        )
        out = run_process(agent_command("fleet", "status", "--broker", broker.url, "--json"), 60)
        assert out.returncode == 0, out.stderr
        found = json.loads(out.stdout.splitlines()[-1])
        table = run_process(agent_command("fleet", "status", "--broker", broker.url), 60).stdout
        # dev-1's agent stops, its uplink goes on: the device is up, its agent silent.
        agent_1.close()
        wait_until(lambda: statuses().get("dev-1") == "silent", 30, message="dev-1's agent silent")
        assert statuses()["dev-0"] == "online"
    assert [r["device"] for r in found] == ["dev-0", "dev-1", "dev-2"]
    hashes = {r["device"]: r["config_hash"] for r in found}
    assert hashes["dev-0"] == hashes["dev-1"] != hashes["dev-2"], "the same config hashes the same"
    # fps is one heartbeat interval's rate: a busy machine may publish nothing in one, so >= 0.
    assert all(r["fps"] >= 0 and r["model"] for r in found)
    assert f"{hashes['dev-2']}*" in table and "config differs" in table and "dev-2" in table.splitlines()[-1]


def test_a_broker_that_refuses_the_connection_or_the_messages_is_reported_without_a_loop(
    tmp_path, const_model, endpoint
):
    passwd, acl = tmp_path / "passwd", tmp_path / "acl"
    for user in ("cam", "ops"):
        subprocess.run(
            ["mosquitto_passwd", "-b", *(["-c"] if user == "cam" else []), str(passwd), user, "pw"],
            check=True,
            capture_output=True,
        )
    # The device may say its status and health, not publish results; the operator reads all.
    acl.write_text(
        "user cam\ntopic write edge-agent/+/status\ntopic write edge-agent/+/health\n"
        "user ops\ntopic read edge-agent/#\n"
    )
    (tmp_path / "pw").write_text("pw\n")
    with Mosquitto(tmp_path, f"allow_anonymous false\npassword_file {passwd}\nacl_file {acl}") as broker:
        cfg, port = write_config(tmp_path, broker, const_model, endpoint)
        log = tmp_path / "uplink.log"
        recorder = Recorder(broker, f"edge-agent/{DEVICE}/#", username="ops", password="pw")
        with started(load_config(str(cfg)), recorder):
            with uplink(cfg, log):  # no credentials: refused at every attempt
                wait_until(lambda: metric(port, "connect_failures") >= 2, 30, message="two refusals")
                assert metric(port, "spool_messages") > 0 and metric(port, "connected") == 0
            assert log.read_text().count("refused the connection") == 1, "once, not at every retry"
            cfg2, port2 = write_config(
                tmp_path,
                broker,
                const_model,
                endpoint,
                name="auth",
                username="cam",
                password_file=str(tmp_path / "pw"),
            )
            with uplink(cfg2, log):
                wait_until(lambda: recorder.payloads(f"edge-agent/{DEVICE}/status")[-1:] == [b"online"], 30)
                # Results the broker refuses for good are dropped and counted, not retried forever.
                wait_until(lambda: metric(port2, "rejected") >= 20, 30, message="refused results counted")
                # rejected first: counted after the spool's dropped, so a later scrape of dropped
                # can only be as high or higher
                rejected = metric(port2, "rejected")
                assert metric(port2, "dropped") >= rejected - metric(port2, "spool_messages")
                assert metric(port2, "sent") == 0 and not det(recorder)
                assert recorder.bodies("/health"), "what the ACL allows still goes"


def test_results_go_over_tls_and_a_broker_of_another_ca_is_refused(tmp_path, const_model, endpoint):
    ca, cert, key = make_tls(tmp_path)
    (tmp_path / "other").mkdir()
    other_ca, _, _ = make_tls(tmp_path / "other")
    with Mosquitto(tmp_path, f"allow_anonymous true\ncafile {ca}\ncertfile {cert}\nkeyfile {key}") as broker:
        tls_url = broker.url.replace("mqtt://", "mqtts://")
        recorder = Recorder(broker, f"edge-agent/{DEVICE}/det/#", ca_file=str(ca))
        with started(load_config(str(write_config(tmp_path, broker, const_model, endpoint)[0]))):
            cfg, port = write_config(
                tmp_path, broker, const_model, endpoint, name="tls", broker=tls_url, ca_file=str(ca)
            )
            with uplink(cfg, tmp_path / "tls.log"):
                wait_until(lambda: len(det(recorder)) >= 10, 30, message="results over TLS")
            # The same broker, checked against another CA: not connected, spooling, no crash.
            cfg, port = write_config(
                tmp_path, broker, const_model, endpoint, name="wrong", broker=tls_url, ca_file=str(other_ca)
            )
            with uplink(cfg, tmp_path / "wrong.log") as proc:
                wait_until(lambda: metric(port, "spool_messages") >= 10, 30, message="spooling")
                assert metric(port, "connected") == 0 and metric(port, "sent") == 0 and proc.poll() is None


@pytest.mark.parametrize(
    "uplink_section, expected",
    [
        ({"broker": "http://broker:1883"}, "uplink.broker: expected mqtt://host[:port] or mqtts://"),
        ({"broker": "mqtt://broker:99999"}, "uplink.broker: bad port"),
        ({"broker": "mqtt://broker", "ca_file": "CA"}, "uplink.broker: TLS files are set: use mqtts://"),
        ({"broker": "mqtts://broker", "ca_file": "CA"}, "uplink TLS: cannot use"),
        ({"username": "u", "password_file": "missing"}, "uplink.password_file"),
    ],
)
def test_bad_broker_settings_fail_clearly_without_a_restart_loop(tmp_path, uplink_section, expected):
    (tmp_path / "CA").write_text("not a certificate\n")
    section = {**uplink_section, "spool_path": str(tmp_path / "spool.sqlite")}
    if section.get("ca_file"):
        section["ca_file"] = str(tmp_path / "CA")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(json.dumps({"uplink": section}))
    out = run_process(agent_command("uplink", "--config", str(cfg)), timeout_s=60)
    assert out.returncode == 2, out.stderr  # the unit's RestartPreventExitStatus=2
    assert expected in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
