"""What a config dataclass declares about its own fields: which name files or folders
(``path_field``), and the checks of its values in ``__post_init__`` (``check``, which
raises ``FieldError``, or collects the failures while the loader builds a document)."""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any, Literal


class FieldError(ValueError):
    """Raised by a config dataclass's ``__post_init__`` to blame one of its keys."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(message)


_collecting = threading.local()


def check(ok: bool, key: str, message: str) -> None:
    """Validation helper for ``__post_init__``: raise ``FieldError`` unless ``ok``.

    While a document is being loaded the failures are collected instead, so one pass
    reports every bad value of a section, not only the first.
    """
    if ok:
        return
    sink = getattr(_collecting, "errors", None)
    if sink is None:
        raise FieldError(key, message)
    sink.append(FieldError(key, message))


@contextlib.contextmanager
def collected_checks() -> Iterator[list[FieldError]]:
    """Within it, this thread's failed ``check`` calls are appended to the list it gives
    instead of raised (the loader builds one section in it); nested, each level its own."""
    outer = getattr(_collecting, "errors", None)
    _collecting.errors = errors = []
    try:
        yield errors
    finally:
        _collecting.errors = outer


PathKind = Literal["file", "dir", "path"]


def path_field(kind: PathKind, default: str = "", reload: tuple[str, ...] = (), local: bool = False) -> Any:
    """A config field that names a file or folder. A relative value resolves against the
    folder of the config file that set it (an environment override: the working folder),
    and ``~`` is the home folder. ``file``/``dir``: an input that must exist when the loader
    checks files; ``path``: created, or needed only in some modes (checked where used).
    ``reload``: how a running agent takes a change, ``local``: left out of the config hash
    (both ``core.reloads``)."""
    return dataclasses.field(default=default, metadata={"path": kind, "reload": reload, "local": local})
