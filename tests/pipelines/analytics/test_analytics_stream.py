"""Zones and lines in a real agent (bundled detector, synthetic camera whose objects come
and go): events on ``event.<source>`` in the schema, numbered without gaps, the running
counts in each result equal to the events before it, the heartbeat's and the metrics'
counts; a reload that keeps what did not change, and one with a bad label that is refused."""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import replace

import jsonschema
import pytest
from conftest import REPO, free_endpoint, started, wait_until
from helpers import Subscriber

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig, TrackerConfig
from edge_agent.pipelines.steps.base import StepContext
from edge_agent.pipelines.steps.registry import build_steps
from edge_agent.service.metrics import AgentCollector
from edge_agent.service.runner import Agent

V2 = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())
HALF = ZoneConfig(name="left", points=((0, 0), (0.5, 0), (0.5, 1), (0, 1)), min_frames=2, dwell_s=(0.5,))
DOOR = LineConfig(name="door", points=((0.5, 0), (0.5, 1)), min_frames=2)


def config(analytics: AnalyticsConfig) -> AgentConfig:
    source = SyntheticSourceConfig(
        fps=60, seed=3, num_objects=8, world_margin=0.1, max_speed_px=8.0, analytics=analytics
    )
    return AgentConfig(
        device_id="analytics-device",
        source=source,
        publish=PublishConfig(endpoint=free_endpoint(), health_interval_s=0.2, wait_for_subscribers=1),
    )


def events_of(sub: Subscriber) -> list[dict]:
    return [m for t, m in zip(list(sub.topics), list(sub.messages)) if t.startswith("event.")]


def test_events_and_counts_agree_in_a_running_agent():
    cfg = config(AnalyticsConfig(zones=(HALF,), lines=(DOOR,)))
    sub = Subscriber(cfg.publish.endpoint, keep_all=True)
    with started(Agent(cfg), sub, clean=True) as agent:
        wait_until(
            lambda: {e["kind"] for e in events_of(sub)} >= {"enter", "exit", "cross", "dwell"}
            and sub.topics.count("det.cam0") > 20,  # a busy machine delivers results later
            90,
            message="every kind of event, and more than 20 results",
        )
        families = {f.name for f in AgentCollector(agent).collect()}
    assert {
        "edge_agent_zone_objects",
        "edge_agent_line_crossings",
        "edge_agent_zone_dwell_seconds",
    } <= families
    validator = jsonschema.Draft202012Validator(V2)
    stream = list(zip(sub.topics, sub.messages))
    for topic, m in stream:
        assert validator.is_valid(m), (topic, sorted(e.message for e in validator.iter_errors(m)))
    events = [m for t, m in stream if t == "event.cam0"]
    assert [e["seq"] for e in events] == list(range(len(events))), "numbered from 0, no gap"
    assert len({e["run_id"] for e in events}) == 1
    # each result's counts are the events published before it, exactly
    seen = {"enter": 0, "exit": 0, "in": 0, "out": 0}
    ids = set()
    checked = 0
    for topic, m in stream:
        if topic == "event.cam0":
            seen[m.get("direction", m["kind"])] = seen.get(m.get("direction", m["kind"]), 0) + 1
        elif topic == "det.cam0":
            ids |= {d["track_id"] for d in m["detections"]}
            zone, line = m["analytics"]["zones"]["left"], m["analytics"]["lines"]["door"]
            assert (zone["entered"], zone["exited"]) == (seen["enter"], seen["exit"])
            assert zone["objects"] == seen["enter"] - seen["exit"] >= 0
            assert (line["in"], line["out"]) == (seen["in"], seen["out"])
            checked += 1
    assert checked > 20
    assert {e["track_id"] for e in events} <= ids, "events only of tracks the stream showed"
    for e in events:
        if e["kind"] == "exit" and e["reason"] == "left":
            assert e["dwell_s"] == pytest.approx(e["at_unix_s"] - e["entered_unix_s"], abs=1e-3)
    beat = [m for t, m in stream if t == "health"][-1]["analytics"]
    assert sum(beat["zones"]["left"]["entered"].values()) <= seen["enter"]
    assert beat["events"] <= len(events)


def test_a_reload_keeps_the_counts_of_what_it_did_not_change_and_refuses_a_bad_label():
    cfg = config(AnalyticsConfig(zones=(HALF,), lines=(DOOR,)))
    sub = Subscriber(cfg.publish.endpoint, "event.", keep_all=True)
    with started(Agent(cfg), sub, clean=True) as agent:
        counter = lambda: agent.pipeline._lanes[0].steps[-1].counter  # noqa: E731
        wait_until(
            lambda: counter().entered.sum() >= 2 and counter().crossed.sum() >= 2,
            90,
            message="entries and crossings",
        )
        moved = replace(DOOR, points=((0.25, 0), (0.25, 1)))
        new = replace(
            cfg, source=replace(cfg.source, analytics=AnalyticsConfig(zones=(HALF,), lines=(moved,)))
        )
        before = counter()
        entered, seq = before.entered.sum(), agent.pipeline._lanes[0].steps[-1].seq
        assert agent.reload(new) == ["source"]
        after = counter()
        assert after is not before
        assert after.entered.sum() >= entered, "the zone did not change: its counts go on"
        assert agent.pipeline._lanes[0].steps[-1].seq >= seq, "event numbers go on"
        # a label the model does not have: refused, the running config stays
        bad = replace(HALF, labels=("person",))
        wrong = replace(cfg, source=replace(cfg.source, analytics=AnalyticsConfig(zones=(bad,))))
        with pytest.raises(ConfigError, match=r"source\.analytics\.zones\[0\]\.labels: label 'person'"):
            agent.reload(wrong)
        assert agent.config == new
        wait_until(lambda: len(events_of(sub)) >= 3, 60, message="events after the reloads")
    events = events_of(sub)
    assert [e["seq"] for e in events] == list(range(len(events))), "one numbering across the reloads"
    assert all(e["line"] == "door" for e in events if e["kind"] == "cross")


def step_names(cfg: AgentConfig) -> list[str]:
    """The per-frame steps the registered plug-ins build for ``cfg``'s source, in order."""
    ctx = StepContext(cfg.source, "source", "m.onnx", ("0",), "dev", "run", lambda t, b: None, lambda m: b"")
    return [s.name for s in build_steps(ctx)]


def test_no_zones_no_step_and_analytics_needs_the_tracker():
    assert step_names(config(AnalyticsConfig())) == ["tracking"]
    assert step_names(config(AnalyticsConfig(zones=(HALF,)))) == ["tracking", "analytics"]
    with pytest.raises(ValueError, match="tracker is off"):
        SyntheticSourceConfig(tracker=TrackerConfig(type="none"), analytics=AnalyticsConfig(zones=(HALF,)))


def test_the_client_parses_an_event_and_listen_prints_it():
    from argparse import Namespace

    from edge_agent.client import Event, GapTracker, parse
    from edge_agent.commands.stream import _print_message

    body = {
        "schema": 2, "type": "event", "device": "d", "source": "cam0", "run_id": "r1", "seq": 4,
        "kind": "exit", "zone": "left", "track_id": 42, "label": "person", "class_id": 0,
        "frame_id": 90, "at_unix_s": 1796000000.5, "entered_unix_s": 1796000000.0, "dwell_s": 0.5,
        "reason": "left",
    }  # fmt: skip
    assert jsonschema.Draft202012Validator(V2).is_valid(body)
    msg = parse("event.cam0", body, 2)
    assert isinstance(msg, Event)
    got = (msg.kind, msg.where, msg.direction, msg.track_id, msg.seq, msg.gap)
    assert got == ("exit", "left", None, 42, 4, 2)
    gaps = GapTracker()
    gaps.update("event.cam0", 4)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _print_message(Namespace(json=False), "event.cam0", body, msg, gaps, False)
    assert out.getvalue() == "cam0 event 4 (lost 2): exit left person#42 after 0.5 s frame=90\n"
