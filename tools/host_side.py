"""The host side of a frame, side by side with Ultralytics' own loop, on the same ONNX and
frames: everything around the model (letterbox, decode, NMS, tracks, lines and zones, the
result), in ms per frame, three rows:

- boxes: the agent with no tracker / Ultralytics ``predict``;
- + tracks: the agent's tracker / ``model.track(persist=True)``;
- + tracks, lines, a zone: the agent with 2 lines and 1 zone / an ``ObjectCounter`` on a line.

    .venv/bin/python tools/host_side.py --model yolov8n-busy-640.onnx --recording busy640.rec \\
        --frames /tmp/bench-png --ul-python /tmp/trackvenv-ul/bin/python --rounds 3

The agent runs its own pipeline (one camera, unpaced, 300 frames played from memory) on
the emulated accelerator with ``device_ms`` 0 (``edge-agent record-outputs`` made the
recording of this model on these frames), so its host side is the process's CPU time per
published frame, every thread counted (``bench.cpu.ThreadClocks``). Ultralytics runs one
call per frame on one thread; its host side is the wall time of the call less its own
``speed["inference"]``. Each round runs every row of both, in a fresh process each,
alternating, so a change of the host's speed weighs on both alike. ``--agent-pythonpath``
measures another tree of the agent (a "before") in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROWS = ("boxes", "tracks", "lines")
LINES = {
    "lines": [
        {"name": "a", "points": [[0.33, 0.05], [0.33, 0.95]]},
        {"name": "b", "points": [[0.05, 0.5], [0.95, 0.5]]},
    ]
}
ZONE = {"name": "z", "points": [[0.1, 0.1], [0.6, 0.1], [0.6, 0.9], [0.1, 0.9]]}


def agent_row(row: str, model: str, recording: str, frames_dir: str, frames: int) -> float:
    """ms of host CPU per published frame for the agent's ``row``."""
    from dataclasses import replace

    from edge_agent.bench.capacity import emulated_config
    from edge_agent.bench.configs import BenchAgent, started, with_model
    from edge_agent.bench.cpu import ThreadClocks
    from edge_agent.bench.record import clip
    from edge_agent.commands.common import latency_first_interpreter, load_config
    from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
    from edge_agent.core.source_config import TrackerConfig

    latency_first_interpreter()
    cfg = with_model(load_config(None), model)
    src = cfg.source
    if row == "boxes":
        src = replace(src, tracker=TrackerConfig(type="none"))
    if row == "lines":
        lines = tuple(
            LineConfig(name=d["name"], points=tuple(map(tuple, d["points"]))) for d in LINES["lines"]
        )
        zone = ZoneConfig(name=ZONE["name"], points=tuple(map(tuple, ZONE["points"])))
        src = replace(src, analytics=AnalyticsConfig(zones=(zone,), lines=lines))
    cfg = replace(cfg, source=src)
    cfg = emulated_config(cfg, recording, 0.0, 1, frames_dir, 0.0)
    images = clip(frames_dir, 100)
    with BenchAgent(cfg, max_frames=frames + 50, played={"cam0": images}) as agent, started(agent):
        pipeline = agent.pipeline
        assert pipeline is not None
        while pipeline.published() < 50:  # warm-up: not counted
            time.sleep(0.01)
        clocks = ThreadClocks(pipeline.threads())
        clocks.start()
        n0 = pipeline.published()
        pipeline.finished.wait()
        n = pipeline.published() - n0
        clocks.stop()
    return clocks.process_s / n * 1e3


def ul_row(row: str, model: str, frames_dir: str, frames: int) -> float:
    """ms per frame of Ultralytics' ``row`` around its own inference."""
    import glob

    import cv2
    from ultralytics import YOLO, solutions

    images = [cv2.imread(p) for p in sorted(glob.glob(os.path.join(frames_dir, "*.png")))[:100]]
    h, w = images[0].shape[:2]
    yolo = YOLO(model, task="detect")
    counter = None
    if row == "lines":
        a = LINES["lines"][0]["points"]
        counter = solutions.ObjectCounter(
            model=model, region=[(x * w, y * h) for x, y in a], show=False, verbose=False
        )
    out = []
    for i in range(frames + 10):
        frame = images[i % len(images)]
        t0 = time.perf_counter()
        if row == "boxes":
            r = yolo.predict(frame, verbose=False)[0]
        elif row == "tracks":
            r = yolo.track(frame, persist=True, verbose=False)[0]
        else:
            counter(frame)
            r = counter.tracks[0] if isinstance(counter.tracks, list) else counter.tracks  # its model.track's
        wall = (time.perf_counter() - t0) * 1e3
        if i >= 10:
            out.append(wall - r.speed["inference"])
    out.sort()
    return out[len(out) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--recording", default="")
    p.add_argument("--frames", default="/tmp/bench-png", help="a folder of PNG frames")
    p.add_argument("--count", type=int, default=300, help="frames per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--ul-python", default="/tmp/trackvenv-ul/bin/python")
    p.add_argument("--agent-pythonpath", default="", help="also measure the agent tree on this PYTHONPATH")
    p.add_argument("--one", nargs=2, metavar=("SIDE", "ROW"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.one:
        side, row = a.one
        ms = (
            agent_row(row, a.model, a.recording, a.frames, a.count)
            if side == "agent"
            else ul_row(row, a.model, a.frames, a.count)
        )
        print(json.dumps({"ms": ms}))
        return
    sides = [("agent", sys.executable, "")]
    if a.agent_pythonpath:
        sides.insert(0, ("agent-before", sys.executable, a.agent_pythonpath))
    sides.append(("ultralytics", a.ul_python, ""))
    got: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.rounds):
        for row in ROWS:
            for name, python, path in sides:
                env = (
                    {**os.environ, "YOLO_OFFLINE": "1", "PYTHONPATH": path}
                    if path
                    else {**os.environ, "YOLO_OFFLINE": "1"}
                )
                side = "ultralytics" if name == "ultralytics" else "agent"
                cmd = [python, __file__, "--model", a.model, "--recording", a.recording, "--frames", a.frames]
                cmd += ["--count", str(a.count), "--one", side, row]
                res = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
                if res.returncode:
                    sys.exit(f"{name} {row} failed:\n{res.stderr[-2000:]}")
                ms = json.loads(res.stdout.strip().splitlines()[-1])["ms"]
                got.setdefault((name, row), []).append(ms)
                print(f"{name:13s} {row:7s} {ms:7.3f} ms", file=sys.stderr, flush=True)
    print("| host side, ms/frame | " + " | ".join(n for n, _, _ in sides) + " |")
    print("| --- |" + " --- |" * len(sides))
    for row in ROWS:
        cells = []
        for name, _, _ in sides:
            v = got[(name, row)]
            cells.append(f"{min(v):.2f}–{max(v):.2f}")
        print(f"| {row} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
