"""The agent against the loops users would otherwise run, side by side, interleaved.

    .venv/bin/python tools/compare_peers.py --peers ../shared/tools/realistic-models \\
        --model /tmp/peer-models/yolov8n-busy-640.onnx --frames /tmp/bench-frames/all \\
        --rounds 2 [--out compare.json]

Each round runs, one after the other: Ultralytics' own ``predict`` loop
(``peer_ultralytics.py``, in the peer tools' venv), the bare ONNX Runtime loop
(``naive_loop.py``, with this venv's Python, so the same ONNX Runtime as the agent), and
``edge-agent bench`` live from the image folder at ``--fps`` (10: nothing queues) with a
200 ms budget (the realistic model is slower than the default 50 ms here, and a frame
dropped as stale would measure nothing). Rounds interleave because this host switches
between two speed levels: compare figures of the same round. Prints per round the
agent's overhead (end to end - capture - inference, plus the input adapter's in-graph
term) next to Ultralytics' pre + post and the bare loop's, the per-stage p50s, and
inference against the bare loop's. The peer tools are measuring tools of the team's
shared folder (they build the models and the frame set; see their README), not part of
the agent.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _peer(peers: Path, script: str, python: str, model: str, out: Path, frames_npy: str) -> dict:
    env_line = f"source {peers / 'bench_env.sh'} >/dev/null && "
    cmd = f"{env_line}{python} {peers / script} --model {model} --frames {frames_npy} --json {out}"
    subprocess.run(["bash", "-c", cmd], check=True, stdout=subprocess.DEVNULL, timeout=900)
    return json.loads(out.read_text())["stats"]


def _ultralytics_task(python: str, model: str, out: Path, frames_npy: str) -> dict:
    """Ultralytics' predict of a pose, oriented-box or segmentation export (its task from
    the metadata: ``tools/exports/ultralytics_predict.py``), its per-frame stage times as
    the peer tool's stats (p50 of each stage, the first 10 frames dropped as warm-up)."""
    tool = Path(__file__).resolve().parent / "exports" / "ultralytics_predict.py"
    subprocess.run(
        [python, str(tool), model, "--frames", frames_npy, "--out", str(out)],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=900,
    )
    import numpy as np

    with np.load(out) as d:
        speed = d["speed"][10:]
    return {
        k: {"p50": float(np.percentile(speed[:, i], 50))}
        for i, k in enumerate(("preprocess", "inference", "postprocess"))
    }


def _agent(model: str, frames: str, fps: float, seconds: float, out: Path) -> dict:
    cfg = out.with_suffix(".yaml")
    cfg.write_text("deadline: {budget_ms: 200}\n")
    cmd = [
        sys.executable,
        "-m",
        "edge_agent",
        "bench",
        "-c",
        str(cfg),
        "--source",
        frames,
        "--model",
        model,
        "--source-fps",
        str(fps),
        "--live-seconds",
        str(seconds),
        "--frames",
        "60",
        "--json",
    ]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    out.write_text(res.stdout)
    return json.loads(res.stdout)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peers", required=True, help="the realistic-models tools folder")
    p.add_argument("--model", required=True)
    p.add_argument("--frames", required=True, help="folder of the frame set's images (the agent's source)")
    p.add_argument("--frames-npy", default="/tmp/bench-frames/frames.npy", help="the same, for the peers")
    p.add_argument("--peer-python", default="/tmp/peer-venv/bin/python", help="the venv with ultralytics")
    p.add_argument("--fps", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=20.0, help="live phase of the agent")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", help="write every round's raw figures here (JSON)")
    p.add_argument(
        "--task",
        action="store_true",
        help="a pose, oriented-box or segmentation export: Ultralytics' predict with its task "
        "(tools/exports/ultralytics_predict.py); no bare loop (it decodes boxes only)",
    )
    a = p.parse_args()
    peers = Path(a.peers).resolve()
    rounds, npy = [], a.frames_npy
    with tempfile.TemporaryDirectory(prefix="compare-peers-") as tmp:
        t = Path(tmp)
        for r in range(a.rounds):
            if a.task:
                ul = _ultralytics_task(a.peer_python, a.model, t / f"ul{r}.npz", npy)
                bare = None
            else:
                ul = _peer(peers, "peer_ultralytics.py", a.peer_python, a.model, t / f"ul{r}.json", npy)
                bare = _peer(peers, "naive_loop.py", sys.executable, a.model, t / f"naive{r}.json", npy)
            agent = _agent(a.model, a.frames, a.fps, a.seconds, t / f"agent{r}.json")
            rounds.append({"ultralytics": ul, "naive_loop": bare, "agent": agent})
            _print_round(r, ul, bare, agent)
    if a.out:
        Path(a.out).write_text(json.dumps(rounds, indent=1))
    return 0


def _print_round(r: int, ul: dict, bare: dict | None, agent: dict) -> None:
    live = agent["live"]
    st = live["stages"]
    over = live.get("overhead_with_adapter_ms") or live["overhead_ms"]
    ul_pp = ul["preprocess"]["p50"] + ul["postprocess"]["p50"]
    bare_pp = bare["preprocess"]["p50"] + bare["postprocess"]["p50"] if bare else float("nan")
    dets = live.get("detections_per_frame", {})
    print(
        f"round {r + 1}: {os.path.basename(agent['model'])}, agent live {live['source_fps']:g} fps, "
        f"{dets.get('mean', 0):.1f} detections/frame ({dets.get('frames', 0)} frames)"
    )
    print(
        f"  around the model p50: agent {over['p50']:.3f} ms (p99 {over['p99']:.3f}); "
        f"Ultralytics pre+post {ul_pp:.3f}; bare loop pre+post {bare_pp:.3f}; "
        f"agent/Ultralytics {over['p50'] / ul_pp:.2f}"
    )
    print("  agent stages p50: " + ", ".join(f"{k} {v['p50_ms']:.3f}" for k, v in st.items()))
    ad = agent.get("input_adapter") or {}
    if ad.get("adapted"):
        print(f"  input adapter in-graph term {ad['in_graph_ms']:+.3f} ms")
    infer = st["infer"]["p50_ms"]
    bare_infer = bare["inference"]["p50"] if bare else float("nan")
    print(
        f"  inference p50: agent live {infer:.2f} ms, bare loop {bare_infer:.2f}, "
        f"Ultralytics {ul['inference']['p50']:.2f}; agent/bare {infer / bare_infer:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())
