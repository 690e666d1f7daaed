"""The uplink tracks a bounded number of sources and forgets the least recently seen: a
local process that publishes many fake source names while the agent is down cannot lock
out a real source seen later (review of issue 30, item 5), and the figures stay bounded."""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
from broker import Mosquitto, Recorder
from test_uplink import DEVICE, metric, uplink, write_config
from test_uplink_foreign_input import frame, impostor, result

from edge_agent.service.uplink.forward import FORGOTTEN, ForwardAll, Summarize
from edge_agent.service.uplink.process import _MAX_SOURCES
from edge_agent.service.uplink.validate import finite_number

FAKES = [f"fake{i}" for i in range(_MAX_SOURCES + 44)]


def beat(source: str) -> dict[str, Any]:
    return {"source": source, "ts_unix_s": time.time(), "counts": {"dropped": 0}}


@pytest.fixture
def broker(tmp_path):
    with Mosquitto(tmp_path) as b:
        yield b


def test_fake_source_names_never_lock_out_a_real_source(tmp_path, broker, const_model, endpoint):
    cfg, port = write_config(tmp_path, broker, const_model, endpoint)
    recorder = Recorder(broker, f"edge-agent/{DEVICE}/det/real", f"edge-agent/{DEVICE}/health")
    log = tmp_path / "uplink.log"
    fakes = [frame(f"det.{s}", result(s, 1)) for s in FAKES] + [frame("health", beat(s)) for s in FAKES]
    try:
        with impostor(endpoint) as sock, uplink(cfg, log):
            # Every round: every fake name, then the real source (bounded: 60 rounds at most,
            # about 0.25 s apart; each round is ~600 messages, under the socket's HWM).
            seq, end = 0, time.monotonic() + 30
            while time.monotonic() < end and len(recorder.bodies("/det/real")) < 5:
                for f in fakes:
                    sock.send(f)
                seq += 1
                sock.send(frame("det.real", result("real", seq)))
                sock.send(frame("health", beat("real")))
                time.sleep(0.25)
            assert metric(port, "received") >= len(fakes), "the fakes reached the uplink"
            assert len(recorder.bodies("/det/real")) >= 5, "the real source is forwarded after the fakes"
            time.sleep(1.2)  # the next health (every 0.5 s) has the real source's heartbeat
            sources = recorder.bodies("/health")[-1]["sources"]
            assert "real" in sources and len(sources) <= _MAX_SOURCES, len(sources)
    finally:
        recorder.close()
    assert "Traceback" not in log.read_text()


def test_a_forgotten_source_keeps_its_counts():
    fwd = ForwardAll(max_rate_hz=1.0)
    body = result("cam0", 1)
    assert fwd.offer("det.cam0", body, 0.0) and not fwd.offer("det.cam0", body, 0.1)
    assert fwd.forget("cam0", 0.2) == [] and fwd.rate_limited == {FORGOTTEN: 1}
    assert fwd.offer("det.cam0", body, 0.3), "a forgotten source starts afresh"

    summ = Summarize(10.0)
    summ.offer("det.cam0", result("cam0", 1), 0.0)
    summ.offer("det.cam0", result("cam0", 2), 1.0)
    [(topic, summary)] = summ.forget("cam0", 2.0)
    assert topic == "summary/cam0" and summary["frames"] == 2, "its open interval is sent, not lost"
    assert summ.flush(20.0, final=True) == []


NUMBERS = [(1, True), (0.5, True), (-3, True), (True, False), (False, False), (math.nan, False)]
NUMBERS += [(math.inf, False), (-math.inf, False), ("1", False), (None, False), ([1], False)]


@pytest.mark.parametrize(("value", "ok"), NUMBERS)
def test_finite_number_is_the_one_rule_for_numbers(value, ok):
    assert finite_number(value) is ok
