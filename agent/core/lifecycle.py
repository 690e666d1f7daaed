"""One lifecycle for every long-lived part: started in order, stopped in reverse.

A ``Component`` starts (opens its device, socket or threads) and stops within a timeout,
saying whether its threads ended. ``Parts`` owns the started ones: a part that fails to
stop never keeps the parts started before it from stopping (the power state, started
first, is always put back last). What outlives a stop (model sessions a stuck thread may
still be inside) is closed by its owner only after a clean stop (``Agent.close_models``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)


@runtime_checkable
class Component(Protocol):
    def start(self) -> None:
        """Open and start; raises on failure, leaving nothing running."""

    def stop(self, timeout_s: float) -> bool:
        """Stop and release; True if every thread it ran has ended within ``timeout_s``."""


class Parts:
    """The started components of one owner, in start order."""

    def __init__(self) -> None:
        self._parts: list[Component] = []

    def __contains__(self, part: object) -> bool:
        return any(p is part for p in self._parts)

    def __len__(self) -> int:
        return len(self._parts)

    def start(self, part: Component) -> None:
        part.start()
        self._parts.append(part)

    def stop(self, timeout_s: float) -> bool:
        """Stop every part, the last started first; True if all stopped cleanly."""
        clean = True
        while self._parts:
            part = self._parts.pop()
            try:
                clean = part.stop(timeout_s) and clean
            except Exception:  # the parts started before it must still stop
                log.exception("stopping %s failed", type(part).__name__)
                clean = False
        return clean

    def replace(self, old: object, new: Component) -> None:
        """``new`` (already started) takes ``old``'s place in the stop order."""
        self._parts = [new if p is old else p for p in self._parts]

    def remove(self, part: object) -> None:
        self._parts = [p for p in self._parts if p is not part]

    def insert_before(self, anchor: object, parts: Iterable[Component]) -> None:
        """Started ``parts`` go just before ``anchor``: they stop just after it."""
        i = next(k for k, p in enumerate(self._parts) if p is anchor)
        self._parts[i:i] = list(parts)
