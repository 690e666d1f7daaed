"""Which model the agent runs (``model``), and the inference backend that runs it
(``backend``: ONNX Runtime, TensorRT, or ``auto``, which picks one where it runs)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core.configfields import check, path_field


@dataclass(frozen=True)
class ModelConfig:
    """Which model to run. Thresholds left unset come from the model's manifest."""

    path: str = path_field("file")  # empty: the bundled detector
    manifest: str = path_field("file")  # empty: manifest.yaml beside the model, else read from the ONNX
    score_threshold: float | None = None
    iou_threshold: float | None = None
    max_detections: int = 100
    # Segmentation models: each published detection's mask as `polygon` (its outlines in
    # source pixels, simplified to at most `mask_points` points), `rle` (COCO's uncompressed
    # run-length encoding of the frame-sized bitmap) or `none` (boxes only, no mask made).
    masks: Literal["polygon", "rle", "none"] = "polygon"
    mask_points: int = 64
    # Float NCHW RGB models (Ultralytics exports): `auto` runs a copy of the graph that takes
    # the letterboxed uint8 BGR frame, with the colour swap and 1/255 folded into the first
    # convolution, so the host's preprocessing is the letterbox alone (ONNX Runtime only;
    # TensorRT does this work on the GPU or DLA). `off`: numpy preprocessing of the original.
    input_adapter: Literal["auto", "off"] = "auto"
    # Adapted model copies. Caches are local: their default (~/.cache/...) is written out by
    # `config render` and expanded at load, so with the home folder in the hash the agent
    # (systemd's HOME) and a health check run as root would never agree on a rendered config.
    cache_dir: str = path_field("path", "~/.cache/edge-agent/models", local=True)

    def __post_init__(self) -> None:
        for key in ("score_threshold", "iou_threshold"):
            v = getattr(self, key)
            check(v is None or 0.0 <= v <= 1.0, key, "must be within 0..1")
        check(1 <= self.max_detections <= 10000, "max_detections", "must be within 1..10000")
        check(4 <= self.mask_points <= 4096, "mask_points", "must be within 4..4096")


@dataclass(frozen=True)
class OnnxRuntimeConfig:
    type: Literal["onnxruntime"] = "onnxruntime"
    # CPU by default; on a Jetson with onnxruntime-gpu: CUDAExecutionProvider or
    # TensorrtExecutionProvider ahead of CPUExecutionProvider.
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 0  # 0: ONNX Runtime's choice (one per physical core)
    inter_op_threads: int = 1
    graph_optimization: Literal["disabled", "basic", "extended", "all"] = "all"
    execution_mode: Literal["sequential", "parallel"] = "sequential"
    # Spinning worker threads trade CPU time (and so power) for latency. Measured here
    # (2 cores, 2026-12-01, `edge-agent bench` interleaved) it wins everywhere: YOLOv8n
    # 640 inference 45.8 ms against 52.6-57.0 off, and over 600 live frames end to end
    # p99 59-68 against 72 ms; the bundled detector live p50 6.5 against 8.2-8.9 ms;
    # four cameras live p50 17-19 against 22-24 ms. Off for a
    # battery or thermally bound device (`tune --objective power` weighs it).
    allow_spinning: bool = True

    def __post_init__(self) -> None:
        check(len(self.providers) > 0, "providers", "at least one execution provider")
        check(self.intra_op_threads >= 0, "intra_op_threads", "must be >= 0")
        check(self.inter_op_threads >= 0, "inter_op_threads", "must be >= 0")


@dataclass(frozen=True)
class TensorRTConfig:
    """TensorRT engines built on the device from the model's ONNX, cached by key."""

    type: Literal["tensorrt"] = "tensorrt"
    precision: Literal["fp16", "int8", "fp32"] = "fp16"
    dla_core: int = -1  # -1: the GPU; 0 or 1: that DLA core (with GPU fallback)
    gpu_fallback: bool = True  # layers the DLA cannot run go to the GPU (else the build fails)
    workspace_mib: int = 1024
    optimization_level: int = 3  # TensorRT builder optimisation level, 0..5
    # engines, timing, calibration (local: see ModelConfig.cache_dir)
    cache_dir: str = path_field("path", "~/.cache/edge-agent/engines", local=True)
    # INT8 only: frames for calibration, run through the same letterbox as live frames.
    calibration_images: str = path_field("path")  # checked when an INT8 engine is built
    calibration_frames: int = 200
    # Where normalisation and the NCHW transpose run for float-input models: on a DLA core,
    # on the GPU, or on the CPU (numpy). The letterbox resize stays on the CPU: the DLA
    # cannot downscale, and the box mapping needs the exact geometry.
    preprocess: Literal["dla", "gpu", "cpu"] = "dla"
    zero_copy: bool = True  # mapped page-locked host memory: no H2D/D2H copies on Jetson's iGPU
    # Largest batch of frames (of several sources) the engine takes: on the GPU any batch up
    # to it runs; a DLA takes fixed shapes, so smaller batches are padded. 0: one per source.
    max_batch: int = 0
    # Each frame slot's enqueue captured once into a CUDA graph and replayed per frame (fewer
    # CPU-side launches). auto: where capture succeeds, else plain enqueue with one log line;
    # on: a model that cannot be captured is an error; off: never.
    cuda_graphs: Literal["auto", "on", "off"] = "auto"

    def __post_init__(self) -> None:
        check(0 <= self.max_batch <= 64, "max_batch", "must be within 0..64 (0: one per source)")
        check(-1 <= self.dla_core <= 7, "dla_core", "must be -1 (GPU) or a DLA core number")
        check(16 <= self.workspace_mib <= 65536, "workspace_mib", "must be within 16..65536")
        check(0 <= self.optimization_level <= 5, "optimization_level", "must be within 0..5")
        check(1 <= self.calibration_frames <= 10000, "calibration_frames", "must be within 1..10000")
        check(
            self.precision != "int8" or bool(self.calibration_images),
            "calibration_images",
            "int8 needs a folder of calibration frames",
        )
        check(bool(self.cache_dir), "cache_dir", "an engine cache directory is required")


@dataclass(frozen=True)
class AutoBackendConfig:
    """TensorRT where it imports and a GPU answers, else ONNX Runtime; the choice is logged."""

    type: Literal["auto"] = "auto"
    tensorrt: TensorRTConfig = field(default_factory=TensorRTConfig)
    onnxruntime: OnnxRuntimeConfig = field(default_factory=OnnxRuntimeConfig)


@dataclass(frozen=True)
class EmulatedConfig:
    """The emulated accelerator, for measurement only (``backends/emulated.py``): a model's
    recorded raw outputs replayed, each inference waiting ``device_ms`` off the CPU. Never a
    default; logs, heartbeat, metrics and bench name it. Its results are the recording's."""

    type: Literal["emulated"] = "emulated"
    recording: str = path_field("file")  # written by `edge-agent record-outputs`
    device_ms: float = 5.0  # one inference (a batch), as the accelerator would take it
    device_ms_per_frame: float = 0.0  # added per frame of a batch past the first
    # Largest batch (frames of several sources), as TensorRT's max_batch; 0: one per source.
    max_batch: int = 0

    def __post_init__(self) -> None:
        check(bool(self.recording), "recording", "a recording of the model's outputs is required")
        check(0.0 <= self.device_ms <= 10_000, "device_ms", "must be within 0..10000")
        check(0.0 <= self.device_ms_per_frame <= 10_000, "device_ms_per_frame", "must be within 0..10000")
        check(0 <= self.max_batch <= 64, "max_batch", "must be within 0..64 (0: one per source)")


BackendConfig = AutoBackendConfig | OnnxRuntimeConfig | TensorRTConfig | EmulatedConfig
