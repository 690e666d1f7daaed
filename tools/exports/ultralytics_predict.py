#!/usr/bin/env python3
"""Ultralytics' own predict over the benchmark frames -> per-frame detections (.npz).

Usage (after ``source ../shared/tools/realistic-models/bench_env.sh``, the team's peer tools, outside
the repo, which sets ``$VENV`` to the side venv with Ultralytics and ``$BENCH_FRAMES``)::

    $VENV/bin/python tools/exports/ultralytics_predict.py MODEL.onnx [MODEL2.onnx ...] [--conf 0.25]
        [--iou 0.7] [--imgsz S] [--frames PATH] [--n N] [--out OUT.npz] [--retina]

(default ``--out``: ``<dir>/<name>.ultra.npz`` next to each model, ``<dir>/<name>.ultra-retina.npz`` with
``--retina``; default ``--imgsz``: the last
``-`` field of the file name, e.g. 640 for ``yolo26n-busy-640.onnx``; default ``--frames``:
``$BENCH_FRAMES``, else ``/tmp/bench-frames/frames.npy``.)

Modelled on ``../shared/tools/realistic-models/peer_ultralytics.py --dump-dets``: one predict call per
frame (``model.predict(frame, stream=True, verbose=False, imgsz=S, conf=C, iou=I)``); the frames are the
BGR uint8 arrays of the ``--frames`` .npy (N, H, W, 3), as a camera loop would pass them. Saves
``np.savez_compressed(out, *dets)``: arr_0 .. arr_{N-1}, one float32 array (n_i, 6) per frame, rows
x1 y1 x2 y2 score class in source-frame pixels (= ``results[0].boxes.data``): the layout that
``tools/dump_detections.py`` writes for the agent and ``tools/compare_detections.py`` compares.

The task comes from the export's metadata ``task`` (detect, pose, obb, segment) and the model is loaded
with ``YOLO(path, task=task)``. Detect files hold only arr_0 .. arr_{N-1} (the layout above, unchanged).
Pose, OBB and segment files hold, per frame i, besides ``arr_i``:

  pose     kpt_i  float32 (n, K, 3) = results[0].keypoints.data (x, y in source pixels, conf)
  obb      arr_i  is x1 y1 x2 y2 = results[0].obb.xyxy (the axis-aligned bounds of the rotated box), conf,
                  cls; obb_i float32 (n, 5) = results[0].obb.xywhr (centre, size, angle in radians, source px)
  segment  rle_i  int32: the detections' masks in SOURCE-frame pixels (H x W of the frame) as COCO-style
                  uncompressed RLE -- the boolean mask flattened column-major (order='F'), counts of
                  alternating runs starting with a run of zeros (which may be 0) -- all of frame i's
                  detections' counts concatenated; rlen_i int32 (n,) each detection's number of counts.
                  Default predict: masks.data come in model-input space and are mapped to the frame with
                  Ultralytics' own code for that (plotting.Annotator.masks / fastsam):
                  ``ops.scale_masks(masks[None].float(), orig_shape)[0] > 0.5``. With ``--retina``
                  (retina_masks=True) they come at the frame size (ops.process_mask_native), kept as they are.
                  The first frame's RLEs are decoded back and checked against the masks.

and ``speed`` float32 (N, 3): each frame's results[0].speed preprocess, inference, postprocess (ms).

RT-DETR exports (metadata head == RTDETRDecoder, or 'rtdetr' in the file name) are loaded with
RTDETR(...), which uses RTDETRPredictor: its preprocessing STRETCHES the frame to SxS (LetterBox
scale_fill=True, no padding) and it scales the normalised cxcywh boxes by the frame's width/height.
Everything else uses YOLO(path, task=<metadata task>) (end-to-end [1,300,6+extra] / embedded-NMS / raw
[1,4+nc+extra,A] outputs are all handled by Ultralytics' Detection/Pose/OBB/SegmentationPredictor from the
ONNX metadata).

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


def model_meta(path):
    """(task, is RT-DETR) from the export's Ultralytics metadata (task defaults to detect)."""
    import ast

    import onnxruntime as ort

    md = {}
    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        md = sess.get_modelmeta().custom_metadata_map
    except Exception:
        pass
    rt = md["head"] == "RTDETRDecoder" if "head" in md else "rtdetr" in os.path.basename(path).lower()
    task = md.get("task") or "detect"
    kpt = tuple(ast.literal_eval(md["kpt_shape"])) if md.get("kpt_shape") else None
    return task, rt, kpt


def rle_counts(mask):
    """COCO-style uncompressed RLE counts of one boolean (H, W) mask: column-major (order='F') runs,
    alternating, starting with a run of zeros (0 when the first pixel is set)."""
    f = np.asarray(mask, dtype=bool).ravel(order="F")
    if f.size == 0:
        return np.zeros(0, np.int32)
    change = np.flatnonzero(f[1:] != f[:-1]) + 1
    counts = np.diff(np.concatenate(([0], change, [f.size])))
    if f[0]:
        counts = np.concatenate(([0], counts))
    return counts.astype(np.int32)


def rle_decode(counts, shape):
    """Inverse of rle_counts: (H, W) boolean mask."""
    vals = np.arange(len(counts)) % 2 == 1  # runs alternate 0, 1, 0, ...
    return np.repeat(vals, counts).reshape(shape[::-1]).T


def source_masks(r):
    """Results -> (n, H, W) boolean masks in SOURCE-frame pixels, as Ultralytics maps them itself.

    Default predict (retina_masks=False): masks.data are (n, S, S) uint8 in model-input (letterboxed) space;
    Ultralytics' own mapping to the original image (ultralytics/utils/plotting.py Annotator.masks, and
    models/fastsam/predict.py) is ``ops.scale_masks(masks[None].float(), orig_shape)[0] > 0.5``: crop the
    letterbox padding, bilinear resize to the frame, threshold 0.5. With retina_masks=True they are already
    at the frame size (ops.process_mask_native) and are taken as they are."""
    from ultralytics.utils import ops

    h, w = r.orig_shape
    if r.masks is None:
        return np.zeros((0, h, w), bool)
    m = r.masks.data
    if tuple(m.shape[1:]) != (h, w):
        m = ops.scale_masks(m[None].float(), (h, w))[0] > 0.5
    return m.bool().cpu().numpy()


def run(path, frames, imgsz, conf, iou, out, retina=False):
    from ultralytics import RTDETR, YOLO

    task, rt, _kpt = model_meta(path)
    model = RTDETR(path) if rt else YOLO(path, task=task)
    kw = dict(stream=True, verbose=False, imgsz=imgsz, conf=conf, iou=iou)
    if retina:
        kw["retina_masks"] = True
    dets, extra, speed, diag = [], {}, [], []
    t0 = time.perf_counter()
    for i, frame in enumerate(frames):
        results = list(model.predict(frame, **kw))
        r = results[0]
        speed.append([r.speed.get(k) or 0.0 for k in ("preprocess", "inference", "postprocess")])
        if task == "obb":
            o = r.obb
            d = np.concatenate(
                [o.xyxy.cpu().numpy(), o.conf.cpu().numpy()[:, None], o.cls.cpu().numpy()[:, None]], 1
            ).reshape(-1, 6)
            extra[f"obb_{i}"] = o.xywhr.cpu().numpy().astype(np.float32).reshape(-1, 5)
            diag.append(extra[f"obb_{i}"][:, 4])
        else:
            d = r.boxes.data.cpu().numpy()
        dets.append(d.astype(np.float32))
        if task == "pose":
            k = r.keypoints.data.cpu().numpy().astype(np.float32) if r.keypoints is not None else None
            extra[f"kpt_{i}"] = k if k is not None and len(d) else np.zeros((0, *_kpt), np.float32)
            diag.append(extra[f"kpt_{i}"].reshape(-1, extra[f"kpt_{i}"].shape[-1]))
        elif task == "segment":
            ms = source_masks(r)
            assert len(ms) == len(d), (len(ms), len(d))
            cs = [rle_counts(m) for m in ms]
            if i == 0:  # self-check: every RLE of the first frame decodes back to its mask
                for c, m in zip(cs, ms):
                    assert c.sum() == m.size and np.array_equal(rle_decode(c, m.shape), m), "RLE round trip"
            extra[f"rle_{i}"] = np.concatenate(cs).astype(np.int32) if cs else np.zeros(0, np.int32)
            extra[f"rlen_{i}"] = np.array([len(c) for c in cs], np.int32)
            diag.append(ms.reshape(len(ms), -1).mean(1) if len(ms) else np.zeros(0))
    dt = time.perf_counter() - t0
    if task == "detect":  # unchanged layout: arr_0 .. arr_{N-1} only
        np.savez_compressed(out, *dets)
    else:
        np.savez_compressed(out, *dets, **extra, speed=np.array(speed, np.float32).reshape(-1, 3))
    n = np.array([len(d) for d in dets])
    note = ""
    dg = np.concatenate(diag) if diag else np.zeros(0)
    if task == "obb" and dg.size:
        note = f"  angle rad min {dg.min():.3f} max {dg.max():.3f} std {dg.std():.3f}"
    elif task == "pose" and dg.size:
        note = f"  kpt x std {dg[:, 0].std():.1f} y std {dg[:, 1].std():.1f}" + (
            f" conf min {dg[:, 2].min():.3f} max {dg[:, 2].max():.3f}" if dg.shape[1] > 2 else ""
        )
    elif task == "segment" and dg.size:
        note = f"  mask area/frame mean {dg.mean():.4f} min {dg.min():.5f} max {dg.max():.4f}"
    print(
        f"{os.path.basename(path)}: {'RTDETR' if rt else 'YOLO'} task={task} predict imgsz={imgsz} "
        f"conf={conf} iou={iou}{' retina_masks' if retina else ''} frames={len(frames)}  "
        f"detections/frame mean {n.mean():.1f} median {np.median(n):.0f} min {n.min()} max {n.max()}  "
        f"({dt / len(frames) * 1e3:.0f} ms/frame)"
        f"{note}  -> {out}",
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
    ap.add_argument(
        "--retina",
        action="store_true",
        help="segment models: predict with retina_masks=True (masks made at the frame size); default --out "
        "<name>.ultra-retina.npz; other tasks are skipped",
    )
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
        if a.retina and model_meta(m)[0] != "segment":
            print(f"{os.path.basename(m)}: not a segment model, --retina skips it", flush=True)
            continue
        out = a.out or os.path.splitext(m)[0] + (".ultra-retina.npz" if a.retina else ".ultra.npz")
        run(m, frames, imgsz, a.conf, a.iou, out, retina=a.retina)
    print(f"network attempts: {len(NET)} {NET[:3]}")


if __name__ == "__main__":
    main()
