"""Jetson capture pipelines with nvvidconv scaling: the strings built for each input and
scale mode, the aspect-fit arithmetic, and the config's checks naming their keys.

GStreamer and a Jetson cannot exist here (this OpenCV has no GStreamer), so nothing is
opened: the strings are compared exactly, as NVIDIA's "Accelerated GStreamer" guide spells
the elements (pipelines/sources/jetson_capture.py says which). The one test that follows
a built string to ``cv2.VideoCapture`` does so through a fake capture, named as one.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import ClassVar

import pytest
from conftest import REPO

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError, load
from edge_agent.core.effective.render import load_effective
from edge_agent.core.plan import capture_part
from edge_agent.core.source_config import (
    CsiCameraInput,
    GStreamerSourceConfig,
    RtspInput,
    UsbCameraInput,
    parse_scale,
)
from edge_agent.pipelines.preprocess import Letterbox, letterbox_geometry
from edge_agent.pipelines.sources import live
from edge_agent.pipelines.sources.base import SourceError
from edge_agent.pipelines.sources.jetson_capture import (
    fit_size,
    gstreamer_pipeline,
    jetson_pipeline,
    output_size,
)

TAIL = "videoconvert ! video/x-raw,format=BGR ! appsink drop=true max-buffers=1 sync=false"
CSI = (
    "nvarguscamerasrc sensor-id=0"
    " ! video/x-raw(memory:NVMM),width=1920,height=1080,framerate=30/1,format=NV12"
)
RTSP = 'rtspsrc location="rtsp://cam.local/stream1" latency=200 protocols=tcp'
USB = "v4l2src device=/dev/video0"

# -- the built strings -----------------------------------------------------------------------

PIPELINES = [
    pytest.param(
        GStreamerSourceConfig(input=CsiCameraInput()),
        f"{CSI} ! nvvidconv ! video/x-raw,format=BGRx ! {TAIL}",
        id="csi-full",
    ),
    pytest.param(
        GStreamerSourceConfig(input=CsiCameraInput(), scale="640x640"),
        f"{CSI} ! nvvidconv interpolation-method=1 ! video/x-raw,width=640,height=360,format=BGRx ! {TAIL}",
        id="csi-640",
    ),
    pytest.param(
        GStreamerSourceConfig(
            input=CsiCameraInput(sensor_id=1, width=3280, height=2464, fps=21),
            scale="640x640",
            interpolation="5-tap",
            flip_method=2,
        ),
        "nvarguscamerasrc sensor-id=1"
        " ! video/x-raw(memory:NVMM),width=3280,height=2464,framerate=21/1,format=NV12"
        " ! nvvidconv flip-method=2 interpolation-method=2"
        f" ! video/x-raw,width=640,height=480,format=BGRx ! {TAIL}",
        id="csi-imx219-full-sensor-upside-down",
    ),
    pytest.param(
        GStreamerSourceConfig(input=CsiCameraInput(), scale="640x640", flip_method=3),
        f"{CSI} ! nvvidconv flip-method=3 interpolation-method=1"
        f" ! video/x-raw,width=360,height=640,format=BGRx ! {TAIL}",
        id="csi-quarter-turn-is-portrait",
    ),
    pytest.param(
        GStreamerSourceConfig(input=CsiCameraInput(), flip_method=1),
        f"{CSI} ! nvvidconv flip-method=1 ! video/x-raw,format=BGRx ! {TAIL}",
        id="csi-full-quarter-turn",
    ),
    pytest.param(
        GStreamerSourceConfig(input=RtspInput(url="rtsp://cam.local/stream1")),
        f"{RTSP} ! rtph264depay ! h264parse ! nvv4l2decoder ! nvvidconv ! video/x-raw,format=BGRx ! {TAIL}",
        id="rtsp-h264-full-size-unknown",
    ),
    pytest.param(
        GStreamerSourceConfig(
            input=RtspInput(url="rtsp://cam.local/stream1", codec="h265", width=3840, height=2160),
            scale="640x640",
        ),
        f"{RTSP} ! rtph265depay ! h265parse ! nvv4l2decoder"
        f" ! nvvidconv interpolation-method=1 ! video/x-raw,width=640,height=360,format=BGRx ! {TAIL}",
        id="rtsp-h265-4k-640",
    ),
    pytest.param(
        GStreamerSourceConfig(
            input=RtspInput(
                url="rtsps://u:p@10.0.0.9:322/live?ch=1&sub=0",
                transport="udp",
                latency_ms=0,
                width=1280,
                height=720,
            ),
            scale="320x320",
            interpolation="nearest",
        ),
        'rtspsrc location="rtsps://u:p@10.0.0.9:322/live?ch=1&sub=0" latency=0 protocols=udp'
        " ! rtph264depay ! h264parse ! nvv4l2decoder"
        f" ! nvvidconv interpolation-method=0 ! video/x-raw,width=320,height=180,format=BGRx ! {TAIL}",
        id="rtsp-udp-query-string-quoted",
    ),
    pytest.param(
        GStreamerSourceConfig(input=UsbCameraInput()),
        f"{USB} ! video/x-raw,format=YUY2,width=1280,height=720,framerate=30/1"
        f" ! nvvidconv ! video/x-raw(memory:NVMM),format=NV12 ! nvvidconv ! video/x-raw,format=BGRx ! {TAIL}",
        id="usb-yuyv-full",
    ),
    pytest.param(
        GStreamerSourceConfig(input=UsbCameraInput(), scale="640x640"),
        f"{USB} ! video/x-raw,format=YUY2,width=1280,height=720,framerate=30/1"
        " ! nvvidconv ! video/x-raw(memory:NVMM),format=NV12"
        f" ! nvvidconv interpolation-method=1 ! video/x-raw,width=640,height=360,format=BGRx ! {TAIL}",
        id="usb-yuyv-640",
    ),
    pytest.param(
        GStreamerSourceConfig(
            input=UsbCameraInput(device="/dev/video2", format="mjpeg", width=1920, height=1080, fps=60),
            scale="640x640",
            interpolation="smart",
        ),
        "v4l2src device=/dev/video2 ! image/jpeg,width=1920,height=1080,framerate=60/1"
        " ! jpegparse ! nvv4l2decoder mjpeg=true"
        f" ! nvvidconv interpolation-method=4 ! video/x-raw,width=640,height=360,format=BGRx ! {TAIL}",
        id="usb-mjpeg-640",
    ),
    pytest.param(
        GStreamerSourceConfig(input=UsbCameraInput(width=640, height=480), scale="640x640"),
        f"{USB} ! video/x-raw,format=YUY2,width=640,height=480,framerate=30/1"
        " ! nvvidconv ! video/x-raw(memory:NVMM),format=NV12"
        f" ! nvvidconv interpolation-method=1 ! video/x-raw,width=640,height=480,format=BGRx ! {TAIL}",
        id="usb-smaller-than-model-not-enlarged",
    ),
]


@pytest.mark.parametrize(("config", "expected"), PIPELINES)
def test_the_pipeline_built_for_each_input_and_scale(config: GStreamerSourceConfig, expected: str):
    assert jetson_pipeline(config) == expected
    assert gstreamer_pipeline(config) == expected


@pytest.mark.parametrize(
    "inp",
    [CsiCameraInput(), RtspInput(url="rtsp://a/b", width=1920, height=1080), UsbCameraInput()],
    ids=["csi", "rtsp", "usb"],
)
def test_full_is_the_same_pipeline_without_the_size_and_interpolation(inp):
    full = jetson_pipeline(GStreamerSourceConfig(input=inp))
    scaled = jetson_pipeline(GStreamerSourceConfig(input=inp, scale="640x640", interpolation="nicest"))
    assert "format=BGRx" in full and "width=640" not in full and "interpolation-method" not in full
    assert scaled.replace(" interpolation-method=5", "").replace("width=640,height=360,", "") == full
    assert full.endswith(f"nvvidconv ! video/x-raw,format=BGRx ! {TAIL}")


def test_a_hand_written_pipeline_is_opened_exactly_as_written():
    written = "nvarguscamerasrc ! nvvidconv ! video/x-raw,format=BGRx ! videoconvert ! appsink"
    assert gstreamer_pipeline(GStreamerSourceConfig(pipeline=written)) == written
    with pytest.raises(ValueError, match="hand-written"):
        jetson_pipeline(GStreamerSourceConfig(pipeline=written))
    with pytest.raises(ValueError, match="hand-written"):
        output_size(GStreamerSourceConfig(pipeline=written))


class FakeGStreamerCapture:
    """A fake ``cv2.VideoCapture`` for the GStreamer backend (there is none here): it records
    what it was asked to open and, like OpenCV on a pipeline that fails, is not opened."""

    opened: ClassVar[list[tuple[str, int]]] = []

    def __init__(self, target: str, api: int) -> None:
        FakeGStreamerCapture.opened.append((target, api))

    def isOpened(self) -> bool:
        return False

    def release(self) -> None:
        pass


def test_open_capture_opens_the_built_pipeline_with_the_gstreamer_backend(monkeypatch):
    monkeypatch.setattr(live, "has_gstreamer", lambda: True)
    monkeypatch.setattr(live.cv2, "VideoCapture", FakeGStreamerCapture)
    FakeGStreamerCapture.opened = []
    config = GStreamerSourceConfig(input=CsiCameraInput(), scale="640x640")
    with pytest.raises(SourceError, match=re.escape("width=640,height=360,format=BGRx")):
        live.open_capture(config)
    assert FakeGStreamerCapture.opened == [(jetson_pipeline(config), live.cv2.CAP_GSTREAMER)]


@pytest.mark.skipif(live.has_gstreamer(), reason="this OpenCV has GStreamer")
def test_a_built_pipeline_without_gstreamer_says_so():
    with pytest.raises(SourceError, match="no GStreamer support"):
        live.open_capture(GStreamerSourceConfig(input=CsiCameraInput(), scale="640x640"))


# -- the aspect fit --------------------------------------------------------------------------

FITS = [
    ((1920, 1080), (640, 640), (640, 360)),  # 16:9 landscape
    ((3840, 2160), (640, 640), (640, 360)),  # 4K
    ((1280, 720), (640, 640), (640, 360)),
    ((4032, 3040), (640, 640), (640, 482)),  # IMX477 full sensor: 482.5 rounds to even 482
    ((3280, 2464), (640, 640), (640, 480)),  # IMX219 full sensor: 480.8 -> 480
    ((1080, 1920), (640, 640), (360, 640)),  # portrait
    ((1279, 719), (640, 640), (640, 360)),  # odd sides: 359.8 -> 360
    ((1921, 1081), (640, 640), (640, 360)),  # odd sides: 360.1 -> 360
    ((1000, 999), (640, 640), (640, 640)),  # all but square: 639.4 -> 640, within the box
    ((1920, 1080), (512, 288), (512, 288)),  # the box has the sensor's aspect: filled exactly
    ((1000, 1000), (640, 480), (480, 480)),  # a landscape box, a square sensor: the height fills
    ((1920, 1080), (320, 320), (320, 180)),
    ((8192, 16), (640, 640), (640, 2)),  # a sliver stays at least 2 high
    ((640, 480), (640, 640), (640, 480)),  # already fits: unchanged
    ((320, 240), (640, 640), (320, 240)),  # smaller than the model: not enlarged
    ((640, 360), (640, 640), (640, 360)),
    ((641, 480), (640, 640), (640, 480)),  # one pixel too wide: 479.3 -> 480
    ((700, 100), (640, 640), (640, 92)),  # 91.4 -> even 92
]


@pytest.mark.parametrize(
    ("src", "box", "expected"), FITS, ids=[f"{s[0]}x{s[1]}-in-{b[0]}x{b[1]}" for s, b, _ in FITS]
)
def test_fit_size(src, box, expected):
    assert fit_size(src, box) == expected


def test_a_fitted_frame_is_only_padded_by_the_host_letterbox():
    """For every sensor size, the scaled frame lies in the box with its aspect kept to the
    rounding, and the host letterbox into a model of the box's size scales it by exactly 1."""
    geo = Letterbox()
    sides = [16, 17, 99, 240, 359, 480, 719, 720, 1080, 1081, 1440, 1920, 2464, 3040, 3280, 4032]
    for box in [(640, 640), (320, 320), (640, 384), (1280, 1280)]:
        for src in [(w, h) for w in sides for h in sides]:
            w, h = fit_size(src, box)
            what = f"{src} in {box} -> {w}x{h}"
            assert w <= box[0] and h <= box[1], what
            if (w, h) != src:
                assert w == box[0] or h == box[1], f"{what}: one side fills the box"
                assert (w % 2, h % 2) == (0, 0), f"{what}: even sides"
                # the aspect kept to within one rounding step of the short side
                assert abs(w * src[1] - h * src[0]) <= 1.0 * src[0] + src[1], what
            letterbox_geometry(w, h, box[0], box[1], geo)
            if w == box[0] or h == box[1]:
                assert (geo.new_w, geo.new_h) == (w, h), f"{what}: the letterbox resized it"


@pytest.mark.parametrize("bad", [(0, 1080), (1920, 0), (-1, 5)])
def test_fit_size_refuses_an_empty_frame(bad):
    with pytest.raises(ValueError, match="positive"):
        fit_size(bad, (640, 640))


@pytest.mark.parametrize(
    ("config", "size"),
    [
        (GStreamerSourceConfig(input=CsiCameraInput()), (1920, 1080)),
        (GStreamerSourceConfig(input=CsiCameraInput(), flip_method=5), (1080, 1920)),
        (GStreamerSourceConfig(input=CsiCameraInput(), scale="640x640", flip_method=7), (360, 640)),
        (GStreamerSourceConfig(input=RtspInput(url="rtsp://a/b")), None),
        (GStreamerSourceConfig(input=UsbCameraInput(width=640, height=480), scale="1280x1280"), (640, 480)),
    ],
)
def test_output_size(config, size):
    assert output_size(config) == size


# -- config ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "box"),
    [("full", None), ("640x640", (640, 640)), ("1280X736", (1280, 736)), ("32x8192", (32, 8192))],
)
def test_parse_scale(text, box):
    assert parse_scale(text) == box


@pytest.mark.parametrize(
    "text", ["model", "640", "640x", "x640", "641x640", "640x30", "8194x640", "-640x640", ""]
)
def test_parse_scale_refuses(text):
    with pytest.raises(ValueError, match="must be 'full' or WIDTHxHEIGHT"):
        parse_scale(text)


def test_a_config_with_an_input_loads():
    cfg = load(
        AgentConfig,
        "source:\n  type: gstreamer\n  input: {type: csi, sensor_id: 1, width: 1280, height: 720, fps: 60}\n"
        "  scale: 640x640\n  flip_method: 2\n",
        "agent.yaml",
    )
    assert cfg.source == GStreamerSourceConfig(
        input=CsiCameraInput(sensor_id=1, width=1280, height=720, fps=60), scale="640x640", flip_method=2
    )
    assert output_size(cfg.source) == (640, 360)


BAD = [
    pytest.param(
        "  input: {type: csi}\n  scale: 641x640\n", "source.scale", r"'641x640': must be 'full' or", id="odd"
    ),
    pytest.param(
        "  input: {type: csi}\n  scale: model\n", "source.scale", r"640x640 \(your model's input", id="model"
    ),
    pytest.param(
        "  pipeline: 'a ! appsink'\n  scale: 640x640\n",
        "source.scale",
        "works with an input:",
        id="scale-by-hand",
    ),
    pytest.param(
        "  pipeline: 'a ! appsink'\n  flip_method: 2\n",
        "source.flip_method",
        "works with an input:",
        id="flip-by-hand",
    ),
    pytest.param(
        "  pipeline: 'a ! appsink'\n  interpolation: smart\n",
        "source.interpolation",
        "works with an input:",
        id="interp-by-hand",
    ),
    pytest.param(
        "  input: {type: csi}\n  flip_method: 8\n", "source.flip_method", r"within 0\.\.7", id="flip-8"
    ),
    pytest.param(
        "  input: {type: csi}\n  interpolation: cubic\n", "source.interpolation", "expected", id="interp"
    ),
    pytest.param(
        "  scale: full\n", "source.pipeline", r"appsink element \(or give an input:\)", id="neither"
    ),
    pytest.param(
        "  input: {type: csi}\n  pipeline: 'a ! appsink'\n", "source.pipeline", "not both", id="both"
    ),
    pytest.param(
        "  input: {type: gige}\n", "source.input.type", r"unknown type 'gige' \(one of 'csi'", id="kind"
    ),
    pytest.param("  input: {type: csi, sensor_id: 16}\n", "source.input.sensor_id", r"0\.\.15", id="sensor"),
    pytest.param("  input: {type: csi, fps: 0}\n", "source.input.fps", r"1\.\.1000", id="fps"),
    pytest.param("  input: {type: csi, fps: 29.97}\n", "source.input.fps", "an integer", id="fps-fraction"),
    pytest.param("  input: {type: csi, width: 9000}\n", "source.input.width", r"16\.\.8192", id="width"),
    pytest.param(
        "  input: {type: csi, url: rtsp://a}\n", "source.input.url", "unknown key", id="key-of-another"
    ),
    pytest.param("  input: {type: rtsp, url: http://a}\n", "source.input.url", "rtsp://", id="url"),
    pytest.param(
        "  input: {type: rtsp, url: 'rtsp://a/\"b'}\n", "source.input.url", "quotes", id="url-quote"
    ),
    pytest.param(
        "  input: {type: rtsp, url: rtsp://a, width: 1920}\n", "source.input.height", "or neither", id="half"
    ),
    pytest.param(
        "  input: {type: rtsp, url: rtsp://a}\n  scale: 640x640\n",
        "source.input.width",
        "the stream's width and height are needed",
        id="rtsp-size-unknown",
    ),
    pytest.param(
        "  input: {type: rtsp, url: rtsp://a, codec: av1}\n", "source.input.codec", "expected", id="codec"
    ),
    pytest.param("  input: {type: usb, device: video0}\n", "source.input.device", "/dev/", id="device"),
    pytest.param("  input: {type: usb, format: nv12}\n", "source.input.format", "expected", id="usb-format"),
]


@pytest.mark.parametrize(("body", "path", "message"), BAD)
def test_a_bad_jetson_source_names_its_key(body: str, path: str, message: str):
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, "source:\n  type: gstreamer\n" + body, "agent.yaml")
    problems = info.value.problems
    assert [p.path for p in problems] == [path], [str(p) for p in problems]
    assert re.search(message, problems[0].message), problems[0].message
    assert problems[0].line >= 2, "the problem points into the source section"


def test_sources_list_errors_name_the_item():
    with pytest.raises(ConfigError) as info:
        load(
            AgentConfig,
            "sources:\n  - {name: a, type: synthetic}\n"
            "  - {name: b, type: gstreamer, input: {type: csi}, scale: 3x3}\n",
            "agent.yaml",
        )
    assert [p.path for p in info.value.problems] == ["sources[1].scale"]


def test_a_scale_change_reopens_the_source_at_a_reload():
    """scale, interpolation, flip and the input are capture settings: a reload that changes
    one reopens the source (``reloading.prepare`` keeps only an equal ``capture_part``)."""
    base = GStreamerSourceConfig(input=CsiCameraInput(), scale="640x640")
    for changed in [
        replace(base, scale="full"),
        replace(base, interpolation="nicest"),
        replace(base, flip_method=2),
        replace(base, input=CsiCameraInput(sensor_id=1)),
    ]:
        assert capture_part(changed) != capture_part(base)
    assert capture_part(replace(base, priority=5)) == capture_part(base)


def test_the_csi_example_builds_a_scaled_pipeline():
    cfg = load_effective(str(REPO / "examples" / "csi-jetson.yaml"), env={}).config
    assert isinstance(cfg.source, GStreamerSourceConfig) and cfg.source.input is not None
    assert "! nvvidconv interpolation-method=1 ! video/x-raw,width=640,height=360,format=BGRx !" in (
        gstreamer_pipeline(cfg.source)
    )


def test_a_built_pipeline_is_logged_when_the_source_opens(caplog):
    """The string to try with gst-launch-1.0 on the device; the opener here refuses at once."""

    def refuse() -> None:
        raise SourceError("no camera here")

    config = GStreamerSourceConfig(
        input=UsbCameraInput(format="mjpeg"), scale="640x640", retry_initial_s=60, retry_max_s=60
    )
    source = live.OpenCvCapture(config, opener=refuse)
    with caplog.at_level("INFO", logger=live.log.name):
        source.open()
        assert source.stop(2.0)
    assert f"source cam0: GStreamer pipeline {jetson_pipeline(config)}" in caplog.messages
