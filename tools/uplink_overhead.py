"""Does the uplink cost the frame path anything? The agent's end-to-end latency and its
overhead (end to end minus capture and inference) with no uplink, and with an uplink
attached (``forward: all``) whose broker is down, so it spools every result to disk.

    .venv/bin/python tools/uplink_overhead.py --model yolov8n-busy-640.onnx --rounds 3 --seconds 20

Runs ``edge-agent run`` for ``--seconds`` per round and mode, the two modes interleaved
(ABAB...) so that a change of the host's speed hits both alike; the latencies are the
agent's own (each result's ``latency_ms``), read by a ZeroMQ subscriber that runs in both
modes. Prints p50/p99 per mode over all rounds, and what the uplink spooled.
"""

from __future__ import annotations

import argparse
import json
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from edge_agent.client import decode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(folder: Path, args: argparse.Namespace) -> Path:
    cfg = {
        "device_id": "bench",
        "source": {"type": "synthetic", "fps": args.fps},
        "model": {"path": args.model} if args.model else {},
        "publish": {"endpoint": f"tcp://127.0.0.1:{free_port()}"},
        "metrics": {"enabled": False},
        "deadline": {"budget_ms": args.budget_ms},
        "uplink": {
            "broker": f"mqtt://127.0.0.1:{free_port()}",  # nothing listens: the broker is down
            "forward": "all",
            "spool_path": str(folder / "spool.sqlite"),
            "metrics": {"enabled": False},
        },
    }
    path = folder / "agent.yaml"
    path.write_text(json.dumps(cfg))
    return path


def collect(endpoint: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.subscribe(b"det")
    sock.rcvtimeo = 200
    sock.connect(endpoint)
    while not stop.is_set():
        try:
            _, body = decode(sock.recv())
        except zmq.Again:
            continue
        lat = body["latency_ms"]
        out.append((lat["total"], lat["total"] - lat["capture"] - lat["infer"]))
    sock.close(linger=0)


def one_run(cfg: Path, seconds: float, with_uplink: bool) -> list[tuple[float, float]]:
    endpoint = json.loads(cfg.read_text())["publish"]["endpoint"]
    exe = [sys.executable, "-m", "edge_agent"]
    uplink = None
    if with_uplink:
        uplink = subprocess.Popen([*exe, "uplink", "--config", str(cfg)], stderr=subprocess.DEVNULL)
    stop, samples = threading.Event(), []
    reader = threading.Thread(target=collect, args=(endpoint, stop, samples))
    reader.start()
    try:
        agent = subprocess.run(
            [*exe, "run", "--config", str(cfg), "--duration", str(seconds), "--quiet"],
            capture_output=True,
            text=True,
            timeout=seconds + 120,
        )
        if agent.returncode != 0:
            raise SystemExit(f"the agent failed: {agent.stderr[-2000:]}")
    finally:
        stop.set()
        reader.join()
        if uplink is not None:
            uplink.terminate()
            uplink.wait(30)
    return samples[len(samples) // 10 :]  # the warm-up's first tenth left out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="", help="ONNX model (default: the bundled detector)")
    p.add_argument("--fps", type=float, default=30.0)
    p.add_argument("--budget-ms", type=float, default=50.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="uplink-overhead-"))
    cfg = write_config(folder, args)
    runs: dict[str, list[tuple[float, float]]] = {"agent alone": [], "uplink, broker down": []}
    for r in range(args.rounds):
        for name, with_uplink in (("agent alone", False), ("uplink, broker down", True)):
            t0 = time.monotonic()
            got = one_run(cfg, args.seconds, with_uplink)
            runs[name] += got
            print(
                f"round {r + 1} {name:<20} {len(got):5d} results ({time.monotonic() - t0:.0f} s)", flush=True
            )
    print(
        f"\nmodel: {args.model or 'bundled'}; source {args.fps:g} fps; "
        f"{args.rounds} x {args.seconds:g} s per mode"
    )
    print(f"{'mode':<22}{'results':>8}{'e2e p50':>10}{'e2e p99':>10}{'ovh p50':>10}{'ovh p99':>10}  (ms)")
    for name, samples in runs.items():
        a = np.array(samples)
        e2e, ovh = np.percentile(a[:, 0], [50, 99]), np.percentile(a[:, 1], [50, 99])
        print(f"{name:<22}{len(a):>8}{e2e[0]:>10.2f}{e2e[1]:>10.2f}{ovh[0]:>10.2f}{ovh[1]:>10.2f}")
    with sqlite3.connect(folder / "spool.sqlite") as db:
        (n,) = db.execute("SELECT COUNT(*) FROM messages").fetchone()
    print(f"\nthe uplink's spool holds {n} results (the broker was down throughout): {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
