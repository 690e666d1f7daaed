"""The command line's part: ``run --model/--manifest/--source/--budget-ms`` as the last
layer of the effective config, each value marked with its flag."""

from __future__ import annotations

from collections.abc import Mapping

import yaml

from edge_agent.core.effective.env import scalar_node
from edge_agent.core.effective.merge import MAP_TAG, Merger


def flags_layer(flags: Mapping[str, tuple[str, object]]) -> yaml.MappingNode | None:
    """The command line's settings as the last layer: ``{"--budget-ms": ("deadline.budget_ms",
    "250")}`` → ``{deadline: {budget_ms: 250}}``, each value marked with its flag so a bad
    one is reported as that flag's. A value is a string (typed as YAML types it) or a mapping
    of strings (a whole section, e.g. a source: a changed ``type`` replaces the section)."""
    root = None
    for flag, (key_path, value) in flags.items():
        mark = yaml.Mark(f"command line {flag}", 0, -1, -1, None, None)
        node = _flag_value(value, mark)
        for part in reversed(key_path.split(".")):
            node = yaml.MappingNode(MAP_TAG, [(scalar_node(part, mark), node)], mark, mark)
        root = node if root is None else Merger().merge(root, node, (), None)
    return root


def _flag_value(value: object, mark: yaml.Mark) -> yaml.Node:
    if isinstance(value, Mapping):
        pairs = [(scalar_node(str(k), mark), _flag_value(v, mark)) for k, v in value.items()]
        return yaml.MappingNode(MAP_TAG, pairs, mark, mark)
    return scalar_node(str(value), mark)
