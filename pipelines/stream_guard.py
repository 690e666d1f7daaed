"""What one subscriber of the result stream may cost the agent, and the disconnect past it.

libzmq keeps every distinct topic a connected subscriber sends, for as long as it stays
connected, and has no option to cap that per peer, nor a call to drop one peer: a local
process could make the agent hold any amount of memory with subscriptions alone. The
guard finds the stream's connections among the process's own sockets (a connected socket
whose local address is the stream's), reads how many bytes each has sent (the kernel's
``TCP_INFO``; a subscriber sends nothing but its handshake and its (un)subscriptions)
and shuts down the connection of one past its allowance. libzmq sees the connection end
and frees that subscriber's subscriptions, as for any disconnect.

The rules, each checked every ``CHECK_INTERVAL_S``:

- at most ``max_subscribers`` connections: past it the newest ones are closed;
- a subscriber may send ``BURST_BYTES`` plus ``BYTES_PER_S`` for each second connected
  (its handshake, thousands of topics, ZeroMQ heartbeats down to 0.2 s apart); past it
  it is disconnected. The kernel counts bytes as they arrive, before libzmq reads them at
  the drain's pace, so a burst is cut before the agent holds it;
- at most ``MAX_SUBSCRIPTIONS`` distinct topics subscribed in all (the drain keeps them):
  past it the subscriber sending fastest is disconnected, which bounds a slow flood too.

A disconnected subscriber may connect again (ZeroMQ clients do by themselves): a flooder
is then cut again, at the same bounded cost. Shutting a connection down (not closing its
descriptor, which libzmq owns) cannot touch another file, even if the number was reused.
"""

from __future__ import annotations

import logging
import os
import socket
import stat
import struct
import time
from dataclasses import dataclass

log = logging.getLogger(__name__)

CHECK_INTERVAL_S = 0.1
BURST_BYTES = 64 * 1024
BYTES_PER_S = 256  # a CURVE client's ZeroMQ heartbeats every 0.5 s take about 85
MAX_SUBSCRIPTIONS = 10_000
SLOW_FLOOD_PAUSE_S = 1.0  # after a drop for the total: its unsubscriptions are read first
LOG_INTERVAL_S = 60.0  # at most one warning per kind in this long

_TCPI_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received (u64) in struct tcp_info (Linux 4.1+)


@dataclass
class _Peer:
    first_seen: float
    peer: object  # getpeername(): tells a reused descriptor number from the same connection
    received: int = 0  # bytes, from TCP_INFO; -1 when the kernel does not say


class SubscriberGuard:
    """Owned by the publisher's drain thread; ``check`` is called from it only."""

    def __init__(
        self,
        max_subscribers: int,
        burst_bytes: int = BURST_BYTES,
        bytes_per_s: float = BYTES_PER_S,
        max_subscriptions: int = MAX_SUBSCRIPTIONS,
    ) -> None:
        self.max_subscribers = max_subscribers
        self.burst_bytes = burst_bytes
        self.bytes_per_s = bytes_per_s
        self.max_subscriptions = max_subscriptions
        self._local: object = None  # the stream's local address, as getsockname() gives it
        self._port = 0  # its port for TCP (0: a Unix socket, compared whole)
        self._peers: dict[int, _Peer] = {}  # descriptor -> connection (inode checked too)
        self._inodes: dict[int, int] = {}  # descriptor -> inode last seen there
        self._next = 0.0
        self._pause_until = 0.0
        self.refused = 0  # connections over max_subscribers
        self.dropped_bytes = 0  # subscribers past their byte allowance
        self.dropped_total = 0  # subscribers dropped for the total of subscriptions
        self._logged: dict[str, float] = {}

    @property
    def connected(self) -> int:
        return len(self._peers)

    def bind(self, endpoint: str) -> None:
        """The stream's bound endpoint (``LAST_ENDPOINT``): which sockets are its connections."""
        self._peers.clear()
        self._inodes.clear()
        if endpoint.startswith("tcp://"):
            self._port = int(endpoint.rsplit(":", 1)[1])
            self._local = None
        elif endpoint.startswith("ipc://"):
            self._port = 0
            self._local = endpoint[len("ipc://") :]
        else:  # inproc and others: no descriptors to look at
            self._port = -1

    def check(self, live_topics: int, now: float | None = None) -> None:
        """Look at the connections (at most every CHECK_INTERVAL_S) and drop what is over."""
        now = time.monotonic() if now is None else now
        if now < self._next or self._port < 0:
            return
        self._next = now + CHECK_INTERVAL_S
        self._scan(now)
        over = len(self._peers) - self.max_subscribers
        if over > 0:
            newest = sorted(self._peers, key=lambda fd: self._peers[fd].first_seen)[-over:]
            for fd in newest:
                self._drop(fd, "refused")
        for fd, p in list(self._peers.items()):
            allowed = self.burst_bytes + self.bytes_per_s * (now - p.first_seen)
            if p.received > allowed:
                self._drop(fd, "dropped_bytes")
        counted = [fd for fd, p in self._peers.items() if p.received >= 0]
        if live_topics > self.max_subscriptions and now >= self._pause_until and counted:
            fastest = max(counted, key=lambda fd: self._rate(self._peers[fd], now))
            self._drop(fastest, "dropped_total")
            self._pause_until = now + SLOW_FLOOD_PAUSE_S

    def _rate(self, p: _Peer, now: float) -> float:
        return p.received / max(now - p.first_seen, CHECK_INTERVAL_S)

    def _scan(self, now: float) -> None:
        """Find the stream's connections among the process's descriptors; read their bytes."""
        try:
            fds = [int(n) for n in os.listdir("/proc/self/fd")]
        except OSError:  # no /proc: nothing to go by
            return
        present: dict[int, int] = {}
        for fd in fds:
            try:
                st = os.fstat(fd)
            except OSError:  # closed meanwhile (listdir's own descriptor too)
                continue
            if not stat.S_ISSOCK(st.st_mode):
                continue
            present[fd] = st.st_ino
            if self._inodes.get(fd) == st.st_ino and fd not in self._peers:
                continue  # a socket seen before that is not one of the stream's
            self._look(fd, now, known=self._inodes.get(fd) == st.st_ino)
        for fd in set(self._peers) - set(present):
            del self._peers[fd]
        self._inodes = present

    def _look(self, fd: int, now: float, known: bool) -> None:
        """Whether ``fd`` is a connection of the stream; if so record it and its bytes."""
        sock = _borrow(fd)
        if sock is None:
            self._peers.pop(fd, None)
            return
        with sock:
            try:
                if not known and not self._ours(sock):
                    self._peers.pop(fd, None)
                    return
                peer = sock.getpeername()
            except OSError:  # a listener, or not connected (any more)
                self._peers.pop(fd, None)
                return
            p = self._peers.get(fd)
            if p is None or p.peer != peer:
                # A Unix socket's bytes are not counted by the kernel: -1, never "fastest".
                p = self._peers[fd] = _Peer(first_seen=now, peer=peer, received=0 if self._port else -1)
            if self._port:
                p.received = _bytes_received(sock)

    def _ours(self, sock: socket.socket) -> bool:
        if self._port:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                return False
            return sock.getsockname()[1] == self._port
        return sock.family == socket.AF_UNIX and sock.getsockname() == self._local

    def _drop(self, fd: int, kind: str) -> None:
        p = self._peers.pop(fd, None)
        if p is None:
            return
        sock = _borrow(fd)
        if sock is None:
            return
        with sock:
            try:
                if sock.getpeername() != p.peer:
                    return  # the number now names another connection: leave it
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                return
        setattr(self, kind, getattr(self, kind) + 1)
        self._warn(kind, p)

    def _warn(self, kind: str, p: _Peer) -> None:
        now = time.monotonic()
        if now - self._logged.get(kind, float("-inf")) < LOG_INTERVAL_S:
            return
        self._logged[kind] = now
        why = {
            "refused": f"over publish.max_subscribers ({self.max_subscribers} connections)",
            "dropped_bytes": f"it sent {p.received} bytes of subscriptions in "
            f"{now - p.first_seen:.1f} s (allowed: {self.burst_bytes} + {self.bytes_per_s:g}/s)",
            "dropped_total": f"the stream held over {self.max_subscriptions} subscriptions "
            "and it sent them fastest",
        }[kind]
        log.warning(
            "result stream: disconnected subscriber %s: %s (%d so far; at most one such "
            "warning a minute)",
            _address(p.peer),
            why,
            getattr(self, kind),
        )


def _borrow(fd: int) -> socket.socket | None:
    """A socket object on a duplicate of ``fd``: closing it leaves ``fd`` (libzmq's) open."""
    try:
        dup = os.dup(fd)
    except OSError:
        return None
    try:
        return socket.socket(fileno=dup)
    except OSError:  # not a socket (any more)
        os.close(dup)
        return None


def _bytes_received(sock: socket.socket) -> int:
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 192)
    except (OSError, AttributeError):
        return -1
    if len(info) < _TCPI_BYTES_RECEIVED + 8:
        return -1  # a kernel older than 4.1
    return int(struct.unpack_from("=Q", info, _TCPI_BYTES_RECEIVED)[0])


def _address(peer: object) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer) or "(unix socket)"
