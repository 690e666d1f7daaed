#!/usr/bin/env python3
"""Ultralytics' own predict over the benchmark frames -> per-frame detections (.npz).

Usage (after ``source ../shared/tools/realistic-models/bench_env.sh``, the team's peer tools, outside
the repo, which sets ``$VENV`` to the side venv with Ultralytics and ``$BENCH_FRAMES``)::

    $VENV/bin/python tools/exports/ultralytics_predict.py MODEL.onnx [MODEL2.onnx ...] [--conf 0.25]
        [--iou 0.7] [--imgsz S] [--frames PATH] [--n N] [--out OUT.npz]

(default ``--out``: ``<dir>/<name>.ultra.npz`` next to each model; default ``--imgsz``: the last
``-`` field of the file name, e.g. 640 for ``yolo26n-busy-640.onnx``; default ``--frames``:
``$BENCH_FRAMES``, else ``/tmp/bench-frames/frames.npy``.)

Modelled on ``../shared/tools/realistic-models/peer_ultralytics.py --dump-dets``: one predict call per
frame (``model.predict(frame, stream=True, verbose=False, imgsz=S, conf=C, iou=I)``); the frames are the
BGR uint8 arrays of the ``--frames`` .npy (N, H, W, 3), as a camera loop would pass them. Saves
``np.savez_compressed(out, *dets)``: arr_0 .. arr_{N-1}, one float32 array (n_i, 6) per frame, rows
x1 y1 x2 y2 score class in source-frame pixels (= ``results[0].boxes.data``): the layout that
``tools/dump_detections.py`` writes for the agent and ``tools/compare_detections.py`` compares.

RT-DETR exports (metadata head == RTDETRDecoder, or 'rtdetr' in the file name) are loaded with
RTDETR(...), which uses RTDETRPredictor: its preprocessing STRETCHES the frame to SxS (LetterBox
scale_fill=True, no padding) and it scales the normalised cxcywh boxes by the frame's width/height.
Everything else uses YOLO(path, task="detect") (end-to-end [1,300,6] / embedded-NMS / raw [1,84,A]
outputs are all handled by Ultralytics' DetectionPredictor from the ONNX metadata).

Any network attempt (there should be none: bench_env.sh sets Ultralytics offline) is recorded by an
audit hook and reported at the end. A measuring tool run by hand; nothing in the package uses it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

NET = []  # record any network attempt (there should be none)
sys.addaudithook(
    lambda e, a: (
        NET.append((e, repr(a)[:120]))
        if e in ("socket.connect", "socket.getaddrinfo", "socket.gethostbyname", "urllib.Request")
        else None
    )
)


def is_rtdetr(path):
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        md = sess.get_modelmeta().custom_metadata_map
        if "head" in md:
            return md["head"] == "RTDETRDecoder"
    except Exception:
        pass
    return "rtdetr" in os.path.basename(path).lower()


def run(path, frames, imgsz, conf, iou, out):
    from ultralytics import RTDETR, YOLO

    rt = is_rtdetr(path)
    model = RTDETR(path) if rt else YOLO(path, task="detect")
    dets, t0 = [], time.perf_counter()
    for frame in frames:
        results = list(model.predict(frame, stream=True, verbose=False, imgsz=imgsz, conf=conf, iou=iou))
        dets.append(results[0].boxes.data.cpu().numpy().astype(np.float32))
    dt = time.perf_counter() - t0
    np.savez_compressed(out, *dets)
    n = np.array([len(d) for d in dets])
    print(
        f"{os.path.basename(path)}: {'RTDETR' if rt else 'YOLO'} predict imgsz={imgsz} conf={conf} iou={iou} "
        f"frames={len(frames)}  detections/frame mean {n.mean():.1f} median {np.median(n):.0f} "
        f"min {n.min()} max {n.max()}  ({dt / len(frames) * 1e3:.0f} ms/frame)  -> {out}",
        flush=True,
    )
    return n


def main():
    ap = argparse.ArgumentParser(
        description="Ultralytics' own predict over the benchmark frames -> per-frame detections (.npz)."
    )
    ap.add_argument("models", nargs="+")
    ap.add_argument("--frames", default=os.environ.get("BENCH_FRAMES", "/tmp/bench-frames/frames.npy"))
    ap.add_argument("--imgsz", type=int, default=None, help="default: from the file name (...-640.onnx)")
    ap.add_argument("--conf", type=float, default=0.25)
    ap.add_argument("--iou", type=float, default=0.7)
    ap.add_argument("--n", type=int, default=None, help="only the first N frames")
    ap.add_argument("--out", default=None, help="output .npz (only with one model)")
    a = ap.parse_args()
    if a.out is not None and len(a.models) != 1:
        ap.error("--out needs exactly one model")
    frames = np.load(a.frames)
    if not (frames.ndim == 4 and frames.shape[-1] == 3 and frames.dtype == np.uint8):
        ap.error(f"{a.frames}: expected uint8 BGR frames (N, H, W, 3), got {frames.dtype} {frames.shape}")
    if a.n:
        frames = frames[: a.n]
    for m in a.models:
        imgsz = a.imgsz or int(os.path.splitext(m)[0].rsplit("-", 1)[-1])
        out = a.out or os.path.splitext(m)[0] + ".ultra.npz"
        run(m, frames, imgsz, a.conf, a.iou, out)
    print(f"network attempts: {len(NET)} {NET[:3]}")


if __name__ == "__main__":
    main()
