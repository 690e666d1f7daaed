"""The JSON Schema of the result stream (version 1), checked against a real agent's messages."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest
from conftest import REPO, free_endpoint, started, wait_until, write_manifest
from helpers import Subscriber

from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.core.stamps import STAGES
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.deadline import DROP_REASONS
from edge_agent.service.runner import Agent

SCHEMA_PATH = REPO / "pipelines/schema/message-v2.schema.json"


@pytest.fixture(scope="module")
def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


@pytest.fixture(scope="module")
def validator(schema) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema)


@pytest.fixture(scope="module")
def stream(tmp_path_factory) -> list[tuple[str, dict]]:
    """About a second of a real agent's stream: results and heartbeats, the final one last."""
    # The const_model and endpoint fixtures, built once for the module (they are per test).
    tmp = tmp_path_factory.mktemp("schema")
    out = yolov8_output([(160, 160, 40, 40), (100, 100, 30, 30)], [0, 2], [0.9, 0.8], 4, 2100)
    model = constant_detector(str(tmp / "model.onnx"), out)
    write_manifest(tmp / "manifest.yaml")
    endpoint = free_endpoint()

    sub = Subscriber(endpoint)
    cfg = AgentConfig(
        device_id="schema-device",
        source=SyntheticSourceConfig(fps=50, seed=1, name="cam0"),
        model=ModelConfig(path=str(model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1),
    )
    agent = Agent(cfg)
    agent.build()
    try:
        with started(agent, clean=True):
            # Enough of both kinds (and results with detections) to check every field.
            wait_until(
                lambda: (
                    sum(t.startswith("det.") for t in sub.topics) >= 20 and sub.topics.count("health") >= 3
                ),
                60,
                message="20 results and 3 heartbeats",
            )
        wait_until(lambda: any(m.get("final") for m in sub.messages), 10, message="the final heartbeat")
    finally:
        sub.close()
    return list(zip(sub.topics, sub.messages))


def test_schema_is_valid_draft_2020_12(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] and schema["title"]
    assert "msgpack" in schema["description"] and "ignore unknown fields" in schema["description"]
    assert {r["$ref"] for r in schema["oneOf"]} == {"#/$defs/result", "#/$defs/health", "#/$defs/event"}


def test_schema_names_exactly_the_code_stages_and_drop_reasons(schema):
    defs = schema["$defs"]
    assert defs["stage"]["enum"] == list(STAGES)
    assert defs["drop_reason"]["enum"] == list(DROP_REASONS)
    lat = defs["result"]["properties"]["latency_ms"]
    assert lat["required"] == [*STAGES, "total"] and list(lat["properties"]) == [*STAGES, "total"]
    assert lat["additionalProperties"] is False
    assert defs["detection"]["additionalProperties"] is False
    counts = defs["health"]["properties"]["counts"]["properties"]
    assert counts["dropped_by_reason"]["required"] == list(DROP_REASONS)
    assert defs["health"]["properties"]["latency_ms"]["properties"]["stages"]["required"] == list(STAGES)
    for kind in ("result", "health"):
        assert defs[kind]["properties"]["schema"]["const"] == SCHEMA_VERSION
        assert defs[kind]["additionalProperties"] is True


def test_every_message_of_a_real_agent_validates(stream, validator):
    results = [(t, m) for t, m in stream if t.startswith("det.")]
    beats = [(t, m) for t, m in stream if t == "health"]
    assert {t for t, _ in stream} == {"det.cam0", "health"}
    assert len(results) >= 20, len(results)
    assert len(beats) >= 3, len(beats)
    assert any(m["detections"] for _, m in results), "the constant model reports boxes"
    assert all("power" in m for _, m in beats), "every heartbeat has the power object"
    for topic, msg in stream:
        errors = sorted(validator.iter_errors(msg), key=lambda e: list(e.path))
        assert not errors, f"{topic}: {[f'{list(e.path)}: {e.message}' for e in errors]}"
    # Each message matches exactly the definition its topic names.
    result_v = validator.evolve(schema={**validator.schema, "oneOf": [{"$ref": "#/$defs/result"}]})
    health_v = validator.evolve(schema={**validator.schema, "oneOf": [{"$ref": "#/$defs/health"}]})
    assert all(result_v.is_valid(m) and not health_v.is_valid(m) for _, m in results)
    assert all(health_v.is_valid(m) and not result_v.is_valid(m) for _, m in beats)
    finals = [m for _, m in beats if "final" in m]
    assert len(finals) == 1 and finals[0] is beats[-1][1] and finals[0]["final"] is True
    assert finals[0]["counts"]["in_flight"] == 0


# -- what the schema must reject --------------------------------------------------------------


@pytest.fixture(scope="module")
def samples(stream) -> tuple[dict, dict]:
    result = next(m for t, m in stream if t.startswith("det.") and m["detections"])
    health = next(m for t, m in stream if t == "health")
    return result, health


def _invalid(validator, msg) -> bool:
    return not validator.is_valid(msg)


def test_samples_are_valid_before_breaking_them(samples, validator):
    result, health = samples
    assert validator.is_valid(result) and validator.is_valid(health)


def test_result_without_seq_fails(samples, validator):
    msg = copy.deepcopy(samples[0])
    del msg["seq"]
    assert _invalid(validator, msg)


def test_detection_score_above_one_fails(samples, validator):
    msg = copy.deepcopy(samples[0])
    msg["detections"][0]["score"] = 1.5
    assert _invalid(validator, msg)


def test_unknown_stage_in_result_latency_fails(samples, validator):
    msg = copy.deepcopy(samples[0])
    msg["latency_ms"]["teleport"] = 0.1
    assert _invalid(validator, msg)


def test_missing_stage_in_result_latency_fails(samples, validator):
    msg = copy.deepcopy(samples[0])
    del msg["latency_ms"]["infer"]
    assert _invalid(validator, msg)


def test_unknown_drop_reason_in_health_fails(samples, validator):
    msg = copy.deepcopy(samples[1])
    msg["counts"]["dropped_by_reason"]["cosmic_ray"] = 1
    assert _invalid(validator, msg)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda m: m["detections"][0].update(extra=1), id="extra-detection-key"),
        pytest.param(lambda m: m["detections"][0].update(box_xyxy=[1.0, 2.0, 3.0]), id="box-of-3"),
        pytest.param(lambda m: m.update(image_wh=[640, 480, 3]), id="image_wh-of-3"),
        pytest.param(lambda m: m.update(schema=1), id="schema-1"),
        pytest.param(lambda m: m.update(capture_mono_ns=1.5), id="float-mono-ns"),
        pytest.param(lambda m: m.update(deadline_missed="no"), id="string-bool"),
    ],
)
def test_other_broken_results_fail(samples, validator, mutate):
    msg = copy.deepcopy(samples[0])
    mutate(msg)
    assert _invalid(validator, msg)


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda m: m["latency_ms"]["stages"].update(x={"p50": 0, "p99": 0, "max": 0}), id="st"),
        pytest.param(lambda m: m.update(final=False), id="final-false"),
        pytest.param(lambda m: m.update(type="status"), id="type"),
        pytest.param(lambda m: m["counts"].pop("in_flight"), id="no-in_flight"),
        pytest.param(lambda m: m.update(event={"kind": "ladder", "from": "full"}), id="short-event"),
    ],
)
def test_other_broken_heartbeats_fail(samples, validator, mutate):
    msg = copy.deepcopy(samples[1])
    mutate(msg)
    assert _invalid(validator, msg)


def test_unknown_top_level_fields_are_allowed(samples, validator):
    result, health = (copy.deepcopy(m) for m in samples)
    result["future_field"] = {"anything": [1, 2]}
    health["future_field"] = "x"
    assert validator.is_valid(result) and validator.is_valid(health)


@pytest.mark.parametrize("n", [0, 1, 10, 100])
def test_the_formatted_detections_parse_to_the_same_objects(n):
    """The JSON fast path (one ``%`` over all detections) says what the object path says:
    same labels (escaped), class ids, scores to 4 decimals and boxes to 1."""
    import numpy as np

    from edge_agent.pipelines.backends.base import IOSet
    from edge_agent.pipelines.messages import MessageBuilder
    from edge_agent.pipelines.slots import FrameSlot

    labels = ("person", 'say "cheese"', "back\\slash", "naïve")
    builder = MessageBuilder("dev", labels, 50.0)
    io = IOSet(inputs={"images": np.zeros((1, 3, 8, 8), np.float32)}, outputs=[])
    slot = FrameSlot(0, io, "images", 100)
    rng = np.random.default_rng(n)
    slot.det_count = n
    slot.det_xyxy[:n] = rng.uniform(0, 1920, (n, 4))
    slot.det_score[:n] = rng.uniform(0.25, 1.0, n)
    slot.det_class[:n] = rng.integers(0, len(labels) + 2, n)  # some beyond the labels
    fast = json.loads(builder.detections_json(slot))
    objects = builder.detections(slot)
    assert len(fast) == len(objects) == n
    for f, o in zip(fast, objects):
        assert (f["label"], f["class_id"]) == (o["label"], o["class_id"])
        assert f["score"] == pytest.approx(o["score"], abs=1e-9)
        assert f["box_xyxy"] == pytest.approx(o["box_xyxy"], abs=1e-9)
    message = builder.build(slot, 7, "m")
    message["latency_ms"] = builder.latencies(slot)
    body = json.loads(builder.encode(message, slot))
    assert list(body)[-1] == "detections" and body["detections"] == fast and body["seq"] == 7
