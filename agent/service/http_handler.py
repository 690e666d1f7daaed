"""Calling what answers an endpoint's requests, from the server's loop: one resource's
``render`` (``one_resource``) or a handler of any path. A handler that raises costs its
request a 500, never the loop; each new failure is logged once, with its traceback."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from edge_agent.service.http_request import Request
from edge_agent.service.http_response import Deferred, Response

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: The answer to a request: a response now, or a ``Deferred`` one.
Handle = Callable[[Request], Response | Deferred]


def one_resource(path: str, render: Callable[[], tuple[bytes, str]]) -> Callable[[Request], Response]:
    """A handler of ``path`` alone: ``render`` gives its body and content type at each
    request; any other path is answered 404, naming where the resource is."""

    def handle(request: Request) -> Response:
        if request.path != path:
            return Response(404, f"the resource is at {path}\n".encode())
        body, content_type = render()
        return Response(200, body, content_type)

    return handle


class GuardedHandler:
    """``handle`` and the deferred answers it gives, called so that an exception answers 500.

    The last failure is remembered: the same one again is logged at debug level only, so a
    broken handler under a scraper's every request does not flood the log.
    """

    def __init__(self, handle: Handle, name: str) -> None:
        self.handle = handle
        self.name = name  # the endpoint's, in messages
        self._last_error = ""

    def answer(self, request: Request) -> Response | Deferred:
        """The handler's answer to ``request``, or a 500."""
        return self._guarded(request.path, lambda: self.handle(request))

    def poll(self, pending: Deferred) -> Response | None:
        """A deferred answer's response, None while it is not ready, or a 500."""
        return self._guarded("a waiting answer", pending)

    def _guarded(self, what: str, answer: Callable[[], _T]) -> _T | Response:
        """``answer()``, or a 500 when it raises (each new failure logged once, with its traceback)."""
        try:
            result = answer()
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
            if message != self._last_error:
                log.exception("%s: answering %s failed; the request gets 500", self.name, what)
            else:
                log.debug("%s: answering failed again: %s", self.name, message)
            self._last_error = message
            return Response(500)
        if result is not None:  # a waiting answer's "not yet" says nothing about failures
            self._last_error = ""
        return result
