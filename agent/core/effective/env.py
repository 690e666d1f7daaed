"""The environment's part: ``${VAR}`` references in fleet files, and ``EDGE_AGENT__`` variables
as the last layer."""

from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

from edge_agent.core.configload import ConfigError, Problem, compose, problem_at
from edge_agent.core.configpaths import ENV_ORIGIN, ENV_PREFIX
from edge_agent.core.effective.merge import MAP_TAG, RESOLVER, STR_TAG, Merger, node_key

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

#: How deep ``${A:-${B:-...}}`` defaults may nest: more is no config anyone writes, and each
#: level is a recursion.
MAX_NESTING = 8


class _Refused(ValueError):
    """A reference that cannot be read (nested too deep, or a default never closed)."""


def substitute(node: yaml.Node, path: str, env: Mapping[str, str], problems: list[Problem]) -> yaml.Node:
    """A copy of ``node`` with ``${VAR}``/``${VAR:-default}`` substituted in its scalars. A
    default may itself hold ``${...}`` (``${CAMERA:-${DEFAULT_CAMERA}}``), as in a shell and
    in Docker Compose: taking it as text would hand the agent a literal ``${DEFAULT_CAMERA}``."""
    if isinstance(node, yaml.MappingNode):
        pairs = []
        for k_node, v_node in node.value:
            sub = f"{path}.{node_key(k_node)}" if path else str(node_key(k_node))
            pairs.append((k_node, substitute(v_node, sub, env, problems)))
        return yaml.MappingNode(node.tag, pairs, node.start_mark, node.end_mark, node.flow_style)
    if isinstance(node, yaml.SequenceNode):
        items = [substitute(n, f"{path}[{i}]", env, problems) for i, n in enumerate(node.value)]
        return yaml.SequenceNode(node.tag, items, node.start_mark, node.end_mark, node.flow_style)
    if not isinstance(node, yaml.ScalarNode) or "$" not in node.value or node.tag != STR_TAG:
        return node
    missing: list[str] = []
    try:
        value, _end, _closed = _expand(node.value, 0, env, missing, 0)
    except _Refused as e:
        problems.append(problem_at(node, path, str(e)))
        return node
    for name in dict.fromkeys(missing):
        problems.append(problem_at(node, path, f"${{{name}}} is not set (and has no default)"))
    if value == node.value:
        return node
    tag = RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) if value else STR_TAG
    return yaml.ScalarNode(tag, value, node.start_mark, node.end_mark, node.style)


def _expand(
    text: str, i: int, env: Mapping[str, str], missing: list[str], depth: int
) -> tuple[str, int, bool]:
    """``text`` from ``i`` substituted; inside a default (``depth`` > 0) up to the ``}`` that
    closes it. Returns the value, where it ended and whether that ``}`` was found. ``$${`` is
    a literal ``${``; a ``$`` that starts no reference stays as written. One pass: each
    character is read once."""
    out: list[str] = []
    while i < len(text):
        if depth and text[i] == "}":
            return "".join(out), i + 1, True
        if text.startswith("$${", i):
            out.append("${")
            i += 3
        elif text.startswith("${", i) and (ref := _reference(text, i, env, missing, depth)) is not None:
            value, i = ref
            out.append(value)
        else:
            out.append(text[i])
            i += 1
    return "".join(out), i, False


def _reference(
    text: str, i: int, env: Mapping[str, str], missing: list[str], depth: int
) -> tuple[str, int] | None:
    """The value of the ``${NAME}`` or ``${NAME:-default}`` at ``i`` and where it ends; None
    when none is written there (no name, or no ``}`` or ``:-`` after it). A default never
    closed is refused: read as text it would hide a typo, and scanning it again as text
    could take time of the power of its nesting."""
    m = _NAME.match(text, i + 2)
    if m is None:
        return None
    name, j = m.group(), m.end()
    if text.startswith("}", j):
        if name not in env:
            missing.append(name)
        return env.get(name, ""), j + 1
    if not text.startswith(":-", j):
        return None
    if depth >= MAX_NESTING:
        raise _Refused(f"${{VAR:-default}} nested more than {MAX_NESTING} deep")
    unused: list[str] = []  # variables of a default not taken are not needed
    default, end, closed = _expand(text, j + 2, env, unused, depth + 1)
    if not closed:
        raise _Refused(f"${{{name}:-...}} has no closing }} (write $${{ for a literal ${{)")
    if name in env:
        return env[name], end
    missing += unused
    return default, end


def scalar_node(value: str, mark: yaml.Mark) -> yaml.ScalarNode:
    tag = RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) if value else STR_TAG
    return yaml.ScalarNode(tag, value, mark, mark)


def env_layer(env: Mapping[str, str], problems: list[Problem]) -> yaml.MappingNode | None:
    """``EDGE_AGENT__SOURCE__FPS=15`` → ``{source: {fps: 15}}``, each value marked with its variable."""
    root = None
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX)):
        mark = yaml.Mark(f"{ENV_ORIGIN}{name}", 0, -1, -1, None, None)
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(parts):
            expected = f"expected {ENV_PREFIX}<SECTION>__<KEY>..., with no empty part"
            problems.append(Problem(mark.name, 0, 0, "", expected))
            continue
        value = _env_value(env[name], mark, ".".join(parts), problems)
        if value is None:
            continue
        for part in reversed(parts):
            value = yaml.MappingNode(MAP_TAG, [(scalar_node(part, mark), value)], mark, mark)
        root = value if root is None else Merger().merge(root, value, (), None)
    return root


def _env_value(text: str, mark: yaml.Mark, path: str, problems: list[Problem]) -> yaml.Node | None:
    if not text.lstrip().startswith(("[", "{")):
        return scalar_node(text, mark)
    try:  # the config files' composer: an alias loop or bomb is refused here too
        node = compose(text, mark.name)
    except ConfigError as e:
        problems += [Problem(mark.name, 0, 0, path, p.message) for p in e.problems]
        return None
    return _remark(node, mark, set()) if node is not None else None


def _remark(node: yaml.Node, mark: yaml.Mark, done: set[int]) -> yaml.Node:
    """``node`` and all below it marked with the variable; a node that aliases share once."""
    if id(node) in done:
        return node
    done.add(id(node))
    node.start_mark = node.end_mark = mark
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            _remark(k, mark, done)
            _remark(v, mark, done)
    elif isinstance(node, yaml.SequenceNode):
        for v in node.value:
            _remark(v, mark, done)
    return node
