"""The request head, read by ``parse_head``: a pure function of the bytes a connection has
sent so far, which gives the ``Request`` (GET or HEAD) once the head is whole and refuses
anything else (``RequestRefused``, with its status) as soon as the bytes show it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, unquote_to_bytes

_TOKEN = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]"
#: A whole request line (``\r`` stripped): method, target, HTTP major and minor.
_REQUEST_LINE = re.compile(rb"(" + _TOKEN + rb"{1,32}) ([\x21-\x7e]+) HTTP/(\d)\.(\d)")
#: What a request line may look like before its end has arrived; anything else (a TLS
#: hello, binary, a space first) is answered 400 at once instead of waiting for more.
_REQUEST_LINE_START = re.compile(
    _TOKEN + rb"{1,32}(?: (?:[\x21-\x7e]+(?: (?:H(?:T(?:T(?:P(?:/(?:\d(?:\.\d?)?)?)?)?)?)?)?)?)?)?"
)
#: A header line (its final CR taken off): a token, a colon, then visible characters, spaces
#: and tabs: no whitespace before the colon, no NUL or bare CR (RFC 9112 §5.1, RFC 9110 §5.5).
_FIELD = re.compile(rb"(" + _TOKEN + rb"+):([\t\x20-\x7e\x80-\xff]*)")
#: A Host value: an address in brackets or a registered name (RFC 3986's characters), and
#: an optional port of digits; nothing after it.
_HOST = re.compile(rb"(\[[0-9A-Za-z:.%_~-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]{0,5})?")


@dataclass(frozen=True)
class Request:
    """A request's head as ``handle`` sees it: the path percent-decoded (UTF-8)."""

    method: str  # GET or HEAD
    path: str
    query: dict[str, list[str]]


class RequestRefused(ValueError):
    """A request head answered at once with ``status`` (4xx or 505), ``body`` saying why and
    ``headers``, then closed; ``head_only`` for a HEAD request (no body sent)."""

    def __init__(
        self, status: int, body: bytes = b"", headers: tuple[str, ...] = (), *, head_only: bool = False
    ) -> None:
        why = body.decode("latin-1").strip()
        super().__init__(f"{status} {HTTPStatus(status).phrase}{f': {why}' if why else ''}")
        self.status, self.body, self.headers, self.head_only = status, body, headers, head_only


def parse_head(
    data: bytes,
    max_bytes: int = 8192,
    allowed_hosts: frozenset[str] | None = None,
    setting: str = "http",
) -> Request | None:
    """The request whose head ``data`` (what a connection has sent so far) begins with, or
    None while that head is not whole yet. Pure: no I/O, no state.

    A head is at most ``max_bytes`` (empty lines before it included); its request line is
    ``METHOD TARGET HTTP/1.x``; each header line ``name: value`` (a token; then visible
    characters, spaces and tabs: no NUL, bare CR or folded line); at most one ``Host``, a
    ``host[:port]`` one of ``allowed_hosts`` (lower case, as ``host_name`` gives them;
    None: any) when present; every ``Content-Length`` one same number. Only GET and HEAD;
    the path percent-decoded as UTF-8 without control characters. Anything else raises
    RequestRefused (400, 405, 421 naming ``setting``.allowed_hosts, 431 or 505); what is not
    HTTP (a TLS hello) is refused as soon as its first bytes show it, not at the deadline.
    """
    buf = data.lstrip(b"\r\n")
    end_of_line = buf.find(b"\n")
    if end_of_line < 0:
        line = _chomp(buf)
        if line and not _REQUEST_LINE_START.fullmatch(line):
            raise RequestRefused(400, b"not an HTTP/1.x request\n")
        if len(data) > max_bytes:
            raise RequestRefused(431)
        return None
    request_line = _REQUEST_LINE.fullmatch(_chomp(buf[:end_of_line]))
    if request_line is None:  # HTTP/0.9 (no version), garbage with a newline
        raise RequestRefused(400, b"not an HTTP/1.x request\n")
    ends = [i for i in (buf.find(b"\n\r\n", end_of_line), buf.find(b"\n\n", end_of_line)) if i >= 0]
    if not ends:
        if len(data) > max_bytes:
            raise RequestRefused(431)
        return None
    if len(data) - len(buf) + min(ends) + 3 > max_bytes:
        raise RequestRefused(431)
    method, target, major = request_line.group(1), request_line.group(2), request_line.group(3)
    head_only = method == b"HEAD"
    hosts, lengths = _fields(buf[end_of_line + 1 : min(ends)], head_only)
    if major != b"1":
        raise RequestRefused(505)
    if method not in (b"GET", b"HEAD"):
        raise RequestRefused(405, headers=("Allow: GET, HEAD",))
    if len(hosts) > 1:
        raise RequestRefused(400, b"more than one Host header\n", head_only=head_only)
    # No Host at all is let through: browsers always send one, so its absence is no rebinding.
    if hosts and not _HOST.fullmatch(hosts[0]):
        raise RequestRefused(400, b"malformed Host header\n", head_only=head_only)
    if hosts and allowed_hosts is not None and host_name(hosts[0].decode("ascii")) not in allowed_hosts:
        why = f"this server does not answer to that host name (see {setting}.allowed_hosts)\n"
        raise RequestRefused(421, why.encode(), head_only=head_only)
    if len(lengths) > 1 or not all(n.isdigit() for n in lengths):
        raise RequestRefused(400, b"malformed Content-Length\n", head_only=head_only)
    raw_path, _, raw_query = target.partition(b"?")
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise RequestRefused(
            400, b"the path is not UTF-8 once percent-decoded\n", head_only=head_only
        ) from None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        raise RequestRefused(400, b"control characters in the path\n", head_only=head_only)
    # The target is visible ASCII (the request line's pattern), so is its query.
    query = parse_qs(raw_query.decode("ascii"), keep_blank_values=True)
    return Request(method.decode(), path, query)


def _chomp(line: bytes) -> bytes:
    """``line`` without the CR of its CRLF (one: a second is a bare CR)."""
    return line[:-1] if line.endswith(b"\r") else line


def _fields(block: bytes, head_only: bool) -> tuple[list[bytes], set[bytes]]:
    """The Host values and the Content-Length values of a head's header lines; raises
    RequestRefused (400) at a line outside the grammar (a folded line included)."""
    hosts: list[bytes] = []
    lengths: set[bytes] = set()
    for raw in block.split(b"\n") if block else ():
        field = _FIELD.fullmatch(_chomp(raw))
        if field is None:
            raise RequestRefused(400, b"malformed header\n", head_only=head_only)
        name, value = field.group(1).lower(), field.group(2).strip(b" \t")
        if name == b"host":
            hosts.append(value)
        elif name == b"content-length":
            lengths.update(n.strip(b" \t") for n in value.split(b","))
    return hosts, lengths


def host_name(value: str) -> str:
    """A Host header's or an address's name: lower case, without port, brackets or final dot
    (a Host is checked against ``_HOST`` first: nothing follows its port)."""
    value = value.strip().lower()
    if value.startswith("["):
        value = value[1:].split("]", 1)[0]
    elif value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")
