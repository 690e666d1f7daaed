"""The result stream's limits per subscriber (issue 30, item 1), on real ZeroMQ sockets:
connections over ``publish.max_subscribers`` are closed, newest first; a subscriber past its
byte allowance or sending fastest when the stream holds too many subscriptions is
disconnected; subscribers within the limits keep receiving; a descriptor number reused by
another connection is never shut down."""

from __future__ import annotations

import socket
import time

import pytest
import zmq
from conftest import free_endpoint, wait_until
from zmq.utils.monitor import recv_monitor_message

from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.stream_guard import SubscriberGuard


class Subscriber:
    """A SUB socket and a monitor of its own connection: was it ever disconnected?"""

    def __init__(self, ctx: zmq.Context, endpoint: str, topics: list[bytes], sndhwm: int = 1000) -> None:
        self.sock = ctx.socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.sndhwm = sndhwm
        self.sock.rcvtimeo = 100
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self.connected = self.disconnected = 0
        for t in topics:
            self.sock.subscribe(t)
        self.sock.connect(endpoint)

    def events(self) -> tuple[int, int]:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            self.connected += event == zmq.EVENT_CONNECTED
            self.disconnected += event == zmq.EVENT_DISCONNECTED
        return self.connected, self.disconnected

    def receives(self, pub: ZmqPublisher, topic: bytes) -> bool:
        """Whether a message published now on ``topic`` arrives (tried for a few seconds)."""
        for _ in range(50):
            pub.send(topic, b"{}")
            try:
                if self.sock.recv().startswith(topic):
                    return True
            except zmq.Again:
                continue
        return False

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)


class Subscribers:
    """Every subscriber a test makes, closed with their context at its end."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.made: list[Subscriber] = []

    def __call__(self, endpoint: str, topics: list[bytes], **kw) -> Subscriber:
        s = Subscriber(self.ctx, endpoint, topics, **kw)
        self.made.append(s)
        return s

    def close(self) -> None:
        for s in self.made:
            s.close()
        self.ctx.term()


@pytest.fixture
def subscriber():
    subs = Subscribers()
    yield subs
    subs.close()


def opened(pub: ZmqPublisher):
    pub.open()
    return pub


@pytest.mark.parametrize("transport", ["tcp", "ipc"])
def test_connections_over_the_cap_are_closed_newest_first(subscriber, tmp_path, transport):
    endpoint = free_endpoint() if transport == "tcp" else f"ipc://{tmp_path}/stream"
    pub = opened(ZmqPublisher(endpoint, max_subscribers=3))
    try:
        first = [subscriber(pub.endpoint, [b"det."]) for _ in range(3)]
        wait_until(lambda: pub.guard.connected == 3, 30, message="three subscribers seen")
        late = [subscriber(pub.endpoint, [b"det."]) for _ in range(2)]
        wait_until(lambda: all(s.events()[1] >= 1 for s in late), 30, message="the late ones closed")
        wait_until(lambda: pub.guard.refused >= 2, 30, message="counted")
        assert [s.events()[1] for s in first] == [0, 0, 0]
        assert all(s.receives(pub, b"det.cam0") for s in first)
    finally:
        pub.close()


def test_a_burst_of_subscriptions_disconnects_the_sender_only(subscriber):
    pub = opened(ZmqPublisher(free_endpoint()))
    try:
        quiet = subscriber(pub.endpoint, [b"det.cam0", b"health"])
        wait_until(lambda: pub.guard.connected == 1, 30, message="the quiet subscriber seen")
        topics = [b"flood.%06d" % i for i in range(20_000)]  # about 300 KB of subscriptions
        flood = subscriber(pub.endpoint, topics, sndhwm=0)
        wait_until(lambda: flood.events()[1] >= 1, 30, message="the flooder disconnected")
        wait_until(lambda: pub.guard.dropped_bytes >= 1, 30, message="counted")
        assert pub.subscription_messages < len(topics)  # cut before the agent read them all
        assert quiet.events()[1] == 0
        assert quiet.receives(pub, b"det.cam0")
    finally:
        pub.close()


def test_past_the_total_of_subscriptions_the_fastest_sender_is_disconnected(subscriber):
    pub = ZmqPublisher(free_endpoint())
    # A byte allowance that never trips: only the total applies here.
    pub.guard = SubscriberGuard(max_subscribers=8, burst_bytes=10**9, max_subscriptions=200)
    opened(pub)
    try:
        quiet = subscriber(pub.endpoint, [b"det.cam0"])
        wait_until(lambda: pub.live_topics == 1, 30, message="the quiet subscription read")
        many = subscriber(pub.endpoint, [b"det.x%04d" % i for i in range(300)])
        wait_until(lambda: many.events()[1] >= 1, 30, message="the one over the total disconnected")
        wait_until(lambda: pub.guard.dropped_total >= 1, 30, message="counted")
        assert quiet.events()[1] == 0
        # Its unsubscriptions are read: the count is back to the quiet one's (and the
        # disconnected one's again when it reconnects, up to the total).
        wait_until(lambda: pub.live_topics <= 200, 30, message="back under the total")
        assert quiet.receives(pub, b"det.cam0")
    finally:
        pub.close()


def test_a_descriptor_number_now_naming_another_connection_is_left_alone():
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        guard = SubscriberGuard(max_subscribers=0)  # every connection is over the cap
        guard.bind(f"tcp://127.0.0.1:{port}")
        first = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        guard._scan(now=0.0)
        fd = accepted.fileno()
        assert fd in guard._peers  # found among the process's descriptors
        # The connection ends and its number goes to another one to the same port.
        accepted.close()
        first.close()
        second = socket.create_connection(("127.0.0.1", port))
        other, _ = server.accept()
        try:
            if other.fileno() != fd:
                pytest.skip("the kernel gave the new connection another descriptor number")
            guard._drop(fd, "refused")
            assert guard.refused == 0
            other.sendall(b"still open")
            assert second.recv(16) == b"still open"
        finally:
            other.close()
            second.close()


def test_duplicates_and_unknown_unsubscriptions_move_no_count(subscriber):
    """A topic subscribed many times counts once (libzmq passes up each duplicate, and one
    unsubscription when its subscriber leaves), and unsubscribing a topic nobody holds
    lowers nothing: neither drifts the total the guard judges by."""
    pub = ZmqPublisher(free_endpoint())
    pub.guard = SubscriberGuard(max_subscribers=8, burst_bytes=10**9, max_subscriptions=200)
    opened(pub)
    try:
        quiet = subscriber(pub.endpoint, [b"det.cam0"])
        wait_until(lambda: pub.live_topics == 1, 30, message="the quiet subscription read")
        # An XSUB sends what it is given: a SUB would send a topic's first subscription only.
        dup = subscriber.ctx.socket(zmq.XSUB)
        dup.linger = 0
        dup.connect(pub.endpoint)
        for _ in range(250):
            dup.send(b"\x01x")
        dup.send(b"\x00never-subscribed")
        try:
            wait_until(lambda: pub.subscription_messages >= 251, 30, message="the duplicates read")
            assert pub.live_topics == 2
        finally:
            dup.close()
        wait_until(lambda: pub.live_topics == 1, 30, message="back to the quiet one's")
        time.sleep(0.3)  # three looks of the guard
        assert pub.guard.dropped_total == 0 and quiet.events()[1] == 0
    finally:
        pub.close()
