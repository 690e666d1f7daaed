"""``edge-agent selftest``: what a device can do, checked on the device itself.

On a Jetson it builds TensorRT engines for the bundled detector (GPU, and each DLA core
present), runs ONNX Runtime on the CPU and TensorRT on the same held-out synthetic
frames, compares the raw output tensors (FP16 tolerance) and the matched detections,
and records layer placement, per-part timings, clocks and the power mode. Elsewhere it
says plainly that TensorRT is not there and checks the rest. Every check ends as
``pass``, ``fail`` or ``skip`` with its reason; the report goes to a JSON and a
Markdown file.
"""

from __future__ import annotations

import glob
import json
import platform
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent import __version__
from edge_agent.checks.evaluation import FrameResult, heldout_images, mean_average_precision
from edge_agent.core.files import atomic_write, read_text
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig, TensorRTConfig
from edge_agent.models.decoders.nms import box_iou
from edge_agent.pipelines.preprocess import Letterbox, boxes_to_source

# FP16 engines against the FP32 CPU model: scores are sigmoid outputs in 0..1, boxes are
# input pixels; these bounds are loose enough for FP16 rounding, tight enough for a bug.
SCORE_ATOL = 0.03
BOX_ATOL_PX = 2.0
MIN_MATCHED = 0.95


@dataclass
class Check:
    name: str
    status: str  # pass | fail | skip
    detail: str
    data: dict[str, Any] = field(default_factory=dict)


def _run(cmd: list[str], timeout_s: float = 5.0) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"({cmd[0]} unavailable: {e})"
    return (out.stdout + out.stderr).strip()


def platform_check() -> Check:
    import cv2

    from edge_agent.pipelines.sources.live import has_gstreamer
    from edge_agent.power import sysfs

    data = {
        "edge_agent": __version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "l4t": sysfs.detect().l4t,
        "model": read_text("/proc/device-tree/model"),
        "opencv": cv2.__version__,
        "opencv_gstreamer": has_gstreamer(),
    }
    detail = f"{data['model'] or platform.machine()}; L4T: {data['l4t'] or 'not a Jetson'}"
    return Check("platform", "pass", detail, data)


def clocks_check() -> Check:
    """The power mode and clocks as the device reports them (read only)."""
    data: dict[str, Any] = {}
    if Path("/usr/sbin/nvpmodel").exists() or Path("/usr/bin/nvpmodel").exists():
        data["nvpmodel"] = _run(["nvpmodel", "-q"])
    for f in sorted(glob.glob("/sys/class/devfreq/*/cur_freq")):
        name = Path(f).parent.name
        data[f"devfreq {name} cur_freq_hz"] = read_text(f)
    if not data:
        return Check("clocks", "skip", "no nvpmodel and no devfreq devices (not a Jetson)")
    return Check("clocks", "pass", "; ".join(f"{k}: {v}" for k, v in data.items())[:300], data)


def _run_model(model: Any, frames: int) -> tuple[list[np.ndarray], list[FrameResult], list[float], dict]:
    io = model.backend.allocate()
    model.backend.warmup(io)
    geo = Letterbox()
    raw, results, times = [], [], []
    parts: dict[str, list[float]] = {}
    for image, gt in heldout_images(frames):
        t = time.perf_counter()
        xyxy, scores, classes, _ = model.run_one(image, io, geo)
        times.append((time.perf_counter() - t) * 1000)
        for k, v in model.backend.timings(io).items():
            parts.setdefault(k, []).append(v)
        raw.append(io.outputs[model.output_index].copy())
        results.append(FrameResult(boxes_to_source(xyxy.copy(), geo), scores, classes, gt.copy()))
    return raw, results, times, {k: float(np.median(v)) for k, v in parts.items()}


def compare(
    ref: list[np.ndarray], got: list[np.ndarray], ref_res: list[FrameResult], got_res: list[FrameResult]
):
    """Raw-tensor differences and the share of reference detections found again."""
    score_err = box_err = 0.0
    for a, b in zip(ref, got):
        a, b = a.reshape(a.shape[-2], -1), b.reshape(b.shape[-2], -1).astype(np.float32)
        box_err = max(box_err, float(np.max(np.abs(a[:4] - b[:4]))))
        score_err = max(score_err, float(np.max(np.abs(a[4:] - b[4:]))))
    found = total = 0
    for r, g in zip(ref_res, got_res):
        keep = r.scores >= 0.25
        total += int(keep.sum())
        if not keep.any() or not len(g.scores):
            continue
        iou = box_iou(r.xyxy[keep].astype(np.float64), g.xyxy.astype(np.float64))
        same = r.class_ids[keep][:, None] == g.class_ids[None, :]
        found += int(np.any((iou >= 0.5) & same, axis=1).sum())
    return score_err, box_err, (found / total if total else 1.0)


@dataclass(frozen=True)
class Target:
    """One TensorRT configuration the self-test builds, runs and compares with the CPU."""

    name: str
    core: int = -1  # the model engine's DLA core; -1: GPU
    preprocess: str = "cpu"  # cpu | gpu | dla: where the float variant's normalisation runs
    zero_copy: bool = True
    answers: str = ""  # the open question (docs/jetson.md) this target settles on a device
    # off: plain execute_async_v3 (what the other targets check); on: replayed CUDA graphs,
    # also compared with a plain run of the same engine on the same frames.
    cuda_graphs: str = "off"


def tensorrt_targets(n_dla: int) -> list[Target]:
    """Every target for a device with ``n_dla`` DLA cores (the DLA ones only where present)."""
    targets = [
        Target("tensorrt-gpu", answers="zero-copy (mapped) buffers on the GPU"),
        Target("tensorrt-gpu-copy", zero_copy=False, answers="device buffers and async copies"),
        Target("tensorrt-gpu-preprocess-gpu", preprocess="gpu", answers="device preprocessing on the GPU"),
        Target(
            "tensorrt-gpu-graphs",
            cuda_graphs="on",
            answers="CUDA graph capture (cuda-python) on pycuda's streams, replay against plain execution",
        ),
        Target(
            "tensorrt-gpu-copy-preprocess-graphs",
            zero_copy=False,
            preprocess="gpu",
            cuda_graphs="on",
            answers="graphs holding the preprocessing engine and the output copies",
        ),
    ]
    for i in range(n_dla):
        targets.append(Target(f"tensorrt-dla{i}", core=i, answers="the model on a DLA core, zero-copy I/O"))
    if n_dla:
        targets += [
            Target("tensorrt-dla0-copy", core=0, zero_copy=False, answers="DLA I/O through device buffers"),
            Target(
                "tensorrt-gpu-preprocess-dla",
                preprocess="dla",
                answers="Shuffle/Scale/Gather on the DLA (the preprocessing engine's placement)",
            ),
        ]
    return targets


def skipped_targets(reason: str, n_dla: int = 1) -> list[Check]:
    """The targets as skipped checks, each with the reason (off-device, or no DLA)."""
    return [Check(t.name, "skip", f"{reason} (would check: {t.answers})") for t in tensorrt_targets(n_dla)]


def float_variant(folder: str) -> ModelConfig:
    """The bundled detector taking float NCHW pixels (0..255, BGR), so that device
    preprocessing has a float input to produce; its outputs equal the uint8 model's."""
    import onnx

    from edge_agent.models import manifest as mf

    src = Path(mf.__file__).parent / mf.BUNDLED_MODEL
    proto = onnx.load(str(src / "model.onnx"))
    g = proto.graph
    first = g.node[0]  # Transpose NHWC -> NCHW, then a Cast to float
    assert first.op_type == "Transpose", first.op_type
    for node in g.node:
        renamed = [g.input[0].name if i == first.output[0] else i for i in node.input]
        del node.input[:]
        node.input.extend(renamed)
    g.node.remove(first)
    t = g.input[0].type.tensor_type
    t.elem_type = onnx.TensorProto.FLOAT
    dims = list(t.shape.dim)
    order = [dims[0], dims[3], dims[1], dims[2]]
    values = [(d.dim_param, d.dim_value) for d in order]
    for d, (param, value) in zip(t.shape.dim, values):
        d.Clear()
        if param:
            d.dim_param = param
        else:
            d.dim_value = value
    out = Path(folder) / "shapes-det-float"
    atomic_write(out / "model.onnx", proto.SerializeToString())
    text = (src / "manifest.yaml").read_text()
    text = text.replace("layout: NHWC", "layout: NCHW").replace("dtype: uint8", "dtype: float32")
    text = text.replace("  color: bgr", "  color: bgr\n  scale: 1.0")
    atomic_write(out / "manifest.yaml", text.encode())
    return ModelConfig(
        path=str(out / "model.onnx"), manifest=str(out / "manifest.yaml"), score_threshold=0.001
    )


def _tensorrt_check(
    target: Target, frames: int, cache_dir: str, ref_raw: list[np.ndarray], ref_res: list[FrameResult]
) -> Check:
    """Build and run one TensorRT target and compare it with the CPU reference."""
    from edge_agent.pipelines.model import load_model

    cfg = TensorRTConfig(
        dla_core=target.core,
        preprocess=target.preprocess,
        zero_copy=target.zero_copy,
        cuda_graphs=target.cuda_graphs,  # type: ignore[arg-type]
    )
    if cache_dir:
        cfg = replace(cfg, cache_dir=cache_dir)
    model = None
    try:
        try:
            model_cfg = ModelConfig(score_threshold=0.001)
            if target.preprocess != "cpu":
                model_cfg = float_variant(str(Path(cfg.cache_dir).expanduser()))
            t0 = time.monotonic()
            model = load_model(model_cfg, cfg)
            build_s = time.monotonic() - t0
            raw, res, ms, parts = _run_model(model, frames)
            check = _judge(target, model.backend.describe(), raw, res, ms, parts, build_s, ref_raw, ref_res)
            if target.cuda_graphs == "on":
                graphs = _graph_cpu(model, frames)
                closed, model = _close(model), None
                if closed:
                    raise RuntimeError(closed)
                check = _judge_graphs(check, raw, graphs, _plain_raw(model_cfg, cfg, frames))
        except Exception as e:  # the self-test reports every failure, it does not stop at one
            check = Check(target.name, "fail", f"{type(e).__name__}: {e}")
    finally:
        closed = _close(model)
    if closed:  # a close that fails fails this target, not the targets after it
        return Check(target.name, "fail", f"{check.detail}; {closed}", check.data)
    return check


def _graph_cpu(model: Any, frames: int) -> dict:
    """The infer stage's CPU time per frame replaying graphs and enqueueing plainly."""
    from edge_agent.bench.phases import compare_graphs

    io = model.backend.allocate()
    ((image, _gt),) = list(heldout_images(1))
    model.preprocessor(image, io.inputs[model.input_name], Letterbox())
    model.backend.upload(io)
    return compare_graphs(model.backend, io, max(frames, 20))


def _plain_raw(model_cfg: ModelConfig, cfg: TensorRTConfig, frames: int) -> list[np.ndarray]:
    """The same engine (from the cache) run plainly on the same frames: its raw outputs."""
    from edge_agent.pipelines.model import load_model

    plain = load_model(model_cfg, replace(cfg, cuda_graphs="off"))
    try:
        return _run_model(plain, frames)[0]
    finally:
        plain.close()


def _judge_graphs(check: Check, raw: list[np.ndarray], graphs: dict, plain_raw: list[np.ndarray]) -> Check:
    """A graph target passes its CPU comparison, replayed graphs on every frame, and outputs
    equal to plain execution's on every frame (the same kernels: rounding at most)."""
    from edge_agent.pipelines.backends.trt_graphs import same_outputs

    differ = [i for i, (a, b) in enumerate(zip(plain_raw, raw)) if same_outputs([a], [b])]
    diff = max(
        float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32)))) for a, b in zip(plain_raw, raw)
    )
    ok = check.status == "pass" and graphs["replaying"] and not differ and len(raw) == len(plain_raw)
    cpu = (
        f"infer CPU p50 {graphs['graphs_cpu_ms']['p50']:.3f} ms with graphs, "
        f"{graphs['plain_cpu_ms']['p50']:.3f} ms plain"
        if graphs["replaying"]
        else f"graphs off: {graphs['off']}"
    )
    detail = (
        f"{check.detail}; against plain execution: max |diff| {diff:.2e}, "
        f"{len(differ)} of {len(raw)} frames differ; {cpu}"
    )
    return Check(
        check.name, "pass" if ok else "fail", detail, {**check.data, "graphs": graphs, "max_diff": diff}
    )


def _close(model: Any) -> str:
    """Close ``model``; what went wrong, or ""."""
    if model is None:
        return ""
    try:
        model.close()
    except Exception as e:
        return f"close() failed: {type(e).__name__}: {e}"
    return ""


def _judge(target: Target, info: dict, raw, res, ms, parts, build_s: float, ref_raw, ref_res) -> Check:
    score_err, box_err, matched = compare(ref_raw, raw, ref_res, res)
    passed = score_err <= SCORE_ATOL and box_err <= BOX_ATOL_PX and matched >= MIN_MATCHED
    if target.preprocess != "cpu" and info.get("preprocess") != "device":
        passed = False  # it ran, but not what this target is for: the notes say why
    placed = ""
    if target.preprocess == "dla":  # which preprocessing layers the DLA did not take
        off = (info.get("off_dla") or {}).get("preprocess")
        if off is None:  # listed by the build only
            placed = ", off the DLA: unknown (the engine came from the cache)"
        else:
            placed = f", off the DLA: {', '.join(off) if off else 'none'}"
    return Check(
        target.name,
        "pass" if passed else "fail",
        f"max |score diff| {score_err:.4f} (≤ {SCORE_ATOL}), max |box diff| {box_err:.2f} px "
        f"(≤ {BOX_ATOL_PX}), detections matched {matched:.1%} (≥ {MIN_MATCHED:.0%}), "
        f"{np.median(ms):.2f} ms/frame, load+build {build_s:.1f} s{placed}; checks: {target.answers}",
        {
            "score_err": score_err,
            "box_err": box_err,
            "matched": matched,
            "ms_p50": float(np.median(ms)),
            "device_parts_ms_p50": parts,
            "backend": info,
        },
    )


def run_selftest(frames: int = 50, cache_dir: str = "") -> list[Check]:
    from edge_agent.pipelines.backends.registry import tensorrt_unavailable
    from edge_agent.pipelines.model import load_model

    checks = [platform_check(), clocks_check()]
    cpu = load_model(ModelConfig(score_threshold=0.001), OnnxRuntimeConfig())
    try:
        ref_raw, ref_res, ref_ms, _ = _run_model(cpu, frames)
    finally:
        cpu.close()
    m_ap, _ = mean_average_precision(ref_res, len(cpu.manifest.labels))
    ok = m_ap >= 0.9
    checks.append(
        Check(
            "onnxruntime-cpu",
            "pass" if ok else "fail",
            f"bundled detector, {frames} held-out frames: mAP@0.5 {m_ap:.3f}, "
            f"{np.median(ref_ms):.2f} ms/frame",
            {"map50": m_ap, "ms_p50": float(np.median(ref_ms))},
        )
    )
    reason = tensorrt_unavailable()
    if reason:
        checks.append(Check("tensorrt", "skip", f"TensorRT is not available on this machine: {reason}"))
        return checks + skipped_targets("TensorRT is not available on this machine")
    import tensorrt as trt

    from edge_agent.pipelines.backends.trt_support import shared_logger

    n_dla = trt.Builder(shared_logger(trt)).num_DLA_cores
    if not n_dla:
        checks.append(Check("dla", "skip", "this device has no DLA (an Orin Nano has none)"))
        have = {t.name for t in tensorrt_targets(0)}
        checks += [c for c in skipped_targets("this device has no DLA") if c.name not in have]
    for target in tensorrt_targets(n_dla):
        checks.append(_tensorrt_check(target, frames, cache_dir, ref_raw, ref_res))
    return checks


def write_report(checks: list[Check], path: str) -> tuple[Path, Path]:
    base = Path(path)
    json_path = base.with_suffix(".json")
    md_path = base.with_suffix(".md")
    atomic_write(
        json_path, json.dumps([c.__dict__ for c in checks], indent=2, default=str).encode(), mode=0o644
    )
    lines = [
        f"# edge-agent self-test ({time.strftime('%Y-%m-%d %H:%M:%S')})",
        "",
        "| check | result | detail |",
        "| --- | --- | --- |",
    ]
    lines += [f"| {c.name} | {c.status} | {c.detail} |" for c in checks]
    atomic_write(md_path, ("\n".join(lines) + "\n").encode(), mode=0o644)
    return json_path, md_path
