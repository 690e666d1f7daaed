"""Plug-ins by name, collected from the modules of one package: the decoders
(``models/decoders/``) and the sources (``pipelines/sources/``).

Each module of the package declares what it adds (a decoder its ``DECODER``, a source
module its ``SOURCES``); the package's registry imports its modules on the first lookup
and takes those explicitly into a plain dict that refuses a name twice. Importing a module
registers nothing by itself (no import side effects, no ``__subclasses__``), and a
plug-in's module is all it takes to add one: nothing else lists it.
"""

from __future__ import annotations

import importlib
import pkgutil
import threading
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Generic, TypeVar

T = TypeVar("T")


class PackageRegistry(Generic[T]):
    """``what`` by name (for messages: "decoder", "source type"), from the modules of
    ``package`` (its import name) in folder ``folder``, each giving its (name, item) pairs
    through ``declared``."""

    def __init__(
        self, what: str, package: str, folder: str, declared: Callable[[ModuleType], Iterable[tuple[str, T]]]
    ) -> None:
        self.what = what
        self._package, self._folder, self._declared = package, folder, declared
        self._items: dict[str, T] = {}
        self._lock = threading.RLock()  # a plug-in module may look a name up while imported
        self._imported = False

    def register(self, name: str, item: T) -> T:
        """Make ``item`` known as ``name``; ValueError for a name already registered (the
        package's modules are collected first, so a name one of them declares counts)."""
        self._import_modules()
        if name in self._items:
            raise ValueError(f"{self.what} {name!r} is already registered")
        self._items[name] = item
        return item

    def _import_modules(self) -> None:
        """Every module's items, all or none: a module that fails to import raises its own
        error, and leaves nothing half registered for the next lookup to trip over."""
        with self._lock:
            if self._imported:
                return
            self._imported = True  # a plug-in module looking a name up while imported sees the rest
            before = dict(self._items)
            try:
                for info in sorted(pkgutil.iter_modules([self._folder]), key=lambda m: m.name):
                    for name, item in self._declared(importlib.import_module(f"{self._package}.{info.name}")):
                        self.register(name, item)
            except BaseException:
                self._items, self._imported = before, False
                raise

    def names(self) -> list[str]:
        self._import_modules()
        return sorted(self._items)

    def items(self) -> list[T]:
        """Every item, by name (not by the order their modules were imported in)."""
        return [self._items[name] for name in self.names()]

    def get(self, name: str) -> T:
        """The item registered as ``name``; LookupError naming the known ones."""
        self._import_modules()
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(map(repr, self.names()))
            raise LookupError(f"unknown {self.what} {name!r} (one of {known})") from None
