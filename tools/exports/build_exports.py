#!/usr/bin/env python3
"""Build realistic ONNX exports (end-to-end / embedded-NMS / RT-DETR; pose / obb / seg) for testing.

Usage, in the side venv that has Ultralytics and torch (after
``source ../shared/tools/realistic-models/bench_env.sh``: the team's peer tools, outside the repo;
it sets ``$VENV``, ``$BENCH_FRAMES`` and Ultralytics' offline switches)::

    $VENV/bin/python tools/exports/build_exports.py build [NAME ...] --out DIR   # default: all
    $VENV/bin/python tools/exports/build_exports.py inspect [FILE ...] --out DIR # default: DIR/*.onnx

NAME is one of yolo26n, yolov10n, yolov8n-nms, rtdetr-l (detect), yolov8n-pose, yolov8n-obb, yolov8n-seg
(classic heads Pose / OBB / Segment: raw [1, 4+nc+extra, A] output, NMS in the predictor), yolo26n-pose,
yolo26n-obb, yolo26n-seg (YOLO26 end-to-end heads Pose26 / OBB26 / Segment26: [1, 300, 6+extra] one-to-one
top-k output, no NMS); the word ``build`` may be left out. Options (both subcommands): ``--out DIR``
where the exports, ``build_log.json`` and ``inspect.json`` go (default /tmp/e2e-models); ``--frames PATH``
the benchmark frames .npy (default ``$BENCH_FRAMES``, else /tmp/bench-frames/frames.npy); ``--peers DIR``
the peer tools, for ``make_frames.py`` (default ../shared/tools/realistic-models beside the repo). A
measuring tool run by hand, not part of the package: nothing in agent/, pipelines/ or models/ imports it,
nor do the tests.

Recipe follows ../shared/tools/realistic-models/make_peer_models.sh: architecture from Ultralytics'
YAML (no weight download), torch.manual_seed(0) random init, exported by Ultralytics' own exporter
(format=onnx, opset=17, simplify=True, dynamic=False, half=False, batch=1, device=cpu), export date in
the metadata pinned to 1970-01-01 so the files are byte-reproducible. Files: NAME-S.onnx and
NAME-busy-S.onnx, for S in 320 and 640. YAML names (Ultralytics 8.4.190's cfg/models): yolov8n-pose.yaml
(nc 1, kpt_shape [17, 3]), yolov8n-obb.yaml (nc 80), yolov8n-seg.yaml (nc 80, 32 protos), yolo26n-pose.yaml
-> 26/yolo26-pose.yaml (nc 80, kpt_shape [17, 3]), yolo26n-obb.yaml -> 26/yolo26-obb.yaml, yolo26n-seg.yaml
-> 26/yolo26-seg.yaml (scale n each).

"busy" variants (suffix -busy before the size, e.g. yolo26n-busy-640.onnx, so that the size stays the
last '-' field of the name): separately per input size, (a) every BatchNorm's running statistics are
re-estimated on the first 32 benchmark frames (letterboxed, pad 114, RGB, /255), then (b) the class-logit
bias of the head that the export actually uses is set to one constant so that the wanted number of
candidates pass score 0.25 on those 32 frames:
  yolov8n-nms (nms=True),  one-to-many head cv3[i][-1] (Pose / OBB / Segment subclass Detect: their class
  yolov8n-pose, -obb, -seg logits are cv3[i][-1] too); 1% of anchors have max class score > 0.25
                           (yolov8n-nms: identical weights to make_peer_models.sh's yolov8n-busy-*).
                           After Ultralytics' NMS (iou 0.7): ~15-20 detections/frame @320, ~50-70 @640
  yolo26n, yolov10n,       one-to-one head one2one_cv3[i][-1] (Pose26 / OBB26 / Segment26 likewise); the
  yolo26n-pose, -obb, -seg (anchor, class) pairs with score > 0.25 number 0.7% of the anchors per frame on
                           average (~59 @640, ~15 @320) -- counted per pair because the end-to-end top-k
                           may return one anchor with several classes. The per-frame count is heavy-tailed
                           (pose/obb @320: 21 of 200 frames have none, one has the full 300)
  rtdetr-l                 decoder score heads dec_score_head[*] (only the last one, eval_idx=-1, is
                           used at inference); 50 (query, class) pairs per frame > 0.25 at both sizes.
                           Also: the inference decoder layer's bbox head (zero-initialised by Ultralytics,
                           which makes every box its w == h anchor) gets seeded random weights so boxes
                           move off the anchor grid and w != h (see build()).
  segmentation (both)      also (c): the mask-coefficient layer of the head in use (cv4[i][-1], or
                           one2one_cv4[i][-1] for yolo26n-seg) gets its bias set to minus the mean
                           coefficient vector of the calibration candidates that pass 0.25. Without it the
                           kept boxes' coefficients share a common offset and, the prototypes being SiLU
                           outputs with a positive mean, their masks filled a median 92 % of their box
                           (yolo26n-seg), nearly mask == box; with it about half (median 0.45-0.57 of the
                           box area at both sizes). Boxes and scores are unaffected (see build()).
Pose and OBB heads need no such fix: no layer of Pose / Pose26 / OBB / OBB26 is zero-initialised and the
busy exports give distinct keypoints (per-detection spread ~15-30 px, confidences 0..1) and distinct angles
(OBB: (sigmoid - 0.25) * pi in [-pi/4, 3pi/4]; OBB26: the raw, unbounded logit, seen -6.5 .. 6.1 rad).
With one seed, heads built in the same order get the same weights: the class scores (hence the candidate
counts) of yolov8n-obb and yolov8n-seg are identical, and likewise those of yolo26n-pose, -obb and -seg; the
boxes (OBB: rotated) and the task outputs differ. Plain (not busy) exports give no detection at 0.25.
BatchNorm re-estimation runs the network in train mode for YOLO (exactly as make_peer_models.sh);
for RT-DETR only the BatchNorm modules are put in train mode (its decoder's train mode wants targets
for denoising queries).

``inspect`` prints each file's inputs, outputs and Ultralytics metadata and, for the busy ones, the
boxes > 0.25 per frame over 20 frames spread over the set (frames 0, 10, ..., 190) with ONNX Runtime;
it merges its rows into DIR/inspect.json.
"""

import argparse
import ast
import hashlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

NET = []  # record any network attempt (there should be none)
sys.addaudithook(
    lambda e, a: (
        NET.append((e, repr(a)[:120]))
        if e in ("socket.connect", "socket.getaddrinfo", "urllib.Request")
        else None
    )
)

# Imported after the audit hook on purpose: it records what these imports do too.
import cv2  # noqa: E402
import numpy as np  # noqa: E402

DEFAULT_OUT = "/tmp/e2e-models"
DEFAULT_FRAMES = os.environ.get("BENCH_FRAMES", "/tmp/bench-frames/frames.npy")
# The team's peer tools, beside the repo: <repo>/../shared/tools/realistic-models.
DEFAULT_PEERS = Path(__file__).resolve().parents[3] / "shared" / "tools" / "realistic-models"
CONF = 0.25
N_CAL = 32

SPECS = {
    # name: (class, yaml, nms, busy kind, sizes)
    "yolo26n": ("YOLO", "yolo26n.yaml", False, "e2e", (320, 640)),
    "yolov10n": ("YOLO", "yolov10n.yaml", False, "e2e", (320, 640)),
    "yolov8n-nms": ("YOLO", "yolov8n.yaml", True, "v8", (320, 640)),
    "rtdetr-l": ("RTDETR", "rtdetr-l.yaml", False, "rtdetr", (320, 640)),
    # pose / oriented-box / segmentation (issue 34): classic heads (raw output, NMS in the predictor) ...
    "yolov8n-pose": ("YOLO", "yolov8n-pose.yaml", False, "v8", (320, 640)),
    "yolov8n-obb": ("YOLO", "yolov8n-obb.yaml", False, "v8", (320, 640)),
    "yolov8n-seg": ("YOLO", "yolov8n-seg.yaml", False, "v8", (320, 640)),
    # ... and YOLO26 end-to-end heads (Pose26 / OBB26 / Segment26, one-to-one top-k in the graph)
    "yolo26n-pose": ("YOLO", "yolo26n-pose.yaml", False, "e2e", (320, 640)),
    "yolo26n-obb": ("YOLO", "yolo26n-obb.yaml", False, "e2e", (320, 640)),
    "yolo26n-seg": ("YOLO", "yolo26n-seg.yaml", False, "e2e", (320, 640)),
}
E2E_FRAC = 0.007  # e2e: mean (anchor, class) pairs > CONF per frame = 0.7 % of anchors
V8_FRAC = 0.01  # v8: fraction of anchors with max class score > CONF (make_peer_models.sh)
RTDETR_PER_FRAME = 50  # rtdetr: mean (query, class) pairs > CONF per frame
RTDETR_BOX_STD = 0.5  # rtdetr busy: std of the inference bbox head's logit-space box delta


def letterbox(f, s):
    """480x640 BGR -> s x s (Ultralytics LetterBox auto=False, pad 114), uint8 BGR."""
    h0, w0 = f.shape[:2]
    r = min(s / h0, s / w0)
    w, h = round(w0 * r), round(h0 * r)
    img = f if (w, h) == (w0, h0) else cv2.resize(f, (w, h), interpolation=cv2.INTER_LINEAR)
    dw, dh = (s - w) / 2, (s - h) / 2
    top, left = round(dh - 0.1), round(dw - 0.1)
    pad = np.full((s, s, 3), 114, np.uint8)
    pad[top : top + h, left : left + w] = img
    return pad


def blob(frames, s):
    """letterbox, BGR->RGB, HWC->CHW, /255 float32 -> (N,3,s,s)."""
    x = np.stack([letterbox(f, s)[..., ::-1].transpose(2, 0, 1) for f in frames])
    return np.ascontiguousarray(x, dtype=np.float32) / 255


def calib_frames(peers, frames_path):
    sys.path.insert(0, str(peers))
    from make_frames import make_frames

    fr = make_frames(n=N_CAL)  # == first 32 benchmark frames (checked below)
    bench = np.load(frames_path, mmap_mode="r")
    assert np.array_equal(fr, bench[:N_CAL]), "make_frames(32) != frames.npy[:32]"
    return fr


def layer_outputs(net, x, layers, take):
    """What ``take(layer, output)`` gives for each of ``layers`` while ``net`` runs on ``x`` in
    batches of 8: concatenated over the layers (axis 2), then over the batches (axis 0)."""
    import torch

    got = []
    hooks = [m.register_forward_hook(lambda m, a, o: got.append(take(m, o))) for m in layers]
    per_batch = []
    with torch.no_grad():
        for i in range(0, len(x), 8):
            got.clear()
            net(x[i : i + 8])
            per_batch.append(torch.cat(got, 2))
    for h in hooks:
        h.remove()
    return torch.cat(per_batch)


def build(name, busy, imgsz, peers, frames_path):
    import torch
    from ultralytics import RTDETR, YOLO

    cls, yaml, _, kind, _ = SPECS[name]
    torch.manual_seed(0)
    model = (YOLO if cls == "YOLO" else RTDETR)(yaml)  # architecture only; nothing downloaded
    if not busy:
        return model, None
    net = model.model
    x = torch.from_numpy(blob(calib_frames(peers, frames_path), imgsz))
    bns = [m for m in net.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over all calibration batches
    if kind == "rtdetr":
        net.eval()
        for m in bns:
            m.train()
    else:
        net.train()
    with torch.no_grad():
        for i in range(0, len(x), 8):
            net(x[i : i + 8])
    net.eval()
    head = net.model[-1]
    bbox_info = ""
    if kind == "rtdetr":
        # With Ultralytics' init the bbox heads' last layers are zero, so every output box IS its encoder
        # anchor (w == h in {0.05, 0.1, 0.2}). Give the inference layer's bbox head seeded random weights,
        # scaled so the logit-space box delta has std RTDETR_BOX_STD on the calibration frames: boxes then
        # move and get w != h. Scores are unaffected (this is the last layer; score head reads the features).
        bl = head.dec_bbox_head[head.decoder.eval_idx].layers[-1]
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            bl.weight.copy_(torch.randn(bl.weight.shape, generator=g))
        d = []
        hk = bl.register_forward_hook(lambda m, a, o: d.append(o - m.bias))
        with torch.no_grad():
            for i in range(0, len(x), 8):
                net(x[i : i + 8])
        hk.remove()
        sd = torch.cat([t.flatten() for t in d]).std().item()
        with torch.no_grad():
            bl.weight.mul_(RTDETR_BOX_STD / sd)
        bbox_info = (
            f"; dec_bbox_head[{head.decoder.eval_idx}] last layer weight = N(0,1) (seed 1)"
            f" x {RTDETR_BOX_STD / sd:.4g}"
        )
    if kind == "rtdetr":
        hooked = [head.dec_score_head[head.decoder.eval_idx]]
        set_bias = list(head.dec_score_head)
    elif kind == "e2e":
        hooked = set_bias = [head.one2one_cv3[i][-1] for i in range(head.nl)]
    else:
        hooked = set_bias = [head.cv3[i][-1] for i in range(head.nl)]

    def unbiased(m, o):
        z = o - (m.bias.view(1, -1, 1, 1) if o.ndim == 4 else m.bias)
        return z.flatten(2) if o.ndim == 4 else z.transpose(1, 2)  # (B, nc, A) / (B, nc, Q)

    z = layer_outputs(net, x, hooked, unbiased)  # (N, nc, A) bias-free logits
    n, _nc, n_anchors = z.shape
    if kind == "v8":  # recipe of make_peer_models.sh: 1 % of anchors (max over classes) above CONF
        q = torch.quantile(z.max(1).values.flatten(), 1 - V8_FRAC).item()
        target = f"{V8_FRAC:.0%} of anchors (max class)"
    else:
        per = E2E_FRAC * n_anchors if kind == "e2e" else RTDETR_PER_FRAME
        k = round(per * n)
        q = torch.topk(z.flatten(), k + 1).values[-2:].mean().item()  # between k-th and (k+1)-th pair logit
        target = f"{per:.1f} (anchor/query, class) pairs per frame"
    shift = math.log(CONF / (1 - CONF)) - q
    with torch.no_grad():
        for h in set_bias:
            h.bias.fill_(shift)
    if hasattr(head, "proto"):  # Segment / Segment26
        # Centre the mask coefficients of the boxes that are kept. With the random init the coefficients
        # of the anchors that pass the score threshold share a common offset (it comes with the features
        # that make their class logits high) and the prototypes (SiLU outputs) have a positive mean, so
        # their mask logit is mostly that product: yolo26n-seg's masks filled a median 92 % of their box,
        # which would hide a wrong crop or proto mapping. Set each coefficient channel's bias so that its
        # mean over the (frame, anchor)s with max class score > CONF on the calibration frames is 0. Boxes
        # and scores are unaffected (last layer of the separate mask-coefficient branch).
        convs = [(head.one2one_cv4 if kind == "e2e" else head.cv4)[i][-1] for i in range(head.nl)]
        c = layer_outputs(net, x, convs, unbiased)  # (N, nm, A), anchors in the order of z
        sel = z.max(1).values + shift > math.log(CONF / (1 - CONF))  # (N, A) kept candidates
        mean = c.transpose(1, 2)[sel].mean(0)  # (nm,)
        with torch.no_grad():
            for m in convs:
                m.bias.copy_(-mean)
        bbox_info += (
            f"; mask-coefficient bias of {len(convs)} layer(s) = -(mean over {int(sel.sum())} kept"
            f" candidates), mean |.| {mean.abs().mean():.4f}"
        )
    info = (
        f"{len(bns)} BN layers re-estimated on {n} frames; class bias of {len(set_bias)} layer(s) = "
        f"{shift:.4f} (target {target}){bbox_info}"
    )
    print(f"busy calibration {name}@{imgsz}: {info}", flush=True)
    return model, info


def export_one(name, busy, imgsz, out, peers, frames_path):
    import onnx

    nms = SPECS[name][2]
    dst = out / f"{name}{'-busy' if busy else ''}-{imgsz}.onnx"
    t0 = time.time()
    model, info = build(name, busy, imgsz, peers, frames_path)
    f = model.export(
        format="onnx",
        imgsz=imgsz,
        opset=17,
        simplify=True,
        dynamic=False,
        half=False,
        nms=nms,
        batch=1,
        device="cpu",
        verbose=False,
    )
    shutil.move(f, dst)
    m = onnx.load(str(dst))
    for p in m.metadata_props:  # pin the only run-dependent bytes (export timestamp)
        if p.key == "date":
            p.value = "1970-01-01T00:00:00+00:00"
    onnx.save(m, str(dst))
    h = hashlib.sha256(dst.read_bytes()).hexdigest()
    print(f"{dst}  {dst.stat().st_size} bytes  sha256={h}  ({time.time() - t0:.1f} s)", flush=True)
    return {"file": str(dst), "bytes": dst.stat().st_size, "sha256": h, "calibration": info}


def cmd_build(names, out, peers, frames_path):
    import traceback

    out.mkdir(parents=True, exist_ok=True)
    # A model built from a YAML is exported to <yaml stem>.onnx in the working directory: export in a
    # scratch directory, then move the file to --out (every path used below is absolute, see main()).
    work = tempfile.mkdtemp(prefix="e2e-export.", dir="/tmp")
    os.chdir(work)
    log = {}
    lp = out / "build_log.json"
    if lp.exists():
        log = json.loads(lp.read_text())
    for name in names:
        _, _, _, kind, sizes = SPECS[name]
        for busy in (False, True) if kind else (False,):
            for s in sizes:
                key = f"{name}{'-busy' if busy else ''}-{s}"
                try:
                    log[key] = export_one(name, busy, s, out, peers, frames_path)
                except Exception as e:  # report and move on
                    traceback.print_exc()
                    log[key] = {"error": f"{type(e).__name__}: {e}"}
                    print(f"FAILED {key}: {type(e).__name__}: {e}", flush=True)
                lp.write_text(json.dumps(log, indent=1))
    os.chdir("/")
    shutil.rmtree(work, ignore_errors=True)
    print(f"network attempts during build/export: {len(NET)} {NET[:3]}")


def count_boxes(out, nc, rtdetr=False, conf=CONF):
    """boxes with score > conf in one frame's first output (score column / max class score).

    nc is the number of classes (len(names) of the metadata). Layouts: RT-DETR [1, 300, 4+nc] (max class
    score); end-to-end / embedded NMS [1, 300, 6+extra] rows x y x y|cx cy w h, score, class, extra (extra:
    pose 3*K keypoint values, obb 1 angle, seg 32 mask coefficients; score column 4); otherwise the raw
    pre-NMS candidates [1, 4+nc+extra, A] (max class score over rows 4 .. 4+nc)."""
    o = out[0]
    if rtdetr:
        return int((o[:, 4 : 4 + nc].max(1) > conf).sum())
    if o.ndim == 2 and o.shape[-1] < o.shape[0]:  # [300, 6+extra]
        return int((o[:, 4] > conf).sum())
    return int((o[4 : 4 + nc].max(0) > conf).sum())  # [4+nc+extra, A] raw (pre-NMS candidates)


def cmd_inspect(files, out, frames_path):
    import onnxruntime as ort

    frames = np.load(frames_path, mmap_mode="r")
    sel = list(range(0, len(frames), 10))[:20]  # 20 frames spread over the set (0, 10, ..., 190)
    rows = {}
    for f in files:
        so = ort.SessionOptions()
        sess = ort.InferenceSession(str(f), so, providers=["CPUExecutionProvider"])
        md = sess.get_modelmeta().custom_metadata_map
        ins = [(i.name, i.shape, i.type) for i in sess.get_inputs()]
        outs = [(o.name, o.shape, o.type) for o in sess.get_outputs()]
        names = md.get("names", "")
        nc = len(ast.literal_eval(names)) if names else 80
        r = {
            "inputs": ins,
            "outputs": outs,
            "end2end": md.get("end2end"),
            "args": md.get("args"),
            "task": md.get("task"),
            "kpt_shape": md.get("kpt_shape"),
            "imgsz": md.get("imgsz"),
            "head": md.get("head"),
            "date": md.get("date"),
            "names_count": nc,
            "names[:3]": ", ".join(names.strip("{}").split(", ")[:3]),
        }
        print(f"== {Path(f).name}  ({Path(f).stat().st_size} bytes)")
        for k, v in r.items():
            print(f"   {k}: {v}")
        if "-busy-" in Path(f).name:
            s = ins[0][1][2]
            x = blob(frames[sel], s)
            counts, t = [], time.perf_counter()
            for i in range(len(sel)):
                y = sess.run(None, {ins[0][0]: x[i : i + 1]})[0]
                counts.append(count_boxes(y, nc, rtdetr=md.get("head") == "RTDETRDecoder"))
            ms = (time.perf_counter() - t) * 1e3 / len(sel)
            r["boxes>0.25 per frame (20 frames)"] = {
                "mean": float(np.mean(counts)),
                "min": int(min(counts)),
                "max": int(max(counts)),
                "per_frame": counts,
            }
            r["ort_ms_per_frame"] = round(ms, 1)
            print(
                f"   boxes>0.25 per frame over frames {sel[0]}..{sel[-1]} step 10: "
                f"mean {np.mean(counts):.1f} min {min(counts)} max {max(counts)}  "
                f"({ms:.0f} ms/frame ORT)  {counts}"
            )
        rows[Path(f).name] = r
    p = out / "inspect.json"
    old = json.loads(p.read_text()) if p.exists() else {}
    old.update(rows)
    p.write_text(json.dumps(old, indent=1))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in ("build", "inspect", "-h", "--help"):
        argv = ["build", *argv]  # the subcommand may be left out: build
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--out", default=DEFAULT_OUT, help=f"where the exports and the JSON logs go (default {DEFAULT_OUT})"
    )
    common.add_argument(
        "--frames",
        default=DEFAULT_FRAMES,
        help=f"benchmark frames .npy (default: $BENCH_FRAMES, else /tmp/bench-frames/frames.npy; "
        f"here {DEFAULT_FRAMES})",
    )
    common.add_argument(
        "--peers",
        default=str(DEFAULT_PEERS),
        help=f"the peer tools, for make_frames.py (default {DEFAULT_PEERS})",
    )
    ap = argparse.ArgumentParser(
        description="Build realistic Ultralytics ONNX exports (plain and busy), or inspect them."
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", parents=[common], help="build exports (default: all)")
    b.add_argument("names", nargs="*", metavar="NAME", help=f"one of {', '.join(SPECS)} (default: all)")
    insp = sub.add_parser(
        "inspect", parents=[common], help="describe exports (default: every .onnx in --out)"
    )
    insp.add_argument("files", nargs="*", metavar="FILE")
    a = ap.parse_args(argv)
    # Absolute: cmd_build works from a scratch directory.
    out, frames_path, peers = (Path(p).resolve() for p in (a.out, a.frames, a.peers))
    if a.cmd == "inspect":
        cmd_inspect(a.files or sorted(out.glob("*.onnx")), out, frames_path)
    else:
        unknown = [n for n in a.names if n not in SPECS]
        if unknown:
            b.error(f"unknown NAME {', '.join(unknown)}: choose from {', '.join(SPECS)}")
        cmd_build(a.names or list(SPECS), out, peers, frames_path)


if __name__ == "__main__":
    main()
