"""Dump the agent's detections on a frame set, to compare with another loop's.

    .venv/bin/python tools/dump_detections.py --model yolov8n-busy-640.onnx \\
        --frames /tmp/bench-frames/frames.npy --iou 0.7 --out agent.npz [--input-adapter off]

Runs each frame through the agent's own per-frame path (``LoadedModel.run_one``: the
preprocessor, the backend, the model's decoder and NMS, the mapping back to source
pixels) with the config's ONNX Runtime defaults. Writes one array per frame, rows
``x1 y1 x2 y2 score class``, in the order of the frames: the layout of the ``--dump-dets``
files of the reference loops, so a tool that compares those compares these too.
``--frames`` is a ``.npy`` of BGR frames (N, H, W, 3) or a folder of images (sorted).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator

import cv2
import numpy as np

from edge_agent.checks.evaluation import detect
from edge_agent.core.config import ModelConfig, OnnxRuntimeConfig
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.sources.files import list_images


def frames_of(path: str) -> Iterator[np.ndarray]:
    if path.endswith(".npy"):
        for frame in np.load(path, mmap_mode="r"):
            yield np.ascontiguousarray(frame)
        return
    files = list_images(path)
    if not files:
        raise SystemExit(f"{path}: no images")
    for f in files:
        image = cv2.imread(f, cv2.IMREAD_COLOR)
        if image is None:
            raise SystemExit(f"{f}: cannot read the image")
        yield image


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="ONNX file (manifest beside it, else read from the ONNX)")
    p.add_argument("--frames", required=True, help=".npy of BGR frames or a folder of images")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--score", type=float, default=0.25, help="score threshold")
    p.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold (Ultralytics' default: 0.7)")
    p.add_argument("--max-det", type=int, default=300, help="detections kept per frame")
    p.add_argument("--input-adapter", choices=["auto", "off"], default="auto")
    p.add_argument("--cache-dir", default="~/.cache/edge-agent/models", help="for the adapted copy")
    a = p.parse_args()
    model = ModelConfig(
        path=a.model,
        score_threshold=a.score,
        iou_threshold=a.iou,
        max_detections=a.max_det,
        input_adapter=a.input_adapter,
        cache_dir=a.cache_dir,
    )
    loaded = load_model(model, OnnxRuntimeConfig())
    with loaded:
        found = detect(loaded, frames_of(a.frames))
    dets = [np.concatenate([xyxy, s[:, None], c[:, None].astype(np.float32)], 1) for xyxy, s, c in found]
    np.savez_compressed(a.out, *dets)
    counts = [len(d) for d in dets]
    adapted = "adapted" if loaded.adapted_from else "original"
    mean = np.mean(counts)
    print(f"{a.out}: {len(dets)} frames ({adapted}), detections/frame mean {mean:.1f} max {max(counts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
