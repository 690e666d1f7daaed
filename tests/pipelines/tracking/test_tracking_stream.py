"""Tracks in a real agent's stream: each detection's track id and age (schema 2), the
heartbeat's run id and tracker figures, a consumer of schema 1 still reading it, no track
fields when the source does not track, and reloads that keep or restart the tracks."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from types import SimpleNamespace

import jsonschema
import msgpack
import numpy as np
import pytest
from conftest import REPO, free_endpoint, started, wait_until, write_manifest
from helpers import Subscriber

from edge_agent.client import parse
from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig, TrackerConfig
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.tasks.base import DETECT
from edge_agent.service.runner import Agent

V2 = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())
V1 = json.loads((REPO / "pipelines/schema/message-v1.schema.json").read_text())
#: What version 2 added, and where.
V2_ONLY_DETECTION = ("track_id", "track_age")
V2_ONLY_HEALTH = ("run_id", "tracking")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A real ONNX model that always reports the same two boxes: two still objects."""
    tmp = tmp_path_factory.mktemp("tracking")
    out = yolov8_output([(160, 160, 40, 40), (100, 100, 30, 30)], [0, 2], [0.9, 0.8], 4, 2100)
    path = constant_detector(str(tmp / "model.onnx"), out)
    write_manifest(tmp / "manifest.yaml")
    return path


def config(
    model, endpoint: str, tracker: TrackerConfig | None = None, wait: int | None = None
) -> AgentConfig:
    source = SyntheticSourceConfig(fps=50, seed=1, name="cam0")
    if tracker is not None:
        source = replace(source, tracker=tracker)
    return AgentConfig(
        device_id="track-device",
        source=source,
        model=ModelConfig(path=str(model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1, wait_for_subscribers=wait),
    )


def stream_of(cfg: AgentConfig) -> list[tuple[str, dict]]:
    sub = Subscriber(cfg.publish.endpoint)
    try:
        with started(Agent(cfg), clean=True):
            results = lambda: sum(t.startswith("det.") for t in sub.topics)  # noqa: E731
            wait_until(
                lambda: results() >= 15 and sub.topics.count("health") >= 3,
                60,
                message="15 results and 3 heartbeats",
            )
    finally:
        sub.close()
    return list(zip(sub.topics, sub.messages))


@pytest.fixture(scope="module")
def tracked(model) -> list[tuple[str, dict]]:
    """From the first frame on: the agent waits for the subscriber."""
    return stream_of(config(model, free_endpoint(), wait=1))


@pytest.fixture(scope="module")
def untracked(model) -> list[tuple[str, dict]]:
    return stream_of(config(model, free_endpoint(), TrackerConfig(type="none")))


def results(stream):
    return [m for t, m in stream if t.startswith("det.")]


def beats(stream):
    return [m for t, m in stream if t == "health"]


def test_a_tracked_stream_validates_and_carries_stable_ids(tracked):
    validator = jsonschema.Draft202012Validator(V2)
    for _, m in tracked:
        assert validator.is_valid(m), sorted(e.message for e in validator.iter_errors(m))
    res = results(tracked)
    assert all(m["schema"] == 2 for _, m in tracked)
    later = res[3:]  # confirmed after two frames
    ids = {tuple(sorted(d["track_id"] for d in m["detections"])) for m in later}
    assert ids == {(1, 2)}, "two still objects: two ids, the same in every frame"
    ages = [max(d["track_age"] for d in m["detections"]) for m in later]
    assert ages == sorted(ages) and ages[-1] > ages[0], "ages grow"
    first = res[0]["detections"]
    assert all(d["track_id"] is None and d["track_age"] == 0 for d in first), "unconfirmed on its first frame"


def test_the_heartbeat_has_the_run_id_and_the_trackers_figures(tracked):
    hb = beats(tracked)
    assert len({m["run_id"] for m in hb}) == 1 and len(hb[0]["run_id"]) == 16
    t = hb[-1]["tracking"]
    assert t["type"] == "bytetrack" and t["live"] == t["tracked"] == 2 and t["ids_issued"] == 2
    assert t["overflow"] == 0 and t["restarts"] == 0
    assert t["cost_ms"]["cumulative"]["count"] >= 15


def test_an_untracked_source_has_no_track_fields(untracked):
    validator = jsonschema.Draft202012Validator(V2)
    assert all(validator.is_valid(m) for _, m in untracked)
    dets = [d for m in results(untracked) for d in m["detections"]]
    assert dets and not any(set(V2_ONLY_DETECTION) & set(d) for d in dets)
    assert not any("tracking" in m for m in beats(untracked))


def test_a_consumer_of_schema_1_still_reads_it(tracked):
    """Version 2 only added fields: without them (and with its number) every message is a
    valid version 1 message, and the client of either version parses it."""
    v1 = jsonschema.Draft202012Validator(V1)
    for topic, m in tracked:
        old = json.loads(json.dumps(m))
        old["schema"] = 1
        for key in V2_ONLY_HEALTH:
            old.pop(key, None)
        for d in old.get("detections", ()):
            for key in V2_ONLY_DETECTION:
                del d[key]
        assert v1.is_valid(old), (topic, sorted(e.message for e in v1.iter_errors(old)))
        # what a version-1 consumer reads, from the version-2 message itself
        if topic.startswith("det."):
            r = parse(topic, m)
            assert [(d.label, d.box_xyxy) for d in r.detections] == [
                (d["label"], tuple(d["box_xyxy"])) for d in m["detections"]
            ]
    last = parse("det.cam0", results(tracked)[-1])
    assert sorted(d.track_id for d in last.detections) == [1, 2]


def test_msgpack_and_json_carry_the_same_tracks():
    slot = SimpleNamespace(
        task=DETECT,
        det_count=3,
        det_class=np.array([0, 1, 0], np.int32),
        det_score=np.array([0.9, 0.4, 0.8], np.float32),
        det_xyxy=np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], np.float32),
        det_track=np.array([7, 0, 9], np.int64),
        det_track_age=np.array([12, 0, 3], np.int32),
    )
    builder = MessageBuilder("d", ("a", "b"), 50.0, tracks=True)
    as_json = json.loads(builder.detections_json(slot))
    as_objects = msgpack.unpackb(msgpack.packb(builder.detections(slot)), raw=False)
    assert as_json == as_objects
    assert [(d["track_id"], d["track_age"]) for d in as_json] == [(7, 12), (None, 0), (9, 3)]
    plain = MessageBuilder("d", ("a", "b"), 50.0)
    assert not any("track_id" in d for d in json.loads(plain.detections_json(slot)))


def _ids(agent: Agent) -> set[int]:
    (tracker,) = [s for s in agent.pipeline._lanes[0].steps if s.name == "tracking"]
    t = tracker.tracker
    return set(t.ids[: t.n].tolist()) - {0}


def test_a_reload_keeps_the_tracks_unless_the_tracker_changed(model, caplog):
    cfg = config(model, free_endpoint())
    sub = Subscriber(cfg.publish.endpoint, "det")
    try:
        with started(Agent(cfg), sub, clean=True) as agent:
            wait_until(lambda: _ids(agent) == {1, 2}, 30, message="two confirmed tracks")
            # a change that touches neither the model nor the tracker: the tracks go on
            same = replace(cfg, source=replace(cfg.source, priority=5))
            assert agent.reload(same) == ["source"]
            n = len(sub.messages)
            wait_until(lambda: len(sub.messages) >= n + 5, 30, message="results after the reload")
            assert _ids(agent) == {1, 2}
            assert {d["track_id"] for d in sub.messages[-1]["detections"]} == {1, 2}
            snap = agent.pipeline.figures().lanes[0].tracking
            assert snap.restarts == 0
            # the tracker's settings change: it restarts, says so, and ids go on
            caplog.set_level(logging.INFO, logger="edge_agent.pipelines.steps.tracking")
            other = replace(same, source=replace(same.source, tracker=TrackerConfig(lost_frames=10)))
            assert agent.reload(other) == ["source"]
            assert any("tracker restarted: its settings changed" in r.getMessage() for r in caplog.records)
            wait_until(lambda: len(_ids(agent)) == 2, 30, message="two new tracks")
            assert _ids(agent) == {3, 4}, "new tracks, new ids: none reused within the run"
            assert agent.pipeline.figures().lanes[0].tracking.restarts == 1
            # off, then on again: the ids still go on
            off = replace(other, source=replace(other.source, tracker=TrackerConfig(type="none")))
            assert agent.reload(off) == ["source"]
            assert agent.pipeline._lanes[0].steps == ()
            assert agent.reload(other) == ["source"]
            wait_until(lambda: len(_ids(agent)) == 2, 30, message="two tracks again")
            assert _ids(agent) == {5, 6}
            restarts = agent.pipeline.figures().lanes[0].tracking.restarts
            # the same tracker on another input (the camera reopened): its tracks end too
            reopened = replace(other, source=replace(other.source, seed=2))
            assert agent.reload(reopened) == ["source"]
            assert any("tracker restarted: its input changed" in r.getMessage() for r in caplog.records)
            wait_until(lambda: len(_ids(agent)) == 2, 30, message="two tracks on the new input")
            assert _ids(agent) == {7, 8}
            assert agent.pipeline.figures().lanes[0].tracking.restarts == restarts + 1
    finally:
        sub.close()


def test_a_config_without_trackers_runs_no_step(model):
    """Tracking off costs nothing: no post step, no tracker on the lane."""
    off = config(model, free_endpoint(), TrackerConfig(type="none"))
    with Agent(off) as agent:
        assert agent.pipeline._lanes[0].steps == ()
    with Agent(config(model, free_endpoint())) as agent:
        assert [s.name for s in agent.pipeline._lanes[0].steps] == ["tracking"]
