"""The agent's tracker alone: its ``update`` per frame at 10 and 72 boxes, on the same box
streams as bench_cost.py (the synthetic scene's motion, jitter, 15 % low-scored boxes), or
on a model's own detections of a folder of images.

    .venv/bin/python tools/tracking/agent_cost.py --rounds 3
    .venv/bin/python tools/tracking/agent_cost.py --model yolov8n-busy-640.onnx --images frames/ --evict-mb 64

Prints p50 and p99 (us) per round; the first 100 frames of each run are warm-up. Each
round runs the compiled tracker and its numpy path (``--paths``) one after the other on
each stream, a fresh tracker each time (a tree without kernels: its one path); the
kernels' load time (compile, or the disk cache) is printed first.
``--evict-mb N`` writes an N MB array between frames, as an inference does to the caches:
inside the agent each frame's tracking starts cold. Inside the agent the same work is timed
per frame and reported by ``edge-agent bench`` (``of which tracker``) and in each heartbeat
(``tracking.cost_ms``).
"""

from __future__ import annotations

import argparse
import inspect
import time
from pathlib import Path

import numpy as np
from bench_cost import BOX_COUNTS, WARMUP, stream

from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

Frames = list[tuple[np.ndarray, np.ndarray, np.ndarray]]
_INIT = inspect.signature(ByteTracker.__init__).parameters


def synthetic_streams() -> dict[str, Frames]:
    return {
        f"{n:3d} boxes/frame": [
            (np.ascontiguousarray(d[:, :4], np.float32), d[:, 4].astype(np.float32), d[:, 5].astype(np.int32))
            for d in stream(n)
        ]
        for n in BOX_COUNTS
    }


def model_stream(model: str, images: str, loops: int) -> dict[str, Frames]:
    """The model's detections (the agent's own loading and per-frame path, its default
    score threshold) of the folder's images, played ``loops`` times."""
    import cv2

    from edge_agent.checks.evaluation import detect
    from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
    from edge_agent.pipelines.model import load_model

    paths = sorted(p for p in Path(images).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
    loaded = load_model(ModelConfig(path=model), OnnxRuntimeConfig())
    try:
        found = detect(loaded, (cv2.imread(str(p)) for p in paths))
    finally:
        loaded.close()
    frames = [(xyxy, s.astype(np.float32), c.astype(np.int32)) for xyxy, s, c in found] * loops
    mean = np.mean([len(f[1]) for f in frames])
    return {f"{Path(model).stem}, {mean:.1f} boxes/frame": frames}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--model", help="an ONNX detector: track its detections of --images")
    p.add_argument("--images", help="a folder of images for --model")
    p.add_argument("--loops", type=int, default=3, help="times the images are played (--model)")
    p.add_argument("--evict-mb", type=int, default=0, help="MB written between frames (0: none)")
    p.add_argument("--paths", nargs="+", choices=("compiled", "numpy"), default=["compiled", "numpy"])
    a = p.parse_args()
    if bool(a.model) != bool(a.images):
        p.error("--model and --images go together")
    streams = model_stream(a.model, a.images, a.loops) if a.model else synthetic_streams()
    evict = np.ones(a.evict_mb << 17) if a.evict_mb else None
    ids = np.zeros(1024, np.int64)
    age = np.zeros(1024, np.int32)
    journeys = np.zeros(1024, np.int64)
    # (an earlier tree's tracker, run with its edge_agent on PYTHONPATH, has no journeys)
    extra = (journeys,) if "out_journey" in inspect.signature(ByteTracker.update).parameters else ()
    # (an earlier tree's tracker has no kernels: it runs its one path)
    paths = a.paths if "compiled" in _INIT else ["numpy"]
    t0 = time.perf_counter()
    made = {path: ByteTracker(TrackerConfig(), **_path(path)) for path in paths}
    print(f"trackers made in {(time.perf_counter() - t0) * 1e3:.0f} ms: {_kernel_state()}")
    for path, tracker in made.items():
        if path == "compiled" and not tracker.compiled:
            p.error("the kernels did not load (see above); --paths numpy measures the numpy path alone")
    for r in range(a.rounds):
        for name, frames in streams.items():
            for path in paths:
                tracker = ByteTracker(TrackerConfig(), **_path(path))
                if hasattr(tracker, "view"):
                    tracker.view = (640.0, 480.0)  # as the agent's step tells it
                us = np.empty(len(frames))
                for i, (xyxy, scores, classes) in enumerate(frames):
                    if evict is not None:
                        evict += 1.0
                    t0 = time.perf_counter_ns()
                    tracker.update(xyxy, scores, classes, 1.0, ids, age, *extra)
                    us[i] = (time.perf_counter_ns() - t0) / 1e3
                us = us[WARMUP:]
                print(
                    f"round {r}: {name}, {path:8}: p50 {np.percentile(us, 50):6.1f} us"
                    f"  p99 {np.percentile(us, 99):6.1f} us  ({len(us)} frames, {tracker.live} tracks left)"
                )
    return 0


def _path(path: str) -> dict:
    return {"compiled": path == "compiled"} if "compiled" in _INIT else {}


def _kernel_state() -> str:
    try:
        from edge_agent.pipelines import jit
    except ImportError:  # an earlier tree
        return "no kernels in this tree"
    return str(jit.state())


if __name__ == "__main__":
    raise SystemExit(main())
