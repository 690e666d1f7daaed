"""YAML nodes with their marks: files read once and bounded, text and files composed into
nodes (syntax errors, alias loops and bombs, documents too large, unreadable files named), a
problem at a node, duplicate keys, lookups and node kinds for messages. The config loader
(``configload``) and the fleet's merge work on these."""

from __future__ import annotations

import os
import select
import stat
import time
from dataclasses import dataclass

import yaml
import yaml.reader
from yaml.constructor import SafeConstructor

from edge_agent.core.text import printable


class Scalars(SafeConstructor):
    """SafeConstructor for one scalar at a time, keeping nothing: its cache of what it
    constructed is emptied only at the end of a document, which a lone call never reaches,
    so every node it saw stayed, and through the node's marks the whole text (a reload's
    config each time)."""

    def construct_object(self, node: yaml.Node, deep: bool = False) -> object:
        try:
            return super().construct_object(node, deep)
        finally:
            self.constructed_objects.clear()
            self.state_generators.clear()


_scalars = Scalars()


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
        # Keys, names and values come from the file: escaped and cut, so a key of ESC codes
        # cannot redraw the terminal, nor a megabyte key make a megabyte message.
        file = printable(self.file, 400)
        where = f"{file}:{self.line}:{self.column}" if self.line else file
        key = f" {printable(self.path, 200)}:" if self.path else ""
        return f"{where}:{key} {printable(self.message, 2000)}"


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

#: The most nodes (every scalar, list and mapping; a key and its value are two) one document
#: may compose, aliases counted once here. A config is a few hundred; a source with every zone
#: and line the schema allows (32 + 32 polygons of 64 points) about 13,000; a fleet file of
#: 1,000 devices some 10,000. Composing costs ~40 µs and ~0.4 KiB a node in pure-Python
#: PyYAML, so the bound keeps a refusal to seconds and tens of MiB; unbounded, a 400 kB list
#: took 10 s and 184 MB to reach the schema's refusal.
MAX_NODES = 100_000

#: The largest YAML file read (a config, a fleet file, an overlay, a manifest): real ones are
#: a few KiB. Refused before composing: 4 MB of plain YAML took over a minute and 1.4 GB.
MAX_FILE_BYTES = 1 << 20

#: How long a pipe, a FIFO or stdin may take to deliver a whole file (the writer started,
#: written, closed): a generator piped in (``config render ... |``) takes a few seconds on a
#: Jetson; a FIFO nobody writes would otherwise block the command, or a reload, forever.
READ_TIMEOUT_S = 10.0

#: The path that names standard input.
STDIN = "-"

#: The longest integer scalar: Python refuses to read one of over 4,300 digits (a
#: ValueError where a config problem is due), and no config value needs a tenth of that.
MAX_INT_CHARS = 4_000
_INT_TAG = "tag:yaml.org,2002:int"
_STR_TAG = "tag:yaml.org,2002:str"

#: The tags safe loading knows (``!!str``, ``!!int``, ``!!map``, ``!!set``...).
_SAFE_TAGS = frozenset(tag for tag in SafeConstructor.yaml_constructors if tag is not None)

_LOOP = "an alias refers to a mapping or list that contains it (a loop)"


class _Mark(yaml.Mark):
    """A mark in slots, without a dict: two per node, so a quarter less memory a document."""

    __slots__ = ("buffer", "column", "index", "line", "name", "pointer")


class _BoundedLoader(yaml.SafeLoader):
    """A composer that counts nodes as it composes, before the tree is complete: it refuses a
    document of more than ``MAX_NODES`` nodes, or whose aliases add more than
    ``MAX_ALIAS_NODES`` (an alias to a node costs that node's size after expansion, known
    once the node is complete), or an alias inside what it names (a loop, which every walk
    over the tree would follow forever), naming the line; and nesting deeper than
    ``MAX_DEPTH``."""

    def __init__(self, text: str, file: str) -> None:
        super().__init__(text)
        self.file = file
        # an anchored node's size after expansion, by id, once complete: only aliases ask
        self.sizes: dict[int, int] = {}
        self.nodes = 0  # composed, an alias once
        self.expanded = 0  # composed, an alias as the nodes it repeats
        self.alias_nodes = 0
        self.depth = 0

    def get_mark(self) -> yaml.Mark:
        return _Mark(self.name, self.index, self.line, self.column, self.buffer, self.pointer)

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if not self.check_event(yaml.AliasEvent):
            self.nodes += 1
            if self.nodes > MAX_NODES:
                self._refuse(f"more than {MAX_NODES} nodes in one document (is it a config?)")
            self.depth += 1
            if self.depth > MAX_DEPTH:
                self._refuse(f"lists and mappings nested more than {MAX_DEPTH} deep")
            anchored = self.peek_event().anchor is not None
            before = self.expanded
            self.expanded += 1
            node = super().compose_node(parent, index)
            self.depth -= 1
            if isinstance(node, yaml.ScalarNode) and node.tag == _INT_TAG and len(node.value) > MAX_INT_CHARS:
                self._refuse(
                    f"an integer of {len(node.value)} characters (at most {MAX_INT_CHARS})", node.start_mark
                )
            if node.tag not in _SAFE_TAGS:  # !!python/object, !custom: no constructor, a traceback later
                self._refuse(
                    f"unknown tag {short(node.tag)!r} (a config takes YAML's own tags only)", node.start_mark
                )
            if isinstance(node, yaml.ScalarNode) and node.tag != _STR_TAG:
                self._constructs(node)
            if anchored:
                self.sizes[id(node)] = self.expanded - before
            return node
        mark = self.peek_event().start_mark
        node = super().compose_node(parent, index)  # an undefined alias: a syntax error
        size = self.sizes.get(id(node))
        if size is None:  # named before it is complete: the alias is inside it
            self._refuse(_LOOP, mark)
        self.expanded += size
        self.alias_nodes += size
        if self.alias_nodes > MAX_ALIAS_NODES:
            much = f"aliases (*name) expand this document by more than {MAX_ALIAS_NODES} nodes"
            self._refuse(f"{much} (an alias bomb? write the values out, or alias less)", mark)
        return node

    def _constructs(self, node: yaml.ScalarNode) -> None:
        """Refuse a scalar that its tag cannot construct (``!!int x``, ``!!binary #``, the
        date 2001-13-45), here with its line: later, a ValueError or a KeyError escaped."""
        try:
            _scalars.construct_object(node)
        except Exception as e:  # each constructor fails its own way
            what = f"not a valid {node.tag.rsplit(':', 1)[-1]}: {short(repr(node.value))}"
            reason = str(e).partition("\n")[0]  # a ConstructorError's next lines quote the text
            why = "" if isinstance(e, KeyError) else f" ({short(reason, 80)})"
            self._refuse(what + why, node.start_mark)

    def _refuse(self, message: str, mark: yaml.Mark | None = None) -> None:
        mark = mark or self.peek_event().start_mark
        raise ConfigError([Problem(self.file, mark.line + 1, mark.column + 1, "", message)])


def _compose(text: str, file: str, name: str) -> yaml.Node | None:
    """``text`` composed with its marks named ``name``; an empty document gives None."""
    if len(text) > MAX_FILE_BYTES:  # characters: at least as many bytes
        raise ConfigError([Problem(file, 0, 0, "", f"larger than {_mib(MAX_FILE_BYTES)}")])
    try:
        loader = _BoundedLoader(text, file)  # a str's control characters are refused here
    except yaml.YAMLError as e:
        raise _syntax_error(e, file, text) from None
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
    """Compose a YAML file (``-``: stdin), read once (``read_file``); every mark names the
    file, so a tree merged from several files blames the right one.

    An empty document (or one with every line commented out) gives None. An unreadable,
    binary, non-UTF-8 or too large file, or a YAML syntax error, raises ``ConfigError``
    naming it.
    """
    return compose_bytes(read_file(path), path)


def compose_bytes(data: bytes, path: str) -> yaml.Node | None:
    """Compose the bytes of file ``path``, as ``compose_file`` does once it has read them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        problem = f"not text (a binary file?): byte {e.start} is not UTF-8 ({e.reason})"
        raise ConfigError([Problem(path, line, 0, "", problem)]) from None
    return _compose(text, path, path)


def read_file(path: str, limit: int = MAX_FILE_BYTES, timeout_s: float = READ_TIMEOUT_S) -> bytes:
    """The bytes of ``path``, read once: a regular file, stdin (``-``), a pipe
    (``/dev/stdin``, ``/dev/fd/N`` of a shell's ``<(...)``) or a FIFO. A pipe, a FIFO or stdin
    must deliver the whole file (its writer closes it) within ``timeout_s`` seconds; a FIFO is
    opened without waiting for a writer, so one with none is refused then too.

    Raises ``ConfigError`` naming ``path``: not there or not readable, a folder, a terminal,
    more than ``limit`` bytes (refused at the first byte over, an endless device too), or
    nothing complete within ``timeout_s``.
    """
    fd, own = 0, path != STDIN
    if own:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as e:
            raise _unreadable(path, e) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ConfigError([Problem(path, 0, 0, "", "is a directory, not a YAML file")])
        if os.isatty(fd):  # a person typing a config has no end of file, nor a deadline
            raise ConfigError([Problem(path, 0, 0, "", "is a terminal: give a file, or pipe the config in")])
        if stat.S_ISREG(mode) and os.fstat(fd).st_size > limit:
            raise ConfigError([Problem(path, 0, 0, "", f"larger than {_mib(limit)}")])
        data = _read_until(fd, path, limit + 1, time.monotonic() + timeout_s, timeout_s)
    except OSError as e:
        raise _unreadable(path, e) from None
    finally:
        if own:
            os.close(fd)
    if len(data) > limit:
        raise ConfigError([Problem(path, 0, 0, "", f"larger than {_mib(limit)}")])
    return data


def _read_until(fd: int, path: str, most: int, deadline: float, timeout_s: float) -> bytes:
    """Up to ``most`` bytes of ``fd`` up to its end, waiting for a pipe only until ``deadline``.

    poll() first: stdin stays blocking (its file description is shared with the caller), and
    for a FIFO with no writer yet, read() would say end of file at once where poll() waits."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    chunks: list[bytes] = []
    size = 0
    while size < most:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            late = f"nothing complete to read within {timeout_s:g} s"
            why = "a pipe or FIFO with no writer, or one that never closes"
            raise ConfigError([Problem(path, 0, 0, "", f"{late} ({why})")])
        try:
            chunk = os.read(fd, min(1 << 16, most - size))
        except BlockingIOError:
            continue
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _unreadable(path: str, e: OSError) -> ConfigError:
    return ConfigError([Problem(path, 0, 0, "", f"cannot read: {e.strerror or e}")])


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def is_stream(path: str) -> bool:
    """Whether ``path`` is stdin, a pipe, a FIFO or a device: what can be read only once."""
    if path == STDIN:
        return True
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


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
