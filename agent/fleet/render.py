"""A device's effective config: the fleet's layers that match it, then its local overlay and
the environment, merged and built into an ``AgentConfig`` once; validation of every device."""

from __future__ import annotations

import fnmatch
import os
import socket
from collections.abc import Mapping

import yaml

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import (
    Builder,
    ConfigError,
    Problem,
    compose_file,
    lookup,
    node_kind,
    to_plain,
)
from edge_agent.fleet.diff import quote_key
from edge_agent.fleet.env import env_layer, scalar_node, substitute
from edge_agent.fleet.merge import MAP_TAG, SCALARS, Merger
from edge_agent.fleet.parse import (
    DeviceFacts,
    Rendered,
    _config_layer,
    _config_node,
    _Device,
    _fleet_files,
    _Group,
    _is_null,
    _items,
    _labels,
    _Layer,
    _str_value,
    _where,
    problem_at,
)


def load_fleet(path: str) -> Fleet:
    """Read a fleet file or directory; structure errors raise ``ConfigError`` (all of them)."""
    problems: list[Problem] = []
    fleet = Fleet(path)
    groups_at: dict[str, str] = {}
    for file in _fleet_files(path):
        root = compose_file(file)
        if root is None:
            continue
        if not isinstance(root, yaml.MappingNode):
            problems.append(
                problem_at(
                    root, "", "expected a mapping with defaults, groups, devices; got " + node_kind(root)
                )
            )
            continue
        for key, _k, v_node in _items(root, "", problems, ("defaults", "groups", "devices")):
            if key == "defaults":
                fleet._defaults.append(_Layer("defaults", _config_node(v_node, "defaults", problems)))
            elif key == "groups":
                _load_groups(fleet, v_node, problems, groups_at)
            else:
                _load_devices(fleet, v_node, problems)
    if problems:
        raise ConfigError(problems)
    return fleet


def _load_groups(fleet: Fleet, node: yaml.Node, problems: list[Problem], groups_at: dict[str, str]) -> None:
    if _is_null(node):
        return
    if not isinstance(node, yaml.SequenceNode):
        problems.append(problem_at(node, "groups", f"expected a list of groups, got {node_kind(node)}"))
        return
    for i, g_node in enumerate(node.value):
        path = f"groups[{i}]"
        if not isinstance(g_node, yaml.MappingNode):
            problems.append(
                problem_at(g_node, path, f"expected a mapping (name, match, config), got {node_kind(g_node)}")
            )
            continue
        name = None
        hostname = module = None
        labels: dict[str, str] = {}
        config = None
        for key, _k, v_node in _items(g_node, path, problems, ("name", "match", "config")):
            sub = f"{path}.{key}"
            if key == "name":
                name = _str_value(v_node, sub, problems)
                if name is not None and name in groups_at:
                    problems.append(
                        problem_at(v_node, sub, f"duplicate group {name!r} (also at {groups_at[name]})")
                    )
                    name = None
                elif name is not None:
                    groups_at[name] = _where(v_node)
            elif key == "config":
                config = _config_node(v_node, sub, problems)
            elif _is_null(v_node):
                continue
            elif not isinstance(v_node, yaml.MappingNode):
                problems.append(
                    problem_at(
                        v_node, sub, f"expected a mapping (hostname, module, labels), got {node_kind(v_node)}"
                    )
                )
            else:
                for mkey, _mk, m_node in _items(v_node, sub, problems, ("hostname", "module", "labels")):
                    msub = f"{sub}.{mkey}"
                    if mkey == "hostname":
                        hostname = _str_value(m_node, msub, problems)
                    elif mkey == "module":
                        module = _str_value(m_node, msub, problems)
                    else:
                        labels = _labels(m_node, msub, problems)
        if name is None and lookup(g_node, "name", last=True) is None:
            problems.append(problem_at(g_node, f"{path}.name", "missing required key (a group name)"))
        if name is not None:
            label = f"{path} {quote_key(name)}"
            fleet._groups.append(_Group(name, label, groups_at[name], hostname, module, labels, config))


def _load_devices(fleet: Fleet, node: yaml.Node, problems: list[Problem]) -> None:
    if _is_null(node):
        return
    if not isinstance(node, yaml.MappingNode):
        problems.append(
            problem_at(node, "devices", f"expected a mapping of device id: entry, got {node_kind(node)}")
        )
        return
    for k_node, d_node in node.value:
        device_id = SCALARS.construct_object(k_node) if isinstance(k_node, yaml.ScalarNode) else None
        if not isinstance(device_id, str) or not device_id:
            problems.append(
                problem_at(
                    k_node, "devices", "a device id must be a non-empty string, got " + node_kind(k_node)
                )
            )
            continue
        path = f"devices.{device_id}"
        if device_id in fleet._devices:
            other = fleet._devices[device_id].where
            problems.append(problem_at(k_node, path, f"duplicate device {device_id!r} (also at {other})"))
            continue
        hostname, module = device_id, ""
        labels: dict[str, str] = {}
        config = None
        if not _is_null(d_node) and not isinstance(d_node, yaml.MappingNode):
            problems.append(
                problem_at(
                    d_node,
                    path,
                    f"expected a mapping (hostname, module, labels, config), got {node_kind(d_node)}",
                )
            )
        elif isinstance(d_node, yaml.MappingNode):
            for key, _k, v_node in _items(d_node, path, problems, ("hostname", "module", "labels", "config")):
                sub = f"{path}.{key}"
                if key == "hostname":
                    hostname = _str_value(v_node, sub, problems) or hostname
                elif key == "module":
                    module = _str_value(v_node, sub, problems) or ""
                elif key == "labels":
                    labels = _labels(v_node, sub, problems)
                else:
                    config = _config_node(v_node, sub, problems)
        fleet._devices[device_id] = _Device(device_id, _where(k_node), hostname, module, labels, config)


class Fleet:
    """A loaded fleet; ``render`` gives one device's effective config."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._defaults: list[_Layer] = []
        self._groups: list[_Group] = []
        self._devices: dict[str, _Device] = {}

    def device_ids(self) -> list[str]:
        """The ids listed under ``devices``, in file order."""
        return list(self._devices)

    def group_names(self) -> list[str]:
        return [g.name for g in self._groups]

    def facts(self, device_id: str, facts: DeviceFacts | None = None) -> DeviceFacts:
        """The facts match rules see: the device's entry, overridden by ``facts`` where given."""
        listed = self._devices.get(device_id)
        hostname = listed.hostname if listed else device_id
        module = listed.module if listed else ""
        labels = dict(listed.labels) if listed else {}
        if facts is not None:
            hostname = facts.hostname or hostname
            module = facts.module or module
            labels.update(facts.labels)
        return DeviceFacts(device_id, hostname, module, labels)

    def matching_groups(self, facts: DeviceFacts) -> list[str]:
        return [g.name for g in self._groups if _matches(g, facts)]

    def render(
        self,
        device_id: str,
        overlay: str | None = None,
        env: Mapping[str, str] | None = None,
        facts: DeviceFacts | None = None,
        check_files: bool = False,
        resolve_paths: bool = True,
    ) -> Rendered:
        """The effective config of ``device_id``; raises ``ConfigError`` with every problem.

        ``check_files``: input files and folders the config names must exist (on the
        device that runs it; a fleet validated elsewhere names the devices' paths).
        """
        seen = self.facts(device_id, facts)
        layers = list(self._defaults)
        layers += [_Layer(g.label, g.config) for g in self._groups if _matches(g, seen)]
        listed = self._devices.get(device_id)
        if listed is not None:
            layers.append(_Layer(f"devices.{device_id}", listed.config))
        return _render_local(self.path, device_id, layers, overlay, env, check_files, resolve_paths)


def _render_local(
    file: str,
    device_id: str,
    layers: list[_Layer],
    overlay: str | None,
    env: Mapping[str, str] | None,
    check_files: bool,
    resolve_paths: bool = True,
) -> Rendered:
    """``layers``, then this device's own: the overlay file and the environment."""
    env = os.environ if env is None else env
    problems: list[Problem] = []
    if overlay is not None:
        layer = _config_layer("overlay", compose_file(overlay), problems)
        layers = [*layers, layer] if layer else layers
    env_node = env_layer(env, problems)
    return _render(file, device_id, layers, env, env_node, problems, check_files, resolve_paths)


def is_fleet(path: str) -> bool:
    """A fleet is a directory of YAML files, or a file whose top level has only
    ``defaults``/``groups``/``devices``. Raises ``ConfigError`` for an unreadable file."""
    return os.path.isdir(path) or _fleet_shaped(compose_file(path))


def _fleet_shaped(node: yaml.Node | None) -> bool:
    if not isinstance(node, yaml.MappingNode):
        return False
    keys = [k.value if isinstance(k, yaml.ScalarNode) else None for k, _v in node.value]
    return bool(keys) and set(keys) <= {"defaults", "groups", "devices"}


def load_effective(
    path: str | None,
    device: str | None = None,
    overlay: str | None = None,
    env: Mapping[str, str] | None = None,
    check_files: bool = False,
    resolve_paths: bool = True,
) -> Rendered:
    """The config this device runs: the embedded default (``path`` None), a plain config
    file, or device ``device`` (default: this host's name) of a fleet; then the local
    overlay file and the ``EDGE_AGENT__`` environment variables, by the same rules
    everywhere. A plain file is one layer; ``${VAR}`` works in it as in a fleet's.

    Raises ``ConfigError`` naming the file, line and key path (or the variable) of every
    problem; ``check_files``: also of every input file or folder that does not exist.
    ``resolve_paths`` false keeps relative paths as written (to compare two configs).
    """
    host = socket.gethostname()
    node = None  # the plain file, composed once
    if path is not None and (os.path.isdir(path) or _fleet_shaped(node := compose_file(path))):
        return load_fleet(path).render(
            device or host, overlay, env, check_files=check_files, resolve_paths=resolve_paths
        )
    problems: list[Problem] = []
    layer = _config_layer("file", node, problems)
    if problems:
        raise ConfigError(problems)
    layers = [layer] if layer else []
    return _render_local(path or "<default config>", host, layers, overlay, env, check_files, resolve_paths)


def _matches(group: _Group, facts: DeviceFacts) -> bool:
    if group.hostname is not None and not fnmatch.fnmatchcase(facts.hostname, group.hostname):
        return False
    if group.module is not None and facts.module != group.module:
        return False
    return all(facts.labels.get(k) == v for k, v in group.labels.items())


def _render(
    file: str,
    device_id: str,
    layers: list[_Layer],
    env: Mapping[str, str],
    env_node: yaml.MappingNode | None,
    problems: list[Problem],
    check_files: bool = False,
    resolve_paths: bool = True,
) -> Rendered:
    merger = Merger()
    id_mark = yaml.Mark("<device id>", 0, -1, -1, None, None)
    root = yaml.MappingNode(
        MAP_TAG,
        [(scalar_node("device_id", id_mark), scalar_node(device_id, id_mark))],
        id_mark,
        id_mark,
    )
    merger.origins["device_id"] = "device id"
    for layer in layers:
        if layer.node is None:
            continue
        node = substitute(layer.node, "", env, problems)
        root = merger.merge(root, node, (), layer.label)
    if env_node is not None:
        root = merger.merge(root, env_node, (), None)
    builder = Builder(file, resolve_paths=resolve_paths, check_files=check_files)
    config = builder.build(AgentConfig, root, "")
    reported = {(p.file, p.line, p.column) for p in problems}
    problems += [p for p in builder.problems if (p.file, p.line, p.column) not in reported]
    if problems:
        raise ConfigError(_dedupe(problems))
    origins = dict(sorted(merger.origins.items()))
    return Rendered(config, to_plain(config), origins)


def _dedupe(problems: list[Problem]) -> list[Problem]:
    return list(dict.fromkeys(problems))


def validate_fleet(path: str, env: Mapping[str, str] | None = None) -> list[Problem]:
    """Every problem of a fleet: its structure, then every device and every group rendered.

    A group is rendered as defaults + that group alone; a device with its matching groups
    and entry. ``env`` feeds ``${VAR}`` substitution only: neither overlay files nor
    ``EDGE_AGENT__`` variables (both local to one device) take part. Empty list: valid.
    """
    env = os.environ if env is None else env
    try:
        fleet = load_fleet(path)
    except ConfigError as e:
        return _dedupe(e.problems)
    problems: list[Problem] = []
    renders: list[tuple[str, list[_Layer]]] = []
    for device_id, device in fleet._devices.items():
        seen = fleet.facts(device_id)
        layers = list(fleet._defaults) + [
            _Layer(g.label, g.config) for g in fleet._groups if _matches(g, seen)
        ]
        renders.append((device_id, [*layers, _Layer(f"devices.{device_id}", device.config)]))
    for group in fleet._groups:
        renders.append((f"group-{group.name}", [*list(fleet._defaults), _Layer(group.label, group.config)]))
    if not renders:
        renders.append(("defaults", list(fleet._defaults)))
    for device_id, layers in renders:
        try:
            _render(path, device_id, layers, env, None, [])
        except ConfigError as e:
            problems += e.problems
    return _dedupe(problems)
