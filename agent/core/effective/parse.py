"""A fleet's files read into layers: ``defaults``, ``groups`` (with their match rules) and
``devices``. configload's ``Builder`` checks their structure; ``config`` values stay YAML
nodes, so the merge keeps every value's file and line."""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field, fields

import yaml

from edge_agent.core.config import AgentConfig
from edge_agent.core.configbuild import Builder
from edge_agent.core.configfields import check
from edge_agent.core.configload import (
    ConfigError,
    Problem,
    compose_file,
    duplicate_keys,
    lookup,
    node_kind,
    problem_at,
)
from edge_agent.core.configpaths import ENV_ORIGIN
from edge_agent.core.effective.diff import quote_key
from edge_agent.core.effective.merge import SCALARS


@dataclass(frozen=True)
class DeviceFacts:
    """What group match rules see of a device."""

    device_id: str
    hostname: str = ""
    module: str = ""
    labels: dict[str, str] = field(default_factory=dict)


#: The origin of ``device_id`` when no layer set it: the id the device was rendered as.
DEVICE_ID_ORIGIN = "device id"


@dataclass(frozen=True)
class Rendered:
    """One device's effective config, and which layer set each key."""

    config: AgentConfig
    plain: dict
    origins: dict[str, str]  # dotted key path -> layer, e.g. 'defaults (fleet.yaml:3)'

    @property
    def defaults_only(self) -> bool:
        """No config file set anything (an empty file; variables may have)."""
        return all(o == DEVICE_ID_ORIGIN or o.startswith(ENV_ORIGIN) for o in self.origins.values())


@dataclass
class Layer:
    label: str  # 'defaults', 'groups[1] "orin-nano"', 'devices.cam-001', 'overlay'
    node: yaml.MappingNode | None


@dataclass(frozen=True)
class MatchSpec:
    """A group's match rule: every key given must hold (none given: every device). A device's
    entry states the same facts. Null is as if not given."""

    hostname: str | None = None  # a shell glob in a rule
    module: str | None = None
    # As written, not resolved: `floor: 3` is the label "3", to compare as text.
    labels: dict[yaml.ScalarNode, yaml.ScalarNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for key in ("hostname", "module"):
            check(getattr(self, key) != "", key, "expected a non-empty string, got ''")

    def label_values(self) -> dict[str, str]:
        return {k.value: v.value for k, v in self.labels.items()}


@dataclass(frozen=True)
class DeviceSpec(MatchSpec):
    """A device's entry; its hostname defaults to its id."""

    config: yaml.MappingNode | None = None


@dataclass(frozen=True)
class GroupSpec:
    name: str
    match: MatchSpec = field(default_factory=MatchSpec)
    config: yaml.MappingNode | None = None

    def __post_init__(self) -> None:
        check(self.name != "", "name", "expected a non-empty string, got ''")

    def matches(self, facts: DeviceFacts) -> bool:
        rule = self.match
        return (
            (rule.hostname is None or fnmatch.fnmatchcase(facts.hostname, rule.hostname))
            and rule.module in (None, facts.module)
            and all(facts.labels.get(k) == v for k, v in rule.label_values().items())
        )


@dataclass(frozen=True)
class FleetFile:
    defaults: yaml.MappingNode | None = None
    groups: list[GroupSpec] = field(default_factory=list)
    # Keys kept as nodes: a duplicate names where the first one is.
    devices: dict[yaml.ScalarNode, DeviceSpec] = field(default_factory=dict)


@dataclass
class FleetSpec:
    defaults: list[Layer] = field(default_factory=list)  # one per file that has them
    groups: dict[str, GroupSpec] = field(default_factory=dict)  # by layer label, in file order
    devices: dict[str, DeviceSpec] = field(default_factory=dict)  # by id, in file order


@dataclass(frozen=True)
class ConfigFile:
    """A config path read once: a fleet's folder, or a file's document. Whether it is a
    fleet, and then its config, come from this one read: stdin or a pipe has no second."""

    path: str
    node: yaml.Node | None = None  # the file's document; None: empty, or a folder
    folder: bool = False

    @classmethod
    def read(cls, path: str) -> ConfigFile:
        """Raises ``ConfigError`` naming the file (``yamlnodes.read_file``, ``compose_file``)."""
        if os.path.isdir(path):
            return cls(path, folder=True)
        return cls(path, compose_file(path))

    @property
    def is_fleet(self) -> bool:
        """A folder of YAML files, or a file whose top level has only ``defaults``,
        ``groups`` and ``devices``."""
        if self.folder:
            return True
        if not isinstance(self.node, yaml.MappingNode):
            return False
        keys = [k.value if isinstance(k, yaml.ScalarNode) else None for k, _v in self.node.value]
        return bool(keys) and set(keys) <= {f.name for f in fields(FleetFile)}


def read_fleet(path: str | ConfigFile) -> FleetSpec:
    """Every file of a fleet, in name order (a file already read, as it was read);
    structure errors raise ``ConfigError`` (all of them)."""
    given = path if isinstance(path, ConfigFile) and not path.folder else None
    path = path.path if isinstance(path, ConfigFile) else path
    fleet = FleetSpec()
    builder = Builder(path, null_is_empty=True)
    seen: dict[str, str] = {}  # "group 'x'" / "device 'x'" -> file:line of the first
    for file in _fleet_files(path):
        root = given.node if given is not None else compose_file(file)
        spec = builder.build(FleetFile, root, "") if root is not None else None
        if not isinstance(spec, FleetFile):
            continue  # empty, or its problems are reported
        fleet.defaults.append(Layer("defaults", spec.defaults))
        groups = lookup(root, "groups")
        for i, group in enumerate(spec.groups):
            name_node = lookup(groups.value[i], "name")
            if _unique(builder, seen, f"group {group.name!r}", name_node, f"groups[{i}].name"):
                fleet.groups[f"groups[{i}] {quote_key(group.name)}"] = group
        for key, device in spec.devices.items():
            device_id = SCALARS.construct_object(key)
            if not isinstance(device_id, str) or not device_id:
                builder.fail(key, "devices", f"a device id must be a non-empty string, got {node_kind(key)}")
            elif _unique(builder, seen, f"device {device_id!r}", key, f"devices.{device_id}"):
                fleet.devices[device_id] = device
    if builder.problems:
        raise ConfigError(builder.problems)
    return fleet


def _unique(builder: Builder, seen: dict[str, str], what: str, node: yaml.Node, path: str) -> bool:
    """Group names and device ids are unique across all files; a duplicate names both places."""
    if what in seen:
        builder.fail(node, path, f"duplicate {what} (also at {seen[what]})")
        return False
    seen[what] = f"{node.start_mark.name}:{node.start_mark.line + 1}"
    return True


def _fleet_files(path: str) -> list[str]:
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith((".yaml", ".yml")) and not n.startswith("."))
        files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        if not files:
            raise ConfigError([Problem(path, 0, 0, "", "no *.yaml or *.yml files in this directory")])
        return files
    return [path]


def config_layer(label: str, node: yaml.Node | None, problems: list[Problem]) -> Layer | None:
    """A whole file as one config layer (an overlay, or a plain config file)."""
    if node is None:
        return None
    if not isinstance(node, yaml.MappingNode):
        problems.append(problem_at(node, "", "expected an agent config mapping, got " + node_kind(node)))
        return None
    problems += [problem_at(k, path, "duplicate key") for k, path in duplicate_keys(node, "")]
    return Layer(label, node)
