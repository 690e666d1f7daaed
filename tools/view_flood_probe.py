"""Issue 30, item 2: the live view under a connection flood and slow-trickle clients.

Starts an agent (synthetic camera, bundled detector, the view on a free loopback port) in
this process, opens ``--flood`` idle connections and ``--trickle`` clients that send one
byte of a request every ``--every`` seconds, then times normal GETs of /api/health and
reports what the view holds (descriptors, threads). Loopback only, bounded in count and time.

    .venv/bin/python tools/view_flood_probe.py [--flood 400] [--trickle 50] [--every 3] [--gets 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import statistics
import threading
import time
import urllib.request

from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig, ViewConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.service.runner import Agent


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flood", type=int, default=400)
    ap.add_argument("--trickle", type=int, default=50)
    ap.add_argument("--every", type=float, default=3.0)
    ap.add_argument("--gets", type=int, default=10)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    port = free_port()
    cfg = AgentConfig(
        publish=PublishConfig(endpoint=f"tcp://127.0.0.1:{free_port()}"),
        metrics=MetricsConfig(enabled=False),
        view=ViewConfig(enabled=True, port=port),
    )
    agent = Agent(cfg)
    agent.build()
    agent.start()
    socks: list[socket.socket] = []
    stop = threading.Event()
    try:
        time.sleep(2)
        base_fds, base_threads = fds(), threading.active_count()
        for _ in range(args.flood):
            with contextlib.suppress(OSError):
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        trick = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(args.trickle)]
        socks += trick
        req = b"GET /api/health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 500

        def trickle() -> None:
            i = 0
            while not stop.wait(args.every):
                for s in trick:
                    with contextlib.suppress(OSError):
                        s.send(req[i : i + 1])
                i += 1

        threading.Thread(target=trickle, daemon=True).start()
        time.sleep(1)
        held_at_once = fds() - base_fds - len(socks)
        threads = threading.active_count() - base_threads - 1  # less the trickle thread
        times = []
        for _ in range(args.gets):
            t0 = time.monotonic()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=30) as r:
                assert r.status == 200
                r.read()
            times.append((time.monotonic() - t0) * 1000)
            time.sleep(0.5)
        print(
            f"flood {len(socks) - len(trick)} + trickle {len(trick)}: the view holds {held_at_once} "
            f"descriptors after them (cap 32), {fds() - base_fds - len(socks)} after the GETs, "
            f"{threads} extra threads; GET /api/health "
            f"median {statistics.median(times):.1f} ms, max {max(times):.1f} ms over {len(times)}"
        )
    finally:
        stop.set()
        for s in socks:
            s.close()
        agent.stop()


if __name__ == "__main__":
    main()
