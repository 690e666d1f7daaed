"""A device's effective config: the fleet's layers that match it, then its local overlay and
the environment, merged and built into an ``AgentConfig`` once; validation of every device."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

import yaml

from edge_agent.core.config import AgentConfig
from edge_agent.core.configbuild import Builder
from edge_agent.core.configload import ConfigError, Problem, compose_file, to_plain
from edge_agent.core.effective.env import env_layer, scalar_node, substitute
from edge_agent.core.effective.flags import flags_layer
from edge_agent.core.effective.merge import MAP_TAG, Merger
from edge_agent.core.effective.parse import (
    DEVICE_ID_ORIGIN,
    ConfigFile,
    DeviceFacts,
    Layer,
    Rendered,
    config_layer,
    read_fleet,
)


def load_fleet(path: str | ConfigFile) -> Fleet:
    """Read a fleet file or directory (or take a file already read); structure errors raise
    ``ConfigError`` (all of them)."""
    return Fleet(path)


class Fleet:
    """A loaded fleet; ``render`` gives one device's effective config."""

    def __init__(self, path: str | ConfigFile) -> None:
        self.path = path.path if isinstance(path, ConfigFile) else path
        self.spec = read_fleet(path)

    def device_ids(self) -> list[str]:
        """The ids listed under ``devices``, in file order."""
        return list(self.spec.devices)

    def group_names(self) -> list[str]:
        return [g.name for g in self.spec.groups.values()]

    def facts(self, device_id: str, facts: DeviceFacts | None = None) -> DeviceFacts:
        """The facts match rules see: the device's entry, overridden by ``facts`` where given."""
        listed = self.spec.devices.get(device_id)
        hostname = (listed and listed.hostname) or device_id
        module = (listed and listed.module) or ""
        labels = listed.label_values() if listed else {}
        if facts is not None:
            hostname = facts.hostname or hostname
            module = facts.module or module
            labels.update(facts.labels)
        return DeviceFacts(device_id, hostname, module, labels)

    def matching_groups(self, facts: DeviceFacts) -> list[str]:
        return [g.name for g in self.spec.groups.values() if g.matches(facts)]

    def layers(self, device_id: str, facts: DeviceFacts | None = None) -> list[Layer]:
        """The fleet's layers of ``device_id``: defaults, its matching groups, its entry."""
        seen = self.facts(device_id, facts)
        layers = list(self.spec.defaults)
        layers += [Layer(label, g.config) for label, g in self.spec.groups.items() if g.matches(seen)]
        listed = self.spec.devices.get(device_id)
        return layers + ([Layer(f"devices.{device_id}", listed.config)] if listed else [])

    def render(
        self,
        device_id: str,
        overlay: str | None = None,
        env: Mapping[str, str] | None = None,
        facts: DeviceFacts | None = None,
        check_files: bool = False,
        resolve_paths: bool = True,
        flags: Mapping[str, tuple[str, object]] | None = None,
    ) -> Rendered:
        """The effective config of ``device_id``; raises ``ConfigError`` with every problem.

        ``check_files``: input files and folders the config names must exist (on the
        device that runs it; a fleet validated elsewhere names the devices' paths).
        """
        layers = self.layers(device_id, facts)
        return _render_local(self.path, device_id, layers, overlay, env, check_files, resolve_paths, flags)


def _render_local(
    file: str,
    device_id: str,
    layers: list[Layer],
    overlay: str | None,
    env: Mapping[str, str] | None,
    check_files: bool,
    resolve_paths: bool = True,
    flags: Mapping[str, tuple[str, object]] | None = None,
) -> Rendered:
    """``layers``, then this device's own: the overlay file, the environment, the flags."""
    env = os.environ if env is None else env
    problems: list[Problem] = []
    if overlay is not None:
        layer = config_layer("overlay", compose_file(overlay), problems)
        layers = [*layers, layer] if layer else layers
    env_node = env_layer(env, problems)
    flag_node = flags_layer(flags) if flags else None
    return _render(file, device_id, layers, env, env_node, problems, check_files, resolve_paths, flag_node)


def load_effective(
    path: str | ConfigFile | None,
    device: str | None = None,
    overlay: str | None = None,
    env: Mapping[str, str] | None = None,
    check_files: bool = False,
    resolve_paths: bool = True,
    flags: Mapping[str, tuple[str, object]] | None = None,
) -> Rendered:
    """The config this device runs: the embedded default (``path`` None), a plain config
    file (``-``: stdin; or one already read, a ``ConfigFile``), or device ``device``
    (default: this host's name) of a fleet; then the local overlay file, the
    ``EDGE_AGENT__`` environment variables and the command line's ``flags`` (see
    ``env.flags_layer``), by the same rules everywhere. A plain file is one layer;
    ``${VAR}`` works in it as in a fleet's.

    Raises ``ConfigError`` naming the file, line and key path (or the variable) of every
    problem; ``check_files``: also of every input file or folder that does not exist.
    ``resolve_paths`` false keeps relative paths as written (to compare two configs).
    """
    host = socket.gethostname()
    source = ConfigFile.read(path) if isinstance(path, str) else path  # read once
    if source is not None and source.is_fleet:
        return load_fleet(source).render(
            device or host, overlay, env, check_files=check_files, resolve_paths=resolve_paths, flags=flags
        )
    problems: list[Problem] = []
    layer = config_layer("file", source.node if source else None, problems)
    if problems:
        raise ConfigError(problems)
    layers = [layer] if layer else []
    file = source.path if source else "<default config>"
    return _render_local(file, host, layers, overlay, env, check_files, resolve_paths, flags)


def _render(
    file: str,
    device_id: str,
    layers: list[Layer],
    env: Mapping[str, str],
    env_node: yaml.MappingNode | None,
    problems: list[Problem],
    check_files: bool = False,
    resolve_paths: bool = True,
    flag_node: yaml.MappingNode | None = None,
) -> Rendered:
    merger = Merger()
    id_mark = yaml.Mark("<device id>", 0, -1, -1, None, None)
    pair = (scalar_node("device_id", id_mark), scalar_node(device_id, id_mark))
    root = yaml.MappingNode(MAP_TAG, [pair], id_mark, id_mark)
    merger.origins["device_id"] = DEVICE_ID_ORIGIN
    for layer in layers:
        if layer.node is None:
            continue
        node = substitute(layer.node, "", env, problems)
        root = merger.merge(root, node, (), layer.label)
    if env_node is not None:
        root = merger.merge(root, env_node, (), None)
    if flag_node is not None:
        root = merger.merge(root, flag_node, (), "command line")
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


def validate_fleet(path: str | ConfigFile, env: Mapping[str, str] | None = None) -> list[Problem]:
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
    renders = [(device_id, fleet.layers(device_id)) for device_id in fleet.device_ids()]
    for label, group in fleet.spec.groups.items():
        renders.append((f"group-{group.name}", [*fleet.spec.defaults, Layer(label, group.config)]))
    if not renders:
        renders.append(("defaults", list(fleet.spec.defaults)))
    for device_id, layers in renders:
        try:
            _render(fleet.path, device_id, layers, env, None, [])
        except ConfigError as e:
            problems += e.problems
    return _dedupe(problems)
