"""Issue 43, trials 2 and 3: stream messages outside the JSON data model (msgpack bytes and
ExtType, NaN and infinities) and heartbeats that would balloon the retained health. Each
costs only itself: real ZeroMQ, the real uplink process and a real Mosquitto."""

from __future__ import annotations

import json
import time
from typing import Any

import msgpack
import pytest
from broker import Mosquitto, Recorder
from conftest import wait_until
from test_uplink import DEVICE, metric, uplink, write_config
from test_uplink_events import event
from test_uplink_foreign_input import frame, impostor, result

from edge_agent.service.uplink.forward import Summarize


@pytest.fixture
def broker(tmp_path):
    with Mosquitto(tmp_path) as b:
        yield b


def strict(payload: bytes) -> Any:
    """JSON as a strict parser reads it: NaN and the infinities are no JSON."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(payload, parse_constant=refuse)


def packed(topic: str, body: dict[str, Any]) -> bytes:
    return topic.encode() + b" " + msgpack.packb(body, use_bin_type=True)


def heartbeat(source: str, **extra: Any) -> dict[str, Any]:
    return {"source": source, "ts_unix_s": time.time(), "counts": {"dropped": 0}, "fps": 10.0} | extra


def poisons() -> list[bytes]:
    """One of each kind of message outside the JSON data model, in both encodings and on
    every topic the uplink reads."""
    ext = msgpack.ExtType(5, b"\x00" * 8)
    return [
        packed("det.cam0", result("cam0", 10**6) | {"extra": b"\x00\xff"}),
        packed("event.cam0", event("cam0", 10**6) | {"note": ext}),
        packed("det.cam0", result("cam0", 10**6, total=float("nan"))),
        packed("event.cam0", event("cam0", 10**6) | {"at_unix_s": float("inf")}),
        packed("health", heartbeat("cam0", version=b"1.0")),
        b"det.cam0 " + json.dumps(result("cam0", 10**6) | {"score": float("nan")}).encode(),
        b"det.cam0 " + json.dumps(result("cam0", 10**6) | {"x": [float("-inf")]}).encode(),
        packed("det.cam0", result("cam0", 10**6) | {"deep": {"k": [{"t": msgpack.Timestamp(1, 0)}]}}),
    ]


def test_poisoned_messages_cost_only_themselves_and_every_valid_one_is_delivered(
    tmp_path, broker, const_model, endpoint
):
    """Trial 2: one poisoned message every 0.2 s (bytes, ExtType, NaN in turn, msgpack and
    JSON); every valid result and event reaches the broker, every poisoned one is dropped
    and counted, the health keeps coming, and every payload is strict JSON."""
    cfg, port = write_config(tmp_path, broker, const_model, endpoint, events=True)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/#")
    bad = poisons()
    try:
        with impostor(endpoint) as sock, uplink(cfg, tmp_path / "uplink.log"):
            warm = 0  # until the uplink's subscription has reached the socket
            end = time.monotonic() + 30
            while not recorder.bodies("/det/probe"):
                assert time.monotonic() < end, "the uplink never forwarded the stream"
                sock.send(frame("det.probe", result("probe", warm)))
                warm += 1
                time.sleep(0.05)
            before = metric(port, "rejected")
            ticks, poisoned = 80, 0
            for i in range(ticks):  # 20 ticks a second, a poisoned message every fourth
                sock.send(packed("det.cam0", result("cam0", i)))
                sock.send(packed("event.cam0", event("cam0", i)))
                sock.send(packed("health", heartbeat("cam0")))
                if i % 4 == 0:
                    sock.send(bad[poisoned % len(bad)])
                    poisoned += 1
                time.sleep(0.05)

            def delivered() -> bool:
                results = {b["seq"] for b in recorder.bodies("/det/cam0")}
                events = {b["seq"] for b in recorder.bodies("/event/cam0")}
                return results >= set(range(ticks)) and events >= set(range(ticks))

            wait_until(delivered, 30, message="every valid result and event on the broker")
            wait_until(lambda: metric(port, "rejected") - before >= poisoned, 10, message="poisons counted")
            assert metric(port, "rejected") - before == poisoned, "each poisoned message counted once"
            assert metric(port, "lost") == 0, "no batch lost for one message in it"
            health_topic = f"edge-agent/{DEVICE}/health"
            n = len(recorder.payloads(health_topic))
            wait_until(
                lambda: len(recorder.payloads(health_topic)) > n + 1,
                10,
                message="the health keeps coming after a poisoned heartbeat",
            )
            last = strict(recorder.payloads(health_topic)[-1])
            assert last["sources"]["cam0"]["fps"] == 10.0
    finally:
        recorder.close()
    with recorder.lock:
        payloads = [(t, p) for t, p, _ in recorder.messages if p.startswith(b"{")]
    for topic, payload in payloads:
        strict(payload)  # raises on NaN or an infinity
        assert b"\x00\xff" not in payload, topic
    assert 10**6 not in {b["seq"] for b in recorder.bodies("/det/cam0")}, "no poisoned result went up"
    assert "Traceback" not in (tmp_path / "uplink.log").read_text()


def test_heartbeats_with_large_maps_keep_the_retained_health_bounded(tmp_path, broker, const_model, endpoint):
    """Trial 3: 60 fake heartbeats, each a valid frame under 1 MiB with a large ``counts``
    map, made a retained health of 52.7 MB; the uplink's health stays within its cap."""
    from edge_agent.service.uplink.process import MAX_HEALTH_BYTES

    cfg, _ = write_config(tmp_path, broker, const_model, endpoint)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/health")
    counts = {f"{k:04d}" + "c" * 800: k for k in range(1000)}
    beats = [frame("health", heartbeat(f"cam{i}", counts=counts)) for i in range(60)]
    assert all(len(b) < 1 << 20 for b in beats)
    topic = f"edge-agent/{DEVICE}/health"
    try:
        with impostor(endpoint) as sock, uplink(cfg, tmp_path / "uplink.log"):

            def all_sources() -> bool:
                for b in beats:
                    sock.send(b)
                payloads = recorder.payloads(topic)
                return bool(payloads) and len(json.loads(payloads[-1])["sources"]) >= 60

            wait_until(all_sources, 60, interval_s=0.5, message="a health holding the 60 sources")
            last = recorder.payloads(topic)[-1]
    finally:
        recorder.close()
    assert len(last) <= MAX_HEALTH_BYTES, f"a retained health of {len(last)} bytes"
    health = json.loads(last)
    for name, line in health["sources"].items():
        assert len(json.dumps(line["counts"])) < 4096, f"{name}: counts capped"


def test_summary_labels_are_bounded_and_every_detection_still_counted():
    """Trial 3: 12,000 distinct labels gave 3.9 MB summaries; past the cap they are counted
    in ``detections_other`` so the total stays exact."""
    fwd = Summarize(1.0)
    total = 0
    for seq in range(120):
        body = result("cam0", seq)
        body["detections"] = [
            {
                "label": f"label-{seq * 100 + k:05d}-" + "x" * 200,
                "class_id": k,
                "score": 0.5,
                "box_xyxy": [0] * 4,
            }
            for k in range(100)
        ]
        total += 100
        fwd.offer("det.cam0", body, 0.001 * seq)
    ((_, summary),) = fwd.flush(2.0)
    size = len(json.dumps(summary))
    assert size < 64 << 10, f"a summary of {size} bytes"
    counted = sum(summary["detections_by_label"].values()) + summary["detections_other"]
    assert counted == total, "every detection counted once, by label or in detections_other"
