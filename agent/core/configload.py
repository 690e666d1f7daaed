"""Reading a config document into a frozen dataclass, and writing one back out.

``load`` and ``load_file`` compose the YAML (not construct it, so every value keeps its
position) and hand it to a ``configbuild.Builder``; every problem in a document is
collected before one ``ConfigError`` is raised, so a user fixes them all in one pass.
``to_plain`` and ``dump`` give a config back as plain data and YAML.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import yaml

from edge_agent.core.configbuild import Builder

# Re-exported: the loader's callers name these as configload's.
from edge_agent.core.yamlnodes import ConfigError as ConfigError
from edge_agent.core.yamlnodes import Problem as Problem
from edge_agent.core.yamlnodes import compose as compose
from edge_agent.core.yamlnodes import compose_file as compose_file
from edge_agent.core.yamlnodes import duplicate_keys as duplicate_keys
from edge_agent.core.yamlnodes import lookup as lookup
from edge_agent.core.yamlnodes import node_kind as node_kind
from edge_agent.core.yamlnodes import problem_at as problem_at


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



def to_plain(value: Any, home: bool = False) -> Any:
    """A config dataclass as plain dicts/lists, in field order (for YAML/JSON output).

    ``home``: ``~`` in path fields expanded, as a resolved config prints them (``config
    show``), also in the defaults, which the loader leaves as they are.
    """
    if dataclasses.is_dataclass(value):
        # The discriminator first, so a dumped section reads as "type: ..., then its keys".
        fields = sorted(dataclasses.fields(value), key=lambda f: f.name != "type")
        return {f.name: _plain_field(f, getattr(value, f.name), home) for f in fields}
    if isinstance(value, (list, tuple)):
        return [to_plain(v, home) for v in value]
    if isinstance(value, dict):
        return {k: to_plain(v, home) for k, v in value.items()}
    return value


def _plain_field(f: dataclasses.Field, value: Any, home: bool) -> Any:
    if home and f.metadata.get("path") and isinstance(value, str) and value.startswith("~"):
        return os.path.expanduser(value)
    return to_plain(value, home)


def dump(value: Any) -> str:
    return yaml.safe_dump(to_plain(value), sort_keys=False, default_flow_style=False)
