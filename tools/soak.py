"""Soak test: run the agent for a long time on several synthetic cameras and watch it.

    .venv/bin/python tools/soak.py --duration 3600 --out soak-out/

Writes a config (4 synthetic sources at 30 fps, metrics and publish on free loopback
ports), runs ``edge-agent run --duration N --quiet`` in its own session (ended on every
way out of this script), and meanwhile:

- scrapes /metrics every 5 s (failures counted; frames published give fps per source),
- samples the agent's /proc/<pid>: VmRSS, Threads and open fds at 1 min, every 5 min and
  5 s before the end,
- counts results per source and gaps in their seq numbers on a ZeroMQ subscriber, and
  reads each source's heartbeat for its tracker: live tracks, ids issued, tracks refused
  and the per-frame cost since the previous beat (first and last 5 minutes compared).

``--objects 12 --world-margin 0.2``: busier scenes whose objects enter and leave the view,
so tracks start and end all along (the tracker's soak, docs/tracking.md). ``--zones``: each
camera with two zones and a line (docs/analytics.md), its events counted (and their seq
gaps) and its analytics' cost per beat compared like the tracker's; ``--snapshots``: the
events' snapshots into OUT/snapshots, capped at 200 files, counted at the end.

At the end: a table of the samples, the agent's summary (its stderr tail) and exit code;
the samples go to OUT/samples.json, the agent's log to OUT/agent.log. Stdlib and the
project's own client (its subscriber and seq gap tracker).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from statistics import median

from agent_process import stop_group  # tools/, beside this script

from edge_agent.client import GapTracker, Subscriber

METRIC = re.compile(r"^(edge_agent_frames_\w+_total)\{([^}]*)\} ([0-9.e+]+)$", re.M)


def snapshot_folder(path: Path) -> dict:
    files = [f for f in path.glob("*.jpg")] if path.is_dir() else []
    mib = sum(f.stat().st_size for f in files) / 2**20
    return {"files": len(files), "mib": mib, "cap_files": SNAPSHOT_FILES}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """{'published/cam0': n, 'captured/cam0': n, ...} from the agent's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode()
    out: dict[str, float] = Counter()
    for name, labels, value in METRIC.findall(text):
        source = re.search(r'source="([^"]*)"', labels)
        kind = name.removeprefix("edge_agent_frames_").removesuffix("_total")
        out[f"{kind}/{source.group(1) if source else '?'}"] += float(value)
    return out


def proc_sample(pid: int) -> dict[str, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "threads": int(status["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


class Results:
    """Results per source and seq gaps, counted on a background thread; each heartbeat's
    tracker figures kept, by source."""

    def __init__(self, endpoint: str) -> None:
        # No high-water mark: the seq gaps counted must be the agent's, not this reader's.
        self.stream = Subscriber(endpoint, ("det.", "health", "event."), timeout_s=0.2, rcvhwm=0)
        self.count: Counter[str] = Counter()
        self.tracking: list[dict] = []  # per heartbeat of a tracking source
        self.analytics: list[dict] = []  # per heartbeat of a source with zones or lines
        self.events: Counter[str] = Counter()
        self.event_seq = GapTracker()  # events missing per source
        self.seq = GapTracker()  # seq numbers missing per source (messages lost to us)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.stream.recv()
            if got is None:
                continue
            msg = got[1]
            if msg.get("type") == "event":
                self.event_seq.update(msg["source"], msg["seq"])
                self.events[msg["source"]] += 1
                continue
            if msg.get("type") == "health":
                a = msg.get("analytics")
                if a is not None and "window" in a["cost_ms"]:
                    w = a["cost_ms"]["window"]
                    self.analytics.append(
                        {"mono": time.monotonic(), "source": msg["source"], "events": a["events"]}
                        | {"frames": w["count"], "p50_ms": w["p50"], "p99_ms": w["p99"]}
                    )
                t = msg.get("tracking")
                if t is not None and "window" in t["cost_ms"]:
                    w = t["cost_ms"]["window"]
                    self.tracking.append(
                        {"mono": time.monotonic(), "source": msg["source"], "live": t["live"]}
                        | {"ids": t["ids_issued"], "overflow": t["overflow"], "frames": w["count"]}
                        | {"p50_ms": w["p50"], "p99_ms": w["p99"]}
                    )
                continue
            self.seq.update(msg["source"], msg["seq"])
            self.count[msg["source"]] += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.stream.close()


def print_report(r: dict, names: list[str]) -> None:
    row = "{:>7} {:>8} {:>5} {:>7} {} {:>11}"
    print(row.format("t s", "RSS MiB", "fds", "threads", " ".join(f"{n:>7}" for n in names), "scrape fail"))
    for s in r["samples"]:
        fps = " ".join(f"{s['fps'][n]:7.1f}" if "fps" in s else f"{'-':>7}" for n in names)
        print(
            row.format(
                f"{s['t_s']:.0f}", f"{s['rss_mib']:.1f}", s["fds"], s["threads"], fps, s["scrape_failures"]
            )
        )
    print(
        f"(fps: results published per second since the row before; /metrics first answered at "
        f"{r['first_scrape_s']} s; {r['scrapes']} scrapes, {r['scrape_failures']} failed after that)"
    )
    print(
        "results received: "
        + ", ".join(f"{n} {r['results'].get(n, 0)} (seq gaps {r['seq_gaps'].get(n, 0)})" for n in names)
    )
    tracking = r["tracking"]
    if tracking:
        for name, beats, timed in first_and_last(tracking):
            if not timed:
                print(f"tracker, {name} 5 min: no frame tracked")
                continue
            print(
                f"tracker, {name} 5 min: p50 {median([b['p50_ms'] for b in timed]):.3f} ms,"
                f" p99 {median([b['p99_ms'] for b in timed]):.3f} ms (medians of the beats),"
                f" live tracks per source at most {max(b['live'] for b in beats)}"
            )
        final = {b["source"]: b for b in tracking}
        print(
            f"track ids issued: {sum(b['ids'] for b in final.values())},"
            f" refused (overflow): {sum(b['overflow'] for b in final.values())}"
        )
    if r["analytics"]:
        for name, _beats, timed in first_and_last(r["analytics"]):
            if timed:
                print(
                    f"analytics, {name} 5 min: p50 {median([b['p50_ms'] for b in timed]):.3f} ms,"
                    f" p99 {median([b['p99_ms'] for b in timed]):.3f} ms (medians of the beats)"
                )
        beat_events = sum({b["source"]: b["events"] for b in r["analytics"]}.values())
        print(
            f"events received: {sum(r['events'].values())} (the last beats count {beat_events}),"
            f" seq gaps {sum(r['event_gaps'].values())}"
        )
    if r.get("snapshots"):
        s = r["snapshots"]
        print(f"snapshots at the end: {s['files']} files, {s['mib']:.1f} MiB (cap {s['cap_files']} files)")
    print("agent stderr (tail):\n  " + "\n  ".join(r["stderr_tail"]))
    print(f"agent exit code: {r['exit_code']}")


def first_and_last(beats: list[dict]) -> list[tuple[str, list[dict], list[dict]]]:
    """The beats of the first and of the last 5 minutes, each with those that timed a frame."""
    end = max(b["t_s"] for b in beats)
    parts = {
        "first": [b for b in beats if b["t_s"] <= 300],
        "last": [b for b in beats if b["t_s"] >= end - 300],
    }
    return [(name, part, [b for b in part if b["frames"]]) for name, part in parts.items()]


ZONES = {
    "zones": [
        {"name": "left", "points": [[0.05, 0.2], [0.45, 0.2], [0.45, 0.9], [0.05, 0.9]], "dwell_s": [2, 5]},
        {
            "name": "right",
            "points": [[0.55, 0.1], [0.95, 0.1], [0.95, 0.6], [0.75, 0.6], [0.75, 0.95], [0.55, 0.95]],
        },
    ],
    "lines": [{"name": "middle", "points": [[0.5, 0.05], [0.5, 0.95]]}],
}
SNAPSHOT_FILES = 200


def main() -> int:
    p = argparse.ArgumentParser(description="long run of the agent, watched")
    p.add_argument("--duration", type=float, default=3600, help="seconds the agent runs")
    p.add_argument("--out", type=Path, required=True, help="folder for config, log and samples.json")
    p.add_argument("--sources", type=int, default=4)
    p.add_argument("--fps", type=float, default=30)
    p.add_argument("--objects", type=int, default=6, help="objects per synthetic scene")
    p.add_argument("--world-margin", type=float, default=0.0, help="objects enter and leave the view (0..1)")
    p.add_argument("--zones", action="store_true", help="two zones and a line per camera")
    p.add_argument(
        "--snapshots", action="store_true", help="with --zones: events' snapshots into OUT/snapshots"
    )
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = [f"cam{i}" for i in range(args.sources)]
    mport, endpoint = free_port(), f"tcp://127.0.0.1:{free_port()}"
    scene: dict = {"num_objects": args.objects, "world_margin": args.world_margin}
    snapshots = (args.out / "snapshots").resolve()
    if args.zones:
        snaps = {"snapshots": {"dir": str(snapshots), "max_files": SNAPSHOT_FILES}} if args.snapshots else {}
        scene["analytics"] = {**ZONES, **snaps}
    sources = [
        {"type": "synthetic", "name": n, "fps": args.fps, "seed": i, **scene} for i, n in enumerate(names)
    ]
    config = {  # JSON is YAML
        "device_id": "soak",
        "sources": sources,
        "publish": {"endpoint": endpoint, "send_hwm": 10000, "wait_for_subscribers": 1},
        "metrics": {"enabled": True, "port": mport},
    }
    cfg = args.out / "agent.yaml"
    cfg.write_text(json.dumps(config, indent=2) + "\n")
    # A SIGTERM to this script unwinds through the finally below, as Ctrl-C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    results = Results(endpoint)
    log = (args.out / "agent.log").open("w")
    cmd = [sys.executable, "-m", "edge_agent", "run", "--config", str(cfg), "--quiet"]
    agent = subprocess.Popen(
        [*cmd, "--duration", str(args.duration)], stdout=log, stderr=log, start_new_session=True
    )
    t0 = time.monotonic()
    end = args.duration - 5
    due = sorted(d for d in {60.0, *range(300, int(end), 300), end} if 0 < d <= end)
    samples: list[dict] = []
    scrapes, failures, first_ok = 0, 0, None
    last, mark = None, None  # the newest scrape (t, values); the one at the previous sample
    try:
        while agent.poll() is None and due:
            time.sleep(5 - (time.monotonic() - t0) % 5)  # on a 5 s grid
            now = time.monotonic() - t0
            try:
                last = (now, scrape(mport))
                scrapes += 1
                if first_ok is None:  # fps of the first row: since the agent first answered
                    first_ok, mark = round(now, 1), last
            except OSError:
                failures += first_ok is not None  # before the first success: still loading
            if due and now >= due[0] - 0.5:
                due = [d for d in due if d > now + 0.5]
                try:
                    s = {"t_s": round(now, 1), **proc_sample(agent.pid), "scrape_failures": failures}
                except OSError:  # it has just exited
                    continue
                if last is not None and mark is not None and last[0] > mark[0]:
                    dt = last[0] - mark[0]
                    s["fps"] = {
                        n: (last[1][f"published/{n}"] - mark[1][f"published/{n}"]) / dt for n in names
                    }
                mark = last
                samples.append(s)
        code = agent.wait(timeout=args.duration + 300)
    finally:
        if agent.poll() is None:
            stop_group(agent)
        results.close()
        log.close()

    report = {
        **{"config": config, "duration_s": args.duration, "samples": samples, "exit_code": code},
        **{"scrapes": scrapes, "scrape_failures": failures, "first_scrape_s": first_ok},
        **{"results": dict(results.count), "seq_gaps": dict(results.seq.lost)},
        "tracking": [{"t_s": round(b.pop("mono") - t0, 1), **b} for b in results.tracking],
        "analytics": [{"t_s": round(b.pop("mono") - t0, 1), **b} for b in results.analytics],
        "events": dict(results.events),
        "event_gaps": dict(results.event_seq.lost),
        "snapshots": snapshot_folder(snapshots) if args.snapshots else None,
        "stderr_tail": (args.out / "agent.log").read_text().splitlines()[-60:],
    }
    (args.out / "samples.json").write_text(json.dumps(report, indent=2) + "\n")
    print_report(report, names)
    return 0 if code == 0 and not failures and not any(results.seq.lost.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
