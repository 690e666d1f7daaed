"""A fleet's files read into layers: ``defaults``, ``groups`` (with their match rules) and
``devices``, each kept as YAML nodes so every problem names its file, line and key."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import yaml

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import (
    ENV_ORIGIN,
    ConfigError,
    Problem,
    node_kind,
)
from edge_agent.fleet.merge import NULL_TAG, SCALARS


@dataclass(frozen=True)
class DeviceFacts:
    """What group match rules see of a device."""

    device_id: str
    hostname: str = ""
    module: str = ""
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Rendered:
    """One device's effective config, and which layer set each key."""

    config: AgentConfig
    plain: dict
    origins: dict[str, str]  # dotted key path -> layer, e.g. 'defaults (fleet.yaml:3)'

    @property
    def defaults_only(self) -> bool:
        """No config file set anything (an empty file; variables may have)."""
        return all(o == "device id" or o.startswith(ENV_ORIGIN) for o in self.origins.values())


@dataclass
class _Layer:
    label: str  # 'defaults', 'groups[1] "orin-nano"', 'devices.cam-001', 'overlay'
    node: yaml.MappingNode | None


@dataclass
class _Group:
    name: str
    label: str
    where: str  # file:line, for duplicate messages
    hostname: str | None
    module: str | None
    labels: dict[str, str]
    config: yaml.MappingNode | None


@dataclass
class _Device:
    device_id: str
    where: str
    hostname: str
    module: str
    labels: dict[str, str]
    config: yaml.MappingNode | None


def problem_at(node: yaml.Node | None, path: str, message: str, file: str = "") -> Problem:
    mark = node.start_mark if node is not None else None
    if mark is None:
        return Problem(file, 0, 0, path, message)
    return Problem(mark.name or file, mark.line + 1, mark.column + 1, path, message)


def _where(node: yaml.Node) -> str:
    return f"{node.start_mark.name}:{node.start_mark.line + 1}"


def _fleet_files(path: str) -> list[str]:
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith((".yaml", ".yml")) and not n.startswith("."))
        files = [os.path.join(path, n) for n in names if os.path.isfile(os.path.join(path, n))]
        if not files:
            raise ConfigError([Problem(path, 0, 0, "", "no *.yaml or *.yml files in this directory")])
        return files
    return [path]


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == NULL_TAG


def _items(node: yaml.MappingNode, path: str, problems: list[Problem], allowed: tuple[str, ...] | None):
    """(key, key node, value node) of a mapping; unknown and duplicate keys are problems."""
    seen: set[str] = set()
    for k_node, v_node in node.value:
        key = k_node.value if isinstance(k_node, yaml.ScalarNode) else None
        sub = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str) or (allowed is not None and key not in allowed):
            expected = f" (expected one of: {', '.join(allowed)})" if allowed else ""
            problems.append(problem_at(k_node, sub, f"unknown key{expected}"))
            continue
        if key in seen:
            problems.append(problem_at(k_node, sub, "duplicate key"))
            continue
        seen.add(key)
        yield key, k_node, v_node


def _str_value(node: yaml.Node, path: str, problems: list[Problem]) -> str | None:
    if isinstance(node, yaml.ScalarNode):
        value = SCALARS.construct_object(node)
        if isinstance(value, str) and value:
            return value
    problems.append(problem_at(node, path, f"expected a non-empty string, got {node_kind(node)}"))
    return None


def _labels(node: yaml.Node, path: str, problems: list[Problem]) -> dict[str, str]:
    if _is_null(node):
        return {}
    if not isinstance(node, yaml.MappingNode):
        problems.append(problem_at(node, path, f"expected a mapping of label: value, got {node_kind(node)}"))
        return {}
    out = {}
    for key, _k, v_node in _items(node, path, problems, None):
        if isinstance(v_node, yaml.ScalarNode) and not _is_null(v_node):
            out[key] = v_node.value  # as written: `floor: 3` is the label "3"
        else:
            problems.append(
                problem_at(v_node, f"{path}.{key}", f"expected a scalar label value, got {node_kind(v_node)}")
            )
    return out


def _config_node(node: yaml.Node, path: str, problems: list[Problem]) -> yaml.MappingNode | None:
    if _is_null(node):
        return None
    if not isinstance(node, yaml.MappingNode):
        problems.append(problem_at(node, path, f"expected an agent config mapping, got {node_kind(node)}"))
        return None
    _check_duplicates(node, path, problems)
    return node


def _check_duplicates(node: yaml.Node, path: str, problems: list[Problem]) -> None:
    """Duplicate keys inside a config layer (the merge would otherwise hide them)."""
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k_node, v_node in node.value:
            key = k_node.value if isinstance(k_node, yaml.ScalarNode) else None
            sub = f"{path}.{key}" if path else str(key)
            if key is not None and key in seen:
                problems.append(problem_at(k_node, sub, "duplicate key"))
            seen.add(key)
            _check_duplicates(v_node, sub, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, f"{path}[{i}]", problems)


def _config_layer(label: str, node: yaml.Node | None, problems: list[Problem]) -> _Layer | None:
    """A whole file as one config layer (an overlay, or a plain config file)."""
    if node is None:
        return None
    if not isinstance(node, yaml.MappingNode):
        problems.append(problem_at(node, "", "expected an agent config mapping, got " + node_kind(node)))
        return None
    _check_duplicates(node, "", problems)
    return _Layer(label, node)
