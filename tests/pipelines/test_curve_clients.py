"""The CURVE allow-list on the real socket: bad key files, revocation at a refresh (also of
clients already connected), refused clients in the log, the secret key's mode."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
import zmq.auth
from conftest import free_endpoint, wait_until
from helpers import refused_handshake

from edge_agent.client import Subscriber
from edge_agent.pipelines.publish import ZmqPublisher

PUBLISH_LOG = "edge_agent.pipelines"  # the publisher and its CURVE allow-list (curve.py)
QUIET_S = 1.5  # how long a refused client must receive nothing


class Keys:
    """Key pairs made by pyzmq in ``tmp/keys``; ``allowed`` is the clients folder."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "keys"
        self.dir.mkdir()
        self.allowed = tmp / "allowed"
        self.allowed.mkdir()
        for name in ("server", "a", "b", "c"):
            zmq.auth.create_certificates(str(self.dir), name)
        self.server_secret.chmod(0o600)

    @property
    def server_secret(self) -> Path:
        return self.dir / "server.key_secret"

    def public(self, name: str) -> Path:
        return self.dir / f"{name}.key"

    def z85(self, name: str) -> str:
        return zmq.auth.load_certificate(self.public(name))[0].decode()

    def allow(self, *names: str) -> None:
        for name in names:
            shutil.copy(self.public(name), self.allowed / f"{name}.key")

    def revoke(self, name: str) -> None:
        (self.allowed / f"{name}.key").unlink()


class Sender:
    """Publishes ``{"seq": n}`` every few milliseconds on its own thread, as the agent does."""

    def __init__(self, pub: ZmqPublisher) -> None:
        self.pub = pub
        self.seq = 0  # the last seq sent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-sender")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.pub.send(b"det.cam0", json.dumps({"seq": self.seq + 1}).encode())
            self.seq += 1
            self.pub.poll_subscriptions()  # as the heartbeat does
            time.sleep(0.005)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Client:
    """A CURVE subscriber made by ``edge_agent.client.Subscriber``; ``seqs`` is what arrived."""

    def __init__(self, ctx: zmq.Context, keys: Keys, name: str, endpoint: str) -> None:
        self.sub = Subscriber(
            endpoint,
            ("det",),
            server_key=str(keys.public("server")),
            client_cert=str(keys.dir / f"{name}.key_secret"),
            timeout_s=0,  # drain() takes what is there and returns
            context=ctx,
        )
        self.seqs: list[int] = []

    def drain(self) -> list[int]:
        while (got := self.sub.recv()) is not None:
            self.seqs.append(got[1]["seq"])
        return self.seqs

    def after(self, seq: int) -> list[int]:
        return [s for s in self.drain() if s > seq]

    def close(self) -> None:
        self.sub.close()


@pytest.fixture
def keys(tmp_path: Path) -> Keys:
    return Keys(tmp_path)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    try:
        yield context
    finally:
        context.destroy(linger=0)  # closes any socket a failed test left open


@contextlib.contextmanager
def streaming(keys: Keys, clients_dir: Path | None = None) -> Iterator[tuple[ZmqPublisher, Sender]]:
    """An open CURVE publisher on a free loopback port, publishing all along."""
    pub = ZmqPublisher(
        free_endpoint(),
        curve_server_key=str(keys.server_secret),
        curve_clients_dir=str(clients_dir or keys.allowed),
    )
    pub.open()
    sender = None
    try:
        sender = Sender(pub)
        yield pub, sender
    finally:
        if sender is not None:
            sender.close()
        pub.close()
    assert pub._auth is None, "the authenticator stops with the publisher"


def receives_nothing_after(client: Client, seq: int, seconds: float = QUIET_S) -> list[int]:
    """What ``client`` received with a seq above ``seq`` while polling for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        client.sub.poll(0.05)
        client.drain()
    return client.after(seq)


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith(PUBLISH_LOG) and r.levelno == logging.WARNING
    ]


def test_a_malformed_key_file_is_named_and_skipped(keys, ctx, caplog):
    keys.allow("a")
    garbage = keys.allowed / "garbage.key"
    garbage.write_text("this is not a certificate\n\x00\xff")
    truncated = keys.allowed / "b.key"  # b's certificate, cut in the middle of its key
    text = keys.public("b").read_text()
    truncated.write_text(text[: text.index("public-key") + 30])
    caplog.set_level(logging.INFO, logger=PUBLISH_LOG)
    with streaming(keys) as (pub, _):
        a = Client(ctx, keys, "a", pub.endpoint)
        b = Client(ctx, keys, "b", pub.endpoint)
        try:
            wait_until(lambda: len(a.drain()) >= 5, 30, message="results for the allowed client")
            assert receives_nothing_after(b, 0) == [], "a truncated key admits nobody"
        finally:
            a.close()
            b.close()
    logged = warnings(caplog)
    for bad in (garbage, truncated):
        assert any(str(bad) in m and "skipped" in m for m in logged), (bad, logged)
    assert not any(str(keys.allowed / "a.key") in m for m in logged), logged


def test_a_removed_key_is_refused_at_the_next_refresh_even_with_a_bad_file(keys, ctx, caplog):
    keys.allow("a", "b")
    caplog.set_level(logging.INFO, logger=PUBLISH_LOG)
    with streaming(keys) as (pub, sender):
        a = Client(ctx, keys, "a", pub.endpoint)
        b = Client(ctx, keys, "b", pub.endpoint)
        try:
            wait_until(lambda: len(a.drain()) >= 5 and len(b.drain()) >= 5, 30, message="both receive")
            wait_until(lambda: pub.poll_subscriptions() == 2, 30, message="both subscriptions counted")

            keys.revoke("a")
            (keys.allowed / "broken.key").write_text("public-key = \n")
            assert pub.refresh_clients() is True, "a key was removed"
            marker = sender.seq  # everything after this was sent after the refresh returned

            wait_until(lambda: b.after(marker), 30, message="the allowed client receives after the refresh")
            assert receives_nothing_after(a, marker) == [], "the revoked client still receives"
            wait_until(lambda: pub.poll_subscriptions() == 1, 30, message="b subscribed again, a not")
        finally:
            a.close()
            b.close()
    logged = warnings(caplog)
    assert any(str(keys.allowed / "broken.key") in m for m in logged), logged
    assert any("rebound to drop revoked clients" in m for m in logged), logged


def test_adding_a_key_keeps_connected_clients(keys, ctx, caplog):
    keys.allow("a")
    caplog.set_level(logging.INFO, logger=PUBLISH_LOG)
    with streaming(keys) as (pub, sender):
        a = Client(ctx, keys, "a", pub.endpoint)
        b = None
        try:
            wait_until(lambda: len(a.drain()) >= 5, 30, message="results for a")
            keys.allow("b")
            assert pub.refresh_clients() is False, "nothing was removed: no rebind"
            marker = sender.seq
            b = Client(ctx, keys, "b", pub.endpoint)
            wait_until(lambda: b.after(marker), 30, message="b admitted once its key is in")
            seen = a.drain()
            assert seen == list(range(seen[0], seen[-1] + 1)), "a was not disconnected (no gap)"
        finally:
            a.close()
            if b is not None:
                b.close()
    assert not any("rebound" in m for m in warnings(caplog))


def refused_attempt(ctx: zmq.Context, keys: Keys, name: str, endpoint: str) -> None:
    """One connection with ``name``'s key, until CURVE refused it."""
    server_public = zmq.auth.load_certificate(keys.public("server"))[0]
    key_pair = zmq.auth.load_certificate(keys.dir / f"{name}.key_secret")
    refused_handshake(ctx, server_public, key_pair, endpoint)


def test_a_refused_client_is_logged_once_not_per_attempt(keys, ctx, caplog):
    keys.allow("a")
    caplog.set_level(logging.WARNING, logger=PUBLISH_LOG)
    with streaming(keys) as (pub, _):
        for _ in range(10):
            refused_attempt(ctx, keys, "c", pub.endpoint)
        refused_attempt(ctx, keys, "b", pub.endpoint)
    about_c = [m for m in warnings(caplog) if keys.z85("c")[:8] in m]
    assert len(about_c) == 1, about_c
    assert "not in the allowed folder" in about_c[0] and str(keys.allowed) in about_c[0]
    assert len([m for m in warnings(caplog) if keys.z85("b")[:8] in m]) == 1, "one per key"


def test_refusals_not_logged_are_counted_in_the_next_warning(keys, ctx, caplog, monkeypatch):
    from edge_agent.pipelines import curve

    keys.allow("a")
    caplog.set_level(logging.WARNING, logger=PUBLISH_LOG)
    with streaming(keys) as (pub, _):
        for _ in range(3):  # one warning, two refusals held back
            refused_attempt(ctx, keys, "c", pub.endpoint)
        monkeypatch.setattr(curve, "REFUSED_LOG_INTERVAL_S", 0.0)  # as if a minute passed
        refused_attempt(ctx, keys, "c", pub.endpoint)
    about_c = [m for m in warnings(caplog) if keys.z85("c")[:8] in m]
    assert len(about_c) == 2, about_c
    assert "2 more refusal(s) of it not logged" in about_c[1]


@pytest.mark.parametrize(("mode", "warned"), [(0o644, True), (0o600, False)])
def test_a_secret_key_readable_by_others_warns(keys, caplog, mode, warned):
    keys.allow("a")
    keys.server_secret.chmod(mode)
    caplog.set_level(logging.WARNING, logger=PUBLISH_LOG)
    pub = ZmqPublisher(
        free_endpoint(), curve_server_key=str(keys.server_secret), curve_clients_dir=str(keys.allowed)
    )
    pub.open()
    pub.close()
    about = [m for m in warnings(caplog) if str(keys.server_secret) in m]
    if warned:
        assert len(about) == 1 and "0644" in about[0] and "chmod 600" in about[0], about
    else:
        assert about == []


def test_a_missing_folder_at_refresh_refuses_everyone(keys, ctx, caplog, tmp_path):
    folder = tmp_path / "clients"
    folder.mkdir()
    shutil.copy(keys.public("a"), folder / "a.key")
    caplog.set_level(logging.WARNING, logger=PUBLISH_LOG)
    with streaming(keys, folder) as (pub, sender):
        a = Client(ctx, keys, "a", pub.endpoint)
        late = None
        try:
            wait_until(lambda: len(a.drain()) >= 5, 30, message="results for a")
            shutil.rmtree(folder)
            assert pub.refresh_clients() is True
            marker = sender.seq
            late = Client(ctx, keys, "a", pub.endpoint)  # a fresh connection with the same key
            wait_until(lambda: sender.seq > marker + 20, 30, message="the publisher keeps sending")
            assert receives_nothing_after(a, marker) == []
            assert receives_nothing_after(late, 0) == []
            assert pub.poll_subscriptions() == 0
        finally:
            a.close()
            if late is not None:
                late.close()
    logged = warnings(caplog)
    assert any(str(folder) in m and "every client is refused" in m for m in logged), logged


def test_a_missing_folder_at_open_is_still_an_error(keys, tmp_path):
    pub = ZmqPublisher(
        free_endpoint(), curve_server_key=str(keys.server_secret), curve_clients_dir=str(tmp_path / "nowhere")
    )
    with pytest.raises(OSError, match="allowed-clients folder not found"):
        pub.open()
    assert pub._auth is None
    assert os.path.isdir(keys.allowed)


def test_a_refused_reload_still_applies_a_revoked_key(keys, ctx):
    """SIGHUP with a config that does not load: the running config stays, but the allowed
    clients are read again all the same (a revocation must not wait for a valid config)."""
    from types import SimpleNamespace

    from edge_agent.core.configload import ConfigError, Problem
    from edge_agent.service.sdnotify import Notifier
    from edge_agent.service.supervisor import Signals, Supervisor

    keys.allow("a", "b")
    with streaming(keys) as (pub, sender):
        a = Client(ctx, keys, "a", pub.endpoint)
        try:
            wait_until(lambda: len(a.drain()) >= 5, 30, message="a receives")

            def broken_config():
                raise ConfigError([Problem("agent.yaml", 3, 1, "source.fps", "must be >= 0")])

            agent = SimpleNamespace(publisher=pub)
            sup = Supervisor(agent, Notifier(None), Signals(), broken_config)
            keys.revoke("a")
            assert sup.reload() is False and sup.refused_reloads == 1
            marker = sender.seq
            assert receives_nothing_after(a, marker) == [], "the revoked client still receives"
        finally:
            a.close()
