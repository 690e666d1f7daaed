"""Every decoder by name: each decoder module declares its decoder as ``DECODER`` (or its
decoders, for one task's classic and end-to-end heads, as ``DECODERS``), and the registry
puts those in a plain dict that refuses a name twice.

The package's modules are imported once, on the first lookup, and their ``DECODER`` is
taken explicitly: importing a module registers nothing by itself (no import side effects,
no ``__subclasses__``), and a decoder's module is all it takes to add one, since nothing
else lists it. The shared modules declare neither.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from edge_agent.core.plugins import PackageRegistry
from edge_agent.models.decoders.base import Decoder


def _declared(module: ModuleType) -> list[tuple[str, Decoder]]:
    one = getattr(module, "DECODER", None)
    found = [one] if one is not None else list(getattr(module, "DECODERS", ()))
    return [(d.name, d) for d in found]


_REGISTRY: PackageRegistry[Decoder] = PackageRegistry(
    "decoder", __package__, str(Path(__file__).parent), _declared
)


def register(decoder: Decoder) -> Decoder:
    """Make ``decoder`` known by its name. Raises ValueError for a name already registered."""
    return _REGISTRY.register(decoder.name, decoder)


def registered() -> list[Decoder]:
    """Every registered decoder, by name."""
    return _REGISTRY.items()


def names() -> list[str]:
    return _REGISTRY.names()


def get(name: str) -> Decoder:
    """The decoder registered as ``name``. Raises LookupError naming the known ones."""
    return _REGISTRY.get(name)
