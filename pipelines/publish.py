"""The result stream's socket: one ZeroMQ PUB message per frame (its body: ``messages.py``).

A message is a single ZeroMQ frame: the topic (``det.<source>``), one space, then the
JSON body. One frame rather than a multipart message so that subscribers may use
CONFLATE (keep only the newest message), which does not support multipart messages.
PUB never blocks: a subscriber that falls ``send_hwm`` messages behind loses messages,
the agent does not wait for it.

The socket is an XPUB, a PUB that also hands the application the subscriptions it
receives: ZeroMQ drops every message sent before a subscriber's subscription arrived,
so for a file (every frame matters) the agent can wait for its subscribers first.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
from typing import Any

import zmq

from edge_agent.core.exposure import on_loopback
from edge_agent.core.publish_config import PublishConfig
from edge_agent.pipelines.curve import AllowedClients, read_client_keys, read_server_key
from edge_agent.pipelines.messages import packer
from edge_agent.pipelines.stream_guard import SubscriberGuard

log = logging.getLogger(__name__)

CLOSE_LINGER_MS = 200  # at most this long to flush queued messages when the socket closes


REBIND_TIMEOUT_S = 5.0  # a rebind waits at most this long for the old listener to let go of the port

# Subscription messages (XPUB hands the application every (un)subscription, and libzmq keeps
# them until read, in memory without a bound) are read by a thread of their own, a batch at
# a time under the socket's lock: send() waits for one batch at most, never for a flood.
DRAIN_BATCH = 256  # messages read under the lock at once (well under a millisecond)
DRAIN_PAUSE_S = 0.001  # between full batches: the flood gets a bounded share of the GIL
DRAIN_IDLE_S = 0.05  # how often an empty queue is looked at again
DRAIN_TRIM_AFTER = 10_000  # after a flood this large, freed memory is given back to the system
# Each subscriber's queue of (un)subscriptions not yet taken in by the socket: when full,
# libzmq stops reading that connection, so a flood waits in the flooder's own memory and
# comes in at the pace of the drain, not all at once into the agent's.
SUBSCRIPTION_HWM = 100
HANDSHAKE_MS = 5000
FLOOD_LOG_INTERVAL_S = 60.0  # at most one warning about a subscription flood in this long
FLOOD_MESSAGES = 100_000  # subscription messages in one interval that count as a flood


class ZmqPublisher:
    """The PUB socket. With CURVE, only clients whose public key is in the allowed folder
    can connect (a ZAP authenticator in the socket's own context asks ``AllowedClients``,
    which holds the keys read at open and at every ``refresh_clients``)."""

    def __init__(
        self,
        endpoint: str,
        send_hwm: int = 100,
        encoding: str = "json",
        curve_server_key: str = "",
        curve_clients_dir: str = "",
        topic: str = "det",
        max_subscribers: int = 32,
    ) -> None:
        self.endpoint = endpoint
        self._results = f"{topic}.".encode()  # results go out as "<topic>.<source>"
        self.send_hwm = send_hwm
        self.max_subscribers = max_subscribers
        self.encoding = encoding
        self.curve_server_key = curve_server_key
        self.curve_clients_dir = curve_clients_dir
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._auth: Any = None
        self._clients: AllowedClients | None = None
        self._server_keys: tuple[bytes, bytes] | None = None  # CURVE (public, secret)
        # Results come from the post thread and heartbeats from the health thread; a
        # ZeroMQ socket must not be used by two threads at once.
        self._lock = threading.Lock()
        # Notified (under the lock) when subscription messages were read: wait_for_subscribers
        # waits on it, with the lock released, rather than polling the socket under the lock.
        self._arrived = threading.Condition(self._lock)
        self._refresh_lock = threading.Lock()  # one refresh at a time (reading the folder)
        self.sent = 0
        self.error: str | None = None  # the stream is down for good (a rebind failed)
        self.subscriptions = 0  # to results (not heartbeats only): subscribed minus unsubscribed
        self.subscription_messages = 0  # every (un)subscription read, any topic
        # The distinct topics subscribed, any subscriber (what libzmq holds, in kind): a
        # set, not a count of messages, so a topic subscribed twice counts once (libzmq passes
        # up each duplicate, but one unsubscription when its subscriber leaves) and an
        # unsubscription of a topic nobody has is nothing. Needs XPUB_VERBOSER, which passes
        # up the unsubscriptions of a subscriber that left; None: not kept.
        self._topics: set[bytes] | None = set()
        self.guard = SubscriberGuard(max_subscribers)  # drain thread's only
        self._drainer: threading.Thread | None = None
        self._drain_stop = threading.Event()
        self._flood_window = (0.0, 0)  # (its start, subscription_messages then)
        self._flood_logged = float("-inf")
        self._pack = packer(encoding)

    @classmethod
    def from_config(cls, pub: PublishConfig) -> ZmqPublisher:
        """The stream as the ``publish`` section says (the section whole: a key is read here)."""
        return cls(
            pub.endpoint,
            pub.send_hwm,
            pub.encoding,
            pub.curve_server_key,
            pub.curve_clients_dir,
            pub.topic,
            max_subscribers=pub.max_subscribers,
        )

    def encode(self, message: dict[str, Any]) -> bytes:
        return self._pack(message)

    def open(self) -> None:
        self._ctx = zmq.Context()
        sock: zmq.Socket | None = None
        try:
            if self.curve_server_key:
                self._curve()
            elif not on_loopback(self.endpoint):
                log.warning(
                    "result stream on %s without CURVE: anyone who can reach it reads it "
                    "(set publish.curve_server_key and curve_clients_dir)",
                    self.endpoint,
                )
            sock = self._socket()
            sock.bind(self.endpoint)
        except (zmq.ZMQError, OSError, ValueError) as e:
            if sock is not None:
                sock.close()
            self._stop_auth()
            self._ctx.term()
            self._ctx = None
            # A bind error is about the endpoint: name the setting, so the user knows what
            # to change (a CURVE key problem says its own file instead).
            hint = bind_hint(e) if sock is not None else ""
            raise OSError(f"cannot bind result stream to {self.endpoint}: {e}{hint}") from None
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT) or self.endpoint
        self._sock = sock
        self.guard.bind(self.endpoint)
        self._drain_stop.clear()
        self._drainer = threading.Thread(target=self._drain_loop, name="xpub-subscriptions", daemon=True)
        self._drainer.start()

    def _socket(self) -> zmq.Socket:
        """A new XPUB, not bound yet (for open and for a rebind)."""
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.XPUB)
        # All of these only apply to later binds, so they are set first.
        sock.sndhwm = self.send_hwm
        sock.rcvhwm = SUBSCRIPTION_HWM  # an XPUB receives only (un)subscriptions
        sock.linger = 0
        # A connection that never completes its handshake gives its place back this soon
        # (libzmq's default is 30 s): idle ones cannot hold publish.max_subscribers for long.
        sock.handshake_ivl = HANDSHAKE_MS
        # Every subscriber's subscriptions and unsubscriptions (a disconnect included), not
        # only a topic's first and last: wait_for_subscribers counts them.
        try:
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)
        except (AttributeError, zmq.ZMQError):  # libzmq < 4.3: no unsubscriptions counted
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)
            self._topics = None
        if self._server_keys is not None:
            sock.curve_publickey, sock.curve_secretkey = self._server_keys
            sock.curve_server = True
        return sock

    def _curve(self) -> None:
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = read_server_key(self.curve_server_key)  # bounded, each key checked
        mode = stat.S_IMODE(os.stat(self.curve_server_key).st_mode)
        if mode & 0o077:
            log.warning(
                "CURVE: the server's secret key %s has mode %04o: users other than its owner "
                "can read it (chmod 600 %s)",
                self.curve_server_key,
                mode,
                self.curve_server_key,
            )
        if not os.path.isdir(self.curve_clients_dir):
            raise ValueError(f"allowed-clients folder not found: {self.curve_clients_dir}")
        keys, problem = read_client_keys(self.curve_clients_dir)
        if problem:
            raise ValueError(problem)
        self._server_keys = (public, secret)
        self._clients = AllowedClients(self.curve_clients_dir)
        self._auth = ThreadAuthenticator(self._ctx)
        self._auth.start()
        # Our own provider rather than configure_curve(location=...): pyzmq's folder load
        # gives up on the first bad file and then keeps the previous list (see refresh_clients).
        self._auth.configure_curve_callback(domain="*", credentials_provider=self._clients)
        self._apply_clients(self._clients, keys)

    def refresh_clients(self) -> bool:
        """Re-read the allowed-clients folder and apply it at once; returns whether keys were
        removed (the stream was then rebound, see below).

        Each ``*.key`` file is read on its own. A file that is not a valid public certificate
        is named in a warning and skipped, and the others still apply: refusing the whole
        reload instead would keep the old list, and so keep a revoked client in, which is
        the worse failure. An empty list (also a folder that is gone or unreadable now)
        refuses every client, with a warning: it fails closed.

        ZeroMQ asks the authenticator only at a connection's handshake, so a client already
        connected would keep receiving after its key was removed. When keys were removed the
        socket is therefore closed and bound again on the same endpoint: every client
        connects again (ZeroMQ clients reconnect by themselves within 100 ms) and is checked
        against the new list; the results published meanwhile are lost to them (a gap in
        seq), and ``subscriptions`` counts again from 0 as their subscriptions come back.
        """
        clients = self._clients
        if clients is None:  # no CURVE, or not open
            return False
        with self._refresh_lock:
            # A folder that is gone or unreadable now gives an empty list, not the old one.
            keys, problem = read_client_keys(self.curve_clients_dir)
            return self._apply_clients(clients, keys, problem)

    def _apply_clients(self, clients: AllowedClients, keys: frozenset[bytes], problem: str = "") -> bool:
        before = clients.allowed
        # One reference swap (atomic under the GIL): the authenticator thread sees either the
        # old set or the new one, and the next handshake is checked against the new one.
        clients.allowed = keys
        removed = before - keys
        if not keys:
            log.warning(
                "CURVE: no allowed client keys (%s): every client is refused",
                problem or f"no valid .key file in {self.curve_clients_dir}",
            )
        else:
            log.info(
                "CURVE: %d allowed client key(s) in %s (%d added, %d removed)",
                len(keys),
                self.curve_clients_dir,
                len(keys - before),
                len(removed),
            )
        if removed:
            with self._lock:
                if self._sock is not None:  # not at open (not bound yet) nor after close
                    self._rebind()
                    log.warning(
                        "CURVE: %d client key(s) removed: the result stream on %s was rebound "
                        "to drop revoked clients (allowed ones reconnect)",
                        len(removed),
                        self.endpoint,
                    )
        return bool(removed)

    def _rebind(self) -> None:
        """Close the socket (every connection with it) and bind a new one; under the lock."""
        assert self._sock is not None
        self._sock.close(linger=0)  # nothing more for anyone on the old connections
        self._sock = None
        self.subscriptions = 0
        if self._topics is not None:
            self._topics.clear()
        sock = self._socket()
        # The old listener is closed by ZeroMQ's I/O thread, a moment after close().
        deadline = time.monotonic() + REBIND_TIMEOUT_S
        while True:
            try:
                sock.bind(self.endpoint)
                break
            except zmq.ZMQError as e:
                if e.errno != zmq.EADDRINUSE or time.monotonic() >= deadline:
                    sock.close()
                    # Nothing is published from here on: the watchdog must not be fed.
                    self.error = f"the result stream could not be bound again to {self.endpoint}: {e}"
                    log.error("CURVE: %s", self.error)
                    raise OSError(f"cannot bind result stream to {self.endpoint} again: {e}") from None
                time.sleep(0.01)
        self._sock = sock

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        self._clients = None

    def wait_for_subscribers(
        self, count: int, timeout_s: float, interrupt: threading.Event | None = None
    ) -> int:
        """Wait until ``count`` subscriptions to results have arrived, ``timeout_s`` passed
        or ``interrupt`` is set; returns how many arrived. A subscriber that was waiting for
        the agent connects within ZeroMQ's reconnect interval (100 ms), so its subscription
        is here well inside a second. A client that CURVE refuses never subscribes."""
        deadline = time.monotonic() + timeout_s
        with self._arrived:
            while True:
                if self._sock is None:
                    return self.subscriptions
                self._drain(DRAIN_BATCH)  # one batch, as the heartbeat does
                left_s = deadline - time.monotonic()
                if self.subscriptions >= count or left_s <= 0:
                    return self.subscriptions
                if interrupt is not None and interrupt.is_set():
                    return self.subscriptions
                # The drain thread reads the rest and wakes us; waiting releases the lock, so
                # send() and the drain never wait for this. Short slices: ``interrupt`` is polled.
                self._arrived.wait(min(left_s, DRAIN_IDLE_S))

    def poll_subscriptions(self) -> int:
        """The current count of subscriptions to results. The heartbeat calls this: it reads
        one batch at most (the drain thread reads the rest), so a flood never delays a beat."""
        with self._lock:
            if self._sock is not None:
                self._drain(DRAIN_BATCH)
            return self.subscriptions

    def _drain(self, limit: int) -> int:
        """Read at most ``limit`` subscription messages; under the lock. Returns how many."""
        assert self._sock is not None
        n = 0
        while n < limit:
            try:
                msg = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            if self._topics is not None:
                if msg[:1] == b"\x01":
                    self._topics.add(msg[1:])
                elif msg[:1] == b"\x00":
                    self._topics.discard(msg[1:])
            prefix = msg[1:]
            # A subscription to "", "d", "det" or "det.cam0" receives results; "health" not.
            if not (self._results.startswith(prefix) or prefix.startswith(self._results)):
                continue
            if msg[:1] == b"\x01":
                self.subscriptions += 1
            elif msg[:1] == b"\x00":
                self.subscriptions = max(0, self.subscriptions - 1)
        self.subscription_messages += n
        if n:
            self._arrived.notify_all()
        return n

    def _drain_loop(self) -> None:
        """The drain thread: full batches back to back (a pause between, the lock released),
        an idle wait when the queue is empty."""
        since_trim = 0
        guard_failed = False
        while not self._drain_stop.is_set():
            self._log_flood()
            with self._lock:
                n = self._drain(DRAIN_BATCH) if self._sock is not None else 0
            # Outside the lock: send() never waits for a look at the connections.
            try:
                self.guard.check(self.live_topics)
            except Exception:  # the drain goes on without the guard rather than stop
                if not guard_failed:
                    log.exception("result stream: the subscriber guard failed (subscriptions still read)")
                guard_failed = True
            since_trim += n
            if n == DRAIN_BATCH:
                time.sleep(DRAIN_PAUSE_S)
                continue
            if since_trim >= DRAIN_TRIM_AFTER:
                # libzmq freed a flood's (un)subscriptions, but the C heap keeps the pages
                # unless asked: without this the agent's RSS stays at its peak for good.
                _trim_heap()
                since_trim = 0
            self._drain_stop.wait(DRAIN_IDLE_S)

    def _log_flood(self) -> None:
        now = time.monotonic()
        start, count = self._flood_window
        if now - start < FLOOD_LOG_INTERVAL_S:
            if (
                self.subscription_messages - count >= FLOOD_MESSAGES
                and now - self._flood_logged >= FLOOD_LOG_INTERVAL_S
            ):
                self._flood_logged = now
                log.warning(
                    "result stream on %s: %d subscription messages in %.0f s, a subscriber "
                    "floods it (read at a bounded pace; results and heartbeats go on)",
                    self.endpoint,
                    self.subscription_messages - count,
                    now - start,
                )
            return
        self._flood_window = (now, self.subscription_messages)

    @property
    def live_topics(self) -> int:
        """The distinct topics subscribed now (0 when not kept)."""
        topics = self._topics
        return len(topics) if topics is not None else 0

    def send(self, topic: bytes, body: bytes) -> None:
        with self._lock:
            if self._sock is None:
                # Closed for a rebind or the stop: the message is dropped, not an error.
                log.debug("result stream closed: message on %s dropped", topic[:40])
                return
            self._sock.send(topic + b" " + body, zmq.NOBLOCK)
            self.sent += 1

    def start(self) -> None:
        self.open()

    def stop(self, timeout_s: float = CLOSE_LINGER_MS / 1000) -> bool:
        """Close within ``timeout_s``; True if the drain thread ended in it."""
        return self.close(timeout_s)

    def close(self, timeout_s: float = CLOSE_LINGER_MS / 1000) -> bool:
        deadline = time.monotonic() + timeout_s
        self._drain_stop.set()
        drainer, self._drainer = self._drainer, None
        if drainer is not None:
            drainer.join(timeout_s)  # it holds the lock for one batch at most
        ended = drainer is None or not drainer.is_alive()
        with self._lock:
            if self._sock is not None:
                # The last results and the final heartbeat may still be queued for the
                # network: a linger bounded by what is left of the timeout sends them.
                left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
                self._sock.close(linger=min(CLOSE_LINGER_MS, left_ms))
                self._sock = None
        self._stop_auth()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        return ended


def _trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc); nothing elsewhere."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def bind_hint(e: BaseException) -> str:
    """What to do about a failed bind, naming the setting: ZeroMQ says only what failed
    ("Address already in use"), not which part of the config chose the address."""
    if getattr(e, "errno", None) == zmq.EADDRINUSE:
        return (
            ": another process holds the port, most likely another edge-agent already running; "
            "stop it, or set publish.endpoint (or EDGE_AGENT__PUBLISH__ENDPOINT) to a free port"
        )
    return " (the address is publish.endpoint, or EDGE_AGENT__PUBLISH__ENDPOINT)"
