"""Fleet configuration: one YAML tree for many devices, rendered into one device's config.

A fleet is a file, or a directory whose ``*.yaml``/``*.yml`` files (dot-files skipped) are
read in name order as if they were one file::

    defaults:                     # an AgentConfig mapping
      publish: {endpoint: "tcp://*:5556"}
    groups:                       # applied in file order, every group whose match holds
      - name: orin-nano
        match:                    # every key given must hold; empty or absent: all devices
          hostname: "cam-*"       # shell glob on the hostname
          module: orin-nano       # exact module name
          labels: {site: berlin}  # every label given must be equal
        config: {backend: {type: tensorrt}}
    devices:                      # by device id
      cam-001:
        hostname: cam-001         # default: the id
        module: orin-nano
        labels: {site: berlin}
        config: {source: {fps: 15}}

Unknown keys anywhere are errors. Group and device names are unique across all files
(a duplicate names both places). ``defaults`` may appear in several files of a directory;
they are applied in name order.

Layers, lowest first: ``device_id`` (the device's id, unless a layer sets it) → defaults →
every matching group in file order → the device's entry → a local overlay file (a plain
AgentConfig YAML, e.g. written by the tuning tool) → environment variables
``EDGE_AGENT__<SECTION>__<KEY>[__<SUBKEY>...]=<value>`` (parts split at ``__`` and
lowercased; the value is a YAML scalar, so ``30`` is an int and ``true`` a bool; a value
starting with ``[`` or ``{`` is a YAML flow list/mapping).

Merge rules:

* mappings merge key by key, deeply (a later layer adds and overrides keys, it never
  removes one);
* lists are replaced whole by a later layer, never concatenated (``deadline.ladder``,
  ``backend.onnxruntime.providers``, ``source.patterns``);
* scalars (null included) are replaced;
* ``source`` and ``sources`` exclude each other: a layer that sets one drops the other
  from the layers below (fleet defaults for one camera, a device with four);
* a section with a ``type`` (``source``, ``backend``) whose type changes in a later layer
  is replaced as a whole, not merged: keys of one source type are not valid for another.
  A section without ``type`` is the union's first member (``synthetic``, ``auto``), so
  ``source: {type: video, ...}`` over a typeless source replaces it too; a later layer
  without ``type`` merges into whatever type is in force.

``${VAR}`` and ``${VAR:-default}`` are substituted inside every scalar of every config layer
(not in the environment-variable layer), from the ``env`` mapping (default ``os.environ``);
``$${`` stands for a literal ``${``. A substituted scalar is resolved again as YAML, so
``"${FPS:-30}"`` is the int 30 (an empty result stays the empty string). ``${VAR}`` unset
without a default is an error.

Values keep their YAML nodes, with file and line, through the merge; the merged tree is
built into an ``AgentConfig`` by ``configload.Builder``, so every error names the original
file, line and key path of the value that is wrong.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import os
import re
import socket
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import (
    ENV_ORIGIN,
    ENV_PREFIX,
    Builder,
    ConfigError,
    Problem,
    compose_file,
    node_kind,
    to_plain,
)

_STR = "tag:yaml.org,2002:str"
_MAP = "tag:yaml.org,2002:map"
_NULL = "tag:yaml.org,2002:null"
_scalars = SafeConstructor()
_resolver = Resolver()


# -- public types ------------------------------------------------------------------------------


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


# -- loading -----------------------------------------------------------------------------------


def _problem(node: yaml.Node | None, path: str, message: str, file: str = "") -> Problem:
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
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL


def _items(node: yaml.MappingNode, path: str, problems: list[Problem], allowed: tuple[str, ...] | None):
    """(key, key node, value node) of a mapping; unknown and duplicate keys are problems."""
    seen: set[str] = set()
    for k_node, v_node in node.value:
        key = k_node.value if isinstance(k_node, yaml.ScalarNode) else None
        sub = f"{path}.{key}" if path else str(key)
        if not isinstance(key, str) or (allowed is not None and key not in allowed):
            expected = f" (expected one of: {', '.join(allowed)})" if allowed else ""
            problems.append(_problem(k_node, sub, f"unknown key{expected}"))
            continue
        if key in seen:
            problems.append(_problem(k_node, sub, "duplicate key"))
            continue
        seen.add(key)
        yield key, k_node, v_node


def _str_value(node: yaml.Node, path: str, problems: list[Problem]) -> str | None:
    if isinstance(node, yaml.ScalarNode):
        value = _scalars.construct_object(node)
        if isinstance(value, str) and value:
            return value
    problems.append(_problem(node, path, f"expected a non-empty string, got {node_kind(node)}"))
    return None


def _labels(node: yaml.Node, path: str, problems: list[Problem]) -> dict[str, str]:
    if _is_null(node):
        return {}
    if not isinstance(node, yaml.MappingNode):
        problems.append(_problem(node, path, f"expected a mapping of label: value, got {node_kind(node)}"))
        return {}
    out = {}
    for key, _k, v_node in _items(node, path, problems, None):
        if isinstance(v_node, yaml.ScalarNode) and not _is_null(v_node):
            out[key] = v_node.value  # as written: `floor: 3` is the label "3"
        else:
            problems.append(
                _problem(v_node, f"{path}.{key}", f"expected a scalar label value, got {node_kind(v_node)}")
            )
    return out


def _config_node(node: yaml.Node, path: str, problems: list[Problem]) -> yaml.MappingNode | None:
    if _is_null(node):
        return None
    if not isinstance(node, yaml.MappingNode):
        problems.append(_problem(node, path, f"expected an agent config mapping, got {node_kind(node)}"))
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
                problems.append(_problem(k_node, sub, "duplicate key"))
            seen.add(key)
            _check_duplicates(v_node, sub, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_duplicates(item, f"{path}[{i}]", problems)


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
                _problem(
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
        problems.append(_problem(node, "groups", f"expected a list of groups, got {node_kind(node)}"))
        return
    for i, g_node in enumerate(node.value):
        path = f"groups[{i}]"
        if not isinstance(g_node, yaml.MappingNode):
            problems.append(
                _problem(g_node, path, f"expected a mapping (name, match, config), got {node_kind(g_node)}")
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
                        _problem(v_node, sub, f"duplicate group {name!r} (also at {groups_at[name]})")
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
                    _problem(
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
        if name is None and _lookup(g_node, "name") is None:
            problems.append(_problem(g_node, f"{path}.name", "missing required key (a group name)"))
        if name is not None:
            label = f"{path} {_quote(name)}"
            fleet._groups.append(_Group(name, label, groups_at[name], hostname, module, labels, config))


def _load_devices(fleet: Fleet, node: yaml.Node, problems: list[Problem]) -> None:
    if _is_null(node):
        return
    if not isinstance(node, yaml.MappingNode):
        problems.append(
            _problem(node, "devices", f"expected a mapping of device id: entry, got {node_kind(node)}")
        )
        return
    for k_node, d_node in node.value:
        device_id = _scalars.construct_object(k_node) if isinstance(k_node, yaml.ScalarNode) else None
        if not isinstance(device_id, str) or not device_id:
            problems.append(
                _problem(
                    k_node, "devices", "a device id must be a non-empty string, got " + node_kind(k_node)
                )
            )
            continue
        path = f"devices.{device_id}"
        if device_id in fleet._devices:
            other = fleet._devices[device_id].where
            problems.append(_problem(k_node, path, f"duplicate device {device_id!r} (also at {other})"))
            continue
        hostname, module = device_id, ""
        labels: dict[str, str] = {}
        config = None
        if not _is_null(d_node) and not isinstance(d_node, yaml.MappingNode):
            problems.append(
                _problem(
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


# -- the fleet ---------------------------------------------------------------------------------


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


def _config_layer(label: str, node: yaml.Node | None, problems: list[Problem]) -> _Layer | None:
    """A whole file as one config layer (an overlay, or a plain config file)."""
    if node is None:
        return None
    if not isinstance(node, yaml.MappingNode):
        problems.append(_problem(node, "", "expected an agent config mapping, got " + node_kind(node)))
        return None
    _check_duplicates(node, "", problems)
    return _Layer(label, node)


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
    env_node = _env_layer(env, problems)
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
    merger = _Merger()
    id_mark = yaml.Mark("<device id>", 0, -1, -1, None, None)
    root = yaml.MappingNode(
        _MAP,
        [(_scalar("device_id", id_mark), _scalar(device_id, id_mark))],
        id_mark,
        id_mark,
    )
    merger.origins["device_id"] = "device id"
    for layer in layers:
        if layer.node is None:
            continue
        node = _substitute(layer.node, "", env, problems)
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


# -- merging -----------------------------------------------------------------------------------


class _Merger:
    """Merges config layers as YAML nodes and records which layer set each key path."""

    def __init__(self) -> None:
        self.origins: dict[str, str] = {}

    def merge(
        self, base: yaml.Node | None, over: yaml.Node, parts: tuple[str, ...], label: str | None
    ) -> yaml.Node:
        if isinstance(base, yaml.MappingNode) and isinstance(over, yaml.MappingNode):
            over_tag = _type_of(over)
            base_tag = _type_of(base) or _default_tag(parts)
            if over_tag is None or over_tag == base_tag:
                pairs = list(base.value)
                if not parts:
                    pairs = self._one_source_form(pairs, over, variable=label is None)
                index = {_key(k): i for i, (k, _v) in enumerate(pairs)}
                for k_node, v_node in over.value:
                    key = _key(k_node)
                    sub = (*parts, str(key))
                    if key is not None and key in index:
                        i = index[key]
                        pairs[i] = (k_node, self.merge(pairs[i][1], v_node, sub, label))
                    else:
                        index[key] = len(pairs)
                        pairs.append((k_node, self.merge(None, v_node, sub, label)))
                return yaml.MappingNode(base.tag, pairs, over.start_mark, over.end_mark, over.flow_style)
        # Replaced whole: a scalar, a list, a new key, or a section whose type changed.
        prefix = ".".join(parts)
        for path in [p for p in self.origins if p == prefix or p.startswith(prefix + ".")]:
            del self.origins[path]
        self._record(over, prefix, label)
        return over

    def _one_source_form(
        self, pairs: list[tuple[yaml.Node, yaml.Node]], over: yaml.MappingNode, variable: bool = False
    ) -> list[tuple[yaml.Node, yaml.Node]]:
        """``source`` (one camera) and ``sources`` (several) exclude each other: a layer that
        sets one replaces the other of the layers below (defaults with one camera, a device
        with four). A ``variable`` (EDGE_AGENT__SOURCES) may replace one camera by a list,
        but EDGE_AGENT__SOURCE__FPS only tunes a single source: over a list it is refused
        (as both), not turned into a default camera."""
        given = {_key(k) for k, _v in over.value}
        if variable:
            drop = {"source"} if "sources" in given else set()
        else:
            drop = {"source", "sources"} - given if given & {"source", "sources"} else set()
        for path in [p for p in self.origins if p.split(".")[0] in drop]:
            del self.origins[path]
        return [(k, v) for k, v in pairs if _key(k) not in drop]

    def _record(self, node: yaml.Node, path: str, label: str | None) -> None:
        if isinstance(node, yaml.MappingNode) and node.value:
            for k_node, v_node in node.value:
                self._record(v_node, f"{path}.{_key(k_node)}" if path else str(_key(k_node)), label)
            return
        if not path:
            return
        mark = node.start_mark
        self.origins[path] = mark.name if label is None else f"{label} ({mark.name}:{mark.line + 1})"


def _key(node: yaml.Node) -> Any:
    return node.value if isinstance(node, yaml.ScalarNode) else id(node)


def _lookup(node: yaml.MappingNode, key: str) -> yaml.Node | None:
    found = None
    for k_node, v_node in node.value:
        if isinstance(k_node, yaml.ScalarNode) and k_node.value == key:
            found = v_node
    return found


def _type_of(node: yaml.MappingNode) -> Any:
    tag = _lookup(node, "type")
    if isinstance(tag, yaml.ScalarNode):
        return _scalars.construct_object(tag)
    return None


def _is_union(t: Any) -> bool:
    return typing.get_origin(t) in (typing.Union, types.UnionType)


@functools.cache
def _default_tag(parts: tuple[str, ...]) -> Any:
    """The ``type`` a section at ``parts`` has when it gives none (a union's first member)."""
    candidates: list[type] = [AgentConfig]
    for part in parts:
        hints = [typing.get_type_hints(c).get(part) for c in candidates if dataclasses.is_dataclass(c)]
        hints = [h for h in hints if h is not None]
        members = [m for h in hints for m in (typing.get_args(h) if _is_union(h) else (h,))]
        candidates = [m for m in members if dataclasses.is_dataclass(m)]
        if not candidates:
            return None
    tag = {f.name: f for f in dataclasses.fields(candidates[0])}.get("type")
    return None if tag is None or parts == () else tag.default


# -- substitution and the environment ----------------------------------------------------------

_VAR = re.compile(r"\$(\$\{)|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _substitute(node: yaml.Node, path: str, env: Mapping[str, str], problems: list[Problem]) -> yaml.Node:
    """A copy of ``node`` with ``${VAR}``/``${VAR:-default}`` substituted in its scalars."""
    if isinstance(node, yaml.MappingNode):
        pairs = []
        for k_node, v_node in node.value:
            sub = f"{path}.{_key(k_node)}" if path else str(_key(k_node))
            pairs.append((k_node, _substitute(v_node, sub, env, problems)))
        return yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)
    if isinstance(node, yaml.SequenceNode):
        items = [_substitute(n, f"{path}[{i}]", env, problems) for i, n in enumerate(node.value)]
        return yaml.SequenceNode(node.tag, items, node.start_mark, node.end_mark, node.flow_style)
    if not isinstance(node, yaml.ScalarNode) or "$" not in node.value or node.tag != _STR:
        return node
    missing: list[str] = []

    def replace(m: re.Match) -> str:
        if m.group(1):
            return "${"
        name, default = m.group(2), m.group(3)
        if name in env:
            return env[name]
        if default is not None:
            return default
        missing.append(name)
        return ""

    value, count = _VAR.subn(replace, node.value)
    for name in missing:
        problems.append(_problem(node, path, f"${{{name}}} is not set (and has no default)"))
    if not count:
        return node
    tag = _resolver.resolve(yaml.ScalarNode, value, (True, False)) if value else _STR
    return yaml.ScalarNode(tag, value, node.start_mark, node.end_mark, node.style)


def _scalar(value: str, mark: yaml.Mark) -> yaml.ScalarNode:
    tag = _resolver.resolve(yaml.ScalarNode, value, (True, False)) if value else _STR
    return yaml.ScalarNode(tag, value, mark, mark)


def _env_layer(env: Mapping[str, str], problems: list[Problem]) -> yaml.MappingNode | None:
    """``EDGE_AGENT__SOURCE__FPS=15`` → ``{source: {fps: 15}}``, each value marked with its variable."""
    root = None
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX)):
        mark = yaml.Mark(f"{ENV_ORIGIN}{name}", 0, -1, -1, None, None)
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            problems.append(
                Problem(
                    f"{ENV_ORIGIN}{name}",
                    0,
                    0,
                    "",
                    f"expected {ENV_PREFIX}<SECTION>__<KEY>..., with no empty part",
                )
            )
            continue
        value = _env_value(env[name], mark, ".".join(parts), problems)
        if value is None:
            continue
        for part in reversed(parts):
            value = yaml.MappingNode(_MAP, [(_scalar(part, mark), value)], mark, mark)
        root = value if root is None else _Merger().merge(root, value, (), None)
    return root


def _env_value(text: str, mark: yaml.Mark, path: str, problems: list[Problem]) -> yaml.Node | None:
    if not text.lstrip().startswith(("[", "{")):
        return _scalar(text, mark)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        problems.append(Problem(mark.name, 0, 0, path, f"YAML syntax: {getattr(e, 'problem', e)}"))
        return None
    return _remark(node, mark)


def _remark(node: yaml.Node, mark: yaml.Mark) -> yaml.Node:
    node.start_mark = node.end_mark = mark
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _remark(k, mark)
            _remark(v, mark)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _remark(v, mark)
    return node


# -- diff --------------------------------------------------------------------------------------


def diff_configs(a: dict, b: dict) -> list[str]:
    """Differences of two plain configs (``to_plain``), sorted by key path.

    ``path: old -> new`` for a changed value, ``+ path: value`` for one only in ``b``,
    ``- path: value`` for one only in ``a``. Lists of scalars compare whole; lists of
    mappings (``deadline.ladder``) item by item.
    """
    fa, fb = _flatten(a, ""), _flatten(b, "")
    lines = []
    for path in sorted(set(fa) | set(fb), key=_path_key):
        if path not in fb:
            lines.append(f"- {path}: {_fmt(fa[path])}")
        elif path not in fa:
            lines.append(f"+ {path}: {_fmt(fb[path])}")
        elif fa[path] != fb[path] or type(fa[path]) is not type(fb[path]):
            lines.append(f"{path}: {_fmt(fa[path])} -> {_fmt(fb[path])}")
    return lines


def _flatten(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{path}[{i}]"))
        return out
    return {path: list(value) if isinstance(value, tuple) else value}


def _path_key(path: str) -> list:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\[\]]+", path) if p]


def _fmt(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
    return text[: -len("...")].strip() if text.endswith("\n...") else text


# -- helpers -----------------------------------------------------------------------------------


def _quote(name: str) -> str:
    return '"' + name.replace('"', '\\"') + '"'
