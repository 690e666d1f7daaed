"""The environment's part: ``${VAR}`` references in fleet files, and ``EDGE_AGENT__`` variables
as the last layer."""

from __future__ import annotations

import re
from collections.abc import Mapping

import yaml

from edge_agent.core.configload import ENV_ORIGIN, ENV_PREFIX, Problem, problem_at
from edge_agent.fleet.merge import MAP_TAG, RESOLVER, STR_TAG, Merger, node_key

_VAR = re.compile(r"\$(\$\{)|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def substitute(node: yaml.Node, path: str, env: Mapping[str, str], problems: list[Problem]) -> yaml.Node:
    """A copy of ``node`` with ``${VAR}``/``${VAR:-default}`` substituted in its scalars."""
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
        problems.append(problem_at(node, path, f"${{{name}}} is not set (and has no default)"))
    if not count:
        return node
    tag = RESOLVER.resolve(yaml.ScalarNode, value, (True, False)) if value else STR_TAG
    return yaml.ScalarNode(tag, value, node.start_mark, node.end_mark, node.style)


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

