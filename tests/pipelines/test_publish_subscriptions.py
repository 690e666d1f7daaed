"""Waiting for the stream's subscribers (issue 30 review, item 7): ``wait_for_subscribers``
must not hold the socket's lock while it waits, or every send() (the frame path) and the
drain thread wait behind it; and it still counts a subscriber that arrives meanwhile."""

from __future__ import annotations

import threading
import time

import zmq
from conftest import free_endpoint

from edge_agent.pipelines.publish import ZmqPublisher

SAMPLES = 40  # looks at the lock during one wait
SAMPLE_EVERY_S = 0.01


def _waiter(pub: ZmqPublisher, count: int, timeout_s: float, interrupt: threading.Event | None = None):
    got: list[int] = []
    thread = threading.Thread(
        target=lambda: got.append(pub.wait_for_subscribers(count, timeout_s, interrupt)), daemon=True
    )
    thread.start()
    return thread, got


def test_waiting_for_subscribers_leaves_the_socket_lock_free():
    pub = ZmqPublisher(free_endpoint())
    pub.open()
    stop = threading.Event()
    thread = None
    try:
        thread, got = _waiter(pub, 1, 30.0, stop)  # nobody subscribes: it waits until stopped
        time.sleep(0.1)  # the waiter thread is in its wait (a few looks more or less change nothing)
        free = 0
        for _ in range(SAMPLES):
            # The lock send() takes (private, but it is what the frame path waits on): a
            # wait that holds it across a blocking poll leaves it free almost never.
            if pub._lock.acquire(blocking=False):
                pub._lock.release()
                free += 1
            time.sleep(SAMPLE_EVERY_S)
        assert free >= SAMPLES // 2, f"the lock was free in only {free} of {SAMPLES} looks during the wait"
        pub.send(b"det.cam0", b"{}")  # and the frame path goes on meanwhile
        assert thread.is_alive() and not got
    finally:
        stop.set()
        if thread is not None:
            thread.join(10)
        pub.close()
    assert got == [0]


def test_a_subscriber_that_arrives_during_the_wait_is_counted():
    pub = ZmqPublisher(free_endpoint())
    pub.open()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.linger = 0
    thread = None
    try:
        thread, got = _waiter(pub, 1, 30.0)
        sub.connect(pub.endpoint)
        sub.setsockopt(zmq.SUBSCRIBE, b"det.")
        thread.join(30)
        assert got == [1]
        # What is sent once it returns reaches the subscriber.
        pub.send(b"det.cam0", b"{}")
        assert sub.poll(10_000), "the subscriber got nothing"
        assert sub.recv() == b"det.cam0 {}"
    finally:
        sub.close()
        ctx.term()
        if thread is not None and thread.is_alive():
            pub.close()
            thread.join(10)
        pub.close()
