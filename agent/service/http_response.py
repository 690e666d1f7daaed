"""What a handler answers: a ``Response`` (its body whole, or a ``Stream`` of parts), or a
``Deferred`` answer polled until it is ready; and the bytes of a response's head."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol


class Stream(Protocol):
    """A body sent in parts as they come (MJPEG), after a head without a length. Polled by
    the server's thread whenever it wakes (``HttpEndpoint.wake``, or twice a second) and
    the previous part has been taken: it must never block."""

    def next_part(self) -> bytes | None:
        """The next part to send, or None when there is nothing new yet."""

    def done(self) -> bool:
        """Whether the body is complete (the connection is then closed)."""

    def close(self) -> None:
        """The connection ended, whatever the reason; called once."""


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[str, ...] = ()
    stream: Stream | None = None  # the body instead of ``body``
    send_buffer: int = 0  # SO_SNDBUF for this connection (0: the system's)


#: An answer not ready yet (a snapshot waiting for a frame): polled like a stream until it
#: returns the response; it must give one (a 503, say) in its own time.
Deferred = Callable[[], Response | None]


def encode_response(
    status: int,
    body: bytes = b"",
    content_type: str = "text/plain; charset=utf-8",
    *,
    head_only: bool = False,
    extra: tuple[str, ...] = (),
    length: bool = True,
) -> bytes:
    """A response as sent: its head (``Connection: close`` always, ``Content-Length`` unless
    ``length`` is false, as for a stream, then ``extra`` header lines) and, unless
    ``head_only``, ``body``; an error without a body gets one that names its status."""
    if not body and status != 200:
        body = f"{status} {HTTPStatus(status).phrase}\n".encode()
    head = "\r\n".join(
        (
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
            f"Content-Type: {content_type}",
            *((f"Content-Length: {len(body)}",) if length else ()),
            "Connection: close",
            *extra,
        )
    )
    data = head.encode("latin-1") + b"\r\n\r\n"
    return data if head_only else data + body
