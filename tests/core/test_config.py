"""Agent configuration: YAML loading, error reporting, dump and the `config` CLI.

(agent/core/config.py and its sections' modules, agent/core/configload.py and configbuild.py,
agent/cli.py `config validate|show`)
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from edge_agent.core.config import AgentConfig, load_config, printed
from edge_agent.core.configload import ConfigError, Problem, dump, load
from edge_agent.core.deadline_config import DeadlineConfig
from edge_agent.core.model_config import AutoBackendConfig, ModelConfig, OnnxRuntimeConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import (
    GStreamerSourceConfig,
    ImageFolderSourceConfig,
    RtspSourceConfig,
    SyntheticSourceConfig,
    V4L2SourceConfig,
    VideoSourceConfig,
)

FILE = "agent.yaml"


def doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def problems_of(text: str) -> list[Problem]:
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, text, FILE)
    problems = info.value.problems
    assert problems, "ConfigError without problems"
    return problems


def write(tmp_path: Path, text: str, name: str = FILE) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- defaults --------------------------------------------------------------------------------


def test_no_file_gives_the_embedded_default():
    cfg = load_config(None)
    assert cfg == AgentConfig()
    assert isinstance(cfg.source, SyntheticSourceConfig)
    assert isinstance(cfg.backend, AutoBackendConfig)
    assert isinstance(cfg.backend.onnxruntime, OnnxRuntimeConfig)
    assert cfg.model == ModelConfig() and cfg.model.path == ""


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n"], ids=["empty", "blank", "comment"])
def test_empty_file_gives_the_defaults(tmp_path, text):
    assert load_config(str(write(tmp_path, text))) == AgentConfig()


@pytest.mark.parametrize(
    "text", ["---\n", "---\n# model:\n#   path: m.onnx\n"], ids=["doc-start", "commented-out"]
)
def test_empty_document_with_start_marker_gives_the_defaults(tmp_path, text):
    assert load_config(str(write(tmp_path, text))) == AgentConfig()


def test_partial_document_keeps_other_defaults():
    cfg = load(AgentConfig, "model:\n  score_threshold: 0.4\n", FILE)
    assert cfg == replace(AgentConfig(), model=ModelConfig(score_threshold=0.4))


def test_backend_without_type_is_auto():
    cfg = load(AgentConfig, "backend:\n  onnxruntime:\n    intra_op_threads: 2\n", FILE)
    assert cfg.backend == AutoBackendConfig(onnxruntime=OnnxRuntimeConfig(intra_op_threads=2))


def test_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    [p] = info.value.problems
    assert p.file == str(path) and p.line == 0 and "cannot read" in p.message
    assert str(info.value).startswith(f"{path}: cannot read: "), str(info.value)


# -- errors: one per document ----------------------------------------------------------------

# (document, line, key path, message pattern)
BAD = [
    pytest.param(
        """
        source:
          type: synthetic
          widht: 320
        """,
        3,
        "source.widht",
        r"unknown key \(expected one of: .*\bwidth\b",
        id="typo-in-section",
    ),
    pytest.param(
        """
        device_id: edge-1
        modle:
          path: m.onnx
        """,
        2,
        "modle",
        r"unknown key \(expected one of: .*\bmodel\b",
        id="typo-top-level",
    ),
    pytest.param(
        """
        source:
          type: synthetic
          fps: fast
        """,
        3,
        "source.fps",
        r"expected a number, got 'fast'",
        id="wrong-type-number",
    ),
    pytest.param(
        """
        model:
          max_detections: 10.5
        """,
        2,
        "model.max_detections",
        r"expected an integer, got 10\.5",
        id="wrong-type-float-for-int",
    ),
    pytest.param(
        """
        source:
          type: synthetic
          width: true
        """,
        3,
        "source.width",
        r"expected an integer, got True",
        id="wrong-type-bool-for-int",
    ),
    pytest.param(
        """
        deadline:
          budget_ms: yes
        """,
        2,
        "deadline.budget_ms",
        r"expected a number, got True",
        id="wrong-type-bool-for-float",
    ),
    pytest.param(
        """
        source:
          type: video
          path: a.mp4
          loop: 1
        """,
        4,
        "source.loop",
        r"expected true or false, got 1",
        id="wrong-type-int-for-bool",
    ),
    pytest.param(
        "device_id: 12\n",
        1,
        "device_id",
        r"expected a string, got 12 \(quote it",
        id="wrong-type-number-for-string",
    ),
    pytest.param(
        """
        backend:
          type: onnxruntime
          providers: CPUExecutionProvider
        """,
        3,
        "backend.providers",
        r"expected a list",
        id="wrong-type-scalar-for-list",
    ),
    pytest.param(
        """
        model:
          path: m.onnx
          score_threshold: 1.5
        """,
        3,
        "model.score_threshold",
        r"must be within 0\.\.1",
        id="range-score-threshold",
    ),
    pytest.param(
        """
        source:
          type: synthetic
          width: 640
          fps: -1
        """,
        4,
        "source.fps",
        r"must be within 0\.\.1000",
        id="range-fps",
    ),
    pytest.param(
        """
        deadline:
          budget_ms: 0
        """,
        2,
        "deadline.budget_ms",
        r"must be within \(0, 60000\]",
        id="range-budget",
    ),
    pytest.param(
        """
        publish:
          endpoint: tcp://0.0.0.0:5556
          send_hwm: 0
        """,
        3,
        "publish.send_hwm",
        r"must be >= 1",
        id="range-send-hwm",
    ),
    pytest.param(
        """
        publish:
          max_subscribers: 0
        """,
        2,
        "publish.max_subscribers",
        r"must be within 1\.\.1000",
        id="range-max-subscribers",
    ),
    pytest.param(
        """
        source:
          type: synthetic
          name: front door
        """,
        3,
        "source.name",
        r"letters, digits",
        id="bad-name",
    ),
    pytest.param(
        """
        source:
          type: rtsp
          url: http://cam/stream
        """,
        3,
        "source.url",
        r"must start with rtsp://",
        id="rtsp-url",
    ),
    pytest.param(
        """
        source:
          type: rtsp
          url: rtsp://cam/stream
          retry_initial_s: 5
          retry_max_s: 1
        """,
        5,
        "source.retry_max_s",
        r"must be within retry_initial_s\.\.3600",
        id="cross-field",
    ),
    pytest.param(
        """
        backend:
          type: onnxruntime
          graph_optimization: max
        """,
        3,
        "backend.graph_optimization",
        r"expected one of 'disabled' \| 'basic' \| 'extended' \| 'all', got 'max'",
        id="bad-literal",
    ),
    pytest.param("log_level: loud\n", 1, "log_level", r"got 'loud'", id="bad-literal-top-level"),
    pytest.param(
        """
        source:
          type: rtsp
          url: rtsp://cam/stream
          transport: quic
        """,
        4,
        "source.transport",
        r"expected one of 'tcp' \| 'udp', got 'quic'",
        id="bad-literal-in-source",
    ),
    pytest.param(
        """
        device_id: edge-1
        source:
          path: clip.mp4
        """,
        3,
        "source.path",
        r"unknown key \(expected one of: name, priority, .*, type, width",
        id="missing-source-type-means-synthetic",
    ),
    pytest.param(
        """
        source:
          type: webcam
        """,
        2,
        "source.type",
        r"unknown type 'webcam' \(one of 'synthetic', 'video'",
        id="unknown-source-type",
    ),
    pytest.param(
        "source: {type: video}\n",
        1,
        "source.path",
        r"a video file path is required",
        id="required-video-path",
    ),
    pytest.param(
        """
        source:
          type: images
          loop: true
        """,
        2,
        "source.path",
        r"an image folder is required",
        id="required-images-path",
    ),
    pytest.param(
        """
        model:
          path: a.onnx
          path: b.onnx
        """,
        3,
        "model.path",
        r"duplicate key",
        id="duplicate-key",
    ),
    pytest.param(
        """
        model:
          - a.onnx
        """,
        2,
        "model",
        r"expected a mapping, got a list",
        id="list-for-section",
    ),
    pytest.param("- a\n- b\n", 1, "", r"expected a mapping, got a list", id="list-document"),
]


@pytest.mark.parametrize(("text", "line", "path", "message"), BAD)
def test_bad_document_names_key_and_line(text, line, path, message):
    problems = problems_of(doc(text))
    assert len(problems) == 1, f"expected one problem, got {[str(p) for p in problems]}"
    [p] = problems
    assert (p.file, p.path, p.line) == (FILE, path, line), f"reported as {p}"
    assert p.column >= 1
    assert re.search(message, p.message), f"message {p.message!r} does not match {message!r}"


@pytest.mark.parametrize(
    ("text", "line"),
    [
        pytest.param("model:\n  path: a\n   bad: [1\n", 3, id="indentation"),
        pytest.param("model: {path: a\nsource: 1\n", 2, id="unclosed-flow-mapping"),
        pytest.param("device_id: a\nlog_level: [info\n", 3, id="unclosed-list-at-eof"),
        pytest.param("device_id: a\n\tmodel: {}\n", 2, id="tab"),
    ],
)
def test_yaml_syntax_error_reports_its_line(tmp_path, text, line):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    [p] = info.value.problems
    assert p.file == str(path) and p.path == ""
    assert p.line == line, f"syntax error reported at line {p.line}: {p}"
    assert p.message.startswith("YAML syntax:")


def test_column_points_at_the_value():
    [p] = problems_of("source:\n  type: synthetic\n  fps: -1\n")
    assert (p.line, p.column) == (3, 8)
    assert str(p) == f"{FILE}:3:8: source.fps: must be within 0..1000"


def test_several_errors_are_all_reported_at_once():
    text = doc(
        """
        device_id: edge-1
        source:
          type: synthetic
          fps: -1
        model:
          iou_thresh: 0.5
        backend:
          type: onnxruntime
          graph_optimization: max
        log_level: loud
        publish:
          send_hwm: 0
        deadline:
          budget_ms: fast
        """
    )
    got = [(p.line, p.path) for p in problems_of(text)]
    expected = [
        (4, "source.fps"),
        (6, "model.iou_thresh"),
        (9, "backend.graph_optimization"),
        (10, "log_level"),
        (12, "publish.send_hwm"),
        (14, "deadline.budget_ms"),
    ]
    assert got == expected
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, text, FILE)
    lines = str(info.value).splitlines()
    assert len(lines) == len(expected), "one line per problem in the error text"
    assert all(line.startswith(f"{FILE}:") for line in lines)


def test_several_range_errors_in_one_section_are_all_reported():
    text = "model:\n  score_threshold: 1.5\n  iou_threshold: 2\n  max_detections: 0\n"
    got = sorted(p.path for p in problems_of(text))
    assert got == ["model.iou_threshold", "model.max_detections", "model.score_threshold"]


def test_scalar_for_source_section_has_a_readable_message():
    [p] = problems_of("source: cam0\n")
    assert p.path == "source" and p.line == 1
    assert "a mapping or a mapping" not in p.message, p.message


# -- valid documents -------------------------------------------------------------------------

GST = "nvarguscamerasrc ! video/x-raw(memory:NVMM), width=1280 ! nvvidconv ! appsink drop=1"

GOOD = [
    pytest.param(
        """
        device_id: jetson-07
        source:
          type: rtsp
          name: gate
          url: rtsp://10.0.0.5:554/stream1
          transport: udp
          retry_initial_s: 1
          retry_max_s: 30
        model:
          path: /opt/models/yolo.onnx
          score_threshold: 0.4
          max_detections: 50
        backend:
          type: onnxruntime
          providers: [CUDAExecutionProvider, CPUExecutionProvider]
          intra_op_threads: 4
          graph_optimization: extended
          allow_spinning: true
        publish:
          endpoint: tcp://0.0.0.0:6000
          topic: detections
          send_hwm: 10
        deadline:
          budget_ms: 33.3
        log_level: debug
        """,
        AgentConfig(
            device_id="jetson-07",
            source=RtspSourceConfig(
                name="gate",
                url="rtsp://10.0.0.5:554/stream1",
                transport="udp",
                retry_initial_s=1.0,
                retry_max_s=30.0,
            ),
            model=ModelConfig(path="/opt/models/yolo.onnx", score_threshold=0.4, max_detections=50),
            backend=OnnxRuntimeConfig(
                providers=("CUDAExecutionProvider", "CPUExecutionProvider"),
                intra_op_threads=4,
                graph_optimization="extended",
                allow_spinning=True,
            ),
            publish=PublishConfig(endpoint="tcp://0.0.0.0:6000", topic="detections", send_hwm=10),
            deadline=DeadlineConfig(budget_ms=33.3),
            log_level="debug",
        ),
        id="rtsp-full",
    ),
    pytest.param(
        "device_id: a\nsource: {type: video, path: /data/clip.mp4, loop: true, realtime: true}\n",
        AgentConfig(device_id="a", source=VideoSourceConfig(path="/data/clip.mp4", loop=True, realtime=True)),
        id="video",
    ),
    pytest.param(
        "device_id: a\nsource: {type: images, path: imgs, patterns: ['*.png']}\n",
        AgentConfig(device_id="a", source=ImageFolderSourceConfig(path="imgs", patterns=("*.png",))),
        id="images",
    ),
    pytest.param(
        "device_id: a\nsource: {type: v4l2, device: /dev/video2, width: 1280, height: 720, fps: 30}\n",
        AgentConfig(
            device_id="a", source=V4L2SourceConfig(device="/dev/video2", width=1280, height=720, fps=30.0)
        ),
        id="v4l2",
    ),
    pytest.param(
        f'device_id: a\nsource:\n  type: gstreamer\n  pipeline: "{GST}"\n',
        AgentConfig(device_id="a", source=GStreamerSourceConfig(pipeline=GST)),
        id="gstreamer",
    ),
    pytest.param(
        "device_id: '123'\nsource: {type: synthetic, fps: 0, seed: 9, num_objects: 0, noise_sigma: 0}\n"
        "model: {iou_threshold: 0.6, score_threshold: null}\n",
        AgentConfig(
            device_id="123",
            source=SyntheticSourceConfig(fps=0.0, seed=9, num_objects=0, noise_sigma=0.0),
            model=ModelConfig(iou_threshold=0.6),
        ),
        id="synthetic-edge-values",
    ),
]


@pytest.mark.parametrize(("text", "expected"), GOOD)
def test_valid_document_loads(text, expected):
    assert load(AgentConfig, doc(text), FILE) == expected


@pytest.mark.parametrize(("text", "expected"), GOOD)
def test_dump_load_round_trip(text, expected):
    dumped = dump(expected)
    assert load(AgentConfig, dumped, "dumped.yaml") == expected, f"round trip changed the config:\n{dumped}"


def test_dump_puts_the_type_first_and_fills_defaults():
    plain = yaml.safe_load(dump(AgentConfig(source=RtspSourceConfig(url="rtsp://x"))))
    assert next(iter(plain["source"])) == "type"
    assert plain["source"]["type"] == "rtsp"
    assert plain["source"]["transport"] == "tcp"
    assert plain["backend"]["type"] == "auto"
    assert plain["backend"]["onnxruntime"]["providers"] == ["CPUExecutionProvider"]


# -- CLI -------------------------------------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True, timeout=60, check=False
    )


GOOD_FILE = GOOD[0].values[0]


def test_cli_validate_good_file(tmp_path):
    (tmp_path / "yolo.onnx").write_bytes(b"")  # validate checks that the files it names exist
    path = write(tmp_path, doc(GOOD_FILE).replace("/opt/models/yolo.onnx", "yolo.onnx"))
    r = cli("config", "validate", str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{path}: OK"
    # It binds its stream to every interface without CURVE: a warning, not an error.
    (warning,) = r.stderr.splitlines()
    assert warning.startswith(f"{path}: warning: publish.endpoint: tcp://0.0.0.0:6000 "), warning


def test_cli_validate_bad_file(tmp_path):
    path = write(
        tmp_path,
        doc(
            """
            source:
              type: synthetic
              fps: -1
            backend:
              type: onnxruntime
              graph_optimization: max
            """
        ),
    )
    r = cli("config", "validate", str(path))
    assert r.returncode == 2, r.stderr
    assert "OK" not in r.stdout
    lines = r.stderr.strip().splitlines()
    assert lines == [
        f"{path}:3:8: source.fps: must be within 0..1000",
        f"{path}:6:23: backend.graph_optimization: "
        "expected one of 'disabled' | 'basic' | 'extended' | 'all', got 'max'",
    ], r.stderr


def test_cli_validate_syntax_error(tmp_path):
    path = write(tmp_path, "model: {path: a\nsource: 1\n")
    r = cli("config", "validate", str(path))
    assert r.returncode == 2, r.stderr
    assert re.fullmatch(rf"{re.escape(str(path))}:2:\d+: YAML syntax: .+\n", r.stderr), r.stderr


# `config show` prints ~ resolved also in the defaults (the loader keeps a default's ~, and
# expands a written one): equal configs print alike. (The round trip of the printed text:
# tests/core/test_backend_shape.py.)


def test_cli_show_prints_yaml_that_loads_back(tmp_path):
    path = write(tmp_path, doc(GOOD_FILE))
    r = cli("config", "show", str(path))
    assert r.returncode == 0, r.stderr
    assert printed(load(AgentConfig, r.stdout, "shown.yaml"), home=True) == printed(
        load_config(str(path)), home=True
    )


def test_cli_show_without_file_prints_the_default():
    r = cli("config", "show")
    assert r.returncode == 0, r.stderr
    assert printed(load(AgentConfig, r.stdout, "shown.yaml"), home=True) == printed(AgentConfig(), home=True)


def test_a_source_without_type_is_the_synthetic_camera():
    cfg = load(AgentConfig, "source:\n  fps: 10\n  seed: 3\n", FILE)
    assert isinstance(cfg.source, SyntheticSourceConfig)
    assert (cfg.source.fps, cfg.source.seed) == (10.0, 3)


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_non_finite_numbers_are_refused(value):
    (p,) = problems_of(f"deadline:\n  budget_ms: {value}\n")
    assert (p.line, p.path) == (2, "deadline.budget_ms") and "finite" in p.message


@pytest.mark.parametrize("path", sorted((REPO / "tools/bench").glob("*.yaml")), ids=str)
def test_bench_configs_validate(path):
    load_config(str(path))


def test_reload_kinds_come_from_the_fields_marks():
    """Reload decides from field metadata, not from lists kept beside the config."""
    from dataclasses import replace

    from edge_agent.core.config import AgentConfig
    from edge_agent.core.deadline_config import LadderStep
    from edge_agent.core.publish_config import PublishConfig
    from edge_agent.core.reloads import LANE, MODELS, REBIND, marked_fields, marked_values
    from edge_agent.core.source_config import SyntheticSourceConfig

    rebind = ("endpoint", "send_hwm", "max_subscribers", "encoding", "curve_server_key", "curve_clients_dir")
    assert marked_fields(PublishConfig, REBIND) == rebind, "a topic change needs no new socket"
    lane = ("priority", "budget_ms", "max_fps", "model", "manifest", "tracker", "analytics")
    assert marked_fields(SyntheticSourceConfig, LANE) == lane

    def models(cfg: AgentConfig) -> frozenset:
        return marked_values(cfg, MODELS)

    cam = SyntheticSourceConfig
    a = AgentConfig(sources=(cam(name="a", model="m.onnx", manifest="x.yaml"), cam(name="b", model="n.onnx")))
    same = replace(a, sources=tuple(reversed(a.sources)), publish=replace(a.publish, topic="other"))
    assert models(a) == models(same), "the sources' order and other keys load no model"
    s0, s1 = a.sources
    swapped = replace(a, sources=(replace(s0, manifest=""), replace(s1, manifest="x.yaml")))
    assert models(a) != models(swapped), "each model with its own manifest"
    small = LadderStep(name="small", model="s.onnx")
    assert models(a) != models(replace(a, deadline=replace(a.deadline, ladder=(LadderStep(), small))))
    # A ladder step on a model some source runs as its own is still a new ladder model (its
    # labels must be checked against the main model's), and the ladder's order counts.
    shared = LadderStep(name="shared", model="n.onnx")
    assert models(a) != models(replace(a, deadline=replace(a.deadline, ladder=(LadderStep(), shared))))
    two = replace(a, deadline=replace(a.deadline, ladder=(LadderStep(), small, shared)))
    swapped_ladder = replace(a, deadline=replace(a.deadline, ladder=(LadderStep(), shared, small)))
    assert models(two) != models(swapped_ladder)
    assert models(a) != models(replace(a, model=replace(a.model, max_detections=5)))


def test_the_config_hash_shows_drift_but_not_who_or_where_a_device_is():
    from edge_agent.core.config import config_hash
    from edge_agent.core.endpoint_config import MetricsConfig

    base = AgentConfig(device_id="a")
    same = AgentConfig(
        device_id="b", metrics=MetricsConfig(port=9200), publish=PublishConfig(endpoint="tcp://*:7")
    )
    assert config_hash(base) == config_hash(same)
    assert config_hash(base) != config_hash(AgentConfig(device_id="a", deadline=DeadlineConfig(budget_ms=40)))
    assert len(config_hash(base)) == 12


@pytest.mark.parametrize("backend", ["auto", "tensorrt"])
def test_every_field_marked_local_is_left_out_of_the_hash_and_only_those(backend):
    """The hash leaves out the fields marked LOCAL wherever they sit (a TensorRT section on
    its own or inside ``auto``), found from the marks, not from a list of key paths."""
    from dataclasses import fields, is_dataclass, replace

    from edge_agent.core.config import config_hash
    from edge_agent.core.model_config import AutoBackendConfig, TensorRTConfig

    trt = TensorRTConfig(cache_dir="/a")
    base = AgentConfig(backend=AutoBackendConfig(tensorrt=trt) if backend == "auto" else trt)

    def changed(section, path):
        """``section`` with the field at ``path`` given another value of its type."""
        name, *rest = path
        value = getattr(section, name)
        if rest:
            return replace(section, **{name: changed(value, rest)})
        other = value + "x" if isinstance(value, str) else value + 1
        return replace(section, **{name: other})

    def marked(section, path=()):
        for f in fields(section):
            v = getattr(section, f.name)
            if f.metadata.get("local") and not is_dataclass(v):
                yield (*path, f.name)
            elif is_dataclass(v) and not f.metadata.get("local"):
                yield from marked(v, (*path, f.name))

    local = sorted(".".join(p) for p in marked(base))
    assert "device_id" in local and "publish.endpoint" in local and "uplink.spool_path" in local
    assert any(p.endswith("tensorrt.cache_dir") or p == "backend.cache_dir" for p in local)
    for path in local:
        assert config_hash(changed(base, path.split("."))) == config_hash(base), path
    # Sections marked whole: the view, the uplink's metrics endpoint.
    assert config_hash(replace(base, view=replace(base.view, port=1))) == config_hash(base)
    uplink = replace(base.uplink, metrics=replace(base.uplink.metrics, port=1))
    assert config_hash(replace(base, uplink=uplink)) == config_hash(base)
    assert config_hash(replace(base, model=replace(base.model, max_detections=5))) != config_hash(base)


def test_the_config_hash_of_a_rendered_config_does_not_depend_on_the_home_folder(tmp_path, monkeypatch):
    """`config render` writes the caches' defaults (~/.cache/...) out, and the loader expands
    ~: the agent (systemd's HOME=/var/lib/edge-agent) and `health --expect-config` run as root
    by the Ansible role must still agree on the hash of that file."""
    from edge_agent.core.config import config_hash

    path = write(tmp_path, dump(printed(AgentConfig(device_id="cam-1"))))
    assert "~/.cache/edge-agent/models" in path.read_text()
    hashes = set()
    for home in ("/var/lib/edge-agent", "/root"):
        monkeypatch.setenv("HOME", home)
        cfg = load_config(str(path))
        assert cfg.model.cache_dir.startswith(home)
        hashes.add(config_hash(cfg))
    assert len(hashes) == 1


def test_an_option_spelled_as_a_yaml_boolean_is_read_as_written():
    """YAML 1.1 reads a plain on/off as a bool; a choice of words that includes it means the
    word (``cuda_graphs: on``, ``input_adapter: off``); anything else is still an error."""
    cfg = load(
        AgentConfig, doc("backend: {type: tensorrt, cuda_graphs: on}\nmodel: {input_adapter: off}"), FILE
    )
    assert cfg.backend.cuda_graphs == "on" and cfg.model.input_adapter == "off"
    for text, got in (
        ("cuda_graphs: true", "True"),
        ("cuda_graphs: yes", "True"),
        ("cuda_graphs: 'no'", "'no'"),
    ):
        with pytest.raises(ConfigError, match=rf"backend\.cuda_graphs: expected one of .*, got {got}"):
            load(AgentConfig, doc(f"backend: {{type: tensorrt, {text}}}"), FILE)
