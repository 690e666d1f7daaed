"""The shipped examples (examples/) load with the real loader, exactly as a user copies them:
every config validates with its file checks (the files it names are made beside a copy), the
fleet validates and renders every device, and none of them exposes anything to the network.

(examples/; agent/core/effective/render.py, agent/commands/configs.py `config validate`)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError
from edge_agent.core.effective.render import load_effective, load_fleet, validate_fleet
from edge_agent.core.exposure import exposure_warnings
from edge_agent.core.model_config import TensorRTConfig
from edge_agent.core.source_config import SourceConfig

EXAMPLES = REPO / "examples"

#: Each example config, and the files and folders it names (relative to it), which a user puts
#: beside it and the test makes beside a copy.
CONFIGS: dict[str, tuple[str, ...]] = {
    "synthetic.yaml": (),
    "video.yaml": ("clip.mp4",),
    "images.yaml": ("frames/",),
    "watch.yaml": ("drop/",),
    "v4l2.yaml": (),
    "rtsp.yaml": (),
    "csi-jetson.yaml": ("yolov8n.onnx",),
    "multi-source.yaml": (),
}


@pytest.fixture
def copied(tmp_path: Path) -> Path:
    """examples/ copied byte for byte, with the inputs the configs name beside them."""
    folder = tmp_path / "examples"
    shutil.copytree(EXAMPLES, folder)
    for inputs in CONFIGS.values():
        for name in inputs:
            if name.endswith("/"):
                (folder / name).mkdir()
            else:
                (folder / name).write_bytes(b"")
    return folder


def test_every_example_config_is_listed():
    assert sorted(p.name for p in EXAMPLES.glob("*.yaml")) == sorted(CONFIGS)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_example_config_validates_with_its_files(copied: Path, name: str):
    rendered = load_effective(str(copied / name), env={}, check_files=True)
    assert not rendered.defaults_only
    assert exposure_warnings(rendered.config) == [], "an example binds loopback only"
    for input_name in CONFIGS[name]:
        assert (copied / input_name.rstrip("/")).exists()


@pytest.mark.parametrize("name", [n for n, inputs in CONFIGS.items() if inputs])
def test_an_example_naming_a_file_fails_without_it(tmp_path: Path, name: str):
    """The file checks take part: the table above is what each example needs."""
    shutil.copy(EXAMPLES / name, tmp_path / name)
    with pytest.raises(ConfigError, match="not found"):
        load_effective(str(tmp_path / name), env={}, check_files=True)


def test_the_examples_cover_every_source_type():
    kinds = set()
    for name in CONFIGS:
        cfg = load_effective(str(EXAMPLES / name), env={}).config
        kinds |= {s.type for s in cfg.source_list()}
    tags = {typing.get_type_hints(t)["type"].__args__[0] for t in typing.get_args(SourceConfig)}
    assert kinds == tags
    assert len(load_effective(str(EXAMPLES / "multi-source.yaml"), env={}).config.sources) > 1


def test_config_validate_command_on_an_example(copied: Path):
    path = copied / "video.yaml"
    r = subprocess.run(
        [sys.executable, "-m", "edge_agent", "config", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and r.stdout.strip() == f"{path}: OK", r.stdout + r.stderr
    assert r.stderr == ""


def test_the_example_fleet_validates_and_renders_every_device():
    fleet_dir = str(EXAMPLES / "fleet")
    assert validate_fleet(fleet_dir, env={}) == []
    fleet = load_fleet(fleet_dir)
    assert fleet.device_ids() == ["cam-001", "cam-002", "gate-07"]
    assert fleet.group_names() == ["orin_nano", "xavier_nx"]
    configs: dict[str, AgentConfig] = {d: fleet.render(d, env={}).config for d in fleet.device_ids()}
    for device, cfg in configs.items():
        assert cfg.device_id == device
        assert exposure_warnings(cfg) == []
    assert [cfg.source.type for cfg in configs.values()] == ["v4l2", "rtsp", "synthetic"]
    assert configs["cam-002"].source.url == "rtsp://10.0.0.52/stream1", "the ${VAR:-default}"
    trt = {d: cfg.backend.tensorrt for d, cfg in configs.items()}
    assert trt["cam-001"] == trt["cam-002"] == TensorRTConfig(precision="fp16")
    assert trt["gate-07"] == TensorRTConfig(precision="fp16", dla_core=0)
    assert configs["gate-07"].deadline.budget_ms == 70.0


def test_config_validate_command_on_the_example_fleet():
    r = subprocess.run(
        [sys.executable, "-m", "edge_agent", "config", "validate", str(EXAMPLES / "fleet")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0 and "OK (3 devices, 2 groups)" in r.stdout, r.stdout + r.stderr
    assert r.stderr == "", "no device of the example exposes anything"


def test_the_inventory_example_names_the_example_fleet_and_its_devices():
    """deploy/ansible's inventory example, copied to the repo's root, rolls examples/fleet out."""
    inventory = yaml.safe_load((REPO / "deploy/ansible/inventory.example.yml").read_text())
    agents = inventory["all"]["children"]["edge_agents"]
    src = agents["vars"]["edge_agent_fleet_src"]
    assert src == "{{ inventory_dir }}/examples/fleet"
    fleet = load_fleet(str(EXAMPLES / "fleet"))
    assert sorted(agents["children"]) == sorted(fleet.group_names())
    hosts = {h: v for group in agents["children"].values() for h, v in group["hosts"].items()}
    assert sorted(hosts) == sorted(fleet.device_ids())
    for device, host in hosts.items():
        assert host["edge_agent_labels"] == fleet.facts(device).labels
        assert fleet.matching_groups(fleet.facts(device)) == [
            g for g, v in agents["children"].items() if device in v["hosts"]
        ]
