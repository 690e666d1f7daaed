"""Zone and line events through the real uplink to a real Mosquitto (issue 33, "up the
fleet"): a ZeroMQ publisher in the agent's place sends schema-valid events (and bad ones),
or a real agent counts its zones; the uplink runs as `edge-agent uplink`.

Events go up unchanged and in order, a bad one is dropped and counted, summaries count the
events and carry the running counts, the health and `fleet status` show each device's
events, and across a broker outage every event arrives: a consumer that keeps the first of
each (run_id, source, seq) sees exactly the events sent."""

from __future__ import annotations

import collections
import json
import time
from typing import Any

import pytest
import zmq
from broker import Mosquitto, Recorder
from conftest import agent_command, run_process, started, wait_until
from helpers import Subscriber
from test_uplink import DEVICE, metric, uplink, write_config
from test_uplink_events import block, event, result
from test_uplink_foreign_input import frame, impostor

from edge_agent.core.config import load_config
from edge_agent.service.uplink.link import WINDOW

EVENTS = f"edge-agent/{DEVICE}/event"
RATE_HZ = 50  # events a second from the fake agent: ten times the synthetic camera's busy scene


@pytest.fixture
def broker(tmp_path):
    with Mosquitto(tmp_path) as b:
        yield b


def beat(source: str) -> dict[str, Any]:
    """A heartbeat of a source with zones (the uplink counts its events in the health)."""
    return {
        "source": source,
        "ts_unix_s": time.time(),
        "counts": {"dropped": 0},
        "analytics": {"zones": {}, "lines": {}, "events": 0, "overflow": 0},
    }


def join(sock: zmq.Socket, port: int, sources: tuple[str, ...] = ()) -> int:
    """Publish a heartbeat of each of ``sources`` and an event on the source ``probe`` about
    20 times a second until the uplink has read an event (its subscription has reached the
    socket: nothing sent after is lost to ZeroMQ's late joining). The probes sent."""
    sent = 0
    end = time.monotonic() + 30
    while not metric(port, "events") >= 1:
        assert time.monotonic() < end, "the uplink never read the stream"
        for s in sources:
            sock.send(frame("health", beat(s)))
        sock.send(frame("event.probe", event("probe", sent)))
        sent += 1
        time.sleep(0.05)
    return sent


def send_paced(sock: zmq.Socket, bodies: list[dict[str, Any]], rate_hz: float) -> None:
    """Publish ``bodies`` (events) at ``rate_hz``, as a camera's events come: spread out."""
    start = time.monotonic()
    for i, body in enumerate(bodies):
        pause = start + i / rate_hz - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        sock.send(frame(f"event.{body['source']}", body))


def key(body: dict[str, Any]) -> tuple[str, str, int]:
    return body["run_id"], body["source"], body["seq"]


def first_of_each(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a consumer that dedupes by (run_id, source, seq) keeps: the first of each."""
    seen: set[tuple[str, str, int]] = set()
    out = []
    for b in bodies:
        if key(b) not in seen:
            seen.add(key(b))
            out.append(b)
    return out


def test_events_go_up_unchanged_in_order_and_a_bad_one_is_dropped_and_counted(
    tmp_path, broker, const_model, endpoint
):
    cfg, port = write_config(tmp_path, broker, const_model, endpoint, forward="summary", interval_s=0.5)
    recorder = Recorder(
        broker, f"{EVENTS}/#", f"edge-agent/{DEVICE}/summary/#", f"edge-agent/{DEVICE}/health"
    )
    good = [event("cam0", i) for i in range(60)]
    blocks = [block(i + 1, i) for i in range(6)]
    bad = [
        event("cam0", 99) | {"seq": "x"},
        event("cam0", 99) | {"zone": "a/b"},
        event("cam0", 99, "cross") | {"direction": "up"},
        event("cam0", 99) | {"source": "cam1"},
        event("cam0", 99) | {"label": "x" * 20_000},  # over the event bound
        {k: v for k, v in event("cam0", 99).items() if k != "run_id"},
    ]
    log = tmp_path / "uplink.log"
    try:
        with impostor(endpoint) as sock, uplink(cfg, log):
            probes = join(sock, port, ("cam0",))
            for i, e in enumerate(good):
                sock.send(frame("event.cam0", e))
                if i % 10 == 9:
                    sock.send(frame("event.cam0", bad[i // 10]))
                    sock.send(frame("det.cam0", result("cam0", i, blocks[i // 10])))
            sock.send(frame("det.cam0", result("cam0", 99) | {"analytics": {"zones": []}}))  # a bad block
            wait_until(
                lambda: len(recorder.bodies("/event/cam0")) >= len(good), 30, message="the good events"
            )
            wait_until(lambda: metric(port, "rejected") >= len(bad) + 1, 10, message="the bad ones counted")
            assert metric(port, "rejected") == len(bad) + 1
            # the probes the uplink read (those sent before its subscription reached the
            # socket are ZeroMQ's to lose) went up too
            read = len(recorder.bodies("/event/probe"))
            assert 1 <= read <= probes and metric(port, "events") == len(good) + read

            def summed(part: str) -> int:
                return sum(s["events"]["total"] for s in recorder.bodies(f"/summary/{part}"))

            wait_until(lambda: summed("cam0") == len(good), 10, message="every event in a summary")

            def health_events() -> int:
                return sum(h["sources"].get("cam0", {}).get("events", 0) for h in recorder.bodies("/health"))

            wait_until(lambda: health_events() == len(good), 10, message="every event in one health")
            out = run_process(agent_command("fleet", "status", "--broker", broker.url, "--json"), 60)
    finally:
        recorder.close()
    assert recorder.bodies("/event/cam0") == good, "every good event, unchanged, in order, once"
    sums = [s for s in recorder.bodies("/summary/cam0") if s["events"]["total"]]
    kinds = collections.Counter(e["kind"] for e in good)
    totals: collections.Counter[str] = collections.Counter()
    for s in sums:
        totals.update(s["events"]["by_kind"])
    assert totals == kinds
    with_block = [s for s in recorder.bodies("/summary/cam0") if s["analytics"] is not None]
    assert with_block[-1]["analytics"] == blocks[-1], "the latest running counts"
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout.splitlines()[-1])
    assert isinstance(row["events"], int) and row["events_interval_s"] is not None, row
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize(
    "outage_s", [3.0, pytest.param(10.0, marks=pytest.mark.slow, id="10s-the-issue's-check")]
)
def test_every_event_arrives_once_by_seq_across_a_broker_outage(
    tmp_path, broker, const_model, endpoint, outage_s
):
    cfg, port = write_config(
        tmp_path, broker, const_model, endpoint, forward="summary"
    )  # events: the default
    recorder = Recorder(broker, f"{EVENTS}/#")
    before = int(RATE_HZ * 1)
    during = int(RATE_HZ * outage_s)
    after = int(RATE_HZ * 1)
    runs = {"cam0": "run-a", "cam1": "run-b"}
    counts = {"cam0": 0, "cam1": 0}

    def next_events(n: int) -> list[dict[str, Any]]:
        out = []
        for i in range(n):
            source = ("cam0", "cam1")[i % 2]
            out.append(event(source, counts[source], run_id=runs[source]))
            counts[source] += 1
        return out

    sent: list[dict[str, Any]] = []
    try:
        with impostor(endpoint) as sock, uplink(cfg, tmp_path / "uplink.log"):
            join(sock, port)
            sent += next_events(before)
            send_paced(sock, sent, RATE_HZ)
            wait_until(lambda: len(recorder.bodies("/event/cam1")) >= before // 2, 30, message="events flow")
            broker.stop()
            outage = next_events(during)  # keep flowing: the camera does not know
            send_paced(sock, outage, RATE_HZ)
            sent += outage
            assert metric(port, "spool_messages") > 0 and metric(port, "connected") == 0
            broker.start()  # the same port and persistence file
            tail = next_events(after)
            send_paced(sock, tail, RATE_HZ)
            sent += tail

            def delivered() -> bool:
                return {key(b) for b in recorder.bodies("/event/cam0") + recorder.bodies("/event/cam1")} >= {
                    key(b) for b in sent
                }

            wait_until(delivered, 60, interval_s=0.1, message="every event sent arrives")
            wait_until(lambda: metric(port, "spool_messages") == 0, 30, message="the spool empties")
            figures = {n: metric(port, n) for n in ("dropped", "event_gaps", "rejected", "reconnects")}
    finally:
        recorder.close()
    assert (
        figures["reconnects"] >= 1 and figures["dropped"] == figures["event_gaps"] == figures["rejected"] == 0
    )
    for source in ("cam0", "cam1"):
        arrived = recorder.bodies(f"/event/{source}")
        mine = [b for b in sent if b["source"] == source]
        kept = first_of_each(arrived)
        assert kept == mine, f"{source}: exactly the events sent, in order, bodies unchanged"
        duplicates = len(arrived) - len(kept)
        # At least once: what was in flight when the broker went (the uplink's window, and
        # the broker's own to the subscriber) may come twice, nothing more.
        assert duplicates <= 2 * WINDOW, f"{source}: {duplicates} duplicates"
        print(f"{source}: {len(mine)} events sent, {len(arrived)} arrived, {duplicates} duplicates")


def test_a_real_agents_events_and_summaries_agree(tmp_path, broker, endpoint, const_model):
    cfg, _ = write_config(tmp_path, broker, const_model, endpoint, forward="summary", interval_s=0.5)
    text = json.loads(cfg.read_text())
    del text["model"]  # the bundled detector: the synthetic camera's objects, moving
    text["source"] |= {
        "fps": 60,
        "seed": 3,
        "num_objects": 8,
        "world_margin": 0.1,
        "max_speed_px": 8.0,
        "analytics": {
            "zones": [{"name": "left", "points": [[0, 0], [0.5, 0], [0.5, 1], [0, 1]], "min_frames": 2}],
            "lines": [{"name": "door", "points": [[0.5, 0], [0.5, 1]], "min_frames": 2}],
        },
    }
    cfg.write_text(json.dumps(text))
    recorder = Recorder(broker, f"{EVENTS}/cam0", f"edge-agent/{DEVICE}/summary/cam0")
    results = Subscriber(endpoint, "det.cam0", keep_all=True)
    with started(load_config(str(cfg)), recorder, results):
        with uplink(cfg, tmp_path / "uplink.log"):
            wait_until(
                lambda: (
                    len(recorder.bodies("/event/cam0")) >= 10
                    and sum(1 for s in recorder.bodies("/summary/cam0") if s["analytics"]) >= 3
                ),
                90,
                message="events and summaries with running counts",
            )
        # The uplink stopped cleanly: its last summary is out, and every event it read.
        events = recorder.bodies("/event/cam0")

        def counted() -> int:
            return sum(s["events"]["total"] for s in recorder.bodies("/summary/cam0"))

        wait_until(
            lambda: counted() == len(recorder.bodies("/event/cam0")), 15, message="events == summaries"
        )
        events = recorder.bodies("/event/cam0")
    summaries = recorder.bodies("/summary/cam0")
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))
    by_seq = {m["seq"]: m for m in results.messages}
    checked = 0
    for s in summaries:
        if s["frames"] and s["last_seq"] in by_seq:
            assert s["analytics"] == by_seq[s["last_seq"]]["analytics"], "the interval's last running counts"
            checked += 1
    assert checked >= 3
    zones: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[str] = collections.Counter()
    for s in summaries:
        for kind, n in s["events"]["zones"].get("left", {}).items():
            zones[kind] += n
        for direction, n in s["events"]["lines"].get("door", {}).items():
            lines[direction] += n
    assert +zones == collections.Counter(e["kind"] for e in events if e.get("zone") == "left")
    assert +lines == collections.Counter(e["direction"] for e in events if e["kind"] == "cross")
