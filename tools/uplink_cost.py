"""What the uplink sends, per ``forward`` policy with and without ``events``: messages and
bytes a second on a real Mosquitto, for one agent on the synthetic camera with zones and
lines (the embedded default's model and camera, its tracker on; the two zones and two lines
of tools/analytics/measure.py, a dwell step at 5 s).

    .venv/bin/python tools/uplink_cost.py [--seconds 60] [--objects 6] [--fps 30]

Every variant's uplink runs at once against the one agent (each as a device of its own on
the broker), so they all see the same frames and events. Counted after a warm-up, over
``--seconds``: the messages each device published under ``<prefix>/<device>/`` by kind
(``det``, ``summary``, ``event``, ``health``; the totals include ``status``) and their
bytes as the spool counts them (topic + payload; MQTT adds about 8 bytes a message, TLS a
little more). Not a test: it measures, it does not judge.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' broker and helpers

import paho.mqtt.client as mqtt
from broker import Mosquitto
from conftest import agent_command, spawn, wait_until
from paho.mqtt.enums import CallbackAPIVersion

VARIANTS = [
    ("summary", False),
    ("summary", True),
    ("none", True),
    ("with_detections", False),
    ("with_detections", True),
    ("all", False),
    ("all", True),
]
ANALYTICS = {
    "zones": [
        {"name": "box", "points": [[0.15, 0.2], [0.4, 0.2], [0.4, 0.6], [0.15, 0.6]], "dwell_s": [5]},
        {
            "name": "ell",
            "points": [[0.55, 0.15], [0.85, 0.15], [0.85, 0.4], [0.7, 0.4], [0.7, 0.85], [0.55, 0.85]],
        },
    ],
    "lines": [
        {"name": "vertical", "points": [[0.5, 0.1], [0.5, 0.9]]},
        {"name": "slanted", "points": [[0.1, 0.3], [0.9, 0.75]], "in_side": "right"},
    ],
}


class Counter:
    """A paho subscriber to ``edge-agent/#`` that counts (device, kind) messages and bytes
    from ``start()`` on."""

    def __init__(self, port: int) -> None:
        self.counts: dict[tuple[str, str], list[int]] = collections.defaultdict(lambda: [0, 0])
        self.seen: set[str] = set()
        self.lock = threading.Lock()
        self.counting = False
        self.client = mqtt.Client(callback_api_version=CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_connect = lambda c, *_: c.subscribe("edge-agent/#", qos=1)
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        parts = msg.topic.split("/")
        device, kind = parts[1], parts[2]
        with self.lock:
            self.seen.add(f"{device}/{kind}")
            if self.counting and not msg.retain:
                entry = self.counts[(device, kind)]
                entry[0] += 1
                entry[1] += len(msg.topic.encode()) + len(msg.payload)

    def start(self) -> float:
        with self.lock:
            self.counts.clear()
            self.counting = True
        return time.monotonic()

    def stop(self) -> dict[tuple[str, str], list[int]]:
        with self.lock:
            self.counting = False
            return {k: list(v) for k, v in self.counts.items()}

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def config(folder: Path, endpoint: str, broker: Mosquitto, args: argparse.Namespace, **uplink: Any) -> Path:
    device = uplink.pop("device", "agent")
    cfg = {
        "device_id": device,
        "source": {
            "type": "synthetic",
            "fps": args.fps,
            "num_objects": args.objects,
            "analytics": ANALYTICS,
        },
        "publish": {"endpoint": endpoint},
        "metrics": {"enabled": False},
        "uplink": {
            "broker": broker.url,
            "spool_path": str(folder / f"{device}.sqlite"),
            "metrics": {"enabled": False},
            **uplink,
        },
    }
    path = folder / f"{device}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--objects", type=int, default=6)
    ap.add_argument("--fps", type=float, default=30.0)
    ap.add_argument("--warmup", type=float, default=5.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        folder = Path(tmp)
        broker = stack.enter_context(Mosquitto(folder))
        from conftest import free_endpoint

        endpoint = free_endpoint()
        counter = Counter(broker.port)
        stack.callback(counter.close)
        log = (folder / "processes.log").open("ab")
        stack.callback(log.close)
        agent_cfg = config(folder, endpoint, broker, args)
        stack.enter_context(spawn(agent_command("run", "--config", str(agent_cfg), "--quiet"), stderr=log))
        names = []
        for forward, events in VARIANTS:
            name = f"{forward.replace('_', '-')}{'-events' if events else ''}"
            names.append(name)
            cfg = config(folder, endpoint, broker, args, device=name, forward=forward, events=events)
            stack.enter_context(
                spawn(agent_command("uplink", "--config", str(cfg)), stdout=subprocess.DEVNULL, stderr=log)
            )
        wait_until(
            lambda: all(f"{n}/health" in counter.seen for n in names),
            120,
            interval_s=0.2,
            message="every uplink's health",
        )
        time.sleep(args.warmup)  # the tracker's tracks confirmed, the first summaries out
        start = counter.start()
        time.sleep(args.seconds)
        counts = counter.stop()
        span = time.monotonic() - start
    print(f"{args.seconds:g} s measured, synthetic camera at {args.fps:g} fps with {args.objects} objects")
    kinds = ("det", "summary", "event", "health")
    heads = ["msg/s", "B/s"] + [f"{k} {u}" for k in kinds for u in ("msg/s", "B/s")]
    print(f"{'variant':22}" + "".join(f"{h:>14}" for h in heads))
    for name in names:
        mine = {kind: v for (device, kind), v in counts.items() if device == name}
        cells = [sum(v[0] for v in mine.values()), sum(v[1] for v in mine.values())]
        cells += [x for k in kinds for x in mine.get(k, [0, 0])]
        print(f"{name:22}" + "".join(f"{c / span:14.1f}" for c in cells))
    events = next((v for (d, k), v in counts.items() if d == "none-events" and k == "event"), [0, 0])
    if events[0]:
        print(f"an event: {events[1] / events[0]:.0f} B on average (topic + payload)")


if __name__ == "__main__":
    main()
