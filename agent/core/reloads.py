"""How a running agent takes a change of a config field, as field metadata (``reload``): the
reload code reads these marks instead of keeping its own lists of keys."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any

LANE = "lane"  # a source's scheduling: its lane takes it, the capture keeps running
REBIND = "rebind"  # the result socket is closed and bound again
MODELS = "models"  # the models are loaded again (engines rebuilt where the key changed)
ELSEWHERE = "elsewhere"  # read by another process (the uplink): the agent does nothing
AT_START = "at_start"  # taken when the agent starts; a reload leaves the running one (and says so)


def reloads(*kinds: str) -> dict[str, tuple[str, ...]]:
    """Field metadata: a running agent takes a change of the field as ``kinds`` say."""
    return {"reload": kinds}


#: Field metadata (``reloads(...) | LOCAL``): the field is this instance's own, not part of
#: the config a fleet shares (who the device is, where it binds and keeps its state), so
#: the config hash leaves it out.
LOCAL: dict[str, bool] = {"local": True}


def drop_local(value: Any, plain: dict) -> dict:
    """``plain`` (``value`` as plain data, sections as dicts) without the fields marked
    LOCAL, in ``value``'s sections and in the sections of its lists; ``plain`` is changed."""
    for f in fields(value):
        if f.metadata.get("local"):
            plain.pop(f.name, None)
            continue
        v, section = getattr(value, f.name), plain.get(f.name)
        if is_dataclass(v) and isinstance(section, dict):
            drop_local(v, section)
        elif isinstance(v, tuple) and isinstance(section, list):
            for item, part in zip(v, section):
                if is_dataclass(item) and isinstance(part, dict):
                    drop_local(item, part)
    return plain


def marked_fields(cls: type, kind: str) -> tuple[str, ...]:
    """The names of ``cls``'s fields marked ``kind``."""
    return tuple(f.name for f in fields(cls) if kind in f.metadata.get("reload", ()))


def marked_values(
    value: Any, kind: str, where: str = ""
) -> frozenset[tuple[str, tuple[tuple[str, str], ...]]]:
    """The fields marked ``kind`` of every section in a config tree, as a set of (where,
    fields) with one entry per section that has any: ``where`` is the section's path, with
    the position in a list for ordered lists (ladder steps) and without it for ``sources``
    (reordering cameras loads no model). Two configs with equal sets need no ``kind`` of
    reload."""
    found: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    own = []
    for f in fields(value):
        v = getattr(value, f.name)
        if kind in f.metadata.get("reload", ()):
            own.append((f.name, repr(v)))
            continue
        path = f"{where}.{f.name}" if where else f.name
        if isinstance(v, tuple):
            for i, item in enumerate(v):
                if is_dataclass(item):
                    found |= marked_values(
                        item, kind, path if f.metadata.get("unordered") else f"{path}[{i}]"
                    )
        elif is_dataclass(v):
            found |= marked_values(v, kind, path)
    if own:
        found.add((where, tuple(own)))
    return frozenset(found)
