"""One shape for the backend: each backend's settings under its own name (``backend.onnxruntime.*``),
whatever the ``type``, in what ``config show``/``render``/``diff`` print and in what loads; the
flat form of a single type (``{type: onnxruntime, providers: ...}``) still loads.

(agent/core/configbuild.py ``Builder._unnest``, agent/core/config.py ``printed``)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from edge_agent.core.config import AgentConfig, load_config, printed
from edge_agent.core.configload import ConfigError, load
from edge_agent.core.model_config import OnnxRuntimeConfig, TensorRTConfig


def problems(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, text, "agent.yaml")
    return [(p.line, p.path, p.message) for p in info.value.problems]


def show(*args: str) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "edge_agent", "config", "show", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_single_type_loads_with_its_settings_nested_under_its_name():
    """The issue's line: the shape `config show` prints for auto, with the type changed."""
    cfg = load(AgentConfig, "backend: {type: onnxruntime, onnxruntime: {allow_spinning: false}}\n", "a.yaml")
    assert cfg.backend == OnnxRuntimeConfig(allow_spinning=False)
    trt = "backend:\n  type: tensorrt\n  tensorrt: {type: tensorrt, precision: fp32, dla_core: 0}\n"
    assert load(AgentConfig, trt, "a.yaml").backend == TensorRTConfig(precision="fp32", dla_core=0)


def test_nested_and_flat_keys_combine_but_a_key_given_both_ways_is_refused():
    text = "backend:\n  type: onnxruntime\n  providers: [CPU]\n  onnxruntime: {inter_op_threads: 2}\n"
    assert load(AgentConfig, text, "a.yaml").backend == OnnxRuntimeConfig(
        providers=("CPU",), inter_op_threads=2
    )
    twice = (
        "backend:\n  type: onnxruntime\n  allow_spinning: true\n  onnxruntime:\n    allow_spinning: false\n"
    )
    [(line, path, message)] = problems(twice)
    assert (line, path) == (5, "backend.onnxruntime.allow_spinning")
    assert "also given outside the section (line 3)" in message


def test_problems_inside_a_nested_section_name_the_key_as_written():
    text = "backend:\n  type: tensorrt\n  tensorrt:\n    precision: int8\n    workspace_mib: 1\n"
    assert problems(text) == [
        (5, "backend.tensorrt.workspace_mib", "must be within 16..65536"),
        (4, "backend.tensorrt.calibration_images", "int8 needs a folder of calibration frames"),
    ]
    [(line, path, message)] = problems("backend:\n  type: onnxruntime\n  onnxruntime: {threads: 2}\n")
    assert (line, path) == (3, "backend.onnxruntime.threads") and message.startswith("unknown key")


def test_the_other_types_section_is_refused_naming_the_types_that_read_it():
    text = "backend:\n  type: onnxruntime\n  tensorrt: {precision: fp16}\n"
    [(line, path, message)] = problems(text)
    assert (line, path) == (3, "backend.tensorrt")
    assert message == "type 'onnxruntime' has no tensorrt section (types that do: 'auto', 'tensorrt')"
    [(line, path, message)] = problems("backend:\n  type: tensorrt\n  tensorrt: {type: onnxruntime}\n")
    assert (line, path) == (3, "backend.tensorrt.type") and "expected 'tensorrt'" in message


def test_sources_take_no_nested_section():
    """Only a member another member of its union holds may be nested: no source holds one."""
    [(line, path, message)] = problems("source:\n  type: video\n  video: {path: a.mp4}\n")
    assert (line, path) == (3, "source.video") and message.startswith("unknown key")


@pytest.mark.parametrize(
    "backend",
    [
        "auto",
        "onnxruntime",
        "tensorrt",
        "{type: auto, onnxruntime: {allow_spinning: false}, tensorrt: {dla_core: 1}}",
        "{type: onnxruntime, intra_op_threads: 3}",
        "{type: tensorrt, tensorrt: {precision: int8, calibration_images: calib}}",
    ],
)
def test_printed_shape_is_one_for_every_type(backend):
    text = f"backend: {backend}\n" if "{" in backend else f"backend: {{type: {backend}}}\n"
    cfg = load(AgentConfig, text, "a.yaml")
    shape = printed(cfg)["backend"]
    kind = shape["type"]
    names = ["tensorrt", "onnxruntime"] if kind == "auto" else [kind]
    assert list(shape) == ["type", *names]
    assert all("type" not in shape[name] for name in names), "the section's type is the backend's"
    assert load(AgentConfig, yaml.safe_dump(printed(cfg)), "printed.yaml") == cfg


@pytest.mark.parametrize(
    "text",
    [
        None,  # the embedded default
        "backend: {type: auto}\n",
        "backend: {type: onnxruntime, onnxruntime: {allow_spinning: false}}\n",
        "backend: {type: tensorrt, precision: fp16, dla_core: 0}\n",
        "model: {cache_dir: ~/models}\nbackend: {type: tensorrt, tensorrt: {cache_dir: engines}}\n",
    ],
)
def test_config_show_output_loads_and_shows_the_same(tmp_path: Path, text):
    args = []
    if text is not None:
        (tmp_path / "agent.yaml").write_text(text)
        args = [str(tmp_path / "agent.yaml")]
    first = show(*args)
    (tmp_path / "shown.yaml").write_text(first)
    assert show(str(tmp_path / "shown.yaml")) == first
    if text is not None:  # the same config (a default's ~ comes back expanded: compare them resolved)
        again, original = load_config(str(tmp_path / "shown.yaml")), load_config(args[0])
        assert printed(again, home=True) == printed(original, home=True)
        assert type(again.backend) is type(original.backend)


def test_a_shown_default_loads_after_its_type_is_changed(tmp_path: Path):
    shown = yaml.safe_load(show())
    shown["backend"]["type"] = "onnxruntime"
    del shown["backend"]["tensorrt"]
    (tmp_path / "ort.yaml").write_text(yaml.safe_dump(shown))
    assert load_config(str(tmp_path / "ort.yaml")).backend == OnnxRuntimeConfig()
