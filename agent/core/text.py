"""Text from outside (a socket, a broker, a command line) made safe to print."""

from __future__ import annotations


def printable(text: str, limit: int | None = 80) -> str:
    """``text`` safe for a terminal or a log line: control and unprintable characters
    escaped (an ANSI sequence from a peer must not redraw the operator's screen, a CR or LF
    must not forge a line), printable non-ASCII kept, and cut to ``limit`` characters
    (None: whole, for text already bounded where it came in, such as a model's labels)."""
    out = text if text.isprintable() else "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
    return out if limit is None or len(out) <= limit else out[: limit - 1] + "…"
