"""Train the bundled ``shapes-det`` detector on synthetic scenes and export it to ONNX.

The model is a tiny anchor-free YOLO-style CNN (two strides, 8 and 16) whose exported graph
follows the Ultralytics YOLOv8 layout the agent decodes: input ``images`` uint8 NHWC BGR
[batch, 320, 320, 3] (normalisation inside the graph), output ``output0`` float32
[batch, 4 + num_classes, anchors] with rows cx, cy, w, h (model-input pixels) followed by
sigmoid class scores.

Training data is rendered on the fly from ``edge_agent.pipelines.sources.synthetic`` with seeds
below 1_000_000; the held-out seeds 1_000_000..1_000_009 are only used for the final
evaluation (VOC mAP@0.5 through onnxruntime, as the agent would run it).

Run (CPU only, ~30 min on 2 cores):

    pip install -e '.[train]'
    python tools/train_detector.py            # writes models/shapes-det/{model.onnx,manifest.yaml}
"""

from __future__ import annotations

import argparse
import copy
import math
import random
import time
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from edge_agent.pipelines.preprocess import Letterbox, boxes_to_input, boxes_to_source, letterbox_into
from edge_agent.pipelines.sources.synthetic import CLASSES, SceneSpec, SyntheticScene

NUM_CLASSES = len(CLASSES)
STRIDES = (8, 16)
PAD_VALUE = 114
HELD_OUT_SEED = 1_000_000  # seeds >= this are never used for training
DIFFICULT_VIS = 0.5  # objects less visible than this are "difficult": ignored in loss and eval
# Source frame sizes: mostly the default camera size, some others so letterboxing varies.
FRAME_SIZES = [(640, 480)] * 6 + [(960, 540), (480, 480), (800, 600)]


# ----------------------------------------------------------------------------- data


def random_spec(rng: random.Random) -> SceneSpec:
    w, h = rng.choice(FRAME_SIZES)
    return SceneSpec(
        width=w,
        height=h,
        seed=rng.randrange(0, HELD_OUT_SEED),
        num_objects=rng.randint(2, 10),
        noise_sigma=rng.uniform(2.0, 12.0),
    )


class ScenePool:
    """A rotating pool of scenes: building one costs ~0.1 s (its noise bank), rendering ~0.2 ms.

    Replacing a few scenes every batch keeps the per-step cost small while the model still
    sees thousands of different backgrounds over a run.
    """

    def __init__(self, rng: random.Random, size: int, refresh: int, imgsz: int) -> None:
        self.rng = rng
        self.refresh = refresh
        self.imgsz = imgsz
        self.scenes = [self._new_scene() for _ in range(size)]

    def _new_scene(self):
        scene = SyntheticScene(random_spec(self.rng))
        s = scene.spec
        frame = np.empty((s.height, s.width, 3), np.uint8)
        gt = np.empty((s.num_objects, 6), np.float32)
        return scene, frame, gt

    def batch(self, n: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """Return letterboxed uint8 images (n, S, S, 3) and per-image targets (k, 6) in input px."""
        for _ in range(self.refresh):
            self.scenes[self.rng.randrange(len(self.scenes))] = self._new_scene()
        imgs = np.empty((n, self.imgsz, self.imgsz, 3), np.uint8)
        targets = []
        geo = Letterbox()
        for i in range(n):
            scene, frame, gt = self.rng.choice(self.scenes)
            scene.render(self.rng.randint(0, 5000), frame, gt)
            # Exactly the agent's preprocessing, so train and deploy inputs match bit for bit.
            letterbox_into(frame, imgs[i], PAD_VALUE, geo, area=True)
            t = gt.copy()
            boxes_to_input(t[:, 1:5], geo)
            targets.append(t)
        return imgs, targets


def pack_targets(targets: list[np.ndarray]) -> torch.Tensor:
    """Pad per-image targets to (B, M, 6); padded rows have class -1."""
    m = max(1, max(len(t) for t in targets))
    out = torch.full((len(targets), m, 6), -1.0)
    for i, t in enumerate(targets):
        out[i, : len(t)] = torch.from_numpy(t)
    return out


# ----------------------------------------------------------------------------- model


class ConvBNAct(nn.Sequential):
    def __init__(self, c1: int, c2: int, k: int = 3, s: int = 1) -> None:
        super().__init__(
            nn.Conv2d(c1, c2, k, s, k // 2, bias=False), nn.BatchNorm2d(c2), nn.SiLU(inplace=True)
        )


class Residual(nn.Module):
    """Two 3x3 convs with a skip: cheap depth, easy to train from scratch."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.a, self.b = ConvBNAct(c, c), ConvBNAct(c, c)

    def forward(self, x):
        return x + self.b(self.a(x))


class Head(nn.Module):
    """Decoupled per-level head: box distances (l, t, r, b) and class logits."""

    def __init__(self, c: int, nc: int) -> None:
        super().__init__()
        self.box = nn.Sequential(ConvBNAct(c, c), nn.Conv2d(c, 4, 1))
        self.cls = nn.Sequential(ConvBNAct(c, c), nn.Conv2d(c, nc, 1))
        # Start with ~1% scores so the many negatives don't swamp the first steps.
        nn.init.constant_(self.cls[-1].bias, -math.log(99.0))
        nn.init.constant_(self.box[-1].bias, 0.5)

    def forward(self, x):
        return self.box(x), self.cls(x)


class TinyYolo(nn.Module):
    """Backbone to stride 16, a one-step top-down FPN, heads at strides 8 and 16."""

    def __init__(self, nc: int = NUM_CLASSES, w: tuple[int, ...] = (16, 24, 48, 96)) -> None:
        super().__init__()
        c1, c2, c3, c4 = w
        self.stem = nn.Sequential(ConvBNAct(3, c1, 3, 2), ConvBNAct(c1, c2, 3, 2))  # /4
        self.s8 = nn.Sequential(ConvBNAct(c2, c3, 3, 2), Residual(c3))  # /8
        self.s16 = nn.Sequential(ConvBNAct(c3, c4, 3, 2), Residual(c4))  # /16
        self.lat = ConvBNAct(c4, c3, 1)
        self.fuse8 = ConvBNAct(2 * c3, c3)
        self.heads = nn.ModuleList([Head(c3, nc), Head(c4, nc)])

    def forward(self, x):
        """x: float NCHW in [0, 1]. Returns per-level (box_raw, cls_logits) pairs."""
        p8 = self.s8(self.stem(x))
        p16 = self.s16(p8)
        up = F.interpolate(self.lat(p16), scale_factor=2.0, mode="nearest")
        f8 = self.fuse8(torch.cat([p8, up], 1))
        return [self.heads[0](f8), self.heads[1](p16)]


def make_anchors(imgsz: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Anchor centres (A, 2) in input pixels and their strides (A, 1), level by level."""
    pts, strides = [], []
    for s in STRIDES:
        n = imgsz // s
        r = (torch.arange(n, dtype=torch.float32, device=device) + 0.5) * s
        yy, xx = torch.meshgrid(r, r, indexing="ij")
        pts.append(torch.stack([xx, yy], -1).reshape(-1, 2))
        strides.append(torch.full((n * n, 1), float(s), device=device))
    return torch.cat(pts), torch.cat(strides)


def flatten_levels(outs) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, A, 4) raw box outputs and (B, A, C) class logits over all levels."""
    box = torch.cat([b.flatten(2) for b, _ in outs], 2).transpose(1, 2)
    cls = torch.cat([c.flatten(2) for _, c in outs], 2).transpose(1, 2)
    return box, cls


def decode_xyxy(box_raw, anchors, strides):
    """Distances (l, t, r, b) = softplus(raw) * stride around each anchor centre."""
    d = F.softplus(box_raw) * strides
    return torch.cat([anchors - d[..., :2], anchors + d[..., 2:]], -1)


class ExportModel(nn.Module):
    """Deployment graph: uint8 NHWC BGR in, YOLOv8-layout [B, 4 + C, A] out."""

    def __init__(self, net: TinyYolo, imgsz: int) -> None:
        super().__init__()
        self.net = net
        anchors, strides = make_anchors(imgsz)
        self.register_buffer("anchors", anchors)
        self.register_buffer("strides", strides)

    def forward(self, images):
        x = images.permute(0, 3, 1, 2).float() * (1.0 / 255.0)
        box_raw, cls = flatten_levels(self.net(x))
        xyxy = decode_xyxy(box_raw, self.anchors, self.strides)
        cxcy = (xyxy[..., :2] + xyxy[..., 2:]) * 0.5
        wh = xyxy[..., 2:] - xyxy[..., :2]
        return torch.cat([cxcy, wh, cls.sigmoid()], -1).transpose(1, 2)


# ----------------------------------------------------------------------------- loss


def box_iou_pairwise(a, b, eps=1e-7):
    """IoU of boxes a (..., 4) against b (..., 4), broadcast elementwise."""
    lt = torch.maximum(a[..., :2], b[..., :2])
    rb = torch.minimum(a[..., 2:], b[..., 2:])
    inter = (rb - lt).clamp(min=0).prod(-1)
    area_a = (a[..., 2:] - a[..., :2]).clamp(min=0).prod(-1)
    area_b = (b[..., 2:] - b[..., :2]).clamp(min=0).prod(-1)
    return inter / (area_a + area_b - inter + eps)


def ciou_loss(p, t, eps=1e-7):
    """1 - CIoU for matched boxes (N, 4) xyxy."""
    iou = box_iou_pairwise(p, t, eps)
    cw = torch.maximum(p[:, 2], t[:, 2]) - torch.minimum(p[:, 0], t[:, 0])
    ch = torch.maximum(p[:, 3], t[:, 3]) - torch.minimum(p[:, 1], t[:, 1])
    c2 = cw**2 + ch**2 + eps
    dx = p[:, 0] + p[:, 2] - t[:, 0] - t[:, 2]
    dy = p[:, 1] + p[:, 3] - t[:, 1] - t[:, 3]
    rho2 = (dx**2 + dy**2) / 4  # squared centre distance
    wp, hp = p[:, 2] - p[:, 0], (p[:, 3] - p[:, 1]).clamp(min=eps)
    wt, ht = t[:, 2] - t[:, 0], (t[:, 3] - t[:, 1]).clamp(min=eps)
    v = (4 / math.pi**2) * (torch.atan(wt / ht) - torch.atan(wp / hp)) ** 2
    with torch.no_grad():
        alpha = v / (v - iou + (1 + eps))
    return 1 - (iou - rho2 / c2 - v * alpha)


@torch.no_grad()
def assign(scores, pred_xyxy, anchors, gt, topk=10, alpha=0.5, beta=6.0, eps=1e-9):
    """Task-aligned assignment (as in YOLOv8/TOOD), plus an ignore mask for difficult objects.

    scores (B, A, C) sigmoid, pred_xyxy (B, A, 4), anchors (A, 2), gt (B, M, 6).
    Returns target boxes (B, A, 4), IoU-aware target scores (B, A, C), positive mask (B, A)
    and a mask (B, A) of anchors whose classification loss counts.
    """
    b, a, _ = scores.shape
    m = gt.shape[1]
    gcls = gt[..., 0].long().clamp(min=0)
    gbox = gt[..., 1:5]
    valid = gt[..., 0] >= 0
    easy = valid & (gt[..., 5] >= DIFFICULT_VIS)

    # Anchor centre strictly inside the gt box.
    ax, ay = anchors[:, 0].view(1, 1, a), anchors[:, 1].view(1, 1, a)
    inside = (
        (ax > gbox[..., 0:1] + eps)
        & (ay > gbox[..., 1:2] + eps)
        & (ax < gbox[..., 2:3] - eps)
        & (ay < gbox[..., 3:4] - eps)
    )  # (B, M, A)

    cand = inside & easy.unsqueeze(-1)
    iou = box_iou_pairwise(pred_xyxy.unsqueeze(1), gbox.unsqueeze(2)).clamp(min=0)  # (B, M, A)
    iou = iou * cand
    cls_score = scores.gather(2, gcls.unsqueeze(1).expand(b, a, m)).transpose(1, 2)  # (B, M, A)
    metric = cls_score.pow(alpha) * iou.pow(beta) * cand

    k = min(topk, a)
    top_idx = metric.topk(k, dim=-1).indices
    is_top = torch.zeros_like(cand).scatter_(-1, top_idx, True)
    pos = is_top & cand  # (B, M, A)

    # An anchor claimed by several objects goes to the one it overlaps most.
    multi = pos.sum(1, keepdim=True) > 1
    best = F.one_hot(iou.argmax(1), m).permute(0, 2, 1).bool()
    pos = torch.where(multi, best & cand, pos)

    fg = pos.any(1)  # (B, A)
    gidx = pos.float().argmax(1)  # (B, A)
    tbox = gbox.gather(1, gidx.unsqueeze(-1).expand(b, a, 4))
    tcls = gcls.gather(1, gidx)

    # IoU-aware soft target: normalise the metric per object to its best IoU.
    metric = metric * pos
    norm = metric.amax(-1, keepdim=True) + eps
    quality = (metric * (iou * pos).amax(-1, keepdim=True) / norm).amax(1)  # (B, A)
    tscore = F.one_hot(tcls, scores.shape[-1]).float() * (quality * fg).unsqueeze(-1)

    # Anchors inside a difficult object (and not positive for a visible one): no cls loss,
    # since predicting or missing them is neither right nor wrong at evaluation.
    hard = valid & ~easy
    in_hard = (inside & hard.unsqueeze(-1)).any(1)
    cls_mask = fg | ~in_hard
    return tbox, tscore, fg, cls_mask


def detection_loss(outs, gt, anchors, strides, box_gain=5.0):
    box_raw, logits = flatten_levels(outs)
    pred_xyxy = decode_xyxy(box_raw, anchors, strides)
    tbox, tscore, fg, cls_mask = assign(logits.detach().sigmoid(), pred_xyxy.detach(), anchors, gt)
    norm = tscore.sum().clamp(min=1.0)
    bce = F.binary_cross_entropy_with_logits(logits, tscore, reduction="none")
    loss_cls = (bce * cls_mask.unsqueeze(-1)).sum() / norm
    if fg.any():
        w = tscore.sum(-1)[fg]
        loss_box = (ciou_loss(pred_xyxy[fg], tbox[fg]) * w).sum() / norm
    else:
        loss_box = pred_xyxy.sum() * 0.0
    return loss_cls + box_gain * loss_box, loss_cls.detach(), loss_box.detach()


# ----------------------------------------------------------------------------- training


class EMA:
    """Exponential moving average of weights; smooths the noisy end of a short run."""

    def __init__(self, model: nn.Module, decay: float = 0.999, tau: float = 500.0) -> None:
        self.ema = copy.deepcopy(model).eval()
        self.decay, self.tau, self.updates = decay, tau, 0
        for p in self.ema.parameters():
            p.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = self.decay * (1 - math.exp(-self.updates / self.tau))
        msd = model.state_dict()
        for k, v in self.ema.state_dict().items():
            if v.dtype.is_floating_point:
                v.mul_(d).add_(msd[k].detach(), alpha=1 - d)
            else:
                v.copy_(msd[k])


def lr_at(step: int, steps: int, base: float, warmup: int) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return base * (0.02 + 0.98 * 0.5 * (1 + math.cos(math.pi * t)))


def to_input(imgs: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(imgs).permute(0, 3, 1, 2).float().div_(255.0)


def train(args) -> TinyYolo:
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    model = TinyYolo()
    ema = EMA(model)
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if p.ndim <= 1 else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 5e-4}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        betas=(0.9, 0.99),
    )
    anchors, strides = make_anchors(args.imgsz)
    pool = ScenePool(rng, size=args.pool, refresh=1, imgsz=args.imgsz)
    with open(args.log, "a", buffering=1) as log:
        t0 = time.time()
        tl = t0
        model.train()
        run_cls = run_box = 0.0
        for step in range(args.steps):
            for g in opt.param_groups:
                g["lr"] = lr_at(step, args.steps, args.lr, warmup=min(300, args.steps // 10))
            imgs, targets = pool.batch(args.batch)
            outs = model(to_input(imgs))
            loss, lc, lb = detection_loss(outs, pack_targets(targets), anchors, strides)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 10.0)
            opt.step()
            ema.update(model)
            run_cls += float(lc)
            run_box += float(lb)
            if (step + 1) % 100 == 0 or step + 1 == args.steps:
                now = time.time()
                n = (step % 100) + 1
                msg = (
                    f"step {step + 1}/{args.steps} cls {run_cls / n:.4f} box {run_box / n:.4f} "
                    f"lr {opt.param_groups[0]['lr']:.2e} {n / (now - tl):.2f} steps/s "
                    f"elapsed {now - t0:.0f}s"
                )
                print(msg, flush=True)
                log.write(msg + "\n")
                run_cls = run_box = 0.0
                tl = now
    return ema.ema


# ----------------------------------------------------------------------------- export / eval


def export_onnx(net: TinyYolo, path: Path, imgsz: int) -> None:
    net = net.eval()
    model = ExportModel(net, imgsz).eval()
    dummy = torch.full((1, imgsz, imgsz, 3), PAD_VALUE, dtype=torch.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        (dummy,),
        str(path),
        opset_version=17,
        input_names=["images"],
        output_names=["output0"],
        dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}},
        do_constant_folding=True,
        dynamo=False,
    )
    # The TorchScript exporter leaves the output's class and anchor dims symbolic; the agent
    # (and TensorRT) prefer them static, only the batch axis is dynamic.
    import onnx

    proto = onnx.load(str(path))
    dims = proto.graph.output[0].type.tensor_type.shape.dim
    n_anchors = sum((imgsz // s) ** 2 for s in STRIDES)
    for d, v in zip(dims, ("batch", 4 + NUM_CLASSES, n_anchors)):
        if isinstance(v, str):
            d.dim_param = v
        else:
            d.dim_value = v
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))


def ort_session(path: Path, threads: int):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def evaluate(onnx_path: Path, imgsz: int, threads: int) -> tuple[float, list[float]]:
    """Held-out VOC mAP@0.5 of the exported model, scored as ``edge-agent eval`` scores it:
    the package's held-out frames (seeds 1e6..1e6+9, frames 0, 7, ..., 343), its decoder
    and class-aware NMS, its box mapping and its mAP (``edge_agent.checks.evaluation``)."""
    from edge_agent.checks.evaluation import FrameResult, heldout_images, mean_average_precision
    from edge_agent.models.decoders.base import DecodeParams
    from edge_agent.models.decoders.yolov8 import YoloV8

    sess = ort_session(onnx_path, threads)
    inp = np.empty((1, imgsz, imgsz, 3), np.uint8)
    geo = Letterbox()
    params = DecodeParams(score_threshold=0.001, iou_threshold=0.45, max_detections=300)
    decoder = YoloV8()
    results = []
    for image, gt in heldout_images(500):
        letterbox_into(image, inp[0], PAD_VALUE, geo, area=True)
        xyxy, scores, classes, _ = decoder.decode(tuple(sess.run(None, {"images": inp})), params)
        results.append(FrameResult(boxes_to_source(xyxy.copy(), geo), scores, classes, gt.copy()))
    return mean_average_precision(results, NUM_CLASSES)


def benchmark(onnx_path: Path, imgsz: int, threads: int, runs: int = 200) -> tuple[float, float]:
    sess = ort_session(onnx_path, threads)
    x = np.full((1, imgsz, imgsz, 3), PAD_VALUE, np.uint8)
    for _ in range(30):
        sess.run(None, {"images": x})
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, {"images": x})
        t.append((time.perf_counter() - t0) * 1e3)
    return float(np.percentile(t, 50)), float(np.percentile(t, 99))


MANIFEST = """\
# Written by tools/train_detector.py; held-out mAP@0.5 = {map:.4f} on 500 frames (seeds 1000000-1000009)
name: shapes-det
description: Small YOLOv8-layout detector trained on edge-agent's synthetic scenes
input:
  name: images
  height: {imgsz}
  width: {imgsz}
  layout: NHWC
  dtype: uint8
  color: bgr
  pad_value: {pad}
  interpolation: area  # as it was trained (tools/train_detector.py)
output:
  name: output0
  decoder: yolov8
labels: [{labels}]
score_threshold: 0.25
iou_threshold: 0.45
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="models/shapes-det", type=Path)
    ap.add_argument("--steps", type=int, default=2800)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--imgsz", type=int, default=320)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--pool", type=int, default=128, help="scenes kept in memory at once")
    ap.add_argument("--log", default="/tmp/train_detector.log")
    ap.add_argument("--ckpt", default="/tmp/shapes_det_ema.pt", help="EMA weights written here")
    ap.add_argument("--export-only", action="store_true", help="skip training: export --ckpt and evaluate")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cv2.setNumThreads(1)
    onnx_path = args.out / "model.onnx"

    if not args.export_only:
        t0 = time.time()
        net = train(args)
        print(f"trained {args.steps} steps in {time.time() - t0:.0f}s", flush=True)
        torch.save(net.state_dict(), args.ckpt)
    else:
        net = TinyYolo()
        net.load_state_dict(torch.load(args.ckpt))
    export_onnx(net, onnx_path, args.imgsz)

    mean_ap, aps = evaluate(onnx_path, args.imgsz, args.threads)
    per_class = ", ".join(f"{n} {a:.4f}" for n, a in zip(CLASSES, aps))
    print(f"held-out mAP@0.5 {mean_ap:.4f} ({per_class})", flush=True)
    p50, p99 = benchmark(onnx_path, args.imgsz, args.threads)
    print(f"onnxruntime CPU batch 1: p50 {p50:.2f} ms, p99 {p99:.2f} ms", flush=True)
    (args.out / "manifest.yaml").write_text(
        MANIFEST.format(map=mean_ap, imgsz=args.imgsz, pad=PAD_VALUE, labels=", ".join(CLASSES))
    )


if __name__ == "__main__":
    main()
