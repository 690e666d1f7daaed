"""``config diff``: two effective configs compared key by key."""

from __future__ import annotations

import re
from typing import Any

import yaml


def diff_configs(a: dict, b: dict) -> list[str]:
    """Differences of two plain configs (``to_plain``), sorted by key path.

    ``path: old -> new`` for a changed value, ``+ path: value`` for one only in ``b``,
    ``- path: value`` for one only in ``a``. Lists of scalars compare whole; lists of
    mappings (``deadline.ladder``) item by item.
    """
    fa, fb = _flatten(a, ""), _flatten(b, "")
    lines = []
    for path in sorted(set(fa) | set(fb), key=_path_key):
        if path not in fb:
            lines.append(f"- {path}: {_fmt(fa[path])}")
        elif path not in fa:
            lines.append(f"+ {path}: {_fmt(fb[path])}")
        elif fa[path] != fb[path] or type(fa[path]) is not type(fb[path]):
            lines.append(f"{path}: {_fmt(fa[path])} -> {_fmt(fb[path])}")
    return lines


def _flatten(value: Any, path: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{path}.{k}" if path else str(k)))
        return out
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{path}[{i}]"))
        return out
    return {path: list(value) if isinstance(value, tuple) else value}


def _path_key(path: str) -> list:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"[.\[\]]+", path) if p]


def _fmt(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20).strip()
    return text[: -len("...")].strip() if text.endswith("\n...") else text


def quote_key(name: str) -> str:
    return '"' + name.replace('"', '\\"') + '"'
