"""The agent's configuration: frozen dataclasses with defaults, validated once at load.

Every section can be omitted; ``AgentConfig()`` is the embedded default (synthetic camera,
bundled detector, ONNX Runtime on the CPU). Sources and backends are told apart by their
``type`` key. Config objects do no I/O: files named here are opened by the components.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core import configload
from edge_agent.core.configload import check, path_field
from edge_agent.core.names import MAX_NAME, NAME_RULE, level_problem, name_ok
from edge_agent.core.reloads import AT_START, ELSEWHERE, LOCAL, MODELS, REBIND, drop_local, reloads
from edge_agent.core.source_config import (
    ImageFolderSourceConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.core.stamps import STAGES
from edge_agent.core.uplink_config import UplinkConfig


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


BackendConfig = AutoBackendConfig | OnnxRuntimeConfig | TensorRTConfig


@dataclass(frozen=True)
class PublishConfig:
    endpoint: str = field(default="tcp://127.0.0.1:5556", metadata=reloads(REBIND) | LOCAL)
    topic: str = "det"  # messages go out as "<topic>.<source name>"
    # messages queued per subscriber before ZeroMQ drops for it
    send_hwm: int = field(default=100, metadata=reloads(REBIND))
    # connections to the stream at once; past it the newest is closed (docs/security.md)
    max_subscribers: int = field(default=32, metadata=reloads(REBIND))
    health_interval_s: float = 1.0  # heartbeat on topic "health"
    # msgpack (the msgpack extra) for bandwidth
    encoding: Literal["json", "msgpack"] = field(default="json", metadata=reloads(REBIND))
    # CURVE encryption and authentication: the server's secret certificate (written by
    # `edge-agent keys generate`) and a folder of the allowed clients' public ones.
    curve_server_key: str = path_field("file", reload=(REBIND,))
    curve_clients_dir: str = path_field("dir", reload=(REBIND,))
    # ZeroMQ drops what is published before a subscriber's subscription arrives. At start,
    # wait for this many subscriptions (up to subscriber_timeout_s) before the first frame
    # is read. null: 1 when a source is a file (every result counts), 0 for live cameras.
    wait_for_subscribers: int | None = None
    subscriber_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        check(0.05 <= self.health_interval_s <= 1.0, "health_interval_s", "must be within 0.05..1.0")
        check(
            self.wait_for_subscribers is None or 0 <= self.wait_for_subscribers <= 1000,
            "wait_for_subscribers",
            "must be within 0..1000 (or null: 1 for file sources, 0 for cameras)",
        )
        check(0 <= self.subscriber_timeout_s <= 3600, "subscriber_timeout_s", "must be within 0..3600")
        check(
            bool(self.curve_server_key) == bool(self.curve_clients_dir),
            "curve_clients_dir" if self.curve_server_key else "curve_server_key",
            "CURVE needs both curve_server_key and curve_clients_dir",
        )
        check("://" in self.endpoint, "endpoint", "expected a ZeroMQ endpoint like tcp://host:port")
        check(name_ok(self.topic), "topic", NAME_RULE)
        # "event.<source>" carries a source's events and "health" the heartbeats on the same
        # socket: results under either would be read as the other by every subscriber
        check(
            self.topic not in ("event", "health"), "topic", "'event' and 'health' are the stream's own topics"
        )
        check(self.send_hwm >= 1, "send_hwm", "must be >= 1")
        check(1 <= self.max_subscribers <= 1000, "max_subscribers", "must be within 1..1000")


@dataclass(frozen=True)
class LadderStep:
    """One rung of the degradation ladder; the first rung is normal operation."""

    name: str = "full"
    frame_stride: int = 1  # process every Nth frame; the others are dropped as "ladder"
    # another ONNX (e.g. the same network at a smaller input); empty: main
    model: str = path_field("file", reload=(MODELS,))
    manifest: str = path_field("file", reload=(MODELS,))  # its manifest; empty: beside it
    infer: bool = True  # false: alert only (frames are counted and dropped, health goes on)

    def __post_init__(self) -> None:
        check(name_ok(self.name), "name", NAME_RULE)
        check(self.frame_stride >= 1, "frame_stride", "must be >= 1")


@dataclass(frozen=True)
class DeadlineConfig:
    budget_ms: float = 50.0  # capture to publish
    # Under overload `throughput` (newest frame wins) starts inference on the newest frame
    # even if it waited up to a frame interval; `latency` starts only on a frame fresh
    # enough to finish within pre + infer + post, waiting for the next capture otherwise:
    # a lower p99 at lower throughput.
    mode: Literal["throughput", "latency"] = "throughput"
    # Per-stage budgets (stage names as in the message's latency_ms); a stage over its
    # budget is counted per stage, so the health stream shows which stage broke the total.
    stage_budgets_ms: dict[str, float] = field(default_factory=dict)
    admission: bool = True  # drop, before inference, frames too old to finish in time
    miss_window_s: float = 2.0  # sliding window for the miss rate
    step_down_miss_rate: float = 0.2  # above this, step down the ladder
    step_up_miss_rate: float = 0.02  # at or below this for step_up_after_s, step back up
    step_up_after_s: float = 5.0
    ladder: tuple[LadderStep, ...] = (LadderStep(),)

    def __post_init__(self) -> None:
        check(0 < self.budget_ms <= 60_000, "budget_ms", "must be within (0, 60000]")
        for name, ms in self.stage_budgets_ms.items():
            check(name in STAGES, "stage_budgets_ms", f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
            check(ms > 0, "stage_budgets_ms", f"budget of {name!r} must be > 0")
        check(0.5 <= self.miss_window_s <= 600, "miss_window_s", "must be within 0.5..600")
        check(0 < self.step_down_miss_rate <= 1, "step_down_miss_rate", "must be within (0, 1]")
        check(
            0 <= self.step_up_miss_rate < self.step_down_miss_rate,
            "step_up_miss_rate",
            "must be >= 0 and below step_down_miss_rate (the gap is the hysteresis)",
        )
        check(0 < self.step_up_after_s <= 3600, "step_up_after_s", "must be within (0, 3600]")
        check(len(self.ladder) >= 1, "ladder", "at least one step (normal operation)")
        names = [s.name for s in self.ladder]
        check(len(set(names)) == len(names), "ladder", "step names must be unique")
        first = self.ladder[0] if self.ladder else LadderStep()
        check(
            first.frame_stride == 1 and first.infer and not first.model,
            "ladder",
            "the first step is normal operation: frame_stride 1, infer true, the main model",
        )


@dataclass(frozen=True)
class BatchingConfig:
    """How the scheduler in front of inference batches frames of several sources.

    A batch holds at most one frame per source. The scheduler waits for more frames only
    while the most urgent frame in hand keeps its slack (and at most ``max_wait_ms``), and
    a batch never grows past what keeps its frames, and the next frame of any
    higher-priority source, within their budgets.
    """

    max_batch: int = 0  # 0: up to one frame per source (or the model's fixed batch); 1: no batching
    max_wait_ms: float = 4.0  # longest wait for more frames once one is ready
    margin_ms: float = 2.0  # kept free of each budget, for the error of the time estimates

    def __post_init__(self) -> None:
        check(0 <= self.max_batch <= 64, "max_batch", "must be within 0..64 (0: as many as sources)")
        check(0 <= self.max_wait_ms <= 1000, "max_wait_ms", "must be within 0..1000")
        check(0 <= self.margin_ms <= 1000, "margin_ms", "must be within 0..1000")


@dataclass(frozen=True)
class PowerConfig:
    """The device state the agent runs in (Jetson), and the telemetry that watches it.

    With ``manage: false`` (default) the agent only reads: a privileged step (the
    edge-agent-power unit: ``edge-agent power apply`` / ``restore``, as root) applies the
    profile. With ``manage: true`` the agent applies it at start and restores it at exit
    itself, which needs root.
    """

    manage: bool = False
    nvpmodel: str = ""  # power mode by name (e.g. "15W") or id ("0"); empty: leave as is
    jetson_clocks: bool | None = None  # true: clocks to the mode's max; false: off; null: leave
    gpu_freq_mhz: float = 0.0  # lock the GPU (min = max) at the nearest available; 0: leave
    cpu_governor: str = ""  # e.g. performance; empty: leave
    cpu_max_freq_mhz: float = 0.0  # cap (nearest available); 0: leave
    fan_mode: str = ""  # jetson-stats fan profile (quiet, cool, manual); needs the jtop service
    fan_speed: int = -1  # 0..100 with fan_mode manual; -1: leave
    thermal_limit_c: float = 85.0  # a zone above this counts as throttling
    # kept until restored
    state_file: str = path_field("path", "/var/lib/edge-agent/power-state.json", local=True)
    sample_hz: float = 2.0  # telemetry rate, off the frame path
    root: str = path_field("dir", "/")  # filesystem root to read and write (a copied tree, for tests)

    def __post_init__(self) -> None:
        check(0 <= self.gpu_freq_mhz <= 10_000, "gpu_freq_mhz", "must be within 0..10000")
        check(0 <= self.cpu_max_freq_mhz <= 10_000, "cpu_max_freq_mhz", "must be within 0..10000")
        check(-1 <= self.fan_speed <= 100, "fan_speed", "must be within 0..100 (or -1: leave)")
        check(20 <= self.thermal_limit_c <= 120, "thermal_limit_c", "must be within 20..120")
        check(0.1 <= self.sample_hz <= 50, "sample_hz", "must be within 0.1..50")
        check(bool(self.state_file), "state_file", "a state file is required")
        check(
            not (self.jetson_clocks and self.gpu_freq_mhz),
            "gpu_freq_mhz",
            "jetson_clocks true already sets the GPU to its maximum: choose one",
        )

    def changes_anything(self) -> bool:
        return bool(
            self.nvpmodel
            or self.jetson_clocks is not None
            or self.gpu_freq_mhz
            or self.cpu_governor
            or self.cpu_max_freq_mhz
            or self.fan_mode
            or self.fan_speed >= 0
        )


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint. Loopback by default: metrics are not for the open network."""

    enabled: bool = True
    host: str = field(default="127.0.0.1", metadata=LOCAL)
    port: int = field(default=9108, metadata=LOCAL)  # 0: any free port (logged)

    def __post_init__(self) -> None:
        check(0 <= self.port <= 65535, "port", "must be within 0..65535")


@dataclass(frozen=True)
class ViewConfig:
    """The live view in a browser (`edge-agent run --view`). Loopback by default, like the
    metrics; a ``token`` is then asked for in every URL (``?token=...``) when set. It answers
    only requests whose Host is a loopback name, ``host`` or one of ``allowed_hosts`` (a web
    page on another site cannot read it through DNS rebinding)."""

    enabled: bool = False
    host: str = "127.0.0.1"  # an address or name to bind ("::1" too); "": all interfaces
    port: int = 8090  # 0: any free port (logged)
    fps: float = 5.0  # annotated frames a second per source, at most
    quality: int = 70  # JPEG quality
    max_width: int = 960  # wider frames are scaled down (aspect kept)
    token: str = ""
    allowed_hosts: tuple[str, ...] = ()  # more names/addresses browsers may use to reach the view

    @staticmethod
    def host_ok(host: str) -> bool:
        """An IP address, or a DNS name (letters, digits, '-', '_', dot-separated labels)."""
        import ipaddress
        import re

        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            pass
        label = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
        return len(host) <= 253 and re.fullmatch(rf"{label}(?:\.{label})*\.?", host) is not None

    def __post_init__(self) -> None:
        check(self.host == "" or self.host_ok(self.host), "host", "must be an IP address or a host name")
        check(
            all(self.host_ok(h) for h in self.allowed_hosts),
            "allowed_hosts",
            "each must be an IP address or a host name (no port, no brackets)",
        )
        check(0 <= self.port <= 65535, "port", "must be within 0..65535")
        check(0.1 <= self.fps <= 30, "fps", "must be within 0.1..30")
        check(10 <= self.quality <= 100, "quality", "must be within 10..100")
        check(64 <= self.max_width <= 7680, "max_width", "must be within 64..7680")
        check(all(c.isalnum() or c in "-_" for c in self.token), "token", "letters, digits, '-' and '_' only")


@dataclass(frozen=True)
class ResilienceConfig:
    """What the agent does when inference keeps failing: reload the backend, then fall
    back to ONNX Runtime on the CPU (with ``fallback_model``, or the same model), then
    exit non-zero for systemd to restart it."""

    max_consecutive_errors: int = 10  # inference errors in a row that trip the breaker
    fallback_model: str = path_field("file")  # empty: the main model

    def __post_init__(self) -> None:
        check(1 <= self.max_consecutive_errors <= 10_000, "max_consecutive_errors", "must be within 1..10000")


@dataclass(frozen=True)
class ServiceConfig:
    """What the systemd watchdog means. Pings go out while the agent does its job: every
    stage thread alive and progressing, no stage failed. A camera that is down is retried
    on schedule and is the camera's fault, not the agent's, so it stops the pings only
    when ``stall_watchdog_s`` asks for it (the outage shows in STATUS=, heartbeats and
    metrics either way)."""

    # A stage thread without progress this long (or 3x the slowest inference so far, if
    # longer) is stuck: no pings.
    stage_timeout_s: float = 5.0
    stall_watchdog_s: float = 0.0  # no frame from any source this long: no pings (a restart); 0: off

    def __post_init__(self) -> None:
        check(self.stage_timeout_s > 0, "stage_timeout_s", "must be > 0")
        check(self.stall_watchdog_s >= 0, "stall_watchdog_s", "must be >= 0 (0: off)")


@dataclass(frozen=True)
class FaultsConfig:
    """Fault injection, for tests on the real pipeline only: refused unless the
    environment variable EDGE_AGENT_FAULTS=1 is set."""

    source_outage_after_frames: int = 0  # the camera disappears after this many frames ...
    source_outage_s: float = 0.0  # ... for this long, then comes back
    backend_error_rate: float = 0.0  # share of inferences that raise
    backend_fail_after_frames: int = 0  # every inference after this many raises (0: never)
    backend_delay_ms: float = 0.0  # added to every inference
    model_load_delay_s: float = 0.0  # added to loading the models (a first TensorRT engine build)
    seed: int = 0

    def __post_init__(self) -> None:
        check(0.0 <= self.backend_error_rate <= 1.0, "backend_error_rate", "must be within 0..1")
        check(self.source_outage_s >= 0 and self.backend_delay_ms >= 0, "source_outage_s", "must be >= 0")
        check(self.model_load_delay_s >= 0, "model_load_delay_s", "must be >= 0")
        check(
            not self.active() or os.environ.get("EDGE_AGENT_FAULTS") == "1",
            "backend_error_rate" if self.backend_error_rate else "source_outage_after_frames",
            "fault injection is for tests: set EDGE_AGENT_FAULTS=1 to allow it",
        )

    def active(self) -> bool:
        return bool(
            self.source_outage_after_frames
            or self.backend_error_rate
            or self.backend_fail_after_frames
            or self.backend_delay_ms
            or self.model_load_delay_s
        )


@dataclass(frozen=True)
class AgentConfig:
    device_id: str = field(default_factory=socket.gethostname, metadata=LOCAL)
    source: SourceConfig = field(default_factory=SyntheticSourceConfig)
    # Several cameras on one accelerator: give ``sources`` instead of ``source``.
    sources: tuple[SourceConfig, ...] = field(default=(), metadata={"unordered": True})
    model: ModelConfig = field(default_factory=ModelConfig, metadata=reloads(MODELS))
    backend: BackendConfig = field(default_factory=AutoBackendConfig, metadata=reloads(MODELS))
    publish: PublishConfig = field(default_factory=PublishConfig)
    deadline: DeadlineConfig = field(default_factory=DeadlineConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    # a person watching one device is no drift: the view is local
    view: ViewConfig = field(default_factory=ViewConfig, metadata=reloads(AT_START) | LOCAL)
    uplink: UplinkConfig = field(default_factory=UplinkConfig, metadata=reloads(ELSEWHERE))
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __post_init__(self) -> None:
        # The id names the device on the stream and in MQTT topics and client ids.
        # No control character: U+0000 makes the broker drop the uplink's connection, silently.
        check(
            level_problem(self.device_id) is None,
            "device_id",
            f"must be non-empty, at most {MAX_NAME} characters, without '/', '+', '#', spaces or "
            "control characters (an MQTT topic level)",
        )
        check(
            not self.sources or self.source == SyntheticSourceConfig(),
            "source",
            "give either source (one camera) or sources (several), not both",
        )
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        check(not dup, "sources", f"source names must be unique (they are topics): {', '.join(dup)}")

    def source_list(self) -> tuple[SourceConfig, ...]:
        """Every source, in config order (``source`` alone when ``sources`` is empty)."""
        return self.sources or (self.source,)

    def subscribers_to_wait_for(self) -> int:
        """``publish.wait_for_subscribers``, its null resolved: 1 when a source is a file
        read frame by frame (a video not paced in real time, an image folder), else 0."""
        if self.publish.wait_for_subscribers is not None:
            return self.publish.wait_for_subscribers
        files = (ImageFolderSourceConfig, VideoSourceConfig)
        sources = self.source_list()
        return int(any(isinstance(s, files) and not getattr(s, "realtime", False) for s in sources))


def config_hash(cfg: AgentConfig) -> str:
    """A short hash of the effective config without the fields marked LOCAL (who the
    device is, where this instance binds and keeps its state: the same across a fleet, and
    different between several agents on one host), so devices that run the same config
    show the same hash (and drift across a fleet shows)."""
    plain = drop_local(cfg, configload.to_plain(cfg))
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def printed(cfg: AgentConfig, home: bool = False) -> dict:
    """The config as ``config show``, ``render`` and ``diff`` print it: ``to_plain`` (``home``:
    ``~`` expanded), with every backend type in one shape, ``type`` and then each backend's
    settings under its name (``backend.onnxruntime.allow_spinning`` whether the type is
    ``auto`` or ``onnxruntime``), so two configs compare key by key, and a printed ``auto``
    loads as one of its types once ``type`` is changed and the other section dropped. The
    flat form (``{type: onnxruntime, providers: ...}``) loads too."""
    plain = configload.to_plain(cfg, home)
    backend = plain["backend"]
    if backend["type"] == "auto":
        sections = {k: v for k, v in backend.items() if k != "type"}
    else:
        sections = {backend["type"]: backend}
    plain["backend"] = {"type": backend["type"]}
    for name, section in sections.items():
        plain["backend"][name] = {k: v for k, v in section.items() if k != "type"}
    return plain


def load_config(path: str | None) -> AgentConfig:
    """The config of file ``path`` as written (relative paths resolved against its folder),
    or the embedded default when ``path`` is None. The command line loads configs through
    ``fleet.load_effective``, which adds environment overrides and file checks.

    Raises ``ConfigError`` naming file, line and key path of every problem.
    """
    if path is None:
        return AgentConfig()
    return configload.load_file(AgentConfig, path)
