"""CURVE against a hostile local user (issue 30): refusals of ever new keys are logged with
a global bound and bounded bookkeeping; the allowed-clients folder is read with bounds (a
FIFO, a symlink to /dev/zero, a huge file are skipped, named, and the good keys still apply)."""

from __future__ import annotations

import logging
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import zmq
import zmq.auth
from conftest import free_endpoint
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
