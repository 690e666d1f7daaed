"""CURVE against a hostile local user (issue 30): refusals of ever new keys are logged with
a global bound and bounded bookkeeping; the allowed-clients folder is read with bounds (a
FIFO, a symlink to /dev/zero, a huge file are skipped, named, and the good keys still apply)."""

from __future__ import annotations

import logging
import os
import re
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq
import zmq.auth
from conftest import free_endpoint, run_process
from helpers import refused_handshake

from edge_agent.pipelines.curve import AllowedClients, read_client_keys
from edge_agent.pipelines.publish import ZmqPublisher

LOG = "edge_agent.pipelines"
READ_TIMEOUT_S = 20.0  # a bounded read of a small folder takes milliseconds


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith(LOG) and r.levelno == logging.WARNING]


@pytest.fixture
def folder(tmp_path: Path) -> tuple[Path, Path, bytes]:
    """(the allowed-clients folder with one good key ``a.key``, the keys folder, a's key)."""
    keys, allowed = tmp_path / "keys", tmp_path / "allowed"
    keys.mkdir()
    allowed.mkdir()
    for name in ("server", "a"):
        zmq.auth.create_certificates(str(keys), name)
    (keys / "server.key_secret").chmod(0o600)
    (allowed / "a.key").write_bytes((keys / "a.key").read_bytes())
    return allowed, keys, zmq.auth.load_certificate(keys / "a.key")[0]


def test_a_fifo_named_key_is_skipped_not_waited_for(folder, caplog):
    allowed, _, a_key = folder
    fifo = allowed / "trap.key"
    os.mkfifo(fifo)
    caplog.set_level(logging.WARNING, logger=LOG)
    got: list[frozenset[bytes]] = []
    reader = threading.Thread(target=lambda: got.append(read_client_keys(str(allowed))[0]), daemon=True)
    reader.start()
    reader.join(READ_TIMEOUT_S)
    hung = reader.is_alive()
    if hung:  # release the reader: a writer that opens and closes gives it an end of file
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        reader.join(READ_TIMEOUT_S)
    assert not hung, "reading the folder waited on a FIFO"
    assert got == [frozenset({a_key})]
    assert any(str(fifo) in m and "not a regular file" in m for m in warnings(caplog)), warnings(caplog)


def test_a_symlink_to_dev_zero_is_skipped_with_bounded_memory(folder):
    """In a child with a 1 GiB address-space limit: an unbounded read of /dev/zero runs out."""
    allowed, _, a_key = folder
    (allowed / "zero.key").symlink_to("/dev/zero")
    code = (
        "import sys\n"
        "from edge_agent.pipelines.curve import read_client_keys\n"
        "keys, problem = read_client_keys(sys.argv[1])\n"
        "print(sorted(k.decode() for k in keys), repr(problem))\n"
    )

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    done = subprocess.run(
        [sys.executable, "-c", code, str(allowed)],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{[a_key.decode()]!r} ''"
    assert "zero.key" in done.stderr and "not a regular file" in done.stderr, done.stderr[-2000:]


def test_a_file_larger_than_a_certificate_is_skipped(folder, caplog):
    allowed, keys, a_key = folder
    big = allowed / "big.key"
    big.write_bytes((keys / "a.key").read_bytes() + b"#" * (1 << 20))
    caplog.set_level(logging.WARNING, logger=LOG)
    found, problem = read_client_keys(str(allowed))
    assert (found, problem) == (frozenset({a_key}), "")
    assert any(str(big) in m and "bytes" in m for m in warnings(caplog)), warnings(caplog)


def test_a_symlink_to_a_key_file_still_counts(folder):
    allowed, keys, a_key = folder
    (allowed / "a.key").unlink()
    (allowed / "linked.key").symlink_to(keys / "a.key")
    assert read_client_keys(str(allowed)) == (frozenset({a_key}), "")


def refused(ctx: zmq.Context, server_public: bytes, endpoint: str) -> None:
    """One real CURVE handshake with a fresh random key pair, until the server refused it."""
    refused_handshake(ctx, server_public, zmq.curve_keypair(), endpoint)


def test_fresh_keys_at_every_attempt_get_a_bounded_number_of_warnings(folder, caplog, monkeypatch):
    from edge_agent.pipelines import curve

    allowed, keys, _ = folder
    caplog.set_level(logging.WARNING, logger=LOG)
    pub = ZmqPublisher(
        free_endpoint(), curve_server_key=str(keys / "server.key_secret"), curve_clients_dir=str(allowed)
    )
    server_public = zmq.auth.load_certificate(keys / "server.key")[0]
    ctx = zmq.Context()
    pub.open()
    try:
        for _ in range(30):
            refused(ctx, server_public, pub.endpoint)
        about = [m for m in warnings(caplog) if "refused client" in m]
        assert 1 <= len(about) <= 10, about
        monkeypatch.setattr(curve, "REFUSED_LOG_INTERVAL_S", 0.0)  # as if the interval passed
        refused(ctx, server_public, pub.endpoint)
    finally:
        pub.close()
        ctx.destroy(linger=0)
    last = [m for m in warnings(caplog) if "refused client" in m][-1]
    assert f"{30 - len(about)} other refusal(s)" in last, last  # none goes uncounted


def test_refusal_bookkeeping_stays_bounded_with_ever_new_keys(caplog):
    """20,000 fresh keys straight into the provider the authenticator calls: the keys
    remembered stay within a bound (the old code kept every key of the last minute)."""
    caplog.set_level(logging.WARNING, logger=LOG)
    clients = AllowedClients("/nowhere")
    for _ in range(20_000):
        assert clients.callback("*", zmq.curve_keypair()[0]) is False
    assert len(clients._refused) <= 1024
    assert len([m for m in warnings(caplog) if "refused client" in m]) <= 10


# The server's secret key file and the clients' files as a hostile local user or a bad copy
# would leave them (issue 43): each is refused with the file (and line) named, at once,
# with bounded memory; a FIFO or a device in the folder is never even opened.

OPEN_STREAM = (
    "import sys\n"
    "from edge_agent.pipelines.publish import ZmqPublisher\n"
    "pub = ZmqPublisher('tcp://127.0.0.1:0', curve_server_key=sys.argv[1], curve_clients_dir=sys.argv[2])\n"
    "try:\n"
    "    pub.open()\n"
    "except OSError as e:\n"
    "    print('refused:', e)\n"
    "    sys.exit(2)\n"
    "pub.close()\n"
    "print('opened')\n"
)
OPEN_TIMEOUT_S = 30.0  # opening the stream takes well under a second


def open_stream(server_key: Path, clients: Path, address_space: int = 0) -> subprocess.CompletedProcess:
    """``ZmqPublisher.open`` in a child (a hang there cannot be undone in this process),
    optionally with an address-space limit; AssertionError when it hangs."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    try:
        return run_process(
            [sys.executable, "-c", OPEN_STREAM, str(server_key), str(clients)],
            timeout_s=OPEN_TIMEOUT_S,
            preexec_fn=limit if address_space else None,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"opening the stream hung on the server key {server_key}") from None


def with_secret(text: str, secret: str) -> str:
    return re.sub(r'secret-key = "[^"]*"', f'secret-key = "{secret}"', text)


SERVER_KEY_CASES = {
    # libzmq refuses the key (EINVAL) after the socket exists, and the context's term()
    # then waited for ever for that socket: the agent hung at start.
    "secret of 39 characters": (lambda t: with_secret(t, "a" * 39), "line 8", "40-character Z85"),
    "secret outside Z85": (lambda t: with_secret(t, "~" * 40), "line 8", "40-character Z85"),
    "secret above 2**32 a group": (lambda t: with_secret(t, "%" * 40), "line 8", "40-character Z85"),
    # pyzmq's reader raised IndexError: a traceback instead of an error naming the file.
    "public-key without =": (
        lambda t: re.sub(r'public-key = "[^"]*"', "public-key", t),
        "line 7",
        "public-key",
    ),
    "public key of another pair": (
        lambda t: re.sub(r'public-key = "[^"]*"', f'public-key = "{zmq.curve_keypair()[0].decode()}"', t),
        "does not match",
        "secret-key",
    ),
}


@pytest.mark.parametrize("case", SERVER_KEY_CASES, ids=list(SERVER_KEY_CASES))
def test_a_malformed_server_key_is_refused_naming_the_file_and_line(folder, case):
    allowed, keys, _ = folder
    change, where, what = SERVER_KEY_CASES[case]
    bad = keys / "bad.key_secret"
    bad.write_text(change((keys / "server.key_secret").read_text()))
    bad.chmod(0o600)
    done = open_stream(bad, allowed)
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert str(bad) in done.stdout and where in done.stdout and what in done.stdout, done.stdout


def test_a_fifo_as_the_server_key_is_refused_not_waited_for(folder):
    allowed, keys, _ = folder
    fifo = keys / "fifo.key_secret"
    os.mkfifo(fifo, 0o600)
    done = open_stream(fifo, allowed)
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert str(fifo) in done.stdout and "not a regular file" in done.stdout, done.stdout


def test_a_server_key_linked_to_dev_zero_is_refused_with_bounded_memory(folder):
    allowed, keys, _ = folder
    zero = keys / "zero.key_secret"
    zero.symlink_to("/dev/zero")
    done = open_stream(zero, allowed, address_space=1 << 30)
    assert done.returncode == 2, (done.stdout, done.stderr[-2000:])
    assert str(zero) in done.stdout and "not a regular file" in done.stdout, done.stdout


def test_a_fifo_in_the_clients_folder_is_never_opened(folder):
    """Opening is already an effect (a FIFO's writer wakes; a device may act on open): what
    is not a regular file is looked at, never opened. A writer blocks in its open until a
    reader opens the FIFO, so it tells whether the folder's read opened it."""
    allowed, _, a_key = folder
    fifo = allowed / "trap.key"
    os.mkfifo(fifo)
    writer_opened = threading.Event()

    def writer() -> None:
        with open(fifo, "wb"):
            writer_opened.set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        assert read_client_keys(str(allowed)) == (frozenset({a_key}), "")
        thread.join(0.5)  # an open by the read wakes the writer at once; this is only slack
        assert not writer_opened.is_set(), "reading the folder opened the FIFO"
    finally:
        fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # releases the writer
        thread.join(READ_TIMEOUT_S)
        os.close(fd)


@pytest.mark.parametrize("name", ["evil\x1b[2J.key", "fake\nCURVE: all clients allowed.key"])
def test_a_client_file_name_with_control_characters_is_escaped_in_the_warning(folder, caplog, name):
    allowed, _, a_key = folder
    (allowed / name).write_bytes(b"not a certificate\n")
    caplog.set_level(logging.WARNING, logger=LOG)
    assert read_client_keys(str(allowed)) == (frozenset({a_key}), "")
    about = [m for m in warnings(caplog) if "skipped" in m]
    assert len(about) == 1 and "\x1b" not in about[0] and "\n" not in about[0], about
    assert repr(name[name.index("\x1b") if "\x1b" in name else name.index("\n")])[1:-1] in about[0], about


def test_a_huge_clients_folder_is_read_within_its_caps(folder, caplog, monkeypatch):
    """Caps made small here, on a real folder: beyond the entries looked at nothing is
    listed, and beyond the files read nothing is opened; both are said in a warning."""
    from edge_agent.pipelines import curve

    allowed, _, a_key = folder
    monkeypatch.setattr(curve, "MAX_FOLDER_ENTRIES", 40)
    monkeypatch.setattr(curve, "MAX_CLIENT_KEY_FILES", 5)
    for i in range(60):
        (allowed / f"z{i:02}.key").write_bytes(b"not a certificate\n")
    caplog.set_level(logging.WARNING, logger=LOG)
    found, problem = read_client_keys(str(allowed))
    assert problem == "" and found <= {a_key}
    said = warnings(caplog)
    assert any("more than 40 entries" in m for m in said), said
    assert any(".key files in" in m and "only the first 5" in m for m in said), said
    assert len([m for m in said if "skipped" in m]) <= 5, said
