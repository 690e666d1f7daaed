"""The endpoint's open connections, bounded: each one's state (its request head so far,
then its response), and which one is closed to make room for a new one when all the
slots are taken."""

from __future__ import annotations

import socket
from collections.abc import Iterator

from edge_agent.service.http_response import Deferred, Stream

# A connection's states, in the order it goes through them: its request head arriving; its
# answer not ready (a Deferred); its response (or a stream's part) being sent; a stream
# waiting for its next part; all sent, reading what the client still sends until it closes.
READING, WAITING, WRITING = "reading", "waiting", "writing"
STREAMING, LINGERING = "streaming", "lingering"


class Connection:
    """One client connection: its request head so far, then its response."""

    __slots__ = (
        "buf",
        "deadline",
        "drained",
        "eof",
        "head_only",
        "out",
        "pending",
        "sock",
        "state",
        "stream",
    )

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.state = READING
        self.buf = bytearray()
        self.out = memoryview(b"")
        self.deadline = deadline  # time.monotonic() by which the current state must end
        self.drained = 0  # bytes read and discarded after the request
        self.eof = False  # the client has half-closed: nothing more to read
        self.head_only = False
        self.pending: Deferred | None = None
        self.stream: Stream | None = None


class Connections:
    """The open connections in accept order (the first is the oldest), at most ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._open: dict[Connection, None] = {}

    def __iter__(self) -> Iterator[Connection]:
        return iter(self._open)

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, conn: object) -> bool:
        return conn in self._open

    @property
    def full(self) -> bool:
        return len(self._open) >= self.limit

    def add(self, conn: Connection) -> None:
        self._open[conn] = None

    def remove(self, conn: Connection) -> None:
        """Forget ``conn``; one already forgotten is no error."""
        self._open.pop(conn, None)

    def in_state(self, *states: str) -> list[Connection]:
        """The connections in one of ``states``, oldest first (a copy: safe to drop them)."""
        return [c for c in self._open if c.state in states]

    def expired(self, now: float) -> list[Connection]:
        """The connections whose deadline is ``now`` or earlier (a copy: safe to drop them)."""
        return [c for c in self._open if c.deadline <= now]

    def evictable(self) -> Connection | None:
        """The oldest connection done with (lingering), else the oldest without a request,
        else the oldest waiting for its answer: requests that wait (a snapshot with no fresh
        frame) must not be able to fill every slot and lock new clients out. None when every
        connection is being answered or streamed."""
        for state in (LINGERING, READING, WAITING):
            for conn in self._open:
                if conn.state == state:
                    return conn
        return None
