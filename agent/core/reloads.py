"""How a running agent takes a change of a config field, as field metadata (``reload``): the
reload code reads these marks instead of keeping its own lists of keys."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

# How a running agent takes a change of a field, as field metadata ("reload"); the reload
# code reads these marks instead of keeping its own lists of keys:


# How a running agent takes a change of a field, as field metadata ("reload"); the reload
# code reads these marks instead of keeping its own lists of keys:
LANE = "lane"  # a source's scheduling: its lane takes it, the capture keeps running


REBIND = "rebind"  # the result socket is closed and bound again


MODELS = "models"  # the models are loaded again (engines rebuilt where the key changed)


def reloads(*kinds: str) -> dict[str, tuple[str, ...]]:
    """Field metadata: a running agent takes a change of the field as ``kinds`` say."""
    return {"reload": kinds}


def marked_fields(cls: type, kind: str) -> tuple[str, ...]:
    """The names of ``cls``'s fields marked ``kind``."""
    return tuple(f.name for f in fields(cls) if kind in f.metadata.get("reload", ()))


def marked_values(value: Any, kind: str) -> frozenset[tuple[tuple[str, str], ...]]:
    """The fields marked ``kind`` of every section in a config tree (sections, and lists of
    sources and ladder steps), one tuple of (name, value) per section that has any, as a
    set: two configs with equal sets need no ``kind`` of reload."""
    found: set[tuple[tuple[str, str], ...]] = set()
    own = []
    for f in fields(value):
        v = getattr(value, f.name)
        if kind in f.metadata.get("reload", ()):
            own.append((f.name, repr(v)))
            continue
        for item in v if isinstance(v, tuple) else (v,):
            if is_dataclass(item):
                found |= marked_values(item, kind)
    if own:
        found.add(tuple(own))
    return frozenset(found)
