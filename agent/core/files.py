"""Writing files so that a crash or power cut never leaves one half-written, and reading the
small text files of /proc and /sys."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` so that ``path`` is never seen half-written.

    The bytes go to a temporary file beside it, are fsync'ed, and replace ``path`` with
    one rename; the directory is fsync'ed too so the rename itself survives a power cut.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def file_sha256(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """The SHA-256 of a file's bytes, read in chunks (models are hundreds of MB)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_text(path: str | os.PathLike) -> str:
    """A small text file's contents, stripped of whitespace and device-tree NULs; "" when it
    cannot be read (not there, not allowed): for reports, never for decisions."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip().strip("\x00")
    except OSError:
        return ""
