"""RTSP sources opened at the same time each get their own transport.

OpenCV's FFmpeg backend takes its demuxer options (rtsp_transport) from the process-wide
OPENCV_FFMPEG_CAPTURE_OPTIONS variable, read inside VideoCapture's open. No RTSP camera
exists here, so a fake of the FFmpeg capture stands in for cv2.VideoCapture: its open
takes a while, like a network open, and reads the variable partway through, as FFmpeg does.
"""

from __future__ import annotations

import os
import threading
import time

import cv2
import pytest

from edge_agent.core.source_config import RtspSourceConfig
from edge_agent.pipelines.sources import live as capture
from edge_agent.pipelines.sources.base import SourceError

VAR = "OPENCV_FFMPEG_CAPTURE_OPTIONS"


class FakeFfmpegCapture:
    """A fake cv2.VideoCapture for the FFmpeg backend: records the options it was opened with."""

    open_s = 0.05
    opened = True

    def __init__(self, url: str, api: int, params: list[int]) -> None:
        assert api == cv2.CAP_FFMPEG
        self.url = url
        time.sleep(self.open_s)  # connecting; FFmpeg reads the options after this
        self.options = os.environ.get(VAR)

    def isOpened(self) -> bool:
        return self.opened

    def release(self) -> None:
        pass


def rtsp(transport: str) -> RtspSourceConfig:
    url = f"rtsp://cam-{transport}.invalid/stream"
    return RtspSourceConfig(name=f"cam-{transport}", url=url, transport=transport)


@pytest.mark.parametrize("previous", [None, "stimeout;5000000"], ids=["unset", "set"])
def test_concurrent_rtsp_opens_each_see_their_own_transport(monkeypatch, previous):
    monkeypatch.setattr(capture.cv2, "VideoCapture", FakeFfmpegCapture)
    if previous is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, previous)
    configs = [rtsp("tcp"), rtsp("udp")]
    rounds = 20
    barrier = threading.Barrier(len(configs))
    seen: list[tuple[str, str | None]] = []
    errors: list[BaseException] = []

    def opener(config: RtspSourceConfig) -> None:
        try:
            for _ in range(rounds):
                barrier.wait(timeout=10)
                cap = capture.open_capture(config)
                seen.append((config.transport, cap.options))
        except BaseException as e:
            errors.append(e)
            barrier.abort()

    threads = [threading.Thread(target=opener, args=(c,)) for c in configs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not errors, errors
    assert len(seen) == rounds * len(configs)
    own = (f"{previous}|" if previous else "") + "rtsp_transport;{}"  # the user's options kept
    wrong = [(transport, options) for transport, options in seen if options != own.format(transport)]
    assert not wrong, f"{len(wrong)} of {len(seen)} opens saw another source's transport: {wrong[:4]}"
    after = os.environ.get(VAR)  # (not os.environ in the assert: a failure would print all of it)
    assert after == previous, "the option must not leak into later FFmpeg opens"


@pytest.mark.parametrize("previous", [None, "stimeout;5000000"], ids=["unset", "set"])
def test_a_failed_rtsp_open_restores_the_variable(monkeypatch, previous):
    class Refused(FakeFfmpegCapture):
        open_s, opened = 0.0, False

    monkeypatch.setattr(capture.cv2, "VideoCapture", Refused)
    if previous is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, previous)
    with pytest.raises(SourceError, match="cannot open RTSP stream"):
        capture.open_capture(rtsp("udp"))
    after = os.environ.get(VAR)
    assert after == previous
