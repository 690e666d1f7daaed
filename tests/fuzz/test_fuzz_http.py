"""Fuzz targets: the HTTP request heads of the live view and the metrics
(``http_request.parse_head``, which the one server of both calls on the bytes a connection
has sent so far), then the view's and the metrics' answers to what it lets through. Inputs:
any bytes, and near-valid heads (methods, paths with %-escapes and ``..``, queries with
repeated keys and the view's token, header lines folded, with NUL, bare CR, non-ASCII,
without a colon, by the thousand, long; one Host or several, valid or not; several
Content-Lengths). The property: a request, ``None`` while the head may still come whole,
or ``RequestRefused`` (a 4xx or 505), within the bounds; what is let through conforms to
HTTP/1.1's grammar (checked here on its own, from RFC 9112) and gets a 2xx, 403, 404 or 503
from its handler. Last, a real metrics server on a real socket takes generated heads: each
is answered (never 500) or closed, and a good request is answered after each."""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator
from types import SimpleNamespace
from urllib.parse import quote, unquote_to_bytes

import pytest
from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.core.endpoint_config import ViewConfig
from edge_agent.service.http_endpoint import HttpEndpoint
from edge_agent.service.http_request import Request, RequestRefused, parse_head
from edge_agent.service.http_response import Response
from edge_agent.service.metrics import AgentCollector, MetricsServer
from edge_agent.service.view.server import ViewServer, allowed_hosts

MAX_BYTES = 8192  # the view's and the metrics' max_request_bytes
TOKEN = "s3cret"
VIEW_CFG = ViewConfig(enabled=True, port=0, token=TOKEN, allowed_hosts=("cam.example",))
# As the view's server holds them (lower case, no port, brackets or final dot).
ALLOWED = HttpEndpoint(
    "127.0.0.1", 0, handle=lambda r: Response(200), allowed_hosts=allowed_hosts(VIEW_CFG)
).allowed_hosts
REFUSALS = {400, 405, 421, 431, 505}


# -- near-valid heads ----------------------------------------------------------------------

METHODS = st.one_of(
    st.sampled_from([b"GET", b"GET", b"HEAD", b"POST", b"get", b"OPTIONS", b"G\x00T", b"", b"X" * 40]),
    st.from_regex(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,34}", fullmatch=True),
)
SEGMENTS = st.one_of(
    st.sampled_from(
        [b"", b"..", b".", b"api", b"health", b"metrics", b"stream", b"snapshot", b"cam0.jpg", b"cam0.mjpg"]
    ),
    st.sampled_from([b"%2e%2e", b"%00", b"%ff", b"%C3%BC", b"%", b"%zz", b"%7f", b"s%C3%BCd.jpg", b"%0d%0a"]),
    st.text(max_size=8).map(lambda t: quote(t, safe="").encode()),
    st.sampled_from([b"a b", b"\xc3\xbc", b"\x00", b"\x7f"]),  # raw: not in a request line
)
PATHS = st.one_of(
    st.lists(SEGMENTS, max_size=5).map(lambda s: b"/" + b"/".join(s)),
    st.sampled_from(
        [
            b"/",
            b"/metrics",
            b"/api/health",
            b"/snapshot/cam0.jpg",
            b"/stream/cam0.mjpg",
            b"*",
            b"//x",
            b"http://evil.example/api/health",
            b"/" + b"a" * 9000,
        ]
    ),
)
QUERIES = st.lists(
    st.tuples(
        st.sampled_from([b"token", b"token", b"a", b"", b"token[]", b"%74oken", b"TOKEN"]),
        st.sampled_from([TOKEN.encode(), b"", b"wrong", b"%FF", b"s3cre%74", b"a%20b", b"x" * 100, b"=="]),
    ),
    max_size=5,
).map(lambda pairs: b"&".join(k + b"=" + v for k, v in pairs))
TARGETS = st.tuples(PATHS, st.none() | QUERIES, st.sampled_from([b"", b"#frag"])).map(
    lambda t: t[0] + (b"" if t[1] is None else b"?" + t[1]) + t[2]
)
VERSIONS = st.sampled_from(
    [
        b"HTTP/1.1",
        b"HTTP/1.1",
        b"HTTP/1.0",
        b"HTTP/2.0",
        b"HTTP/1.",
        b"HTTP/11.1",
        b"http/1.1",
        b"",
        b"HTTP/0.9",
    ]
)
SPACES = st.sampled_from([b" ", b" ", b" ", b"  ", b"\t", b""])
EOLS = st.sampled_from([b"\r\n", b"\r\n", b"\n", b"\r", b"\r\r\n", b"\n\r"])
HOSTS = st.one_of(
    st.sampled_from(
        [
            b"localhost",
            b"LOCALHOST.",
            b"127.0.0.1:8090",
            b"[::1]:1",
            b"cam.example",
            b"[::1]evil",
            b"evil.example",
            b"localhost:notaport",
            b"",
            b"a b",
            b"cam.example:999999",
            b"127.0.0.1.evil.example",
            b"localhost\x00",
            b"[::1",
            b"localhost:80:80",
            b"[fe80::1%25eth0]",
            b"xn--bcher-kva.example",
            b"\xc3\xbc.example",
        ]
    ),
    st.binary(max_size=12),
)
NAMES = st.one_of(
    st.sampled_from(
        [
            b"Host",
            b"host",
            b"HOST",
            b"Content-Length",
            b"Transfer-Encoding",
            b"Cookie",
            b"X-A",
            b"Host ",
            b" Host",
            b"Ho st",
            b"",
            b"X(y)",
            b"\xc3\xbc",
        ]
    ),
    st.binary(max_size=8),
)
VALUES = st.one_of(
    st.sampled_from(
        [b"1", b"-1", b"1, 1", b"1,2", b"chunked", b"token=s3cret", b"a\x00b", b"a\rb", b"\xc3\xbc"]
    ),
    st.sampled_from([b"x" * 300, b" padded ", b"\tx"]),
    st.binary(max_size=20),
)
SEPARATORS = st.sampled_from([b": ", b": ", b":", b" : ", b":\t", b"", b"::"])


def mostly(good: st.SearchStrategy[bytes], bent: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """``good`` five times in six: a head bent in one or two places gets past the rest of the
    parser to the check that matters; bent everywhere, it would be refused at its first line."""
    return st.sampled_from([True] * 5 + [False]).flatmap(lambda ok: good if ok else bent)


GOOD_EOLS = st.sampled_from([b"\r\n", b"\r\n", b"\n"])
GOOD_VALUES = st.one_of(
    st.sampled_from([b"1", b"text/html", b"token=s3cret", b"gzip, deflate", b"\xc3\xbc", b""]),
    st.from_regex(rb"[\x21-\x7e]([\x20-\x7e]{0,30}[\x21-\x7e])?", fullmatch=True),
)


@st.composite
def header(draw: st.DrawFn, eol: bytes) -> bytes:
    kind = draw(st.integers(0, 5))
    if kind == 0:
        name, value = draw(mostly(st.sampled_from([b"Host", b"host"]), NAMES)), draw(HOSTS)
    elif kind == 1:
        name, value = b"Content-Length", draw(mostly(st.sampled_from([b"0", b"12"]), VALUES))
    else:
        name = draw(mostly(st.sampled_from([b"Accept", b"Cookie", b"User-Agent", b"X-A"]), NAMES))
        value = draw(mostly(GOOD_VALUES, VALUES))
    line = name + draw(mostly(st.sampled_from([b": ", b":"]), SEPARATORS)) + value
    if draw(st.integers(0, 9)) == 0:  # obs-fold: a continuation line
        line += eol + draw(st.sampled_from([b" ", b"\t"])) + b"more"
    return line + draw(mostly(st.just(eol), EOLS))


@st.composite
def head(draw: st.DrawFn) -> bytes:
    """A request head as a client would send one, bent here and there."""
    eol = draw(mostly(GOOD_EOLS, EOLS))
    parts = [draw(st.sampled_from([b"", b"", b"", b"\r\n", b"\n", b"\r\n" * 3]))]
    method = draw(mostly(st.sampled_from([b"GET", b"HEAD"]), METHODS))
    space = mostly(st.just(b" "), SPACES)
    version = draw(mostly(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0"]), VERSIONS))
    parts.append(method + draw(space) + draw(TARGETS) + draw(space) + version + eol)
    parts += draw(st.lists(header(eol), max_size=6))
    many = draw(st.sampled_from([0, 0, 0, 0, 10, 300, 2000]))  # header lines by the hundred
    parts.append(b"X-Many: y" + eol)
    parts[-1] *= many
    parts.append(draw(mostly(st.just(eol), st.sampled_from([b"", b"\r\n", b"\n"]))))  # b"": not whole yet
    if draw(st.booleans()):
        parts.append(draw(st.sampled_from([b"x", b"GET / HTTP/1.1\r\n\r\n", b"\x00" * 10])))  # a body
    return b"".join(parts)


HEADS = st.one_of(head(), head(), head(), st.binary(max_size=512))

# -- the grammar a head that is let through must follow (RFC 9112, RFC 9110 §5.5) ------------

_T = rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+"
_VCHAR = rb"[\x21-\x7e\x80-\xff]"
RFC_REQUEST_LINE = re.compile(rb"(GET|HEAD) ([\x21-\x7e]+) HTTP/1\.[0-9]\r?")
RFC_FIELD = re.compile(rb"(" + _T + rb"):[ \t]*((?:" + _VCHAR + rb"+(?:[ \t]+" + _VCHAR + rb"+)*)?)[ \t]*\r?")
RFC_HOST = re.compile(rb"(?:\[[0-9A-Za-z:.%_~-]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]*)?")


def conforms(data: bytes, request: Request, allowed: frozenset[str] | None) -> None:
    """AssertionError unless the head ``request`` was read from is well-formed HTTP/1.x."""
    buf = data.lstrip(b"\r\n")
    lines = buf.split(b"\n")
    end = next(i for i, line in enumerate(lines) if i and line in (b"", b"\r"))
    assert len(data) - len(buf) + sum(len(line) + 1 for line in lines[: end + 1]) <= MAX_BYTES + 1, "size"
    line = RFC_REQUEST_LINE.fullmatch(lines[0])
    assert line is not None, lines[0]
    assert request.method == line.group(1).decode()
    fields = [RFC_FIELD.fullmatch(f) for f in lines[1:end]]
    assert all(fields), [f for f, ok in zip(lines[1:end], fields) if not ok]
    hosts = [f.group(2) for f in fields if f and f.group(1).lower() == b"host"]
    assert len(hosts) <= 1, hosts
    if hosts:
        assert RFC_HOST.fullmatch(hosts[0]), hosts
        assert allowed is None or name_of(hosts[0]) in allowed, hosts
    lengths = {
        n.strip()
        for f in fields
        if f and f.group(1).lower() == b"content-length"
        for n in f.group(2).split(b",")
    }
    assert len(lengths) <= 1 and all(n.isdigit() for n in lengths), lengths
    raw_path = line.group(2).partition(b"?")[0]
    assert request.path == unquote_to_bytes(raw_path).decode("utf-8")
    assert not any(ord(c) < 0x20 or ord(c) == 0x7F for c in request.path), request.path


def name_of(host: bytes) -> str:
    """A valid Host's name as the allowed names are written: lower case, no port, brackets
    or final dot."""
    text = host.decode("ascii").lower()
    name = text[1:].partition("]")[0] if text.startswith("[") else text.partition(":")[0]
    return name.rstrip(".")


def whole_head_in(data: bytes) -> bool:
    buf = data.lstrip(b"\r\n")
    first = buf.find(b"\n")
    return first >= 0 and (buf.find(b"\n\r\n", first) >= 0 or buf.find(b"\n\n", first) >= 0)


# -- the handlers behind it ----------------------------------------------------------------

VIEW = ViewServer(VIEW_CFG, lambda: {"cam0": {"fps": 5.0}})  # not started: its handler only
VIEW.tap("cam0", 10)
METRICS = MetricsServer(AgentCollector(SimpleNamespace(pipeline=None)), "127.0.0.1", 0)


def answered(request: Request) -> None:
    """The view's and the metrics' handlers answer it: 2xx, 403, 404 or 503, never a 500."""
    answer = VIEW._handle(request)
    if not isinstance(answer, Response):  # a snapshot waiting for a frame: polled once
        answer = answer() or Response(503)
    if answer.stream is not None:
        answer.stream.close()
    assert answer.status in (200, 403, 404, 503), (request, answer.status)
    given = request.query.get("token", [""])[0]
    assert answer.status != 200 or given == TOKEN, "the token is asked for on every answer"
    assert METRICS.http.handle(request).status in (200, 404)


def decide(data: bytes, allowed: frozenset[str] | None) -> Request | RequestRefused | None:
    try:
        return parse_head(data, MAX_BYTES, allowed, "view")
    except RequestRefused as refused:
        return refused


@example(b"GET / HTTP/1.1\r\nHost : localhost\r\n\r\n", ALLOWED)  # whitespace before the colon passed
@example(b"GET / HTTP/1.1\r\nHost: [::1]evil.example\r\n\r\n", ALLOWED)  # taken for the loopback
@example(b"GET / HTTP/1.1\r\nHost: localhost:notaport\r\n\r\n", ALLOWED)
@example(b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", None)  # NUL in a value
@example(b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", None)  # bare CR
@example(b"GET / HTTP/1.1\r\nX(y): 1\r\n\r\n", None)  # a name that is not a token
@example(b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", None)
@example(b"GET / HTTP/1.1\r\r\n\r\n", None)  # the request line's bare CR
@example(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", None)
@example(b"\r\n" * 5000 + b"GET / HTTP/1.1\r\n\r\n", None)
@example(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", None)
@example(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", None)  # a TLS hello
@example(b"GET /snapshot/cam0.jpg?token=s3cret HTTP/1.1\r\nHost: cam.example\r\n\r\n", ALLOWED)
@given(HEADS, st.sampled_from([None, ALLOWED]))
def test_a_request_head_is_read_or_refused(data: bytes, allowed: frozenset[str] | None) -> None:
    outcome = bounded(lambda: decide(data, allowed), RequestRefused)
    if isinstance(outcome, RequestRefused):
        assert outcome.status in REFUSALS, outcome
        assert outcome.status != 421 or allowed is not None
    elif outcome is None:  # it waits for more only while a head can still come whole
        assert len(data) <= MAX_BYTES and not whole_head_in(data), data[:200]
    else:
        conforms(data, outcome, allowed)
        answered(outcome)


# -- on a real socket ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def metrics_port() -> Iterator[int]:
    server = MetricsServer(
        AgentCollector(SimpleNamespace(pipeline=None)), "127.0.0.1", 0, request_timeout_s=0.5
    )
    server.start()
    try:
        yield server.port
    finally:
        server.close()


def exchange(port: int, data: bytes) -> bytes:
    """``data`` sent on a fresh connection; what comes back before the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        with contextlib.suppress(OSError):  # refused and closed before all was sent
            sock.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


@given(st.one_of(head().map(lambda h: h + b"\r\n\r\n"), st.binary(max_size=256)))
@settings(max_examples=examples(15))
def test_a_real_server_answers_or_closes_each_head_and_still_serves(metrics_port: int, data: bytes) -> None:
    answer = exchange(metrics_port, data)
    if answer:
        assert re.match(rb"HTTP/1\.1 (200|404|408|4\d\d|505) ", answer), answer[:100]
    good = exchange(metrics_port, b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert good.startswith(b"HTTP/1.1 200 "), good[:100]
