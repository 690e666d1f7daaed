"""Where a path field's relative value resolves (the folder of the file that set it, or the
working folder for the environment and stdin), and why a named input is not there."""

from __future__ import annotations

import os
import re

from edge_agent.core.configfields import PathKind
from edge_agent.core.yamlnodes import STDIN

# The mark of a value set by an environment variable: "env EDGE_AGENT__SOURCE__FPS".
ENV_PREFIX = "EDGE_AGENT__"
ENV_ORIGIN = "env "


def origin_dir(mark_file: str | None, fallback: str) -> str | None:
    """The folder a relative path set at a node resolves against; None: leave it as written."""
    origin = mark_file if mark_file and not mark_file.startswith("<") else fallback
    if origin.startswith(ENV_ORIGIN + ENV_PREFIX) or _pipe_name(origin):
        return os.getcwd()
    if not origin or origin.startswith("<"):
        return None
    return os.path.dirname(os.path.abspath(origin))


def _pipe_name(path: str) -> bool:
    """``-``, ``/dev/stdin``, ``/dev/fd/N``, ``/proc/self/fd/N``: stdin or a pipe, in no
    folder of its own (not /dev): its relative paths are the working folder's, as a shell's."""
    folder = os.path.dirname(os.path.abspath(path))
    return (
        path == STDIN
        or folder in ("/dev", "/dev/fd")
        or re.fullmatch(r"/proc/(self|\d+)/fd", folder) is not None
    )


def missing(kind: PathKind, path: str) -> str | None:
    """Why input ``path`` of ``kind`` is not there (``file``, ``dir``), or None."""
    if kind == "file" and not os.path.isfile(path):
        return f"{'not a file' if os.path.exists(path) else 'file not found'}: {path}"
    if kind == "dir" and not os.path.isdir(path):
        return f"{'not a folder' if os.path.exists(path) else 'folder not found'}: {path}"
    return None
