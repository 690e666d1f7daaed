"""YAML nodes with their marks: text and files composed into nodes (syntax errors, alias
loops and bombs, unreadable files named), a problem at a node, duplicate keys, lookups and
node kinds for messages. The config loader (``configload``) and the fleet's merge work on these."""

from __future__ import annotations

import os
from dataclasses import dataclass

import yaml
import yaml.reader
from yaml.constructor import SafeConstructor

_scalars = SafeConstructor()


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


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


def _syntax_error(e: yaml.YAMLError, file: str, text: str = "") -> ConfigError:
    if isinstance(e, yaml.reader.ReaderError):  # a control character: binary, not text
        what = f"character #x{e.character:04x}" if isinstance(e.character, int) else "a character"
        line = text.count("\n", 0, e.position) + 1 if text else 0
        return ConfigError([Problem(file, line, 0, "", f"not text (a binary file?): {what}")])
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return ConfigError([Problem(file, line, col, "", f"YAML syntax: {short(problem, 200)}")])


#: The most nodes that aliases (``*name``) may add to one document: each alias repeats the
#: whole of what it names. Configs and fleets that share a block a few hundred times stay far
#: below; a 413-byte alias bomb (7 levels of ten aliases) expands to 10 million nodes, which
#: every later walk (the merge, ``${VAR}`` substitution, the typed build) would visit, in
#: ``config validate`` and in a running agent's reload alike.
MAX_ALIAS_NODES = 100_000

#: The deepest nesting of lists and mappings in a document: configs use under ten levels;
#: thousands of ``[`` would overflow the stack of every recursive walk, the composer's first.
MAX_DEPTH = 100

_LOOP = "an alias refers to a mapping or list that contains it (a loop)"


class _BoundedLoader(yaml.SafeLoader):
    """A composer that counts the nodes each alias adds, as it composes (an alias to a node
    costs that node's size after expansion, known once the node is complete), and refuses a
    document past ``MAX_ALIAS_NODES``, or an alias inside what it names (a loop, which every
    walk over the tree would follow forever), naming the alias's line; and nesting deeper
    than ``MAX_DEPTH``."""

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self.file = file
        self.sizes: dict[int, int] = {}  # a complete node's size after expansion, by id
        self.alias_nodes = 0
        self.depth = 0

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if not self.check_event(yaml.AliasEvent):
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self._refuse(f"lists and mappings nested more than {MAX_DEPTH} deep")
            node = super().compose_node(parent, index)
            self.depth -= 1
            self.sizes[id(node)] = 1 + sum(self.sizes[id(c)] for c in _children(node))
            return node
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)  # an undefined alias: a syntax error
        size = self.sizes.get(id(node))
        if size is None:  # named before it is complete: the alias is inside it
            self._refuse(_LOOP, mark)
        self.alias_nodes += size
        if self.alias_nodes > MAX_ALIAS_NODES:
            much = f"aliases (*name) expand this document by more than {MAX_ALIAS_NODES} nodes"
            self._refuse(f"{much} (an alias bomb? write the values out, or alias less)", mark)
        return node

    def _refuse(self, message: str, mark: yaml.Mark | None = None) -> None:
        mark = mark or self.peek_event().start_mark
        raise ConfigError([Problem(self.file, mark.line + 1, mark.column + 1, "", message)])


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return node.value
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _compose(text: str, file: str, name: str) -> yaml.Node | None:
    """``text`` composed with its marks named ``name``; an empty document gives None."""
    loader = _BoundedLoader(text, file)
    loader.name = name
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as e:
        raise _syntax_error(e, file, text) from None
    finally:
        loader.dispose()
    if node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"):
        return None  # "---" alone, or a sample config with every line commented out
    return node


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


def problem_at(node: yaml.Node | None, path: str, message: str, file: str = "") -> Problem:
    """A problem at ``node``. A node composed from an opened file names its own file, so a
    tree merged from several files (the fleet's layers) blames the file each value came
    from; ``file`` is for a node without one."""
    mark = node.start_mark if node is not None else None
    line, col = (mark.line + 1, mark.column + 1) if mark else (0, 0)
    name = getattr(mark, "name", None)
    where = name if isinstance(name, str) and name and not name.startswith("<") else file
    return Problem(where, line, col, path, message)


def duplicate_keys(node: yaml.Node, path: str) -> list[tuple[yaml.Node, str]]:
    """(key node, key path) of every key anywhere in ``node`` that repeats an earlier key of
    its mapping (composing keeps both; a merge or a dict would keep one silently)."""
    found = []
    if isinstance(node, yaml.MappingNode):
        seen = set()
        for k_node, v_node in node.value:
            key = k_node.value if isinstance(k_node, yaml.ScalarNode) else None
            sub = join_path(path, str(key))
            if key is not None and key in seen:
                found.append((k_node, sub))
            seen.add(key)
            found += duplicate_keys(v_node, sub)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += duplicate_keys(item, f"{path}[{i}]")
    return found


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


def node_kind(node: yaml.Node) -> str:
    """What a node is, for messages: "a mapping", "a list" or "a scalar 'x'"."""
    if isinstance(node, yaml.MappingNode):
        return "a mapping"
    if isinstance(node, yaml.SequenceNode):
        return "a list"
    return f"a scalar {short(repr(_scalars.construct_object(node)))}"


def short(text: str, limit: int = 60) -> str:
    """``text`` cut to ``limit`` characters: a garbage file's 4 KB scalar stays one line."""
    return text if len(text) <= limit else f"{text[: limit - 12]}…({len(text)} chars)"
