"""Hostile model files (issue 43, trial 7): metadata that is deep, huge or many; labels
that carry terminal control characters; outputs that would balloon every frame.

Each is a real ONNX file (``onnx.helper``) read by a real ``edge-agent`` subprocess, or by
``load_model`` on a real ONNX Runtime session: a refusal is exit 2 with the file and the
key or output named, never a traceback, a segfault (139) or gigabytes.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from conftest import agent_command, free_endpoint, run_process, spawn
from onnx import TensorProto, helper, numpy_helper

from edge_agent.core.configload import ConfigError
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.models import onnx_info
from edge_agent.models.manifest import ModelError, resolve_model
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.model import load_model

#: The bounds (models/manifest.py, models/onnx_info.py, models/decoders/base.py), written
#: out so the trials run against the code before them too.
MAX_LABELS, MAX_LABEL_CHARS, MAX_NAMES_CHARS, MAX_OUTPUT_ELEMENTS = 10_000, 128, 2**20, 16 * 2**20

#: Each of the four, in one label: ESC (an ANSI sequence that clears the screen), BEL, CR, LF.
HOSTILE = "a\x1b[2Jb\x07c\rd\ne"
ESCAPED = "a\\x1b[2Jb\\x07c\\rd\\ne"
CONTROL = ("\x1b", "\x07", "\r")


def detector(tmp_path: Path, metadata: dict[str, str], name: str = "m.onnx") -> str:
    """A 4-class YOLOv8-layout model (uint8 NHWC 320) that reports one box of class 0."""
    out = yolov8_output([(160, 160, 40, 40)], [0], [0.9], 4, 2100)
    return constant_detector(str(tmp_path / name), out, metadata=metadata)


def models_check(path: str, *args: str) -> subprocess.CompletedProcess:
    return run_process(agent_command("models", "check", path, "--frames", "1", *args), 120)


def assert_refused(r: subprocess.CompletedProcess, *words: str) -> None:
    said = f"exit {r.returncode}\nstdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-2000:]}"
    assert r.returncode == 2, said
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr.replace("error:", ""), said
    for word in words:
        assert word in r.stdout + r.stderr, f"{word!r} not said; {said}"


# -- the trials -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "names",
    [
        pytest.param("1" + "+1" * 10**6, id="sum-of-a-million"),  # a segfault on 3.10, RecursionError on 3.12
        pytest.param("1" + "+1" * 300_000, id="sum-within-the-bound"),  # read by the scanner: no literal
        pytest.param("[" * 30_000, id="30000-brackets"),
        pytest.param("-" * 30_000 + "1", id="30000-signs"),  # the parser's own MemoryError
    ],
)
def test_a_deep_expression_as_names_is_refused_with_exit_2(tmp_path, names):
    path = detector(tmp_path, {"names": names})
    assert_refused(models_check(path), path, "metadata 'names'")


def test_a_task_of_100000_characters_is_refused_before_it_is_parsed(tmp_path):
    path = detector(tmp_path, {"task": "-" * 100_000 + "1"})
    assert_refused(models_check(path), path, "metadata 'task'", "100,001 characters", "at most 256")


def test_a_million_names_are_refused_by_their_size_before_they_are_parsed(tmp_path):
    path = detector(tmp_path, {"names": repr({i: f"c{i}" for i in range(10**6)})})
    assert_refused(models_check(path), path, "metadata 'names'", f"at most {MAX_NAMES_CHARS:,}")


def test_run_refuses_a_hostile_model_with_exit_2(tmp_path):
    path = detector(tmp_path, {"names": "1" + "+1" * 30_000})
    r = run_process(agent_command("run", "--model", path, "--frames", "1", "--quiet"), 120)
    assert_refused(r, path, "metadata 'names'")


@pytest.mark.parametrize("where", ["metadata", "manifest"])
def test_models_check_prints_control_characters_in_labels_escaped(tmp_path, where):
    labels = [HOSTILE, "bel\x07", "cr\r", "lf\n"]
    if where == "metadata":
        path = detector(tmp_path, {"names": repr(dict(enumerate(labels)))})
    else:
        path = detector(tmp_path, {})
        quoted = ", ".join(
            '"' + s.encode("unicode_escape").decode().replace("\\x1b", "\\e") + '"' for s in labels
        )
        (tmp_path / "manifest.yaml").write_text(
            "input: {name: images, height: 320, width: 320, layout: NHWC, dtype: uint8, color: bgr}\n"
            f"output: {{name: output0, decoder: yolov8}}\nlabels: [{quoted}]\n"
        )
        assert resolve_model(path).manifest.labels == tuple(labels)
    r = models_check(path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not any(c in r.stdout + r.stderr for c in CONTROL), repr(r.stdout)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("labels"))
    assert line.split(None, 1)[1] == f"4: {ESCAPED}, bel\\x07, cr\\r, lf\\n", repr(line)


def test_listen_prints_control_characters_in_labels_escaped(tmp_path):
    """A real agent publishes results whose label is ``HOSTILE``; ``listen`` shows it escaped."""
    path = detector(tmp_path, {})
    (tmp_path / "manifest.yaml").write_text(
        "input: {name: images, height: 320, width: 320, layout: NHWC, dtype: uint8, color: bgr}\n"
        'output: {name: output0, decoder: yolov8}\nlabels: ["a\\e[2Jb\\ac\\rd\\ne", b, c, d]\n'
    )
    endpoint = free_endpoint()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"source: {{type: synthetic, fps: 30}}\nmodel: {{path: '{path}'}}\n"
        f"publish: {{endpoint: '{endpoint}'}}\nmetrics: {{enabled: false}}\n"
    )
    agent = agent_command("run", "--config", str(cfg), "--quiet")
    with spawn(agent, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL):
        listen = agent_command("listen", endpoint, "--topic", "det", "--count", "3", "--timeout", "60")
        out = run_process(listen, timeout_s=120)
    assert out.returncode == 0, out.stderr
    # (a listener that joins after the first result also prints "joined at seq N": skipped)
    lines = [ln for ln in out.stdout.splitlines() if "joined at seq" not in ln]
    assert len(lines) == 3 and all(f" {ESCAPED}" in ln and ":0.90@[" in ln for ln in lines), out.stdout
    assert not any(c in out.stdout for c in CONTROL), repr(out.stdout)


def open_anchor_model(path: Path, anchors: int, data_dependent: bool = False) -> str:
    """A pose export's layout ([B, 56, anchors], the anchors axis open in the graph's
    declared output) whose output is one value expanded to ``anchors``: a few hundred bytes
    of file. ``data_dependent``: the size is computed from the image (max pixel + anchors),
    so nothing but a run tells it; otherwise ONNX Runtime infers it at load."""
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 320, 320])
    y = helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["batch", 56, "anchors"])
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Reshape", ["m", "rank3"], ["m3"]),
    ]
    inits = [numpy_helper.from_array(np.array([-1, 1, 1], np.int64), "rank3")]
    if data_dependent:
        inits.append(numpy_helper.from_array(np.array([1, 56, anchors], np.int64), "base"))
        nodes += [
            helper.make_node("ReduceMax", ["images"], ["top"], keepdims=0),
            helper.make_node("Cast", ["top"], ["top64"], to=TensorProto.INT64),
            helper.make_node("Add", ["base", "top64"], ["shape"]),
        ]
    else:
        inits.append(numpy_helper.from_array(np.array([1, 56, anchors], np.int64), "shape"))
    nodes.append(helper.make_node("Expand", ["m3", "shape"], ["output0"]))
    model = helper.make_model(
        helper.make_graph(nodes, "open-anchors", [x], [y], inits), opset_imports=[helper.make_opsetid("", 17)]
    )
    model.ir_version = 8
    meta = {"task": "pose", "names": "{0: 'person'}", "kpt_shape": "[17, 3]", "imgsz": "[320, 320]"}
    for k, v in meta.items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    onnx.save(model, str(path))
    return str(path)


def test_an_output_of_5e6_anchors_is_refused_at_load_with_its_shape(tmp_path):
    """The trial itself: 632 bytes of model that expand to [1, 56, 5e6] (4.5 GB and 2.3 s per
    frame before): ONNX Runtime knows the size at load, so nothing is allocated."""
    path = open_anchor_model(tmp_path / "open.onnx", 5_000_000)
    assert_refused(
        models_check(path), path, "output 'output0'", "[?, 56, 5000000]", f"{MAX_OUTPUT_ELEMENTS:,}"
    )


def test_an_output_whose_size_only_a_run_tells_is_refused_at_its_first_output(tmp_path):
    anchors = MAX_OUTPUT_ELEMENTS // 56 + 1000
    path = open_anchor_model(tmp_path / "open.onnx", anchors, data_dependent=True)
    config = ModelConfig(path=path, input_adapter="off")
    with (
        load_model(config, OnnxRuntimeConfig()) as loaded,
        pytest.raises(ModelError, match=rf"\[1, 56, {anchors}\]"),
    ):
        loaded.backend.allocate()
    assert_refused(models_check(path), path, "output 'output0'", f"[1, 56, {anchors}]")


# -- the bounds, each at its edge -----------------------------------------------------------------


def test_the_bounds_are_the_ones_documented():
    from edge_agent.models import manifest
    from edge_agent.models.decoders import base

    assert (manifest.MAX_LABELS, manifest.MAX_LABEL_CHARS) == (MAX_LABELS, MAX_LABEL_CHARS)
    assert (onnx_info.MAX_NAMES_CHARS, base.MAX_OUTPUT_ELEMENTS) == (MAX_NAMES_CHARS, MAX_OUTPUT_ELEMENTS)


def test_names_within_the_bounds_are_read_and_one_more_is_refused():
    most = [f"c{i}" for i in range(MAX_LABELS)]
    assert onnx_info.parse_names(repr(most)) == tuple(most)
    with pytest.raises(onnx_info.MetadataError, match=f"more than {MAX_LABELS:,} items"):
        onnx_info.parse_names(repr([*most, "x"]))
    long = "x" * MAX_LABEL_CHARS
    assert onnx_info.parse_names(repr({0: long, 1: "b"})) == (long, "b")
    with pytest.raises(onnx_info.MetadataError, match=f"at most {MAX_LABEL_CHARS} characters"):
        onnx_info.parse_names(repr({0: long + "x"}))


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{0: 'a', 'x': 'b'}", "class ids"),  # mixed keys: sorted() raised TypeError
        ("{0: 'a', 1: 2}", "label 1: int 2 is not a string"),
        ("{0: 'a', -1: 'b'}", "class ids"),
        ("{0: 'a'", "flat"),
        ("{0: {1: 'a'}}", "label 0: dict"),
        ("{0: '\\ud800'}", "UTF-8"),  # a lone surrogate: unpublishable
        ("'person'", "a dict of class ids to labels"),
        ("{}", "no labels"),
    ],
)
def test_names_that_are_not_a_flat_dict_or_list_of_labels_are_refused(text, why):
    with pytest.raises(onnx_info.MetadataError, match=why):
        onnx_info.parse_names(text)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("{0: 'person', 1: \"it's\", 2: 'a\\x1bb'}", {0: "person", 1: "it's", 2: "a\x1bb"}),
        ("[640, 640]", [640, 640]),
        ("(17, 3)", (17, 3)),
        ("{'batch': 1, 'nms': True, 'half': False, 'opset': None, 'imgsz': [640, 640], 'f': 1.5e-3}", None),
        ("True", True),
        ("32", 32),
        ("detect", "detect"),
        ("RTDETRDecoder", "RTDETRDecoder"),
        ("1+1", "1+1"),  # not a literal: the text itself, as before
    ],
)
def test_metadata_literals_are_read_as_ultralytics_writes_them(text, value):
    want = value if value is not None else eval(text)  # a literal of this test's own
    assert onnx_info.parse_value("k", text) == want


def test_a_manifest_past_its_bounds_is_refused_before_it_is_built(tmp_path):
    path = detector(tmp_path, {})
    head = (
        "input: {name: images, height: 320, width: 320, layout: NHWC, dtype: uint8, color: bgr}\n"
        "output: {name: output0, decoder: yolov8}\n"
    )
    manifest = tmp_path / "manifest.yaml"
    manifest.write_text(head + "labels: [" + ",".join("a" for _ in range(200_000)) + "]\n")
    with pytest.raises(ModelError, match=r"manifest\.yaml: .*more than [\d,]+ YAML nodes"):
        resolve_model(path)
    manifest.write_text(head + "description: " + "x" * (2 << 20) + "\n")
    with pytest.raises(ModelError, match=r"manifest\.yaml: \d+ bytes, over \d+"):
        resolve_model(path)
    manifest.write_text(head + "labels: [" + ",".join(f"c{i}" for i in range(MAX_LABELS + 1)) + "]\n")
    with pytest.raises(ConfigError, match=f"at most {MAX_LABELS:,}"):
        resolve_model(path)
    manifest.write_text(head + f"labels: [{'x' * (MAX_LABEL_CHARS + 1)}, b, c, d]\n")
    with pytest.raises(ConfigError, match=f"at most {MAX_LABEL_CHARS} characters"):
        resolve_model(path)


def test_a_fifo_as_manifest_is_refused_without_blocking(tmp_path):
    import os

    path = detector(tmp_path, {})
    fifo = tmp_path / "manifest.yaml"
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match="not a regular file"):
        resolve_model(path, str(fifo))


def test_imgsz_out_of_range_is_refused_naming_the_key(tmp_path):
    path = open_anchor_model(tmp_path / "m.onnx", 2100)
    model = onnx.load(path)
    model.graph.input[0].CopyFrom(
        helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, "h", "w"])
    )
    for p in model.metadata_props:
        if p.key == "imgsz":
            p.value = "[100000, 100000]"
    onnx.save(model, path)
    with pytest.raises(ModelError, match=r"m\.onnx: metadata 'imgsz'"):
        resolve_model(path)


def test_listen_escapes_every_field_a_peer_sends(tmp_path):
    """Source, topic, zone and counts come from the peer too."""
    import contextlib
    import io
    from argparse import Namespace

    from edge_agent.client import GapTracker, parse
    from edge_agent.commands.stream import _print_message

    bodies = [
        ("det.c\x1bam", {"source": "c\x1bam", "seq": 0, "frame_id": 0, "detections": []}),
        ("health.x", {"type": "health", "fps": 1.0, "counts": {"captured": "\x1b[2J"}}),
        (
            "event.x",
            {"type": "event", "source": "x\r", "seq": 0, "run_id": "r", "kind": "enter\x07",
             "zone": "z\n", "track_id": 1, "label": HOSTILE, "frame_id": 0, "at_unix_s": 0.0},
        ),
    ]  # fmt: skip
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for topic, body in bodies:
            _print_message(Namespace(json=False), topic, body, parse(topic, body), GapTracker(), False)
    assert not any(c in out.getvalue() for c in CONTROL), repr(out.getvalue())
    assert len(out.getvalue().splitlines()) == 3 and ESCAPED in out.getvalue()
