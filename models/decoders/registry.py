"""Every decoder by name: each decoder module declares its one decoder as ``DECODER``, and
the registry puts those in a plain dict that refuses a name twice.

The package's modules are imported once, on the first lookup, and their ``DECODER`` is
taken explicitly: importing a module registers nothing by itself (no import side effects,
no ``__subclasses__``), and a decoder's module is all it takes to add one, since nothing
else lists it. The shared modules declare no ``DECODER``.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from pathlib import Path

from edge_agent.models.decoders.base import Decoder

_REGISTRY: dict[str, Decoder] = {}
_lock = threading.RLock()  # a decoder module may look a name up while being imported
_imported = False


def register(decoder: Decoder) -> Decoder:
    """Make ``decoder`` known by its name. Raises ValueError for a name already registered."""
    if decoder.name in _REGISTRY:
        raise ValueError(f"decoder {decoder.name!r} is already registered")
    _REGISTRY[decoder.name] = decoder
    return decoder


def _import_modules() -> None:
    """Register the ``DECODER`` of every module of the package, in name order."""
    global _imported
    with _lock:
        if _imported:
            return
        for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
            decoder = getattr(importlib.import_module(f"{__package__}.{info.name}"), "DECODER", None)
            if decoder is not None:
                register(decoder)
        _imported = True


def registered() -> list[Decoder]:
    """Every registered decoder, by name (not by the order their modules were imported in)."""
    _import_modules()
    return [_REGISTRY[name] for name in sorted(_REGISTRY)]


def names() -> list[str]:
    _import_modules()
    return sorted(_REGISTRY)


def get(name: str) -> Decoder:
    """The decoder registered as ``name``. Raises LookupError naming the known ones."""
    _import_modules()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise LookupError(f"unknown decoder {name!r} (one of {', '.join(map(repr, names()))})") from None
