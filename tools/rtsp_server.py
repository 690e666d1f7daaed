#!/usr/bin/python3
"""A real RTSP camera for tests: a live, moving test picture served by gst-rtsp-server.

Tests of RTSP sources (tests/pipelines/sources/test_rtsp_live.py) start it as a subprocess, kill it to take
the "camera" away and start it again on the same port to bring it back. It prints
``READY rtsp://127.0.0.1:PORT/PATH`` on stdout once it serves, and exits cleanly on
SIGTERM or SIGINT.

It runs under the SYSTEM Python (/usr/bin/python3), whose GObject bindings it needs, not
the project's venv. Debian/Ubuntu packages:

    apt-get install -y python3-gi gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-base \
        gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly

(plugins-ugly has x264enc; with ``--encoder jpeg`` it is not needed.)

    /usr/bin/python3 tools/rtsp_server.py --port 8554 --fps 30 --size 640x480
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

# Live (paced by the clock, like a camera) and moving: an agent takes identical frames for
# stall_timeout_s as a frozen camera, and compares a sparse grid of pixels. The default
# (wavy) ball misses that grid for up to 0.7 s; a sweeping one changes it every frame or two.
SOURCE = (
    "videotestsrc is-live=true pattern=ball motion=sweep ! video/x-raw,width={w},height={h},framerate={fps}/1"
)
ENCODERS = {
    # H.264 as cameras send it: no B-frames, a keyframe every second (a client that
    # connects mid-stream decodes within a second), SPS/PPS repeated in band.
    "h264": "x264enc tune=zerolatency speed-preset=ultrafast key-int-max={fps} bitrate=2000"
    " ! video/x-h264,profile=baseline ! rtph264pay name=pay0 pt=96 config-interval=1",
    # Motion JPEG: every frame stands alone; no plugins-ugly needed.
    "jpeg": "videoconvert ! video/x-raw,format=I420 ! jpegenc quality=70 ! rtpjpegpay name=pay0 pt=26",
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8554, help="TCP port for RTSP (0: any free one)")
    p.add_argument("--path", default="/cam", help="mount point (default /cam)")
    p.add_argument("--fps", type=int, default=30)
    p.add_argument("--size", default="640x480", help="WIDTHxHEIGHT")
    p.add_argument("--encoder", choices=sorted(ENCODERS), default="h264")
    args = p.parse_args()
    w, h = (int(v) for v in args.size.lower().split("x"))
    path = args.path if args.path.startswith("/") else "/" + args.path

    Gst.init(None)
    launch = f"( {SOURCE} ! {ENCODERS[args.encoder]} )".format(w=w, h=h, fps=args.fps)
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(True)  # one pipeline for every client (and for a client's reconnects)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))  # bound with SO_REUSEADDR: a restart can take it at once
    server.get_mount_points().add_factory(path, factory)
    if server.attach(None) == 0:
        print(f"cannot serve RTSP on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1

    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, lambda *_: loop.quit() or False)
    print(f"READY rtsp://127.0.0.1:{server.get_bound_port()}{path}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
