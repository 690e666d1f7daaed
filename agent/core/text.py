"""Text from outside (a socket, a broker, a command line) made safe to print."""

from __future__ import annotations


def printable(text: str, limit: int = 80) -> str:
    """``text`` safe for a terminal or a log line: control and unprintable characters
    escaped (an ANSI sequence from a peer must not redraw the operator's screen), printable
    non-ASCII kept, and cut to ``limit`` characters."""
    out = "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return out if len(out) <= limit else out[: limit - 1] + "…"
