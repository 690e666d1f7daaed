"""Fleet configuration: layering, matching, substitution, errors, validate and diff.

(agent/core/effective/; the per-file blame in agent/core/configload.py ``problem_at``)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edge_agent.core.configload import ConfigError, Problem
from edge_agent.core.effective.diff import diff_configs
from edge_agent.core.effective.parse import DeviceFacts
from edge_agent.core.effective.render import load_effective, load_fleet, validate_fleet
from edge_agent.core.model_config import AutoBackendConfig, OnnxRuntimeConfig, TensorRTConfig
from edge_agent.core.source_config import RtspSourceConfig, SyntheticSourceConfig, VideoSourceConfig


def doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# Line numbers matter: the error tests below name lines of this text.
FLEET = doc(
    """
    defaults:
      source:
        fps: 30
        width: 640
      model:
        max_detections: 100
      deadline:
        budget_ms: 50
        ladder:
          - name: full
          - name: half
            frame_stride: 2
      publish:
        endpoint: "tcp://*:5556"
    groups:
      - name: all
        match: {}
        config:
          model:
            max_detections: 90
      - name: orin-nano
        match:
          module: orin-nano
        config:
          source:
            fps: 20
          backend:
            type: tensorrt
            precision: fp16
          deadline:
            budget_ms: 60
            ladder:
              - name: full
      - name: berlin
        match:
          hostname: "ber-*"
          labels: {site: berlin}
        config:
          source:
            fps: 25
          deadline:
            budget_ms: 70
      - name: rtsp-cams
        match:
          labels: {camera: rtsp}
        config:
          source:
            type: rtsp
            url: "rtsp://10.0.0.9/stream"
    devices:
      cam-001:
        module: orin-nano
        config:
          source:
            fps: 15
      cam-002:
        hostname: ber-cam-002
        module: orin-nx
        labels: {site: berlin}
      cam-003:
        hostname: ber-cam-003
        module: orin-nano
        labels: {site: berlin, floor: 3}
        config:
          deadline:
            budget_ms: 80
      cam-004:
        hostname: muc-cam-004
        labels: {site: munich, camera: rtsp}
      cam-005:
        hostname: ber-cam-005
        labels: {site: hamburg}
    """
)


def write(tmp_path: Path, text: str, name: str = "fleet.yaml") -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc(text), encoding="utf-8")
    return str(path)


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """1-based line of the nth line of ``text`` containing ``needle``."""
    hits = [i + 1 for i, line in enumerate(doc(text).splitlines()) if needle in line]
    return hits[nth - 1]


@pytest.fixture
def fleet_path(tmp_path) -> str:
    return write(tmp_path, FLEET)


@pytest.fixture
def fleet(fleet_path):
    return load_fleet(fleet_path)


def problems_of(fn, *args, **kwargs) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)
    assert info.value.problems
    return info.value.problems


# -- layering and precedence ------------------------------------------------------------------


def test_device_ids_in_file_order(fleet):
    assert fleet.device_ids() == ["cam-001", "cam-002", "cam-003", "cam-004", "cam-005"]


@pytest.mark.parametrize(
    ("device", "key", "expected", "layer"),
    [
        # defaults < group order < device
        ("cam-005", "source.fps", 30.0, "defaults"),  # hostname matches berlin, label does not
        ("cam-002", "source.fps", 25.0, 'groups[2] "berlin"'),
        ("cam-003", "source.fps", 25.0, 'groups[2] "berlin"'),  # berlin after orin-nano
        ("cam-001", "source.fps", 15.0, "devices.cam-001"),  # device over group
        ("cam-005", "model.max_detections", 90, 'groups[0] "all"'),
        ("cam-001", "deadline.budget_ms", 60.0, 'groups[1] "orin-nano"'),
        ("cam-002", "deadline.budget_ms", 70.0, 'groups[2] "berlin"'),
        ("cam-003", "deadline.budget_ms", 80.0, "devices.cam-003"),
        ("cam-004", "deadline.budget_ms", 50.0, "defaults"),
        ("cam-003", "source.width", 640, "defaults"),  # untouched keys survive deep merges
    ],
)
def test_precedence(fleet, device, key, expected, layer):
    rendered = fleet.render(device, env={})
    value = rendered.plain
    for part in key.split("."):
        value = value[part]
    assert value == expected
    assert rendered.origins[key].startswith(layer + " (")


def test_overlay_and_env_win_over_the_fleet(fleet, tmp_path):
    overlay = write(tmp_path, "source:\n  fps: 12\ndeadline:\n  budget_ms: 90\n", "tuned.yaml")
    env = {"EDGE_AGENT__DEADLINE__BUDGET_MS": "95", "EDGE_AGENT__LOG_LEVEL": "debug"}
    rendered = fleet.render("cam-001", overlay=overlay, env=env)
    cfg = rendered.config
    assert cfg.source.fps == 12.0 and cfg.deadline.budget_ms == 95.0 and cfg.log_level == "debug"
    assert rendered.origins["source.fps"] == f"overlay ({overlay}:2)"
    assert rendered.origins["deadline.budget_ms"] == "env EDGE_AGENT__DEADLINE__BUDGET_MS"
    assert rendered.origins["log_level"] == "env EDGE_AGENT__LOG_LEVEL"


def test_env_values_are_yaml_scalars_and_flow_lists(fleet):
    env = {
        "EDGE_AGENT__SOURCE__FPS": "7",
        "EDGE_AGENT__POWER__MANAGE": "true",
        "EDGE_AGENT__BACKEND__ONNXRUNTIME__PROVIDERS": "[CUDAExecutionProvider, CPUExecutionProvider]",
        "EDGE_AGENT_UNRELATED": "x",
    }
    cfg = fleet.render("cam-002", env=env).config
    assert cfg.source.fps == 7.0 and cfg.power.manage is True
    assert cfg.backend.onnxruntime.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")


def test_origins_name_the_file_and_line(fleet, fleet_path):
    origins = fleet.render("cam-003", env={}).origins

    def at(label: str, needle: str, nth: int = 1) -> str:
        return f"{label} ({fleet_path}:{line_of(FLEET, needle, nth)})"

    assert origins["source.fps"] == at('groups[2] "berlin"', "fps: 25")
    assert origins["backend.type"] == at('groups[1] "orin-nano"', "type: tensorrt")
    assert origins["deadline.budget_ms"] == at("devices.cam-003", "budget_ms: 80")
    assert origins["publish.endpoint"] == at("defaults", "endpoint")
    assert origins["deadline.ladder"] == at('groups[1] "orin-nano"', "- name: full", 2)
    assert origins["device_id"] == "device id"
    assert "source.height" not in origins  # nobody set it


def test_device_id_is_set_unless_a_layer_sets_it(fleet, tmp_path):
    assert fleet.render("cam-004", env={}).config.device_id == "cam-004"
    overlay = write(tmp_path, "device_id: lab-7\n", "o.yaml")
    assert fleet.render("cam-004", overlay=overlay, env={}).config.device_id == "lab-7"


def test_lists_are_replaced_not_concatenated(fleet):
    nano = fleet.render("cam-001", env={}).config
    assert [s.name for s in nano.deadline.ladder] == ["full"]
    other = fleet.render("cam-002", env={}).config
    assert [(s.name, s.frame_stride) for s in other.deadline.ladder] == [("full", 1), ("half", 2)]


def test_type_change_replaces_the_section(fleet):
    # defaults give a (typeless: synthetic) source with fps and width; rtsp-cams switches
    # the type, so those keys do not leak into the rtsp source.
    rendered = fleet.render("cam-004", env={})
    assert rendered.config.source == RtspSourceConfig(url="rtsp://10.0.0.9/stream")
    assert "source.fps" not in rendered.origins and "source.width" not in rendered.origins
    assert rendered.origins["source.url"].startswith('groups[3] "rtsp-cams"')
    # orin-nano switches the backend from auto to tensorrt
    assert isinstance(fleet.render("cam-001", env={}).config.backend, TensorRTConfig)
    assert isinstance(fleet.render("cam-002", env={}).config.backend, AutoBackendConfig)


def test_same_type_merges_and_type_change_in_overlay(fleet, tmp_path):
    overlay = write(tmp_path, "backend:\n  type: tensorrt\n  dla_core: 0\n", "a.yaml")
    backend = fleet.render("cam-001", overlay=overlay, env={}).config.backend
    assert backend == TensorRTConfig(precision="fp16", dla_core=0)
    overlay = write(tmp_path, "backend:\n  type: onnxruntime\n", "b.yaml")
    assert fleet.render("cam-001", overlay=overlay, env={}).config.backend == OnnxRuntimeConfig()
    overlay = write(tmp_path, "source:\n  type: video\n  path: /data/a.mp4\n", "c.yaml")
    source = fleet.render("cam-002", overlay=overlay, env={}).config.source
    assert source == VideoSourceConfig(path="/data/a.mp4")


# -- matching --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "groups"),
    [
        ("cam-001", ["all", "orin-nano"]),  # module
        ("cam-002", ["all", "berlin"]),  # hostname glob + label
        ("cam-003", ["all", "orin-nano", "berlin"]),
        ("cam-004", ["all", "rtsp-cams"]),  # label only
        ("cam-005", ["all"]),  # hostname matches, label does not: every key must hold
    ],
)
def test_matching(fleet, device, groups):
    assert fleet.matching_groups(fleet.facts(device)) == groups


def test_unlisted_device_and_explicit_facts(fleet):
    rendered = fleet.render("ber-new", env={})  # hostname defaults to the id; no labels
    assert rendered.config.device_id == "ber-new" and rendered.config.source.fps == 30.0
    facts = DeviceFacts("ber-new", labels={"site": "berlin"})
    assert fleet.render("ber-new", env={}, facts=facts).config.source.fps == 25.0
    facts = DeviceFacts("x", hostname="ber-x", module="orin-nano", labels={"site": "berlin"})
    assert fleet.render("x", env={}, facts=facts).origins["source.fps"].startswith('groups[2] "berlin"')
    # explicit facts override the listed ones: cam-002 moved to hamburg
    moved = DeviceFacts("cam-002", labels={"site": "hamburg"})
    assert fleet.render("cam-002", env={}, facts=moved).config.source.fps == 30.0


# -- directory ---------------------------------------------------------------------------------


def test_directory_of_files_merged_in_name_order(tmp_path, fleet):
    head, tail = FLEET.split("devices:\n")
    write(tmp_path, head, "fleet.d/10-base.yaml")
    write(tmp_path, "devices:\n" + tail, "fleet.d/20-devices.yml")
    write(tmp_path, "not: yaml: here", "fleet.d/README.md")
    split = load_fleet(str(tmp_path / "fleet.d"))
    assert split.device_ids() == fleet.device_ids()
    for device in fleet.device_ids():
        assert split.render(device, env={}).plain == fleet.render(device, env={}).plain
    origin = split.render("cam-001", env={}).origins["source.fps"]
    assert origin == f"devices.cam-001 ({tmp_path / 'fleet.d' / '20-devices.yml'}:6)"


def test_duplicate_device_across_two_files(tmp_path):
    a = write(tmp_path, "devices:\n  cam-1: {}\n  cam-2: {}\n", "d/a.yaml")
    b = write(tmp_path, "groups: []\ndevices:\n  cam-2:\n    module: x\n", "d/b.yaml")
    (p,) = problems_of(load_fleet, str(tmp_path / "d"))
    assert (p.file, p.line, p.column, p.path) == (b, 3, 3, "devices.cam-2")
    assert f"also at {a}:3" in p.message


def test_duplicate_group_across_two_files(tmp_path):
    a = write(tmp_path, "groups:\n  - name: g\n", "d/a.yaml")
    b = write(tmp_path, "groups:\n  - name: h\n  - name: g\n", "d/b.yaml")
    (p,) = problems_of(load_fleet, str(tmp_path / "d"))
    assert (p.file, p.line, p.path) == (b, 3, "groups[1].name")
    assert f"also at {a}:2" in p.message


def test_empty_directory_and_missing_file(tmp_path):
    (tmp_path / "empty").mkdir()
    (p,) = problems_of(load_fleet, str(tmp_path / "empty"))
    assert p.file == str(tmp_path / "empty") and "no *.yaml" in p.message
    (p,) = problems_of(load_fleet, str(tmp_path / "nope.yaml"))
    assert p.file == str(tmp_path / "nope.yaml") and "cannot read" in p.message


# -- substitution ------------------------------------------------------------------------------

SUBST = """
defaults:
  source:
    fps: "${FPS:-30}"
    name: "${CAM}"
  model:
    path: "/models/${MODEL:-yolo}.onnx"
  publish:
    endpoint: "tcp://${HOST:-127.0.0.1}:$${PORT}"
devices:
  a: {}
"""


def test_substitution_with_defaults_and_int_reresolution(tmp_path):
    fleet = load_fleet(write(tmp_path, SUBST))
    cfg = fleet.render("a", env={"CAM": "front"}).config
    assert cfg.source.fps == 30.0 and cfg.source.name == "front"
    assert cfg.model.path == "/models/yolo.onnx"
    assert cfg.publish.endpoint == "tcp://127.0.0.1:${PORT}"
    cfg = fleet.render("a", env={"CAM": "rear", "FPS": "12", "MODEL": "ssd", "HOST": "h"}).config
    assert (cfg.source.fps, cfg.source.name, cfg.model.path) == (12.0, "rear", "/models/ssd.onnx")
    assert cfg.publish.endpoint == "tcp://h:${PORT}"


def test_substituted_value_is_checked_as_yaml(tmp_path):
    fleet = load_fleet(write(tmp_path, SUBST))
    (p,) = problems_of(fleet.render, "a", env={"CAM": "c", "FPS": "fast"})
    assert (p.line, p.path) == (3, "source.fps") and "expected a number, got 'fast'" in p.message


def test_unset_variable_is_an_error(tmp_path):
    path = write(tmp_path, SUBST)
    (p,) = problems_of(load_fleet(path).render, "a", env={})
    assert (p.file, p.line, p.column, p.path) == (path, 4, 11, "source.name")
    assert p.message == "${CAM} is not set (and has no default)"


NESTED = """
defaults:
  source:
    name: "${CAM:-${HOSTNAME}}"
    fps: "${FPS:-${DEFAULT_FPS:-15}}"
devices:
  a: {}
"""


def test_a_default_may_hold_a_reference_as_in_a_shell(tmp_path):
    """``${A:-${B}}`` is B's value when A is unset (as in sh and Docker Compose), not the
    text ``${B}``; a default not taken needs none of its variables."""
    fleet = load_fleet(write(tmp_path, NESTED))
    cfg = fleet.render("a", env={"HOSTNAME": "gate-1"}).config
    assert (cfg.source.name, cfg.source.fps) == ("gate-1", 15.0)
    cfg = fleet.render("a", env={"CAM": "front", "DEFAULT_FPS": "7"}).config
    assert (cfg.source.name, cfg.source.fps) == ("front", 7.0)
    (p,) = problems_of(fleet.render, "a", env={"FPS": "5"})
    assert (p.line, p.path, p.message) == (3, "source.name", "${HOSTNAME} is not set (and has no default)")


@pytest.mark.parametrize(
    "value, message",
    [
        ("${CAM:-front", "${CAM:-...} has no closing } (write $${ for a literal ${)"),
        ("${A:-" * 9 + "x" + "}" * 9, "${VAR:-default} nested more than 8 deep"),
    ],
)
def test_a_reference_that_cannot_be_read_is_refused_not_kept_as_text(tmp_path, value, message):
    path = write(tmp_path, f"defaults:\n  source:\n    name: '{value}'\ndevices:\n  a: {{}}\n")
    (p,) = problems_of(load_fleet(path).render, "a", env={})
    assert (p.file, p.line, p.path, p.message) == (path, 3, "source.name", message)


# -- errors: file, line, key path --------------------------------------------------------------


def test_unknown_fleet_keys(tmp_path):
    path = write(
        tmp_path,
        """
        defaults: {}
        group: []
        groups:
          - name: a
          - name: b
            config: {}
          - name: c
            match:
              hostnme: "x*"
            confg: {}
        devices:
          d1:
            hostname: d1
            modul: nano
        """,
    )
    problems = problems_of(load_fleet, path)
    assert [(p.file, p.line, p.column, p.path) for p in problems] == [
        (path, 2, 1, "group"),
        (path, 9, 7, "groups[2].match.hostnme"),
        (path, 10, 5, "groups[2].confg"),
        (path, 14, 5, "devices.d1.modul"),
    ]
    assert "unknown key (expected one of: name, match, config)" in problems[2].message


def test_fleet_structure_errors(tmp_path):
    path = write(
        tmp_path,
        """
        groups:
          - match: {}
          - name: x
            match: {labels: [a]}
            config: [1]
        devices:
          d1: 3
        """,
    )
    problems = problems_of(load_fleet, path)
    assert [(p.line, p.path) for p in problems] == [
        (2, "groups[0].name"),
        (4, "groups[1].match.labels"),
        (5, "groups[1].config"),
        (7, "devices.d1"),
    ]


def test_nulls_labels_as_written_and_duplicate_keys(tmp_path):
    path = write(
        tmp_path,
        """
        groups:
          - name: third-floor
            match: {labels: {floor: 3}}
            config:
          - name: any
            match:
        devices:
          a: {labels: {floor: "3"}, hostname: ~}
          b: {labels: {floor: 03}}
          c:
        """,
    )
    fleet = load_fleet(path)
    assert fleet.device_ids() == ["a", "b", "c"] and fleet.facts("a").hostname == "a"
    assert fleet.matching_groups(fleet.facts("a")) == ["third-floor", "any"]
    assert fleet.matching_groups(fleet.facts("b")) == ["any"]  # labels compare as written
    bad = write(
        tmp_path,
        """
        groups:
          - name: g
            match: {labels: {site: a, site: b}}
            config: {source: {fps: 1, fps: 2}}
        devices:
          d: {}
          d: {module: x}
        """,
        "bad.yaml",
    )
    assert [(p.line, p.path, p.message) for p in problems_of(load_fleet, bad)] == [
        (3, "groups[0].match.labels.site", "duplicate key"),
        (4, "groups[0].config.source.fps", "duplicate key"),
        (7, "devices.d", "duplicate key"),
    ]


def test_yaml_syntax_error_names_the_file(tmp_path):
    path = write(tmp_path, "defaults:\n  source: [\n")
    (p,) = problems_of(load_fleet, path)
    assert p.file == path and p.line == 3 and p.message.startswith("YAML syntax")


def test_unknown_config_key_in_a_group(tmp_path):
    path = write(
        tmp_path,
        """
        groups:
          - name: g
            config:
              source:
                fsp: 10
        devices:
          d: {}
        """,
    )
    (p,) = problems_of(load_fleet(path).render, "d", env={})
    assert (p.file, p.line, p.column, p.path) == (path, 5, 9, "source.fsp")
    assert p.message.startswith("unknown key")


def test_bad_value_in_a_device(tmp_path):
    path = write(
        tmp_path,
        """
        defaults:
          source: {fps: 10}
        devices:
          d:
            config:
              source:
                fps: 5000
              deadline:
                budget_ms: fast
        """,
    )
    problems = problems_of(load_fleet(path).render, "d", env={})
    assert [(p.file, p.line, p.column, p.path) for p in problems] == [
        (path, 7, 14, "source.fps"),
        (path, 9, 20, "deadline.budget_ms"),
    ]


def test_bad_type_in_the_overlay(fleet, fleet_path, tmp_path):
    text = "# tuned\nsource:\n  type: webcam\nbackend:\n  type: tensorrt\n  precision: fp8\n"
    overlay = write(tmp_path, text, "t.yaml")
    problems = problems_of(fleet.render, "cam-001", overlay=overlay, env={})
    assert [(p.file, p.line, p.path) for p in problems] == [
        (overlay, 3, "source.type"),
        (overlay, 6, "backend.precision"),
    ]
    assert "unknown type 'webcam'" in problems[0].message


def test_missing_overlay_is_named(fleet, tmp_path):
    missing = str(tmp_path / "tuned.yaml")
    (p,) = problems_of(fleet.render, "cam-001", overlay=missing, env={})
    assert p.file == missing and "cannot read" in p.message


def test_bad_env_value_names_the_variable(fleet):
    env = {"EDGE_AGENT__SOURCE__FPS": "lots", "EDGE_AGENT__SOURCE__FSP": "1"}
    problems = problems_of(fleet.render, "cam-002", env=env)
    assert [(p.file, p.line, p.path) for p in problems] == [
        ("env EDGE_AGENT__SOURCE__FPS", 0, "source.fps"),
        ("env EDGE_AGENT__SOURCE__FSP", 0, "source.fsp"),
    ]


def test_error_in_a_key_that_a_later_layer_merged_still_blames_its_layer(tmp_path):
    # the group sets step_up higher than the device's step_down: the cross-field check
    # blames step_up_miss_rate where the group wrote it.
    path = write(
        tmp_path,
        """
        groups:
          - name: g
            config:
              deadline:
                step_up_miss_rate: 0.1
        devices:
          d:
            config:
              deadline:
                step_down_miss_rate: 0.05
        """,
    )
    (p,) = problems_of(load_fleet(path).render, "d", env={})
    assert (p.line, p.path) == (5, "deadline.step_up_miss_rate")


# -- validate ----------------------------------------------------------------------------------


def test_validate_collects_every_device_and_group(tmp_path):
    path = write(
        tmp_path,
        """
        defaults:
          source: {fps: 30}
        groups:
          - name: fast
            match: {labels: {speed: fast}}
            config:
              source: {fps: 2000}
          - name: typo
            match: {module: none-has-this}
            config:
              publsh: {}
        devices:
          a:
            labels: {speed: fast}
          b:
            config:
              model: {max_detections: 0}
          c:
            config:
              source: {name: "${CAM}"}
          ok: {}
        """,
    )
    problems = validate_fleet(path, env={})
    assert [(p.file, p.line, p.path) for p in problems] == [
        (path, 7, "source.fps"),  # device a through group fast (and group fast alone: deduplicated)
        (path, 17, "model.max_detections"),  # device b
        (path, 20, "source.name"),  # device c: unset variable
        (path, 11, "publsh"),  # group typo, matched by no device
    ]
    assert validate_fleet(path, env={"CAM": "x"})[2:] == problems[3:]


def test_validate_structure_errors_and_valid_fleet(tmp_path, fleet_path):
    assert validate_fleet(fleet_path, env={}) == []
    bad = write(tmp_path, "devices:\n  a: {hostnam: x}\n", "bad.yaml")
    (p,) = validate_fleet(bad, env={})
    assert (p.line, p.path) == (2, "devices.a.hostnam")


def test_validate_ignores_local_env_layer(fleet_path):
    assert validate_fleet(fleet_path, env={"EDGE_AGENT__SOURCE__FPS": "nope"}) == []


# -- diff --------------------------------------------------------------------------------------


def test_diff_configs(fleet):
    a = fleet.render("cam-002", env={}).plain
    b = fleet.render("cam-001", env={}).plain
    lines = diff_configs(a, b)
    assert "source.fps: 25.0 -> 15.0" in lines
    assert "deadline.budget_ms: 70.0 -> 60.0" in lines
    assert "device_id: cam-002 -> cam-001" in lines
    assert "backend.type: auto -> tensorrt" in lines
    assert "- backend.onnxruntime.providers: [CPUExecutionProvider]" in lines
    assert "+ backend.precision: fp16" in lines
    assert "- deadline.ladder[1].name: half" in lines
    assert lines == sorted(lines, key=lambda s: s.lstrip("+- ").split(":")[0].replace("[", "."))
    assert diff_configs(a, a) == []


def test_diff_configs_small():
    a = {"source": {"fps": 30, "name": "cam0"}, "model": {"path": ""}, "x": [1, 2]}
    b = {"source": {"fps": 15, "name": "cam0"}, "model": {"path": "m.onnx", "manifest": "y"}, "x": [1]}
    assert diff_configs(a, b) == [
        "+ model.manifest: y",
        "model.path: '' -> m.onnx",
        "source.fps: 30 -> 15",
        "x: [1, 2] -> [1]",
    ]


def config_diff(a: Path | str, b: Path | str, *device: str) -> list[str]:
    args = ["config", "diff", str(a), str(b), *(["--device", *device] if device else [])]
    r = subprocess.run(
        [sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


DIFF_FLEET = """
    defaults:
      source: {type: synthetic, fps: 15}
    groups:
      - name: cpu
        match: {module: x86}
        config:
          backend:
            type: onnxruntime
            onnxruntime: {allow_spinning: false}
    devices:
      cam-001: {module: x86}
    """


@pytest.mark.parametrize(
    "backend",
    [
        "{type: onnxruntime, allow_spinning: false}",  # flat, the fleet nested
        "{type: onnxruntime, onnxruntime: {allow_spinning: false}}",
    ],
)
def test_diff_of_a_file_and_a_fleet_device_with_the_same_config_is_empty(tmp_path, backend):
    """Both sides in one shape, the file rendered as the device: nothing but differences."""
    fleet = write(tmp_path, DIFF_FLEET)
    single = write(tmp_path, f"source: {{type: synthetic, fps: 15}}\nbackend: {backend}\n", "agent.yaml")
    assert config_diff(single, fleet, "cam-001") == ["no differences"]
    assert config_diff(fleet, single, "cam-001") == ["no differences"]


def test_diff_shows_one_changed_key_as_that_key(tmp_path):
    fleet = write(tmp_path, DIFF_FLEET)
    single = write(tmp_path, "source: {fps: 15}\nbackend: {type: onnxruntime}\n", "agent.yaml")
    assert config_diff(single, fleet, "cam-001") == ["backend.onnxruntime.allow_spinning: true -> false"]
    auto = write(
        tmp_path, "source: {fps: 15}\nbackend: {onnxruntime: {allow_spinning: false}}\n", "auto.yaml"
    )
    lines = config_diff(auto, fleet, "cam-001")
    assert "backend.type: auto -> onnxruntime" in lines
    assert all(
        line.startswith("- backend.tensorrt.")
        for line in lines
        if line != "backend.type: auto -> onnxruntime"
    )


def test_diff_keeps_an_id_the_file_sets(tmp_path):
    fleet = write(tmp_path, DIFF_FLEET)
    single = write(
        tmp_path,
        "device_id: bench-1\nsource: {fps: 15}\nbackend: {type: onnxruntime, allow_spinning: false}\n",
        "agent.yaml",
    )
    assert config_diff(single, fleet, "cam-001") == ["device_id: bench-1 -> cam-001"]


# -- the backend's shapes across layers --------------------------------------------------------


def test_the_later_layer_wins_whichever_shape_each_wrote_the_backend_in(tmp_path):
    """`config show` prints ``backend.onnxruntime.x``; a layer may write ``backend.x``: one
    key either way, and the later layer's value wins (a rendered config with a flat
    variable over it, a nested default with a flat group)."""
    path = write(
        tmp_path,
        """
        defaults:
          backend: {type: onnxruntime, onnxruntime: {intra_op_threads: 2, inter_op_threads: 2}}
        devices:
          a:
            config:
              backend: {onnxruntime: {inter_op_threads: 3}}
          b:
            config:
              backend: {intra_op_threads: 4}
        """,
    )
    fleet = load_fleet(path)
    assert fleet.render("a", env={}).config.backend == OnnxRuntimeConfig(
        intra_op_threads=2, inter_op_threads=3
    )
    assert fleet.render("b", env={}).config.backend == OnnxRuntimeConfig(
        intra_op_threads=4, inter_op_threads=2
    )
    env = {"EDGE_AGENT__BACKEND__INTRA_OP_THREADS": "5"}
    assert fleet.render("a", env=env).config.backend == OnnxRuntimeConfig(
        intra_op_threads=5, inter_op_threads=3
    )


def test_one_layer_giving_a_backend_key_both_ways_is_refused(tmp_path):
    path = write(
        tmp_path,
        "backend: {type: onnxruntime, intra_op_threads: 2, onnxruntime: {intra_op_threads: 4}}\n",
        "agent.yaml",
    )
    with pytest.raises(ConfigError) as e:
        load_effective(path, env={})
    [p] = e.value.problems
    assert p.path == "backend.onnxruntime.intra_op_threads" and "give it once" in p.message, p


def test_a_variable_sets_a_nested_key_of_a_single_type(fleet_path, tmp_path):
    path = write(tmp_path, "backend: {type: onnxruntime}\n", "agent.yaml")
    env = {"EDGE_AGENT__BACKEND__ONNXRUNTIME__ALLOW_SPINNING": "false"}
    assert load_effective(path, env=env).config.backend == OnnxRuntimeConfig(allow_spinning=False)


def test_rendered_config_types(fleet):
    assert isinstance(fleet.render("cam-002", env={}).config.source, SyntheticSourceConfig)


def test_a_device_with_several_cameras_replaces_the_default_single_one(tmp_path):
    path = write(
        tmp_path,
        doc(
            """
            defaults:
              source: {fps: 15, width: 320}
            devices:
              gate-1:
                config:
                  sources:
                    - {name: lane1, priority: 5}
                    - {name: lane2}
              cam-1: {}
              back-to-one:
                config:
                  sources: [{name: x}]
            """
        ),
    )
    fleet = load_fleet(path)
    gate = fleet.render("gate-1", env={})
    assert [s.name for s in gate.config.source_list()] == ["lane1", "lane2"]
    assert gate.config.source_list()[0].priority == 5
    assert gate.config.source == SyntheticSourceConfig() and "source.fps" not in gate.origins
    assert fleet.render("cam-1", env={}).config.source.fps == 15
    # An overlay with one camera replaces a layer's several, the same way.
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text("source: {fps: 5}\n")
    one = fleet.render("back-to-one", overlay=str(overlay), env={}).config
    assert one.sources == () and one.source.fps == 5
