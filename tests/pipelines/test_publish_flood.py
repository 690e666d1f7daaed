"""A subscription flood on the result stream (issue 30, item 1): one local SUB that
subscribes to many distinct topics, in a process of its own, against the real publisher.
The flooder is disconnected after a bounded share of its subscriptions was read, results
and heartbeats go on meanwhile (send() and the heartbeat's poll never wait for the flood),
and the memory the flood took is given back."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from conftest import end_process, free_endpoint, wait_until

from edge_agent.pipelines.publish import ZmqPublisher

TOPICS = 600_000  # subscriptions to results ("det.*"), so the publisher counts every one
# The most of them the agent may read before it cuts the flooder: its byte allowance (64 KiB,
# about 4,000 subscriptions) and what the drain reads until the next look (0.1 s), with room.
READ_AT_MOST = 60_000
STALL_S = 1.0  # the longest send() or heartbeat poll may wait: the heartbeat interval
RSS_BACK_MB = 20.0  # the process's RSS after the flood left, above its level before

FLOOD = """
import sys, zmq
ctx = zmq.Context()
sub = ctx.socket(zmq.SUB)
sub.linger = 0
sub.sndhwm = 0  # no limit: with the default, libzmq itself drops a flood's excess
sub.connect(sys.argv[1])
for i in range(int(sys.argv[2])):
    sub.setsockopt(zmq.SUBSCRIBE, b"det.flood%08d" % i)
print("subscribed", flush=True)
sys.stdin.readline()  # until the test says so: then the disconnect unsubscribes them all
sub.close()
ctx.term()
"""


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


class Timed:
    """Calls ``fn`` every ``every_s`` on a thread; ``longest`` is the longest call."""

    def __init__(self, fn, every_s: float) -> None:
        self.fn, self.every_s = fn, every_s
        self.longest = 0.0
        self.peak = 0  # the largest value ``fn`` returned
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            t0 = time.monotonic()
            value = self.fn()
            self.longest = max(self.longest, time.monotonic() - t0)
            self.peak = max(self.peak, value or 0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)


def test_a_subscription_flood_is_cut_short_stalls_nothing_and_memory_comes_back():
    pub = ZmqPublisher(free_endpoint())
    pub.open()
    flood = sender = beat = None
    try:
        rss_before = rss_mb()
        sender = Timed(lambda: pub.send(b"det.cam0", b'{"seq":1}'), 0.005)  # the frame path
        beat = Timed(pub.poll_subscriptions, 0.1)  # the heartbeat thread
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, pub.endpoint, str(TOPICS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert flood.stdout.readline().strip() == "subscribed"
        wait_until(lambda: pub.guard.dropped_bytes >= 1, 60, message="the flooder disconnected")
        # Its subscriptions go with it (libzmq passes up an unsubscription for each).
        wait_until(lambda: pub.poll_subscriptions() == 0, 60, message="the flood's unsubscriptions read")
        assert 0 < pub.subscription_messages <= 2 * READ_AT_MOST, pub.subscription_messages
        flood.stdin.write("\n")
        flood.stdin.flush()
        assert flood.wait(60) == 0
        assert sender.longest < STALL_S, f"a send() waited {sender.longest:.2f} s for the flood"
        assert beat.longest < STALL_S, f"a heartbeat poll took {beat.longest:.2f} s"
        # The freed memory goes back to the system once the drain has caught up.
        wait_until(lambda: rss_mb() - rss_before < RSS_BACK_MB, 30, message="RSS back near its level before")
    finally:
        for t in (sender, beat):
            if t is not None:
                t.close()
        if flood is not None:
            end_process(flood)
        pub.close()
