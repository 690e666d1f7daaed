"""What a pose, oriented-box or segmentation model's decoding costs on the frame path, alone:
the decoder, then ``FrameSlot.fill`` (the task's values to source pixels; a segmentation
model's masks), then the message's detections, per frame, on a model's real outputs.

    .venv/bin/python tools/task_cost.py --model yolov8n-seg-busy-640.onnx \\
        --frames /tmp/bench-frames/frames.npy [--n 40] [--rounds 5] [--masks polygon]

Runs the model once per frame (ONNX Runtime, the input adapter), keeps the outputs, then
times each step over them ``--rounds`` times (warm caches: the frame path's are colder
after an inference; ``edge-agent bench`` measures that). Prints p50/p90 per frame of each
step, and for masks the time per mask. A measuring tool, not a test.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.slots import FrameSlot


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--frames", required=True, help=".npy of BGR frames (N, H, W, 3)")
    p.add_argument("--n", type=int, default=40, help="frames used")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--masks", choices=["polygon", "rle", "none"], default="polygon")
    p.add_argument("--iou", type=float, default=0.7)
    a = p.parse_args()
    loaded = load_model(
        ModelConfig(path=a.model, iou_threshold=a.iou, max_detections=300, masks=a.masks), OnnxRuntimeConfig()
    )
    task = loaded.task
    slot = FrameSlot(0, loaded.backend.allocate(), loaded.input_name, 300, None, task)
    slot.profile = type("Profile", (), {"model": loaded})()  # the message builder reads the task from it
    builder = MessageBuilder("cost", loaded.manifest.labels, 50.0)
    frames = np.load(a.frames, mmap_mode="r")[: a.n]
    kept = []  # (geometry, outputs) per frame
    for image in frames:
        loaded.preprocessor(np.ascontiguousarray(image), slot.tensor, slot.geo)
        loaded.backend.infer(slot.io)
        kept.append([o.copy() for o in slot.io.outputs])
    times: dict[str, list[float]] = {"decode": [], "fill": [], "message": []}
    masks = 0
    for _ in range(a.rounds):
        for outs in kept:
            for o, k in zip(slot.io.outputs, outs):
                o[...] = k
            t0 = time.perf_counter()
            found = loaded.decode(slot.io.outputs, loaded.params)
            t1 = time.perf_counter()
            slot.fill(found)
            t2 = time.perf_counter()
            builder.detections_json(slot)
            t3 = time.perf_counter()
            times["decode"].append(t1 - t0)
            times["fill"].append(t2 - t1)
            times["message"].append(t3 - t2)
            masks += slot.det_count if task.masks else 0
    loaded.close()
    per = len(kept) * a.rounds
    dets = masks / per if task.masks else float("nan")
    print(f"{a.model}: task {task.name}, {len(kept)} frames x {a.rounds} rounds, masks {a.masks}")
    for k, v in times.items():
        ms = np.array(v) * 1e3
        print(f"  {k:8s} p50 {np.percentile(ms, 50):.3f} ms  p90 {np.percentile(ms, 90):.3f} ms")
    if task.masks:
        fill_ms = float(np.sum(times["fill"])) * 1e3
        print(f"  masks: {dets:.1f} a frame, {fill_ms / max(masks, 1) * 1e3:.0f} us each (fill / masks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
