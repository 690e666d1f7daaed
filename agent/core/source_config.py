"""The config of each kind of source (synthetic camera, video file, image folder, watched
folder, V4L2, RTSP, GStreamer), and the settings every source has (its name and its lane's scheduling)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core.analytics_config import AnalyticsConfig
from edge_agent.core.configfields import check, path_field
from edge_agent.core.names import NAME_RULE, name_ok
from edge_agent.core.reloads import LANE, MODELS, marked_fields, reloads


@dataclass(frozen=True)
class TrackerConfig:
    """A source's multi-object tracker (``pipelines/tracking``): every detection a track
    took gets its id. The detections in [``low_score``, ``high_score``) only continue
    tracks: the model's ``score_threshold`` bounds what the tracker sees from below."""

    type: Literal["bytetrack", "none"] = "bytetrack"
    high_score: float = 0.5  # detections scored at least this are matched first
    low_score: float = 0.1  # ... then those down to this, against the tracks left
    new_track_score: float = 0.6  # an unmatched detection scored this starts a track
    match_iou: float = 0.2  # first stage: IoU x score must exceed this
    low_match_iou: float = 0.5  # second stage: IoU must exceed this
    unconfirmed_iou: float = 0.3  # third stage (new tracks): IoU x score must exceed this
    confirm_frames: int = 2  # a new track gets its id after this many hits in a row
    lost_frames: float = 90.0  # a track not seen for more than this many frames ends
    per_class: bool = False  # a track takes only detections of its own class
    max_tracks: int = 256  # live tracks; beyond it new tracks are refused (counted)
    # a new track continues the journey of a lost one (counting keys on journeys) within
    # journey_radius x its size of where the lost one would be (plus its speed x the gap)
    journeys: bool = True
    journey_radius: float = 0.5

    def __post_init__(self) -> None:
        check(0 < self.high_score <= 1, "high_score", "must be within (0, 1]")
        check(0 <= self.low_score <= self.high_score, "low_score", "must be within 0..high_score")
        check(0 < self.new_track_score <= 1, "new_track_score", "must be within (0, 1]")
        check(0 <= self.match_iou < 1, "match_iou", "must be within [0, 1)")
        check(0 <= self.low_match_iou < 1, "low_match_iou", "must be within [0, 1)")
        check(0 <= self.unconfirmed_iou < 1, "unconfirmed_iou", "must be within [0, 1)")
        check(1 <= self.confirm_frames <= 100, "confirm_frames", "must be within 1..100")
        check(0 <= self.lost_frames <= 10_000, "lost_frames", "must be within 0..10000")
        check(1 <= self.max_tracks <= 4096, "max_tracks", "must be within 1..4096")
        check(0 < self.journey_radius <= 10, "journey_radius", "must be within (0, 10]")

    @property
    def enabled(self) -> bool:
        return self.type != "none"


#: An image source's default ``max_pixels``: 40 MP is 120 MB as a BGR frame, above the
#: photos cameras and traps drop (12-24 MP), well within an 8 GB Jetson beside its models.
IMAGE_MAX_PIXELS = 40_000_000
#: The most ``max_pixels`` may be: OpenCV's own cap, ``OPENCV_IO_MAX_IMAGE_PIXELS``, which
#: the package root sets to this unless the environment has it.
IMAGE_MAX_PIXELS_LIMIT = 100_000_000


def _check_max_pixels(value: int) -> None:
    check(
        1 <= value <= IMAGE_MAX_PIXELS_LIMIT,
        "max_pixels",
        f"must be within 1..{IMAGE_MAX_PIXELS_LIMIT} (images declaring more are skipped unread)",
    )


@dataclass(frozen=True)
class _SourceBase:
    name: str = "cam0"
    # Scheduling, when several sources share the accelerator (see ``AgentConfig.sources``).
    # priority: higher is served first when the accelerator is contended; budget_ms: this
    # source's end-to-end budget (0: deadline.budget_ms); max_fps: a frame-rate cap, frames
    # a live source makes in between are skipped (0: none).
    priority: int = field(default=0, metadata=reloads(LANE))
    budget_ms: float = field(default=0.0, metadata=reloads(LANE))
    max_fps: float = field(default=0.0, metadata=reloads(LANE))
    # this source's own model (same thresholds); empty: the shared one
    model: str = path_field("file", reload=(LANE, MODELS))
    manifest: str = path_field("file", reload=(LANE, MODELS))  # its manifest; empty: beside it
    # Its tracker: a change restarts it at a reload (ids go on); any other change keeps its tracks.
    tracker: TrackerConfig = field(default_factory=TrackerConfig, metadata=reloads(LANE))
    # Zones and lines counted on its tracks: a change keeps the tracks, and the counts of
    # the zones and lines whose definition stayed the same.
    analytics: AnalyticsConfig = field(default_factory=AnalyticsConfig, metadata=reloads(LANE))

    def __post_init__(self) -> None:
        check(name_ok(self.name), "name", f"{NAME_RULE} (it is a topic)")
        check(
            self.tracker.enabled or not self.analytics.enabled,
            "analytics",
            "zones and lines count tracks: this source's tracker is off (tracker.type: none)",
        )
        check(-1000 <= self.priority <= 1000, "priority", "must be within -1000..1000")
        check(0 <= self.budget_ms <= 60_000, "budget_ms", "must be within 0..60000 (0: deadline.budget_ms)")
        check(0 <= self.max_fps <= 1000, "max_fps", "must be within 0..1000 (0: no cap)")
        check(bool(self.model) or not self.manifest, "manifest", "a manifest needs a model")


#: A source's settings that are its lane's, not its capture's (scheduling, and its own
#: model): what a source keeps when it is played from other frames, and what changes
#: without reopening it.
SCHEDULING_FIELDS: tuple[str, ...] = marked_fields(_SourceBase, LANE)


@dataclass(frozen=True)
class SyntheticSourceConfig(_SourceBase):
    """Generated scene with ground truth; paced like a camera unless ``fps`` is 0."""

    type: Literal["synthetic"] = "synthetic"
    width: int = 640
    height: int = 480
    fps: float = 30.0  # 0: a new frame whenever the pipeline asks (benchmarks)
    seed: int = 0
    num_objects: int = 6
    noise_sigma: float = 6.0
    # The objects move in a world this much larger than the view on each side (a fraction
    # of the width and height): they enter and leave the frame (0: they stay in view).
    world_margin: float = 0.0
    max_speed_px: float = 6.0  # an object's top speed, pixels per frame

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.world_margin <= 1, "world_margin", "must be within 0..1")
        check(0 <= self.max_speed_px <= 100, "max_speed_px", "must be within 0..100")
        check(16 <= self.width <= 8192, "width", "must be within 16..8192")
        check(16 <= self.height <= 8192, "height", "must be within 16..8192")
        check(0 <= self.fps <= 1000, "fps", "must be within 0..1000")
        check(0 <= self.num_objects <= 64, "num_objects", "must be within 0..64")
        check(0 <= self.noise_sigma <= 100, "noise_sigma", "must be within 0..100")
        outside = self.analytics.outside(self.width, self.height)
        check(outside is None, "analytics", outside or "")


@dataclass(frozen=True)
class VideoSourceConfig(_SourceBase):
    """A video file. Every frame is processed (the pipeline waits) unless ``realtime``."""

    type: Literal["video"] = "video"
    path: str = path_field("file")
    loop: bool = False
    realtime: bool = False  # pace at the file's frame rate and keep only the newest frame

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.path), "path", "a video file path is required")


@dataclass(frozen=True)
class ImageFolderSourceConfig(_SourceBase):
    """Images of a folder in name order; every image is processed."""

    type: Literal["images"] = "images"
    path: str = path_field("dir")
    patterns: tuple[str, ...] = ("*.jpg", "*.jpeg", "*.png", "*.bmp")
    loop: bool = False
    max_pixels: int = IMAGE_MAX_PIXELS  # an image whose header declares more is skipped, unread

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.path), "path", "an image folder is required")
        _check_max_pixels(self.max_pixels)


@dataclass(frozen=True)
class WatchFolderSourceConfig(_SourceBase):
    """A folder watched for new images (uploads from a camera trap, an FTP drop): each new
    file is processed once, in the order they arrived, once its size stopped changing."""

    type: Literal["watch"] = "watch"
    path: str = path_field("dir")
    patterns: tuple[str, ...] = ("*.jpg", "*.jpeg", "*.png", "*.bmp")
    existing: bool = False  # also the images already there at start (else only new ones)
    poll_s: float = 0.2  # how often the folder is looked at
    settle_s: float = 0.5  # a file is read once its size has not changed for this long
    max_pixels: int = IMAGE_MAX_PIXELS  # an image whose header declares more is skipped, unread

    def __post_init__(self) -> None:
        super().__post_init__()
        check(bool(self.path), "path", "a folder to watch is required")
        check(0.01 <= self.poll_s <= 60, "poll_s", "must be within 0.01..60")
        check(0 <= self.settle_s <= 3600, "settle_s", "must be within 0..3600")
        _check_max_pixels(self.max_pixels)


@dataclass(frozen=True)
class _LiveBase(_SourceBase):
    # A camera that fails to open or stops delivering is reopened with exponential backoff.
    retry_initial_s: float = 0.5
    retry_max_s: float = 10.0
    stall_timeout_s: float = 2.0  # no new frame for this long counts as a failure

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 < self.retry_initial_s <= 3600, "retry_initial_s", "must be within (0, 3600]")
        check(
            self.retry_initial_s <= self.retry_max_s <= 3600,
            "retry_max_s",
            "must be within retry_initial_s..3600",
        )
        check(0 < self.stall_timeout_s <= 3600, "stall_timeout_s", "must be within (0, 3600]")


@dataclass(frozen=True)
class V4L2SourceConfig(_LiveBase):
    """A USB/V4L2 camera through OpenCV's V4L2 backend."""

    type: Literal["v4l2"] = "v4l2"
    device: str = "/dev/video0"
    width: int = 0  # 0: the camera's default
    height: int = 0
    fps: float = 0.0


@dataclass(frozen=True)
class RtspSourceConfig(_LiveBase):
    """An RTSP stream through OpenCV (FFmpeg backend by default)."""

    type: Literal["rtsp"] = "rtsp"
    url: str = ""
    transport: Literal["tcp", "udp"] = "tcp"

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.url.startswith(("rtsp://", "rtsps://")), "url", "must start with rtsp://")


@dataclass(frozen=True)
class CsiCameraInput:
    """A CSI camera on a Jetson through ``nvarguscamerasrc`` (Argus, the ISP): NV12 frames
    in NVMM memory at one of the sensor's modes (``width`` x ``height`` at ``fps``)."""

    type: Literal["csi"] = "csi"
    sensor_id: int = 0  # nvarguscamerasrc sensor-id: 0, 1, ... (which CSI port)
    width: int = 1920
    height: int = 1080
    fps: int = 30

    def __post_init__(self) -> None:
        check(0 <= self.sensor_id <= 15, "sensor_id", "must be within 0..15")
        _check_frame(self.width, self.height, self.fps, required=True)


@dataclass(frozen=True)
class RtspInput:
    """An RTSP stream decoded by the Jetson's hardware decoder (``nvv4l2decoder``).
    ``width`` and ``height`` are the stream's: needed to scale it keeping its aspect."""

    type: Literal["rtsp"] = "rtsp"
    url: str = ""
    codec: Literal["h264", "h265"] = "h264"
    transport: Literal["tcp", "udp"] = "tcp"
    latency_ms: int = 200  # rtspsrc's jitter buffer (its own default is 2000)
    width: int = 0  # 0: unknown (then only scale: full)
    height: int = 0

    def __post_init__(self) -> None:
        check(self.url.startswith(("rtsp://", "rtsps://")), "url", "must start with rtsp://")
        check(
            not any(c.isspace() or c in '"\\' for c in self.url),
            "url",
            "no spaces, quotes or backslashes (percent-encode them)",
        )
        check(0 <= self.latency_ms <= 10_000, "latency_ms", "must be within 0..10000")
        check((self.width > 0) == (self.height > 0), "height", "give width and height, or neither")
        if self.width and self.height:
            _check_frame(self.width, self.height, 0, required=False)


@dataclass(frozen=True)
class UsbCameraInput:
    """A USB (UVC) camera through ``v4l2src``: YUYV frames uploaded to NVMM, or MJPEG
    decoded there by ``nvv4l2decoder``; ``width`` x ``height`` at ``fps`` is one of its modes
    (``v4l2-ctl --list-formats-ext``)."""

    type: Literal["usb"] = "usb"
    device: str = "/dev/video0"
    format: Literal["yuyv", "mjpeg"] = "yuyv"
    width: int = 1280
    height: int = 720
    fps: int = 30

    def __post_init__(self) -> None:
        check(
            self.device.startswith("/dev/") and not any(c.isspace() or c in '"!' for c in self.device),
            "device",
            "must be a /dev/... path (no spaces, quotes or '!')",
        )
        _check_frame(self.width, self.height, self.fps, required=True)


#: The inputs a Jetson pipeline is built for (``gstreamer`` source's ``input:``).
JetsonInput = CsiCameraInput | RtspInput | UsbCameraInput

#: ``interpolation`` names, by nvvidconv's (VIC) ``interpolation-method`` values.
INTERPOLATIONS: tuple[str, ...] = ("nearest", "bilinear", "5-tap", "10-tap", "smart", "nicest")
#: nvvidconv ``flip-method`` values that turn the frame a quarter (width and height swap).
TRANSPOSING_FLIPS = frozenset({1, 3, 5, 7})
_SIDE_MIN, _SIDE_MAX = 32, 8192
_SCALE_RULE = (
    f"must be 'full' or WIDTHxHEIGHT with even sides within {_SIDE_MIN}..{_SIDE_MAX}, e.g. 640x640 "
    "(your model's input size)"
)


def _check_frame(width: int, height: int, fps: int, required: bool) -> None:
    check(16 <= width <= _SIDE_MAX, "width", f"must be within 16..{_SIDE_MAX}")
    check(16 <= height <= _SIDE_MAX, "height", f"must be within 16..{_SIDE_MAX}")
    if required:
        check(1 <= fps <= 1000, "fps", "must be within 1..1000")


def parse_scale(text: str) -> tuple[int, int] | None:
    """A ``scale`` value's box as (width, height); None for ``full``. Raises ``ValueError``
    (saying what is allowed) for anything else."""
    if text == "full":
        return None
    w, sep, h = text.lower().partition("x")
    if sep and w.isdigit() and h.isdigit():
        box = int(w), int(h)
        if all(_SIDE_MIN <= side <= _SIDE_MAX and side % 2 == 0 for side in box):
            return box
    raise ValueError(f"{text!r}: {_SCALE_RULE}")


@dataclass(frozen=True)
class GStreamerSourceConfig(_LiveBase):
    """A GStreamer pipeline ending in appsink, opened through OpenCV: written by hand
    (``pipeline``), or built for a Jetson ``input`` (a CSI camera, an RTSP stream decoded in
    hardware, a USB camera), where nvvidconv (the VIC) can ``scale`` the frame before the
    CPU copies it (``pipelines/sources/jetson_capture.py`` builds the string)."""

    type: Literal["gstreamer"] = "gstreamer"
    pipeline: str = ""
    input: JetsonInput | None = None
    # With an input: the frame nvvidconv hands the CPU. full: the sensor's (stream's) size;
    # WxH: scaled to fit in that box keeping the aspect, never enlarged (1920x1080 in 640x640:
    # 640x360), so the host letterbox only pads. Write the model's input size there.
    scale: str = "full"
    interpolation: Literal["nearest", "bilinear", "5-tap", "10-tap", "smart", "nicest"] = "bilinear"
    flip_method: int = 0  # nvvidconv flip-method 0..7 (2: a camera mounted upside down)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.input is None:
            check(
                "appsink" in self.pipeline, "pipeline", "must end in an appsink element (or give an input:)"
            )
        else:
            check(not self.pipeline, "pipeline", "give a pipeline or an input:, not both")
        built = "with an input: (a hand-written pipeline sets nvvidconv's caps itself)"
        try:
            box = parse_scale(self.scale)
        except ValueError as e:
            check(False, "scale", str(e))
            box = None
        check(box is None or self.input is not None, "scale", f"works {built}")
        check(0 <= self.flip_method <= 7, "flip_method", "must be within 0..7 (nvvidconv's flip-method)")
        check(self.flip_method == 0 or self.input is not None, "flip_method", f"works {built}")
        check(
            self.interpolation == "bilinear" or self.input is not None,
            "interpolation",
            f"works {built}",
        )
        if box is not None and isinstance(self.input, RtspInput):
            check(
                self.input.width > 0,
                "input.width",
                "the stream's width and height are needed to scale it keeping its aspect "
                "(e.g. width: 1920, height: 1080), or scale: full",
            )


SourceConfig = (
    SyntheticSourceConfig
    | VideoSourceConfig
    | ImageFolderSourceConfig
    | WatchFolderSourceConfig
    | V4L2SourceConfig
    | RtspSourceConfig
    | GStreamerSourceConfig
)


def source_from_text(text: str) -> dict[str, str]:
    """A source section from one word on the command line (``run --source``): ``synthetic``;
    ``rtsp://…``; a GStreamer pipeline (it has ``!``); ``/dev/...`` or ``N`` (V4L2); an
    existing folder (images); anything else a video file (its existence is checked with the
    rest of the config). Raises ``ValueError`` for a URL scheme no source reads."""
    if not text:
        raise ValueError("'': empty (a file, a folder, /dev/videoN, rtsp://..., or 'synthetic')")
    if text == "synthetic":
        return {"type": "synthetic"}
    if text.startswith(("rtsp://", "rtsps://")):
        return {"type": "rtsp", "url": text}
    if "!" in text:
        return {"type": "gstreamer", "pipeline": text}
    if text.isdigit() or text.startswith("/dev/"):  # /dev/video2, udev's /dev/v4l/by-id/...
        return {"type": "v4l2", "device": f"/dev/video{text}" if text.isdigit() else text}
    if "://" in text:
        raise ValueError(
            f"{text!r}: no source reads {text.split('://')[0]}:// (rtsp:// streams, files, folders,"
            " /dev/videoN, a GStreamer pipeline or 'synthetic')"
        )
    path = os.path.abspath(os.path.expanduser(text))
    return {"type": "images" if os.path.isdir(path) else "video", "path": path}
