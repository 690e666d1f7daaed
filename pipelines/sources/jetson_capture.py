"""GStreamer pipeline strings for a Jetson's cameras and streams, with the frame scaled by
nvvidconv (the VIC) before the CPU copies it.

A ``gstreamer`` source with an ``input:`` (``core/source_config.py``) is built here into
the string OpenCV opens (``live.open_capture``). Every input ends in the same tail:

    nvvidconv [flip-method=F] [interpolation-method=I]
    ! video/x-raw[,width=W,height=H],format=BGRx ! videoconvert ! video/x-raw,format=BGR
    ! appsink drop=true max-buffers=1 sync=false

nvvidconv converts (and scales) the NVMM frame into system memory as BGRx, a raw output
format the VIC has; OpenCV's appsink takes BGR, not BGRx, so ``videoconvert`` drops the
fourth byte on the CPU, now at W x H instead of the sensor's size. ``drop=true
max-buffers=1 sync=false``: the newest frame wins, as the reader thread's buffers do.

Element names, caps and properties follow NVIDIA's Jetson Linux "Accelerated GStreamer"
guide (nvarguscamerasrc, nvv4l2decoder, nvvidconv's scaling, flip-method and
interpolation-method tables); none of these strings has run on a Jetson here (docs/jetson.md).
Pure functions: no GStreamer is imported or needed to build them.
"""

from __future__ import annotations

from edge_agent.core.source_config import (
    INTERPOLATIONS,
    TRANSPOSING_FLIPS,
    CsiCameraInput,
    GStreamerSourceConfig,
    JetsonInput,
    RtspInput,
    UsbCameraInput,
    parse_scale,
)

APPSINK = "appsink drop=true max-buffers=1 sync=false"


def fit_size(src_wh: tuple[int, int], box_wh: tuple[int, int]) -> tuple[int, int]:
    """The size (width, height) a ``src_wh`` frame is scaled to so that it fits in
    ``box_wh`` keeping its aspect, never enlarged.

    The side that fills the box takes the box's side exactly, as the host letterbox
    (``preprocess.letterbox_geometry``) would scale it, so the letterbox then finds scale 1
    and only pads. The other side is rounded to the nearest even number (at least 2, at
    most the box's): the VIC works on 4:2:0 frames, whose chroma is halved both ways. A
    frame already within the box keeps its size: scaling up would copy more for no detail
    (the host letterbox enlarges it instead). Raises ``ValueError`` for a side below 1.
    """
    sw, sh = src_wh
    bw, bh = box_wh
    if min(sw, sh, bw, bh) < 1:
        raise ValueError(f"sizes must be positive: {sw}x{sh} in {bw}x{bh}")
    if sw <= bw and sh <= bh:
        return sw, sh
    if bw * sh <= bh * sw:  # the width fills the box (exact integer comparison of the ratios)
        return bw, min(bh, max(2, 2 * round(sh * bw / sw / 2)))
    return min(bw, max(2, 2 * round(sw * bh / sh / 2))), bh


def oriented(src_wh: tuple[int, int], flip_method: int) -> tuple[int, int]:
    """The frame's size after nvvidconv's ``flip_method``: a quarter turn or a diagonal
    flip (1, 3, 5, 7) swaps width and height."""
    return (src_wh[1], src_wh[0]) if flip_method in TRANSPOSING_FLIPS else src_wh


def source_size(inp: JetsonInput) -> tuple[int, int] | None:
    """The input's frame size as it leaves the camera or decoder; None when it is not
    known (an RTSP stream without ``width``/``height``)."""
    return (inp.width, inp.height) if inp.width else None


def output_size(config: GStreamerSourceConfig) -> tuple[int, int] | None:
    """The size of the frames the CPU gets from ``config``'s built pipeline; None for
    ``scale: full`` on a stream of unknown size. Raises ``ValueError`` for a config
    without an ``input`` (a hand-written pipeline says its own size)."""
    if config.input is None:
        raise ValueError("a hand-written pipeline: its frame size is its own")
    size = source_size(config.input)
    box = parse_scale(config.scale)
    if size is None:
        return None
    size = oriented(size, config.flip_method)
    return size if box is None else fit_size(size, box)


def head(inp: JetsonInput) -> str:
    """The elements that deliver the input's frames into NVMM memory, up to (not
    including) nvvidconv."""
    if isinstance(inp, CsiCameraInput):
        return (
            f"nvarguscamerasrc sensor-id={inp.sensor_id}"
            f" ! video/x-raw(memory:NVMM),width={inp.width},height={inp.height},"
            f"framerate={inp.fps}/1,format=NV12"
        )
    if isinstance(inp, RtspInput):
        return (
            f'rtspsrc location="{inp.url}" latency={inp.latency_ms} protocols={inp.transport}'
            f" ! rtp{inp.codec}depay ! {inp.codec}parse ! nvv4l2decoder"
        )
    if isinstance(inp, UsbCameraInput):
        src = f"v4l2src device={inp.device}"
        mode = f"width={inp.width},height={inp.height},framerate={inp.fps}/1"
        if inp.format == "mjpeg":
            return f"{src} ! image/jpeg,{mode} ! jpegparse ! nvv4l2decoder mjpeg=true"
        # v4l2src delivers to system memory: one nvvidconv uploads it to NVMM (the VIC's
        # documented raw-input path), the tail's scales it there and brings it back.
        return f"{src} ! video/x-raw,format=YUY2,{mode} ! nvvidconv ! video/x-raw(memory:NVMM),format=NV12"
    raise TypeError(f"not a Jetson input: {type(inp).__name__}")


def tail(config: GStreamerSourceConfig) -> str:
    """nvvidconv with its flip and interpolation, the BGRx caps (with the scaled size
    unless ``scale: full``), the CPU's BGRx -> BGR and the appsink."""
    props = ""
    if config.flip_method:
        props += f" flip-method={config.flip_method}"
    box = parse_scale(config.scale)
    caps = "video/x-raw,format=BGRx"
    if box is not None:
        props += f" interpolation-method={INTERPOLATIONS.index(config.interpolation)}"
        size = output_size(config)
        if size is not None:
            caps = f"video/x-raw,width={size[0]},height={size[1]},format=BGRx"
    return f"nvvidconv{props} ! {caps} ! videoconvert ! video/x-raw,format=BGR ! {APPSINK}"


def jetson_pipeline(config: GStreamerSourceConfig) -> str:
    """The GStreamer pipeline string for ``config``'s ``input``. Raises ``ValueError`` for a
    config without one."""
    if config.input is None:
        raise ValueError("no input: to build a pipeline for (a hand-written pipeline is used as written)")
    return f"{head(config.input)} ! {tail(config)}"


def gstreamer_pipeline(config: GStreamerSourceConfig) -> str:
    """What OpenCV opens for a ``gstreamer`` source: its hand-written ``pipeline`` exactly
    as written, or the one built for its ``input``."""
    return config.pipeline if config.input is None else jetson_pipeline(config)
