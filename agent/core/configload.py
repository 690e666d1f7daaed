"""YAML → frozen dataclasses, with errors that name the file, line and key path.

The YAML is composed (not constructed) so every value keeps its position; the dataclass
fields' type hints drive the conversion. Every problem in a document is collected before
one ``ConfigError`` is raised, so a user fixes them all in one pass.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

import yaml
import yaml.reader
from yaml.constructor import SafeConstructor


@dataclass(frozen=True)
class Problem:
    file: str
    line: int  # 1-based; 0 when unknown
    column: int
    path: str  # dotted key path, e.g. "source.fps"
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line else self.file
        key = f" {self.path}:" if self.path else ""
        return f"{where}:{key} {self.message}"


class ConfigError(ValueError):
    """One or more problems in a configuration document."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class FieldError(ValueError):
    """Raised by a config dataclass's ``__post_init__`` to blame one of its keys."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


_collecting = threading.local()


def check(ok: bool, key: str, message: str) -> None:
    """Validation helper for ``__post_init__``: raise ``FieldError`` unless ``ok``.

    While a document is being loaded the failures are collected instead, so one pass
    reports every bad value of a section, not only the first.
    """
    if ok:
        return
    sink = getattr(_collecting, "errors", None)
    if sink is None:
        raise FieldError(key, message)
    sink.append(FieldError(key, message))


def _syntax_error(e: yaml.YAMLError, file: str, text: str = "") -> ConfigError:
    if isinstance(e, yaml.reader.ReaderError):  # a control character: binary, not text
        what = f"character #x{e.character:04x}" if isinstance(e.character, int) else "a character"
        line = text.count("\n", 0, e.position) + 1 if text else 0
        return ConfigError([Problem(file, line, 0, "", f"not text (a binary file?): {what}")])
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return ConfigError([Problem(file, line, col, "", f"YAML syntax: {short(problem, 200)}")])


def _compose(text: str, file: str, name: str) -> yaml.Node | None:
    """``text`` composed with its marks named ``name``; an empty document gives None."""
    loader = yaml.SafeLoader(text)
    loader.name = name
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as e:
        raise _syntax_error(e, file, text) from None
    finally:
        loader.dispose()
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        return None  # "---" alone, or a sample config with every line commented out
    _check_acyclic(node, file, set())
    return node


def _check_acyclic(node: yaml.Node, file: str, inside: set[int]) -> None:
    """An alias to a node that contains it (``a: &x {b: *x}``) makes a loop, which every
    walk over the tree would follow forever."""
    if id(node) in inside:
        mark = node.start_mark
        loop = "an alias refers to a mapping or list that contains it (a loop)"
        raise ConfigError([Problem(file, mark.line + 1, mark.column + 1, "", loop)])
    if isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        inside.add(id(node))
        for child in node.value:
            for n in child if isinstance(child, tuple) else (child,):
                _check_acyclic(n, file, inside)
        inside.discard(id(node))


def compose(text: str, file: str) -> yaml.Node | None:
    """Parse YAML into a node tree that keeps line numbers; syntax errors → ConfigError.
    An empty document gives None."""
    return _compose(text, file, "<unicode string>")


def compose_file(path: str) -> yaml.Node | None:
    """Compose a YAML file; every mark names the file, so a tree merged from several files
    blames the right one.

    An empty document (or one with every line commented out) gives None. An unreadable,
    binary or non-UTF-8 file, or a YAML syntax error, raises ``ConfigError`` naming it.
    """
    if os.path.isdir(path):
        raise ConfigError([Problem(path, 0, 0, "", "is a directory, not a YAML file")])
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError([Problem(path, 0, 0, "", f"cannot read: {e.strerror}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        problem = f"not text (a binary file?): byte {e.start} is not UTF-8 ({e.reason})"
        raise ConfigError([Problem(path, line, 0, "", problem)]) from None
    return _compose(text, path, path)


def load(cls: type, text: str, file: str) -> Any:
    """Build dataclass ``cls`` from YAML ``text``; an empty document gives the defaults.

    Paths in it are kept as written (no file to resolve them against: see ``load_file``).
    """
    return _build(Builder(file), cls, compose(text, file))


def load_file(cls: type, path: str, check_files: bool = False) -> Any:
    """Build dataclass ``cls`` from a YAML file. Relative paths in it (fields marked with
    ``path_field``) resolve against the file's folder; ``check_files``: a named input file
    or folder that does not exist is a problem too."""
    return _build(Builder(path, resolve_paths=True, check_files=check_files), cls, compose_file(path))


def _build(builder: Builder, cls: type, node: yaml.Node | None) -> Any:
    value = cls() if node is None else builder.build(cls, node, "")
    if builder.problems:
        raise ConfigError(builder.problems)
    return value


# -- paths -------------------------------------------------------------------------------------

PathKind = Literal["file", "dir", "path"]

# The mark of a value set by an environment variable: "env EDGE_AGENT__SOURCE__FPS".
ENV_PREFIX = "EDGE_AGENT__"
ENV_ORIGIN = "env "


def path_field(kind: PathKind, default: str = "", reload: tuple[str, ...] = ()) -> Any:
    """A config field that names a file or folder. A relative value resolves against the
    folder of the config file that set it (an environment override: the working folder),
    and ``~`` is the home folder. ``file``/``dir``: an input that must exist when the loader
    checks files; ``path``: created, or needed only in some modes (checked where used).
    ``reload``: how a running agent takes a change (``core.reloads``)."""
    return dataclasses.field(default=default, metadata={"path": kind, "reload": reload})


def _origin_dir(mark_file: str | None, fallback: str) -> str | None:
    """The folder a relative path set at a node resolves against; None: leave it as written."""
    origin = mark_file if mark_file and not mark_file.startswith("<") else fallback
    if origin.startswith(ENV_ORIGIN + ENV_PREFIX):
        return os.getcwd()
    if not origin or origin.startswith("<"):
        return None
    return os.path.dirname(os.path.abspath(origin))


def _missing(kind: PathKind, path: str) -> str | None:
    if kind == "file" and not os.path.isfile(path):
        return f"{'not a file' if os.path.exists(path) else 'file not found'}: {path}"
    if kind == "dir" and not os.path.isdir(path):
        return f"{'not a folder' if os.path.exists(path) else 'folder not found'}: {path}"
    return None


def short(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters: a garbage file's 4 KB scalar stays one line."""
    return text if len(text) <= limit else f"{text[: limit - 12]}…({len(text)} chars)"


_MISSING = object()
_scalars = SafeConstructor()


def _type_name(t: Any) -> str:
    if t is type(None):
        return "null"
    if typing.get_origin(t) is Literal:
        return " | ".join(repr(a) for a in typing.get_args(t))
    if dataclasses.is_dataclass(t):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(
        t, getattr(t, "__name__", str(t))
    )


def is_union(t: Any) -> bool:
    return typing.get_origin(t) in (Union, types.UnionType)


class Builder:
    """Converts YAML nodes to typed values, collecting problems instead of stopping."""

    def __init__(self, file: str, resolve_paths: bool = False, check_files: bool = False) -> None:
        self.file = file
        self.problems: list[Problem] = []
        self.resolve_paths = resolve_paths  # relative path fields against their file's folder
        self.check_files = check_files  # input files and folders named must exist

    def fail(self, node: yaml.Node | None, path: str, message: str) -> object:
        mark = node.start_mark if node is not None else None
        line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        # A node composed from an opened file (or given a name) names its own file: a tree
        # merged from several files (the fleet's layers) blames the file each value came from.
        name = getattr(mark, "name", None)
        file = name if isinstance(name, str) and name and not name.startswith("<") else self.file
        self.problems.append(Problem(file, line, col, path, message))
        return _MISSING

    def build(self, t: Any, node: yaml.Node, path: str) -> Any:
        origin = typing.get_origin(t)
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
            if value in typing.get_args(t):
                return value
            return self.fail(node, path, f"expected one of {_type_name(t)}, got {short(repr(value))}")
        if t is float and isinstance(value, int) and not isinstance(value, bool):
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
            base = _origin_dir(getattr(node.start_mark, "name", None), self.file)
            if base is not None and not os.path.isabs(value):
                value = os.path.normpath(os.path.join(base, value))
        if self.check_files:
            problem = _missing(kind, value)
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
            trial = Builder(self.file, self.resolve_paths, self.check_files)
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
        return self._dataclass(by_tag[tag], node, path)

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
        for k_node, v_node in node.value:
            key = self.build(key_t, k_node, path)
            value = self.build(value_t, v_node, _join(path, str(key)))
            if key is not _MISSING and value is not _MISSING:
                out[key] = value
        return out

    def _dataclass(self, cls: type, node: yaml.Node, path: str) -> Any:
        if not isinstance(node, yaml.MappingNode):
            return self.fail(node, path, f"expected a mapping, got {node_kind(node)}")
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        values: dict[str, Any] = {}
        nodes: dict[str, yaml.Node] = {}
        ok = True
        for k_node, v_node in node.value:
            if not isinstance(k_node, yaml.ScalarNode):
                self.fail(k_node, path, f"a key must be a name, got {node_kind(k_node)}")
                ok = False
                continue
            key = _scalars.construct_object(k_node)
            if key not in fields:
                known = ", ".join(fields)
                self.fail(k_node, _join(path, str(key)), f"unknown key (expected one of: {known})")
                ok = False
                continue
            if key in nodes:
                self.fail(k_node, _join(path, key), "duplicate key")
                ok = False
                continue
            nodes[key] = v_node
            value = self.build(hints[key], v_node, _join(path, key))
            if value is _MISSING:
                ok = False
                continue
            kind = fields[key].metadata.get("path")
            if kind and value:
                value = self._path(kind, value, v_node, _join(path, key))
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
        outer = getattr(_collecting, "errors", None)
        _collecting.errors = errors = []
        try:
            value = cls(**values)
        except FieldError as e:
            errors.append(e)
        except Exception as e:  # a check that did not guard a later expression
            return self.fail(node, path, f"{type(e).__name__}: {e}")
        finally:
            _collecting.errors = outer
        for e in errors:
            self.fail(nodes.get(e.key, node), _join(path, e.key), str(e))
        return _MISSING if errors else value


def lookup(node: yaml.MappingNode, key: str, last: bool = False) -> yaml.Node | None:
    """The value node of ``key`` in a mapping node: the first, or with ``last`` the last one
    (a merged mapping may hold a key twice; the later layer wins)."""
    found = None
    for k_node, v_node in node.value:
        if isinstance(k_node, yaml.ScalarNode) and k_node.value == key:
            if not last:
                return v_node
            found = v_node
    return found


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def node_kind(node: yaml.Node) -> str:
    """What a node is, for messages: "a mapping", "a list" or "a scalar 'x'"."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"a scalar {short(repr(_scalars.construct_object(node)))}"


def to_plain(value: Any) -> Any:
    """A config dataclass as plain dicts/lists, in field order (for YAML/JSON output)."""
    if dataclasses.is_dataclass(value):
        # The discriminator first, so a dumped section reads as "type: ..., then its keys".
        names = sorted((f.name for f in dataclasses.fields(value)), key=lambda n: n != "type")
        return {n: to_plain(getattr(value, n)) for n in names}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    return value


def dump(value: Any) -> str:
    return yaml.safe_dump(to_plain(value), sort_keys=False, default_flow_style=False)
