"""Merging config layers node by node: mappings merge key by key, a section whose ``type``
changes is replaced whole, lists and scalars are replaced."""

from __future__ import annotations

import dataclasses
import functools
import typing
from typing import Any

import yaml
from yaml.resolver import Resolver

from edge_agent.core.config import AgentConfig
from edge_agent.core.configbuild import is_union, nested_sections
from edge_agent.core.configload import lookup
from edge_agent.core.yamlnodes import Scalars

STR_TAG = "tag:yaml.org,2002:str"
MAP_TAG = "tag:yaml.org,2002:map"
SCALARS = Scalars()  # keeps nothing it constructed
RESOLVER = Resolver()


class Merger:
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
                # One shape for both layers, so that a later layer's key wins whichever way
                # each wrote it (``backend.onnxruntime.x`` as `config show` prints it, or
                # ``backend.x``).
                base = _own_section_lifted(base, base_tag, parts)
                over = _own_section_lifted(over, base_tag, parts)
                pairs = list(base.value)
                if not parts:
                    pairs = self._one_source_form(pairs, over, variable=label is None)
                index = {node_key(k): i for i, (k, _v) in enumerate(pairs)}
                for k_node, v_node in over.value:
                    key = node_key(k_node)
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
        given = {node_key(k) for k, _v in over.value}
        if variable:
            drop = {"source"} if "sources" in given else set()
        else:
            drop = {"source", "sources"} - given if given & {"source", "sources"} else set()
        for path in [p for p in self.origins if p.split(".")[0] in drop]:
            del self.origins[path]
        return [(k, v) for k, v in pairs if node_key(k) not in drop]

    def _record(self, node: yaml.Node, path: str, label: str | None) -> None:
        if isinstance(node, yaml.MappingNode) and node.value:
            for k_node, v_node in node.value:
                self._record(v_node, f"{path}.{node_key(k_node)}" if path else str(node_key(k_node)), label)
            return
        if not path:
            return
        mark = node.start_mark
        self.origins[path] = mark.name if label is None else f"{label} ({mark.name}:{mark.line + 1})"


def node_key(node: yaml.Node) -> Any:
    return node.value if isinstance(node, yaml.ScalarNode) else id(node)


def _type_of(node: yaml.MappingNode) -> Any:
    tag = lookup(node, "type", last=True)
    if isinstance(tag, yaml.ScalarNode):
        return SCALARS.construct_object(tag)
    return None


@functools.cache
def _members(parts: tuple[str, ...]) -> tuple[type, ...]:
    """The dataclasses a section at ``parts`` may be (a union's members, or the one)."""
    candidates: list[type] = [AgentConfig]
    for part in parts:
        hints = [typing.get_type_hints(c).get(part) for c in candidates if dataclasses.is_dataclass(c)]
        hints = [h for h in hints if h is not None]
        members = [m for h in hints for m in (typing.get_args(h) if is_union(h) else (h,))]
        candidates = [m for m in members if dataclasses.is_dataclass(m)]
        if not candidates:
            return ()
    return tuple(candidates)


@functools.cache
def _default_tag(parts: tuple[str, ...]) -> Any:
    """The ``type`` a section at ``parts`` has when it gives none (a union's first member)."""
    members = _members(parts)
    if not members or parts == ():
        return None
    tag = {f.name: f for f in dataclasses.fields(members[0])}.get("type")
    return None if tag is None else tag.default


def _own_section_lifted(node: yaml.MappingNode, tag: Any, parts: tuple[str, ...]) -> yaml.MappingNode:
    """``node`` with the section of its own type lifted to its top level, as the loader
    reads it (``configload.Builder._unnest``): ``{type: onnxruntime, onnxruntime: {x: 1}}``
    is ``{type: onnxruntime, x: 1}``. Other nodes are returned as they are."""
    members = _members(parts)
    own = [m for m in members if getattr(m, "type", None) == tag]
    sections = nested_sections(members)
    if len(own) != 1 or not (sections.keys() - {f.name for f in dataclasses.fields(own[0])}):
        return node
    pairs: list[tuple[yaml.Node, yaml.Node]] = []
    for k_node, v_node in node.value:
        name = node_key(k_node)
        if sections.get(name) is own[0] and isinstance(v_node, yaml.MappingNode):
            pairs += [(k, v) for k, v in v_node.value if node_key(k) != "type"]
        else:
            pairs.append((k_node, v_node))
    return yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)
