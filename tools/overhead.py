"""What do the uplink and the live view cost the frame path? The agent's end-to-end latency
and its overhead (end to end minus capture and inference), in modes run side by side:

- ``--compare uplink``: no uplink; an uplink attached (``forward: all``) whose broker is
  down, so it spools every result to disk;
- ``--compare view``: the live view off; on with no client; on with 3 clients watching
  its MJPEG stream.

    .venv/bin/python tools/overhead.py --compare uplink --model yolov8n-busy-640.onnx --rounds 3

Runs ``edge-agent run`` for ``--seconds`` per round and mode, the modes interleaved
(ABAB...) so that a change of the host's speed hits all alike; the latencies are the
agent's own (each result's ``latency_ms``), read by a ZeroMQ subscriber that runs in every
mode. Prints p50/p99 per mode over all rounds.
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
import urllib.request
from pathlib import Path

import numpy as np

from edge_agent.client import Subscriber


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_config(folder: Path, args: argparse.Namespace, view: bool = False) -> Path:
    cfg = {
        "device_id": "bench",
        "source": {"type": "synthetic", "fps": args.fps},
        "model": {"path": args.model} if args.model else {},
        "publish": {"endpoint": f"tcp://127.0.0.1:{free_port()}"},
        "metrics": {"enabled": False},
        "deadline": {"budget_ms": args.budget_ms},
        "view": {"enabled": view, "port": args.view_port},
        "uplink": {
            "broker": f"mqtt://127.0.0.1:{free_port()}",  # nothing listens: the broker is down
            "forward": "all",
            "spool_path": str(folder / "spool.sqlite"),
            "metrics": {"enabled": False},
        },
    }
    path = folder / ("view.yaml" if view else "agent.yaml")
    path.write_text(json.dumps(cfg))
    return path


def collect(endpoint: str, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    with Subscriber(endpoint, ("det",), timeout_s=0.2) as sub:
        while not stop.is_set():
            got = sub.recv()
            if got is None:
                continue
            lat = got[1]["latency_ms"]
            out.append((lat["total"], lat["total"] - lat["capture"] - lat["infer"]))


def watch(port: int, stop: threading.Event) -> None:
    """A viewer: reads the MJPEG stream until ``stop`` (reconnecting while the agent starts)."""
    while not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stream/cam0.mjpg", timeout=5) as r:
                while not stop.is_set() and r.read(65536):
                    pass
        except OSError:
            stop.wait(0.2)


def one_run(cfg: Path, seconds: float, with_uplink: bool, viewers: int = 0) -> list[tuple[float, float]]:
    settings = json.loads(cfg.read_text())
    endpoint = settings["publish"]["endpoint"]
    exe = [sys.executable, "-m", "edge_agent"]
    uplink = None
    if with_uplink:
        uplink = subprocess.Popen([*exe, "uplink", "--config", str(cfg)], stderr=subprocess.DEVNULL)
    stop, samples = threading.Event(), []
    reader = threading.Thread(target=collect, args=(endpoint, stop, samples))
    reader.start()
    watchers = [
        threading.Thread(target=watch, args=(settings["view"]["port"], stop), daemon=True)
        for _ in range(viewers)
    ]
    for w in watchers:
        w.start()
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
    p.add_argument("--compare", choices=("uplink", "view"), default="uplink")
    p.add_argument("--view-port", type=int, default=8090)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="overhead-"))
    plain, viewed = write_config(folder, args), write_config(folder, args, view=True)
    modes = {  # name: (config, uplink attached, viewers)
        "uplink": {"agent alone": (plain, False, 0), "uplink, broker down": (plain, True, 0)},
        "view": {
            "view off": (plain, False, 0),
            "view on, no client": (viewed, False, 0),
            "view on, 3 clients": (viewed, False, 3),
        },
    }[args.compare]
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    for r in range(args.rounds):
        for name, (cfg, with_uplink, viewers) in modes.items():
            t0 = time.monotonic()
            got = one_run(cfg, args.seconds, with_uplink, viewers)
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
    if args.compare == "uplink":
        with sqlite3.connect(folder / "spool.sqlite") as db:
            (n,) = db.execute("SELECT COUNT(*) FROM messages").fetchone()
        print(f"\nthe uplink's spool holds {n} results (the broker was down throughout): {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
