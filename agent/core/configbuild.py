"""YAML nodes → typed values, driven by the config dataclasses' type hints: a ``Builder``
walks a composed document, checks each value's kind, tells union members apart by their
``type`` key, resolves path fields, runs each section's own checks, and collects every
problem with its file, line and key path instead of stopping at the first."""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
import types
import typing
from typing import Any, Literal, Union

import yaml

from edge_agent.core.configfields import FieldError, PathKind, collected_checks
from edge_agent.core.configpaths import missing, origin_dir
from edge_agent.core.yamlnodes import Problem, Scalars, duplicate_keys, lookup, node_kind, problem_at, short
from edge_agent.core.yamlnodes import join_path as _join

_MISSING = object()
_scalars = Scalars()
_FLOAT_MAX = int(sys.float_info.max)


def _type_name(t: Any) -> str:
    if t is type(None):
        return "null"
    if typing.get_origin(t) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(t))
    if dataclasses.is_dataclass(t):
        return "a mapping"
    return _TYPE_NAMES.get(t, getattr(t, "__name__", str(t)))


_TYPE_NAMES = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    yaml.MappingNode: "a mapping",
    yaml.SequenceNode: "a list",
    yaml.ScalarNode: "a non-null scalar",
}


def _node_types(t: Any) -> tuple[type, ...]:
    """The YAML node classes ``t`` names, when it names only those (and perhaps None)."""
    options = typing.get_args(t) if is_union(t) else (t,)
    kinds = tuple(o for o in options if isinstance(o, type) and issubclass(o, yaml.Node))
    return kinds if kinds and all(o in kinds or o is type(None) for o in options) else ()


_NULL_TAG, _MAP_TAG, _SEQ_TAG = (f"tag:yaml.org,2002:{k}" for k in ("null", "map", "seq"))


def _is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == _NULL_TAG


def _empty(t: Any, null: yaml.Node) -> yaml.Node:
    """An empty list or mapping in place of ``null`` where ``t`` is one (or a section)."""
    if typing.get_origin(t) in (list, tuple):
        return yaml.SequenceNode(_SEQ_TAG, [], null.start_mark, null.end_mark)
    if typing.get_origin(t) is dict or dataclasses.is_dataclass(t):
        return yaml.MappingNode(_MAP_TAG, [], null.start_mark, null.end_mark)
    return null


def nested_sections(options: tuple[type, ...] | list[type]) -> dict[str, type]:
    """The fields of a union's members that hold another member, by name: for the backend,
    ``{"tensorrt": TensorRTConfig, "onnxruntime": OnnxRuntimeConfig}`` (``auto``'s)."""
    return {
        name: hint
        for option in options
        for name, hint in typing.get_type_hints(option).items()
        if hint in options and hint is not option
    }


def _tags_reading(name: str, options: list[type]) -> list[Any]:
    """The ``type`` values that read a ``name`` section: the members that nest it (``auto``),
    and the member it holds."""
    readers = [o for o in options if name in typing.get_type_hints(o)] + [nested_sections(options)[name]]
    return [t for o in readers for t in typing.get_args(typing.get_type_hints(o)["type"])]


def _place(mark: yaml.Mark, beside: yaml.Mark) -> str:
    """Where ``mark`` is, for a message about a node at ``beside``: its line, and its file
    when that is another (a fleet's layers)."""
    same = mark.name == beside.name or str(mark.name).startswith("<")
    return f"line {mark.line + 1}" if same else f"{mark.name}:{mark.line + 1}"


def is_union(t: Any) -> bool:
    return typing.get_origin(t) in (Union, types.UnionType)


class Builder:
    """Converts YAML nodes to typed values, collecting problems instead of stopping."""

    def __init__(
        self, file: str, resolve_paths: bool = False, check_files: bool = False, null_is_empty: bool = False
    ) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.resolve_paths = resolve_paths  # relative path fields against their file's folder
        self.check_files = check_files  # input files and folders named must exist
        # null where a mapping, list or section is expected: an empty one (``devices:`` with
        # every entry commented out), not an error
        self.null_is_empty = null_is_empty
        # Written in a nested section (``_unnest``), by node id: a moved key's path as written,
        # and for the flattened mapping the section's path and node (a key it left out); the
        # mapping is kept too, so its id is not reused while the builder lives.
        self.key_paths: dict[int, str] = {}
        self.sections: dict[int, tuple[str, yaml.Node, yaml.Node]] = {}

    def fail(self, node: yaml.Node | None, path: str, message: str) -> object:
        self.problems.append(problem_at(node, path, message, self.file))
        return _MISSING

    def build(self, t: Any, node: yaml.Node, path: str) -> Any:
        origin = typing.get_origin(t)
        if _node_types(t):
            return self._keep(t, node, path)
        if self.null_is_empty and _is_null(node):
            node = _empty(t, node)
        if dataclasses.is_dataclass(t):
            return self._dataclass(t, node, path)
        if is_union(t):
            return self._union(t, node, path)
        if origin in (list, tuple):
            return self._sequence(t, node, path)
        if origin is dict:
            return self._mapping(t, node, path)
        return self._scalar(t, node, path)

    def _scalar(self, t: Any, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.ScalarNode):
            return self.fail(node, path, f"expected {_type_name(t)}, got {node_kind(node)}")
        value = _scalars.construct_object(node)
        if t is Any:
            return value
        if typing.get_origin(t) is Literal:
            options = typing.get_args(t)
            if value in options:
                return value
            # YAML 1.1 reads a plain on/off/yes/no as a bool: an option spelled so (cuda_graphs:
            # on, input_adapter: off) is meant as written.
            if isinstance(value, bool) and node.style is None and node.value in options:
                return node.value
            return self.fail(node, path, f"expected one of {_type_name(t)}, got {short(repr(value))}")
        if t is float and isinstance(value, int) and not isinstance(value, bool):
            if abs(value) > _FLOAT_MAX:  # float() would raise OverflowError: as .inf, refused
                return self.fail(node, path, f"expected a finite number, got {short(node.value)}")
            return float(value)
        if t is float and isinstance(value, float) and not math.isfinite(value):
            # .inf and .nan are valid YAML, but no duration, rate or budget here is infinite.
            return self.fail(node, path, f"expected a finite number, got {short(repr(value))}")
        if t is type(None) and value is None:
            return None
        if isinstance(value, t) and not (t is int and isinstance(value, bool)):
            return value
        hint = " (quote it to make it a string)" if t is str and value is not None else ""
        return self.fail(node, path, f"expected {_type_name(t)}, got {short(repr(value))}{hint}")

    def _path(self, kind: PathKind, value: str, node: yaml.Node, path: str) -> Any:
        """A path field's value resolved against the file that set it, and checked."""
        if self.resolve_paths:
            value = os.path.expanduser(value)
            base = origin_dir(getattr(node.start_mark, "name", None), self.file)
            if base is not None and not os.path.isabs(value):
                value = os.path.normpath(os.path.join(base, value))
        if self.check_files:
            problem = missing(kind, value)
            if problem:
                return self.fail(node, path, problem)
        return value

    def _union(self, t: Any, node: yaml.Node, path: str) -> Any:
        options = typing.get_args(t)
        tagged = [o for o in options if dataclasses.is_dataclass(o)]
        if tagged and isinstance(node, yaml.MappingNode):
            return self._tagged(tagged, node, path)
        is_null = isinstance(node, yaml.ScalarNode) and _scalars.construct_object(node) is None
        if is_null and type(None) in options:
            return None
        for option in options:
            if option is type(None) or dataclasses.is_dataclass(option):
                continue
            trial = Builder(self.file, self.resolve_paths, self.check_files, self.null_is_empty)
            value = trial.build(option, node, path)
            if not trial.problems:
                return value
        if tagged:
            tags = ", ".join(
                repr(t) for cls in tagged for t in typing.get_args(typing.get_type_hints(cls)["type"])
            )
            return self.fail(node, path, f"expected a mapping with a 'type' key (one of {tags})")
        names = " or ".join(dict.fromkeys(_type_name(o) for o in options))
        return self.fail(node, path, f"expected {names}")

    def _tagged(self, options: list[type], node: yaml.MappingNode, path: str) -> Any:
        """A union of dataclasses is told apart by its ``type`` key (a Literal field).

        Without a ``type`` key the first member of the union is meant (its default).
        """
        by_tag = {}
        for cls in options:
            hint = typing.get_type_hints(cls)["type"]
            for tag in typing.get_args(hint):
                by_tag[tag] = cls
        tag_node = lookup(node, "type")
        tags = ", ".join(repr(k) for k in by_tag)
        if tag_node is None:
            return self._dataclass(options[0], node, path)
        tag = _scalars.construct_object(tag_node) if isinstance(tag_node, yaml.ScalarNode) else None
        if tag not in by_tag:
            where = _join(path, "type")
            return self.fail(tag_node, where, f"unknown type {short(repr(tag))} (one of {tags})")
        node = self._unnest(by_tag[tag], tag, options, node, path)
        return self._dataclass(by_tag[tag], node, path)

    def _unnest(
        self, cls: type, tag: str, options: list[type], node: yaml.MappingNode, path: str
    ) -> yaml.MappingNode:
        """A member that another member of its union nests (``auto`` holds ``onnxruntime:``
        and ``tensorrt:`` sections) may be written that way alone too: ``{type: onnxruntime,
        onnxruntime: {...}}`` is ``{type: onnxruntime, ...}``, so a section shown for one
        type loads after its ``type`` is changed. A section of another member is refused:
        that type would never read it."""
        sections = nested_sections(options)
        own = {f.name for f in dataclasses.fields(cls)}
        names = [k.value if isinstance(k, yaml.ScalarNode) else None for k, _v in node.value]
        if not set(names) & (sections.keys() - own):
            return node
        given = {name: k for name, (k, _v) in zip(names, node.value) if name is not None}
        pairs, section = [], None
        for name, (k_node, v_node) in zip(names, node.value):
            where = _join(path, str(name))
            if name in own or name not in sections:
                pairs.append((k_node, v_node))
            elif sections[name] is not cls:
                readers = ", ".join(repr(t) for t in _tags_reading(name, options))
                self.fail(k_node, where, f"type {tag!r} has no {name} section (types that do: {readers})")
            elif not isinstance(v_node, yaml.MappingNode):
                self.fail(v_node, where, f"expected a mapping, got {node_kind(v_node)}")
            else:
                section = (where, v_node)
                pairs += self._inner_pairs(v_node, tag, given, where)
        flat = yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)
        if section is not None:
            self.sections[id(flat)] = (*section, flat)
        return flat

    def _inner_pairs(
        self, section: yaml.MappingNode, tag: str, given: dict[str, yaml.Node], path: str
    ) -> list[tuple[yaml.Node, yaml.Node]]:
        """The keys of a nested own section, named by their nested key path in problems; a
        key also given outside it is refused (neither may silently win)."""
        pairs = []
        for k_node, v_node in section.value:
            name = k_node.value if isinstance(k_node, yaml.ScalarNode) else None
            where = _join(path, str(name))
            if name == "type":  # the section's own type may be repeated, as auto's sections show it
                if not (isinstance(v_node, yaml.ScalarNode) and v_node.value == tag):
                    self.fail(v_node, where, f"expected {tag!r} (the section's), got {node_kind(v_node)}")
            elif name in given:
                place = _place(given[name].start_mark, k_node.start_mark)
                self.fail(k_node, where, f"also given outside the section ({place}): give it once")
            else:
                self.key_paths[id(k_node)] = where
                pairs.append((k_node, v_node))
        return pairs

    def _sequence(self, t: Any, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.SequenceNode):
            return self.fail(node, path, f"expected a list, got {node_kind(node)}")
        args = typing.get_args(t) or (Any,)
        if typing.get_origin(t) is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(node.value) != len(args):
                return self.fail(node, path, f"expected a list of {len(args)} items")
            items = [self.build(a, n, f"{path}[{i}]") for i, (a, n) in enumerate(zip(args, node.value))]
        else:
            item_t = args[0]
            items = [self.build(item_t, n, f"{path}[{i}]") for i, n in enumerate(node.value)]
        if any(v is _MISSING for v in items):
            return _MISSING
        return tuple(items) if typing.get_origin(t) is tuple else items

    def _mapping(self, t: Any, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.MappingNode):
            return self.fail(node, path, f"expected a mapping, got {node_kind(node)}")
        key_t, value_t = typing.get_args(t) or (str, Any)
        out = {}
        kept: set[str] = set()
        for k_node, v_node in node.value:
            key = name = self.build(key_t, k_node, path)
            if isinstance(key, yaml.ScalarNode):  # a key kept as its node: named by its text
                name = key.value
                if name in kept:
                    self.fail(k_node, _join(path, name), "duplicate key")
                    continue
                kept.add(name)
            value = self.build(value_t, v_node, _join(path, str(name)))
            if key is not _MISSING and value is not _MISSING:
                out[key] = value
        return out

    def _keep(self, t: Any, node: yaml.Node, path: str) -> Any:
        """A value kept as its YAML node (type ``yaml.MappingNode``, ``yaml.ScalarNode | None``,
        ...), for a caller that merges nodes and needs their marks. Only its kind is checked
        (null only where the type allows None), and duplicate keys inside it, which nothing
        downstream would see."""
        options = typing.get_args(t) if is_union(t) else (t,)
        if _is_null(node) and type(None) in options:
            return None
        if _is_null(node) or not isinstance(node, _node_types(t)):
            names = " or ".join(_type_name(o) for o in options)
            return self.fail(node, path, f"expected {names}, got {node_kind(node)}")
        for key_node, key_path in duplicate_keys(node, path):
            self.fail(key_node, key_path, "duplicate key")
        return node

    def _dataclass(self, cls: type, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.MappingNode):
            return self.fail(node, path, f"expected a mapping, got {node_kind(node)}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        values: dict[str, Any] = {}
        nodes: dict[str, yaml.Node] = {}
        wheres: dict[str, str] = {}  # each key's path as written (see ``key_paths``)
        ok = True
        for k_node, v_node in node.value:
            if not isinstance(k_node, yaml.ScalarNode):
                self.fail(k_node, path, f"a key must be a name, got {node_kind(k_node)}")
                ok = False
                continue
            key = _scalars.construct_object(k_node)
            where = self.key_paths.get(id(k_node)) or _join(path, str(key))
            if key not in fields:
                known = ", ".join(fields)
                self.fail(k_node, where, f"unknown key (expected one of: {known})")
                ok = False
                continue
            if key in nodes:
                self.fail(k_node, where, "duplicate key")
                ok = False
                continue
            nodes[key], wheres[key] = v_node, where
            value = self.build(hints[key], v_node, where)
            if value is _MISSING:
                ok = False
                continue
            kind = fields[key].metadata.get("path")
            if kind and value:
                value = self._path(kind, value, v_node, where)
                ok = ok and value is not _MISSING
            values[key] = value
        for name, f in fields.items():
            if (
                name not in nodes
                and f.default is dataclasses.MISSING
                and (f.default_factory is dataclasses.MISSING)
            ):
                self.fail(node, _join(path, name), f"missing required key ({_type_name(hints[name])})")
                ok = False
        if not ok:
            return _MISSING
        with collected_checks() as errors:
            try:
                value = cls(**values)
            except FieldError as e:
                errors.append(e)
            except Exception as e:  # a check that did not guard a later expression
                return self.fail(node, path, f"{type(e).__name__}: {e}")
        # A check on a key left out blames the section it belongs to, as written.
        base, section, _flat = self.sections.get(id(node), (path, node, node))
        for e in errors:
            self.fail(_part(nodes, e.key) or section, wheres.get(e.key) or _join(base, e.key), str(e))
        return _MISSING if errors else value


def _part(nodes: dict[str, yaml.Node], key: str) -> yaml.Node | None:
    """The node a check's key names: its field's, or a part of it (``points[2]``,
    ``zones[0].points[2]``), as deep as the document has it."""
    name, *steps = re.findall(r"[^.\[\]]+|\[\d+\]", key) or [key]
    node = nodes.get(name)
    for step in steps:
        if step[0] == "[" and isinstance(node, yaml.SequenceNode) and int(step[1:-1]) < len(node.value):
            node = node.value[int(step[1:-1])]
        elif isinstance(node, yaml.MappingNode) and lookup(node, step) is not None:
            node = lookup(node, step)
        else:
            break
    return node
