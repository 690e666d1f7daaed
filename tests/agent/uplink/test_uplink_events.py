"""Zone and line events through the uplink's parts (issue 33, "up the fleet"), with explicit
times: the check of an event (message-v2's ``$defs/event``, sizes, the config's name rule),
``WithEvents`` over every policy (every event, unchanged, in order, never capped), the
summary's event counts and analytics block, and the ``events`` of the health and of
`fleet status`. The same over a real broker: test_uplink_events_mqtt.py."""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from conftest import REPO

from edge_agent.core.analytics_config import MAX_ITEMS
from edge_agent.core.configload import ConfigError
from edge_agent.core.uplink_config import UplinkConfig
from edge_agent.service.uplink.forward import FORWARDERS, ForwardNone, Summarize, WithEvents, make_forwarder
from edge_agent.service.uplink.status import health_problem, row, table
from edge_agent.service.uplink.summary import MAX_EVENT_NAMES
from edge_agent.service.uplink.validate import MAX_EVENT_BYTES, frame_problem, message_problem

T0 = 1764582000.25
RUN = "0123456789abcdef"
KINDS = ("enter", "cross", "exit", "dwell")
DETECTION = {"label": "circle", "class_id": 0, "score": 0.9, "box_xyxy": [0, 0, 1, 1]}
V2 = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())


def event(
    source: str, seq: int, kind: str | None = None, zone: str = "door", line: str = "gate", run_id: str = RUN
) -> dict[str, Any]:
    """An event as the agent publishes it (pipelines/analytics/step.py); the kind cycles
    through the four when not given."""
    kind = kind or KINDS[seq % 4]
    at = T0 + seq / 10
    body: dict[str, Any] = {
        "schema": 2,
        "type": "event",
        "device": "cam-1",
        "source": source,
        "run_id": run_id,
        "seq": seq,
        "kind": kind,
        "track_id": 1 + seq % 7,
        "label": "circle",
        "class_id": 0,
        "frame_id": 100 + seq,
        "at_unix_s": at,
    }
    if kind == "cross":
        body |= {"line": line, "direction": "in" if seq % 3 else "out"}
    else:
        body["zone"] = zone
    if kind == "exit":
        body |= {"entered_unix_s": at - 1.5, "dwell_s": 1.5, "reason": "left" if seq % 2 else "lost"}
    if kind == "dwell":
        body |= {"entered_unix_s": at - 5.0, "threshold_s": 5.0}
    return body


def result(source: str, seq: int, block: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema": 2,
        "device": "cam-1",
        "source": source,
        "seq": seq,
        "frame_id": seq,
        "latency_ms": {"total": 10.0},
        "deadline_missed": False,
        "throttled": False,
        "detections": [],
    }
    if block is not None:
        body["analytics"] = block
    return body


def block(entered: int, crossed_in: int = 0) -> dict[str, Any]:
    return {
        "zones": {"door": {"objects": 1, "entered": entered, "exited": entered - 1}},
        "lines": {"gate": {"in": crossed_in, "out": 0}},
    }


def test_the_fixtures_are_what_the_schema_allows():
    validator = jsonschema.Draft202012Validator({"$defs": V2["$defs"], "$ref": "#/$defs/event"})
    for seq in range(8):
        body = event("cam0", seq)
        assert validator.is_valid(body), sorted(e.message for e in validator.iter_errors(body))
    blocks = jsonschema.Draft202012Validator({"$defs": V2["$defs"], "$ref": "#/$defs/analytics_block"})
    assert blocks.is_valid(block(3, 2))


# -- the check ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_a_good_event_of_each_kind_passes(kind):
    assert message_problem("event.cam0", event("cam0", 5, kind), "det.") is None


def _without(key: str):
    return lambda b: {k: v for k, v in b.items() if k != key}


BAD_EVENTS = [
    ("schema 1", "enter", lambda b: b | {"schema": 1}, "schema 2"),
    ("type result", "enter", lambda b: b | {"type": "result"}, "type event"),
    ("seq negative", "enter", lambda b: b | {"seq": -1}, "seq"),
    ("seq a string", "enter", lambda b: b | {"seq": "7"}, "seq"),
    ("seq a bool", "enter", lambda b: b | {"seq": True}, "seq"),
    ("no run_id", "enter", _without("run_id"), "run_id"),
    ("empty run_id", "enter", lambda b: b | {"run_id": ""}, "run_id"),
    ("long run_id", "enter", lambda b: b | {"run_id": "r" * 129}, "run_id"),
    ("run_id escape", "enter", lambda b: b | {"run_id": "r\x1b[2J"}, "run_id"),
    ("track 0", "enter", lambda b: b | {"track_id": 0}, "track_id"),
    ("no frame_id", "enter", _without("frame_id"), "frame_id"),
    ("at NaN", "enter", lambda b: b | {"at_unix_s": float("nan")}, "at_unix_s"),
    ("label a list", "enter", lambda b: b | {"label": ["x"]}, "label"),
    ("label huge", "enter", lambda b: b | {"label": "x" * 2000}, "label"),
    ("kind unknown", "enter", lambda b: b | {"kind": "loiter"}, "kind"),
    ("zone a path", "enter", lambda b: b | {"zone": "a/b"}, "zone"),
    ("zone a wildcard", "enter", lambda b: b | {"zone": "a#"}, "zone"),
    ("zone a space", "enter", lambda b: b | {"zone": "front door"}, "zone"),
    ("zone too long", "enter", lambda b: b | {"zone": "z" * 129}, "zone"),
    ("zone a number", "enter", lambda b: b | {"zone": 3}, "zone"),
    ("enter with a line", "enter", lambda b: b | {"line": "gate"}, "no line"),
    ("cross with a zone", "cross", lambda b: b | {"zone": "door"}, "no zone"),
    ("cross no line", "cross", _without("line"), "line"),
    ("cross sideways", "cross", lambda b: b | {"direction": "up"}, "direction"),
    ("exit no reason", "exit", _without("reason"), "reason"),
    ("exit odd reason", "exit", lambda b: b | {"reason": "gone"}, "reason"),
    ("exit negative dwell", "exit", lambda b: b | {"dwell_s": -1.0}, "dwell_s"),
    ("dwell no threshold", "dwell", _without("threshold_s"), "threshold_s"),
    ("dwell threshold inf", "dwell", lambda b: b | {"threshold_s": float("inf")}, "threshold_s"),
    ("device a number", "enter", lambda b: b | {"device": 1}, "device"),
    ("another source", "enter", lambda b: b | {"source": "cam1"}, "source"),
    ("no source", "enter", _without("source"), "source"),
]


@pytest.mark.parametrize(("why", "kind", "change", "named"), BAD_EVENTS, ids=[b[0] for b in BAD_EVENTS])
def test_a_bad_event_is_refused_saying_why(why, kind, change, named):
    problem = message_problem("event.cam0", change(event("cam0", 5, kind)), "det.")
    assert problem is not None and named in problem, (why, problem)


@pytest.mark.parametrize("source", ["a#b", "a/b", "nul\x00", "x" * 200, ""])
def test_an_event_topic_with_a_bad_source_is_refused(source):
    assert message_problem(f"event.{source}", event(source, 0), "det.") is not None


def test_an_event_is_bounded_before_it_is_decoded():
    small = b"event.cam0 " + json.dumps(event("cam0", 0)).encode()
    assert frame_problem(small) is None
    big = b"event.cam0 " + json.dumps(event("cam0", 0) | {"label": "x" * MAX_EVENT_BYTES}).encode()
    assert "over 16384" in (frame_problem(big) or "")
    # a result of that size is still taken: the event bound is the events' own
    assert frame_problem(b"det.cam0 " + big[11:]) is None


BAD_BLOCKS = [
    ("not an object", []),
    ("no lines", {"zones": {}}),
    ("a count below 0", {"zones": {"door": {"objects": -1, "entered": 0, "exited": 0}}, "lines": {}}),
    ("a count missing", {"zones": {"door": {"objects": 0, "entered": 0}}, "lines": {}}),
    ("a bad name", {"zones": {}, "lines": {"a/b": {"in": 0, "out": 0}}}),
    (
        "too many",
        {"zones": {f"z{i}": {"objects": 0, "entered": 0, "exited": 0} for i in range(33)}, "lines": {}},
    ),
]


@pytest.mark.parametrize(("why", "bad"), BAD_BLOCKS, ids=[b[0] for b in BAD_BLOCKS])
def test_a_result_with_a_bad_analytics_block_is_refused(why, bad):
    assert message_problem("det.cam0", result("cam0", 0, block(1)), "det.") is None
    problem = message_problem("det.cam0", result("cam0", 0) | {"analytics": bad}, "det.")
    assert problem is not None and "analytics" in problem, (why, problem)


# -- every policy forwards every event ------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(FORWARDERS))
def test_every_policy_with_events_forwards_each_event_unchanged_and_in_order(kind):
    fwd = make_forwarder(kind, 0.5, 2.0, run="r1", events=True)  # a cap that would thin results
    assert isinstance(fwd, WithEvents)
    sent, events = [], []
    for i in range(40):  # 40 events at 20 a second on two sources, results between them
        t = T0 + i * 0.05
        e = event(f"cam{i % 2}", i // 2)
        events.append(e)
        sent += fwd.offer(f"event.{e['source']}", e, t)
        sent += fwd.offer("det.cam0", result("cam0", i) | {"detections": [DETECTION]}, t + 0.01)
        sent += fwd.flush(t + 0.02)
    sent += fwd.flush(T0 + 3, final=True)
    forwarded = [(sub, body) for sub, body in sent if sub.startswith("event/")]
    assert [body for _, body in forwarded] == events
    assert all(a is b for (_, a), b in zip(forwarded, events)), "the bodies themselves, unchanged"
    assert [sub for sub, _ in forwarded] == [f"event/{e['source']}" for e in events]
    assert not [sub for sub in fwd.rate_limited if sub.startswith("event/")], "no event is capped"
    others = {sub.split("/")[0] for sub, _ in sent} - {"event"}
    assert others == {"none": set(), "summary": {"summary"}}.get(kind, {"det"})
    if kind in ("all", "with_detections"):
        assert fwd.rate_limited.total > 0, "the cap thinned the results, never the events"


@pytest.mark.parametrize("kind", sorted(FORWARDERS))
def test_without_events_no_policy_sends_one(kind):
    fwd = make_forwarder(kind, 1.0, 0, events=False)
    sent = [m for i in range(8) for m in fwd.offer("event.cam0", event("cam0", i), T0 + i)]
    sent += fwd.flush(T0 + 20, final=True)
    assert not [sub for sub, _ in sent if sub.startswith("event/")]


def test_forward_none_sends_nothing_but_with_events_sends_the_events():
    fwd = make_forwarder("none", 1.0, 0)
    assert isinstance(fwd, ForwardNone)
    assert fwd.offer("det.cam0", result("cam0", 0), T0) == [] and fwd.flush(T0 + 9, final=True) == []
    e = event("cam0", 0)
    assert make_forwarder("none", 1.0, 0, events=True).offer("event.cam0", e, T0) == [("event/cam0", e)]


def test_the_uplink_config_takes_events_and_forward_none_and_refuses_odd_values(tmp_path):
    from edge_agent.core.config import load_config

    assert UplinkConfig().events is True and UplinkConfig().forward == "summary"
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({"uplink": {"forward": "none", "events": False}}))
    up = load_config(str(path)).uplink
    assert (up.forward, up.events) == ("none", False)
    for bad in ({"events": "sometimes"}, {"forward": "events"}):
        path.write_text(json.dumps({"uplink": bad}))
        with pytest.raises(ConfigError, match=f"uplink.{next(iter(bad))}"):
            load_config(str(path))


# -- the summary counts the events ----------------------------------------------------------


def summaries(sent: list[tuple[str, dict[str, Any]]], source: str = "cam0") -> list[dict[str, Any]]:
    return [b for sub, b in sent if sub == f"summary/{source}"]


def test_a_summary_counts_its_events_by_kind_zone_and_line_and_carries_the_latest_block():
    fwd = Summarize(1.0)
    fwd.offer("det.cam0", result("cam0", 0, block(1)), T0)
    for seq, (kind, zone, line) in enumerate(
        [("enter", "door", ""), ("enter", "yard", ""), ("cross", "", "gate"), ("exit", "door", "")]
    ):
        fwd.offer("event.cam0", event("cam0", seq, kind, zone=zone or "door", line=line or "gate"), T0 + 0.1)
    fwd.offer("det.cam0", result("cam0", 1, block(2, 1)), T0 + 0.5)
    (s,) = summaries(fwd.flush(T0 + 1.0))
    assert s["analytics"] == block(2, 1), "the last result's running counts"
    assert s["events"] == {
        "total": 4,
        "by_kind": {"enter": 2, "cross": 1, "exit": 1},
        "zones": {"door": {"enter": 1, "exit": 1, "dwell": 0}, "yard": {"enter": 1, "exit": 0, "dwell": 0}},
        "lines": {"gate": {"in": 1, "out": 0}},  # seq 2: direction in
        "other": 0,
    }
    # An interval with events only is reported (frames 0, no block); one with nothing is not.
    fwd.offer("event.cam0", event("cam0", 4, "dwell"), T0 + 1.5)
    (s,) = summaries(fwd.flush(T0 + 2.0))
    assert (s["frames"], s["analytics"], s["events"]["by_kind"]) == (0, None, {"dwell": 1})
    assert fwd.flush(T0 + 3.5) == []


def test_the_summary_block_holds_only_the_schemas_fields():
    odd = block(1) | {"extra": list(range(100))}
    odd["zones"]["door"]["secret"] = "x" * 1000
    fwd = Summarize(1.0)
    fwd.offer("det.cam0", result("cam0", 0, odd), T0)
    (s,) = summaries(fwd.flush(T0 + 1.0))
    assert s["analytics"] == block(1)


def test_the_zones_and_lines_a_summary_breaks_out_are_bounded_and_nothing_goes_uncounted():
    fwd = Summarize(1.0)
    n = MAX_EVENT_NAMES + 10
    for i in range(n):
        fwd.offer("event.cam0", event("cam0", i, "enter", zone=f"z{i}"), T0 + i / (2 * n))
    (s,) = summaries(fwd.flush(T0 + 1.0))
    ev = s["events"]
    assert len(ev["zones"]) == MAX_EVENT_NAMES == 4 * MAX_ITEMS
    assert (ev["total"], ev["by_kind"], ev["other"]) == (n, {"enter": n}, 10)


def test_every_event_is_counted_in_exactly_one_summary_over_a_random_stream():
    rng = random.Random(7)
    fwd = make_forwarder("summary", 0.5, 0, events=True)
    arrivals: list[tuple[float, dict[str, Any]]] = []
    sent: list[tuple[str, dict[str, Any]]] = []
    t, seq, frame = T0, 0, 0
    last_block: dict[float, dict[str, Any]] = {}
    while t < T0 + 12:
        t += rng.uniform(0.0, 0.3) if rng.random() > 0.02 else rng.uniform(1.0, 2.0)  # pauses too
        if rng.random() < 0.4:
            e = event(
                "cam0",
                seq,
                rng.choice(KINDS),
                zone=rng.choice(("door", "yard")),
                line=rng.choice(("gate", "fence")),
            )
            seq += 1
            arrivals.append((t, e))
            sent += fwd.offer("event.cam0", e, t)
        else:
            b = block(frame + 1, frame)
            frame += 1
            last_block[t] = b
            sent += fwd.offer("det.cam0", result("cam0", frame, b), t)
        sent += fwd.flush(t + 0.01)
    sent += fwd.flush(t + 0.02, final=True)
    forwarded = [b for sub, b in sent if sub == "event/cam0"]
    assert forwarded == [e for _, e in arrivals], "every event forwarded, in order"
    sums = summaries(sent)
    assert [s["seq"] for s in sums] == list(range(len(sums)))
    assert sum(s["events"]["total"] for s in sums) == len(arrivals)
    for s in sums:
        inside = [e for at, e in arrivals if s["start_unix_s"] <= at < s["end_unix_s"] + 1e-9]
        kinds: dict[str, int] = {}
        for e in inside:
            kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
        assert s["events"]["total"] == len(inside) and s["events"]["by_kind"] == kinds, s
        zones = s["events"]["zones"]
        for z in ("door", "yard"):
            for k in ("enter", "exit", "dwell"):
                want = sum(1 for e in inside if e["kind"] == k and e.get("zone") == z)
                assert zones.get(z, {}).get(k, 0) == want
        for ln in ("gate", "fence"):
            for d in ("in", "out"):
                want = sum(
                    1 for e in inside if e["kind"] == "cross" and e["line"] == ln and e["direction"] == d
                )
                assert s["events"]["lines"].get(ln, {}).get(d, 0) == want
        mine = [b for at, b in last_block.items() if s["start_unix_s"] <= at < s["end_unix_s"] + 1e-9]
        assert s["analytics"] == (mine[-1] if mine else None)


# -- the health and fleet status ------------------------------------------------------------


def health(now: float, sources: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "device": "d",
        "ts_unix_s": now,
        "health_interval_s": 5.0,
        "agent_silent_s": 0.1,
        "agent_silent_after_s": 2.0,
        "config_hash": "abc",
        "sources": sources,
        **more,
    }


def test_fleet_status_sums_the_sources_events_and_shows_a_dash_without_zones():
    now = T0
    src = {"fps": 30.0, "miss_rate": 0.0, "e2e_p99_ms": 9.0}
    counted = health(
        now, {"a": src | {"events": 3}, "b": src | {"events": 4}, "c": src}, events_interval_s=5.0
    )
    r = row("d", "online", counted, now)
    assert (r["events"], r["events_interval_s"]) == (7, 5.0)
    none = row("e", "online", health(now, {"a": src}, events_interval_s=5.0), now)
    assert (none["events"], none["events_interval_s"]) == (None, None)
    lines = table([r, none]).splitlines()
    assert "events" in lines[0] and "7/5s" in lines[1] and "7/5s" not in lines[2]


@pytest.mark.parametrize("events", [-1, "12", 1.5, True, None])
def test_a_health_with_an_odd_events_count_is_invalid(events):
    src = {"fps": 30.0, "events": events}
    assert "events" in (health_problem(health(T0, {"a": src}), T0) or "")


def test_a_health_with_an_odd_events_interval_is_invalid():
    assert "events_interval_s" in (health_problem(health(T0, {}, events_interval_s="5"), T0) or "")


# -- the uplink's wiring --------------------------------------------------------------------


@pytest.mark.parametrize("events", [True, False])
def test_the_uplink_adds_the_events_as_its_config_says(tmp_path, endpoint, events):
    from edge_agent.core.config import AgentConfig
    from edge_agent.core.publish_config import PublishConfig
    from edge_agent.service.uplink.process import Uplink

    up = UplinkConfig(spool_path=str(tmp_path / "spool.sqlite"), events=events)
    uplink = Uplink(AgentConfig(publish=PublishConfig(endpoint=endpoint), uplink=up))
    try:
        assert isinstance(uplink.forwarder, WithEvents) is events
        assert isinstance(getattr(uplink.forwarder, "inner", uplink.forwarder), Summarize)
    finally:
        assert uplink.stop(1.0)


def test_results_on_the_event_or_health_topic_are_refused_by_the_config():
    """Results under ``event`` or ``health`` would be read as events or heartbeats by every
    subscriber, the uplink included: the config refuses such a topic, naming the key."""
    from edge_agent.core.config import AgentConfig
    from edge_agent.core.configload import ConfigError, load

    for topic in ("event", "health"):
        with pytest.raises(
            ConfigError, match=r"a\.yaml:2:\d+: publish\.topic: 'event' and 'health' are the stream"
        ):
            load(AgentConfig, f"publish:\n  topic: {topic}\n", "a.yaml")
