"""One rule for names that are a stream topic and an MQTT topic level: a source the config
takes is one the uplink forwards, and the other way round (review of issue 30, item 6)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edge_agent.core.config import load_config
from edge_agent.core.configload import ConfigError
from edge_agent.service.uplink.validate import message_problem

NAMES = [
    "cam0",
    "a" * 128,
    "a" * 129,
    "süd",
    "b" * 127 + "ü",
    "cam-1_x",
    "a b",
    "a/b",
    "a#b",
    "a+b",
    "nul\x00",
    "esc\x1b",
    "",
]


def _config_problem(tmp_path: Path, cfg: dict) -> ConfigError | None:
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML; escapes keep control characters text
    try:
        load_config(str(path))
    except ConfigError as e:
        return e
    return None


def _result(source: str) -> dict:
    return {"source": source, "seq": 1, "latency_ms": {"total": 1.0}, "detections": []}


@pytest.mark.parametrize("name", NAMES, ids=range(len(NAMES)))
def test_the_config_takes_a_source_name_only_if_the_uplink_forwards_it(tmp_path, name):
    error = _config_problem(tmp_path, {"sources": [{"type": "synthetic", "name": name}]})
    uplink = message_problem(f"det.{name}", _result(name), "det.")
    if error is not None:
        assert [p.path for p in error.problems] == ["sources[0].name"], error
    # Stricter in the config is fine (letters, digits, '-', '_'), never looser.
    assert error is not None or uplink is None, f"the config takes {name!r}, the uplink rejects it: {uplink}"


def test_a_129_character_source_name_is_refused_naming_the_key_and_128_is_taken(tmp_path):
    long = _config_problem(tmp_path, {"sources": [{"type": "synthetic", "name": "a" * 129}]})
    assert long is not None and "sources[0].name" in str(long) and "128" in str(long)
    assert _config_problem(tmp_path, {"sources": [{"type": "synthetic", "name": "a" * 128}]}) is None


def test_publish_topic_and_device_id_follow_the_same_length_rule(tmp_path):
    topic = _config_problem(tmp_path, {"publish": {"topic": "t" * 129}})
    assert topic is not None and [p.path for p in topic.problems] == ["publish.topic"]
    device = _config_problem(tmp_path, {"device_id": "d" * 129})
    assert device is not None and [p.path for p in device.problems] == ["device_id"]
    assert "128" in str(device)
    assert _config_problem(tmp_path, {"device_id": "d" * 128, "publish": {"topic": "t" * 128}}) is None
