"""The live view with real parts: an agent on the synthetic camera, its HTTP server, MJPEG
read off a socket, and the page rendered by a real headless Chromium."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import free_endpoint, run_process, started, wait_until
from helpers import free_port

from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig, ViewConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.pipelines.view_tap import ViewFrame
from edge_agent.service.view.annotate import PALETTE, annotate, colour

W, H = 320, 240  # the synthetic camera's frames in these tests


def config(const_model: Path, port: int, size: tuple[int, int] = (W, H), **view) -> AgentConfig:
    return AgentConfig(
        source=SyntheticSourceConfig(fps=30, width=size[0], height=size[1]),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=free_endpoint()),
        metrics=MetricsConfig(enabled=False),
        view=ViewConfig(enabled=True, port=port, **{"fps": 10.0, **view}),
    )


def get(url: str, timeout_s: float = 10) -> bytes:
    return urllib.request.urlopen(url, timeout=timeout_s).read()


def mjpeg_frames(port: int, source: str, n: int, pause_s: float = 0.0) -> list[tuple[float, int, bytes]]:
    """Read ``n`` parts of a multipart MJPEG stream off a raw socket: (arrival, frame id, JPEG)."""
    out: list[tuple[float, int, bytes]] = []
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)  # a small client: no backlog here
        s.settimeout(15)
        s.connect(("127.0.0.1", port))
        s.sendall(f"GET /stream/{source}.mjpg HTTP/1.0\r\n\r\n".encode())
        f = s.makefile("rb")
        assert b"200" in f.readline()
        while f.readline() not in (b"\r\n", b""):
            pass  # the response headers
        while len(out) < n:
            headers = {}
            line = f.readline()
            while line not in (b"\r\n", b""):
                key, _, value = line.decode().partition(":")
                headers[key.strip().lower()] = value.strip()
                line = f.readline()
            if not line:
                raise AssertionError("the stream ended")
            if "content-length" in headers:
                jpeg = f.read(int(headers["content-length"]))
                out.append((time.monotonic(), int(headers["x-frame-id"]), jpeg))
                f.readline()  # the CRLF after the body
                if pause_s:
                    time.sleep(pause_s)  # the test's input: a slow client
    return out


def test_boxes_are_drawn_where_the_detections_are():
    image = np.zeros((200, 300, 3), np.uint8)
    f = ViewFrame(4)
    f.det_xyxy[:2] = [(40, 60, 140, 160), (200, 20, 280, 90)]
    f.det_class[:2] = [1, 3]
    f.det_score[:2] = [0.9, 0.5]
    f.det_count, f.labels, f.frame_id, f.e2e_ms = 2, ["a", "b", "c", "d"], 7, 12.5
    annotate(image, f)
    for (x1, y1, x2, y2), cls in (((40, 60, 140, 160), 1), ((200, 20, 280, 90), 3)):
        c = np.array(colour(cls))
        for x, y in ((x1, (y1 + y2) // 2), (x2, (y1 + y2) // 2), ((x1 + x2) // 2, y2)):
            assert (image[y, x] == c).all(), (cls, x, y, image[y, x])
        assert (image[(y1 + y2) // 2, (x1 + x2) // 2] == 0).all(), "inside the box stays as it was"
    assert image[8:20, 5:60].any(), "the stamp is in the corner"
    assert colour(1) != colour(3) and colour(len(PALETTE) + 1) == colour(1)


def label_and_stamp(image: np.ndarray, box: tuple[int, int, int, int], cls: int) -> tuple[tuple, tuple]:
    """The rectangles (x1, y1, x2, y2, inclusive) of a box's filled label and of the stamp,
    read off the annotated image: the label is its class colour where the box's outline is
    not, the stamp is the black in the top-left corner (the image itself is grey)."""
    x1, y1, x2, y2 = box
    fill = (image == np.array(colour(cls))).all(axis=2)
    outline = np.zeros_like(fill)
    outline[y1 : y2 + 1, x1 : x2 + 1] = True
    outline[y1 + 2 : y2 - 1, x1 + 2 : x2 - 1] = False  # the outline is 1 px here (thick 1)
    ys, xs = np.nonzero(fill & ~outline)
    assert len(ys), f"no label of class {cls} to be seen"
    dark = (image == 0).all(axis=2)
    dark[:, image.shape[1] // 2 :] = False
    sy, sx = np.nonzero(dark)
    return (xs.min(), ys.min(), xs.max(), ys.max()), (sx.min(), sy.min(), sx.max(), sy.max())


@pytest.mark.parametrize(
    "box",
    [(0, 0, 120, 90), (60, 10, 200, 150), (30, 30, 100, 100), (240, 5, 319, 60), (200, 80, 300, 200)],
    ids=["corner", "under-the-stamp", "just-below-the-stamp", "right-of-the-stamp", "clear"],
)
def test_a_label_never_sits_under_the_frame_stamp(box):
    image = np.full((240, 320, 3), 128, np.uint8)
    f = ViewFrame(1)
    f.det_xyxy[0], f.det_class[0], f.det_score[0] = box, 0, 0.9
    f.det_count, f.labels, f.frame_id, f.e2e_ms = 1, ["person"], 123456, 48.3
    annotate(image, f)
    label, stamp = label_and_stamp(image, box, 0)
    (lx1, ly1, lx2, ly2), (sx1, sy1, sx2, sy2) = label, stamp
    assert lx2 < sx1 or lx1 > sx2 or ly2 < sy1 or ly1 > sy2, ("they overlap", label, stamp)
    assert ly2 - ly1 >= 14 and lx2 - lx1 >= 40, "the whole label shows"
    assert (image[ly1 : ly2 + 1, lx1 : lx2 + 1] == 255).all(axis=2).any(), "with its text"
    # At its box's left edge (the outline there is not counted as label), or at the image's right.
    assert 0 <= lx1 - box[0] <= 2 or lx2 == 319, (lx1, lx2, box)
    if box[1] - (ly2 - ly1 + 1) > sy2:  # room above the box, clear of the stamp: the label sits there
        assert ly2 == box[1] - 1 or ly2 == box[1], (ly2, box)


def test_the_frame_path_does_nothing_while_nobody_watches_and_mjpeg_flows_at_the_view_fps(const_model):
    port = free_port()
    with started(config(const_model, port)) as agent:
        tap = agent.view.taps["cam0"]
        wait_until(lambda: agent.pipeline.published() >= 30, 30, message="30 frames published")
        assert tap.captures == 0 and agent.view.encoded == 0, "no copy, no encoding while nobody watches"
        frames = mjpeg_frames(port, "cam0", 20)
        assert tap.captures >= 20 and agent.view.encoded >= 20
        wait_until(lambda: not tap.active, 10, message="the tap goes quiet when the client is gone")
        published = agent.pipeline.published()  # (a frame read just before may still hand over)
        wait_until(lambda: agent.pipeline.published() >= published + 5, 30, message="frames go on")
        taken, published = tap.captures, agent.pipeline.published()
        wait_until(lambda: agent.pipeline.published() >= published + 15, 30, message="frames go on")
        assert tap.captures == taken
    for _, _, jpeg in frames:
        img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert img is not None and img.shape == (H, W, 3)
    # At most view.fps (10): 20 frames take at least ~1.9 s; a loaded machine only slower.
    assert frames[-1][0] - frames[0][0] >= 19 / 10 * 0.9


def test_a_wide_frame_is_scaled_to_max_width_and_a_token_guards_every_url(const_model):
    port = free_port()
    with started(config(const_model, port, max_width=160, token="s3cret")):
        for path in ("", "api/health", "stream/cam0.mjpg", "snapshot/cam0.jpg", "snapshot/cam0.jpg?token=no"):
            with pytest.raises(urllib.error.HTTPError) as e:
                get(f"http://127.0.0.1:{port}/{path}")
            assert e.value.code == 403, path
        jpeg = get(f"http://127.0.0.1:{port}/snapshot/cam0.jpg?token=s3cret")
        img = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
        assert img.shape == (120, 160, 3)
        with pytest.raises(urllib.error.HTTPError) as e:
            get(f"http://127.0.0.1:{port}/snapshot/nope.jpg?token=s3cret")
        assert e.value.code == 404


def test_a_slow_client_neither_slows_the_agent_nor_queues_frames(const_model):
    port = free_port()
    # Camera-sized frames (~100 KB as JPEG): the sockets' buffers hold about one of them.
    with started(config(const_model, port, (1280, 720), max_width=1280)) as agent:
        wait_until(lambda: agent.pipeline.published() >= 10, 30, message="frames flow")
        before = agent.pipeline.published()
        frames = mjpeg_frames(port, "cam0", 8, pause_s=1.0)  # one frame a second
        during = agent.pipeline.published() - before
    # The pipeline went on while the reader dawdled (30 fps for 7 s; a loaded machine fewer).
    assert during >= 60, during
    # After what the sockets hold (a few frames), each read gets a frame queued when a
    # read made room, not the next of a backlog: over the last reads ids advance by about a
    # second of frames a read (the camera makes 30; a backlog would advance by one). Judged
    # on the mean of three reads: the sockets' buffers hold one or two frames, as their
    # sizes vary, so a single step can be short.
    ids = [i for _, i, _ in frames]
    assert (ids[-1] - ids[-4]) / 3 >= 10, f"a backlog: {ids}"
    assert len(agent.view.latest) == 1, "one encoded frame per source is all the view keeps"


def test_a_connection_that_sends_nothing_is_closed(const_model):
    port = free_port()
    with started(config(const_model, port)), socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        assert s.recv(1) == b"", "closed by the server (request timeout), not held forever"


def _chromium() -> str:
    # CHROMIUM: a browser of the user's own (docs/testing.md: Ubuntu's is a snap).
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the live view's browser test needs Chromium (tools/test.sh installs it)"
    return found


def _browser(tmp: Path, *args: str) -> list[str]:
    return [
        _chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp}",
        "--virtual-time-budget=5000",
        *args,
    ]


def test_the_page_shows_the_live_frame_and_the_figures_in_a_real_browser(const_model, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with started(config(const_model, port)):
        wait_until(lambda: b"cam0" in get(url + "api/health"), 30, message="a heartbeat")
        snapshot = cv2.imdecode(np.frombuffer(get(url + "snapshot/cam0.jpg"), np.uint8), cv2.IMREAD_COLOR)
        shot = tmp_path / "page.png"
        out = run_process(_browser(tmp_path / "a", "--window-size=900,700", f"--screenshot={shot}", url), 90)
        assert shot.is_file(), out.stderr[-2000:]
        dom = run_process(_browser(tmp_path / "b", "--dump-dom", url), 90).stdout
    page = cv2.imread(str(shot))

    def has(img: np.ndarray, bgr: tuple[int, int, int]) -> bool:
        return bool((np.abs(img.astype(int) - bgr).max(axis=2) <= 24).sum() >= 20)

    # The const model reports classes 0 and 2: their box colours are in the snapshot, and so
    # in the browser's rendering of the page (the live image), and no other class's is.
    drawn = [c for c in PALETTE if has(snapshot, c)]
    assert colour(0) in drawn and colour(2) in drawn, drawn
    assert all(has(page, c) for c in (colour(0), colour(2)))
    # The figures line, filled in by the page's script from /api/health.
    assert "fps " in dom and "e2e p50" in dom and "ladder full" in dom, dom[-3000:]
    assert "waiting for the first heartbeat" not in dom


def test_run_view_prints_the_url(tmp_path, const_model):
    from conftest import agent_command, spawn

    port = free_port()
    cfg = tmp_path / "a.yaml"
    cfg.write_text(
        f"model: {{path: {const_model}}}\nmetrics: {{enabled: false}}\n"
        f"publish: {{endpoint: '{free_endpoint()}'}}\nview: {{port: {port}}}\n"
    )
    with spawn(
        agent_command("run", "--config", str(cfg), "--view", "--quiet"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        from conftest import read_line

        line = ""
        end = time.monotonic() + 60
        while "live view:" not in line and time.monotonic() < end:
            line = read_line(proc.stderr, 60)
        assert line.strip().endswith(f"http://127.0.0.1:{port}/"), line
        assert get(f"http://127.0.0.1:{port}/").startswith(b"<!doctype html>")


def test_a_reload_keeps_the_running_view_and_swaps_nothing_for_a_view_change(const_model, caplog):
    from dataclasses import replace

    port = free_port()
    cfg = config(const_model, port)
    with started(cfg) as agent:
        pipeline, tap = agent.pipeline, agent.view.taps["cam0"]
        assert agent.reload(replace(cfg, view=replace(cfg.view, fps=2.0))) == []
        assert agent.pipeline is pipeline and agent.view.cfg.fps == 10.0, "no swap, the running view stays"
        assert "view take effect at the next start" in caplog.text
        # A real reload rebuilds the lanes: the new lane gets the same tap (a viewer keeps watching).
        assert agent.reload(replace(cfg, deadline=replace(cfg.deadline, budget_ms=40))) == ["deadline"]
        assert agent.view.taps["cam0"] is tap
        tap.active = True  # someone watches: the new lane's capture stage fills this same tap
        captures = tap.captures
        wait_until(lambda: tap.captures > captures, 10, message="the new lane offers its frames to the tap")
        tap.active = False
        # A source renamed away: its tap goes (the page no longer lists it), the new one comes.
        agent.reload(replace(cfg, source=replace(cfg.source, name="gate")))
        assert set(agent.view.taps) == {"gate"} and not tap.active
        assert b"/stream/gate.mjpg" in get(f"http://127.0.0.1:{port}/")


def test_a_reload_that_raises_max_detections_grows_the_tap():
    import threading

    from edge_agent.pipelines.view_tap import ViewTap

    tap = ViewTap("cam0", 10.0, 4, threading.Event())
    tap.grow(2)  # never shrinks
    assert tap.max_det == 4
    tap.grow(16)
    into = ViewFrame(16)
    assert tap.max_det == 16 and tap.take(into, -1) == 0


# -- the page's figures and chart, with a known heartbeat ---------------------------------------

#: What /api/health answers in the tests below: 82 frames missed since start (80 late, 2
#: dropped as stale), and 80 % of the 60 frames that ended in the miss window.
KNOWN_BEAT = {
    "fps": 29.5,
    "counts": {"late": 80, "dropped_by_reason": {"stale": 2}},
    "miss_rate": 0.8,
    "miss_window_frames": 60,
    "latency_ms": {"window": {"count": 30, "p50": 20.0, "p99": 40.0}},
    "ladder": {"name": "full"},
    "deadline": {"budget_ms": 50.0},
}


def canvas_box(img: np.ndarray) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1) of the chart in a screenshot: the one area of its background colour."""
    bg = (np.abs(img.astype(int) - 0x1B).max(axis=2) <= 1).astype(np.uint8)
    _, _, boxes, _ = cv2.connectedComponentsWithStats(bg)
    x, y, w, h, _ = max(boxes[1:], key=lambda b: b[4])
    return x, y, x + w, y + h


def test_the_chart_has_axes_and_a_legend_and_the_misses_are_named_in_a_real_browser(const_model, tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with started(config(const_model, port)) as agent:
        agent.view.heartbeats = lambda: {"cam0": KNOWN_BEAT}  # the page's input, fixed
        dom = run_process(_browser(tmp_path / "a", "--dump-dom", url), 90).stdout
        shot = tmp_path / "page.png"
        out = run_process(_browser(tmp_path / "b", "--window-size=900,800", f"--screenshot={shot}", url), 90)
        assert shot.is_file(), out.stderr[-2000:]
    # The misses: a rate over the window and a count since start, side by side, each named.
    stats = dom[dom.index('id="stats-cam0"') :].split("</div>")[0]
    assert "missed 80.0 % of the last 60 frames | missed 82 since start |" in stats, stats
    # The legend says which line is which, and the budget line's value.
    legend = dom[dom.index('id="legend-cam0"') :].split("</div>")[0]
    assert "p50 end-to-end latency" in legend and "p99 end-to-end latency" in legend, legend
    assert "budget 50 ms" in legend and "hidden" not in legend, legend
    label = dom[dom.index('id="chart-cam0"') :].split(">")[0]
    assert "p50 and p99 in ms (0 to 75) against seconds ago (60 to 0), budget 50 ms dashed" in label, label

    from edge_agent.service.view.page import PAD, SERIES

    img = cv2.imread(str(shot))
    x0, y0, x1, y1 = canvas_box(img)
    assert (x1 - x0, y1 - y0) == (480, 150), (x0, y0, x1, y1)
    chart = img[y0:y1, x0:x1].astype(int)

    def light_text(region: np.ndarray) -> int:  # the axes' tick labels and titles: light grey
        return int(((region.min(axis=2) > 150) & (np.ptp(region, axis=2) < 16)).sum())

    assert light_text(chart[:, : PAD["left"] - 4]) > 100, "the y axis's ticks and title (ms)"
    assert light_text(chart[-PAD["bottom"] + 3 :, PAD["left"] :]) > 100, "the x axis's ticks and title"

    def rows_of(region: np.ndarray, colour: str) -> np.ndarray:
        bgr = np.array([int(colour[i : i + 2], 16) for i in (5, 3, 1)])
        return np.nonzero((np.abs(region - bgr).max(axis=2) <= 30).sum(axis=1) >= 3)[0]

    (p50, c50), (p99, c99) = SERIES
    assert (p50, p99) == ("p50", "p99")
    low, high = rows_of(chart, c50), rows_of(chart, c99)
    # The legend's colours are the lines': p50's line (20 ms) below p99's (40 ms), in the plot.
    assert len(low) and len(high) and low.min() > high.max(), (low, high)
    assert high.min() >= PAD["top"] and low.max() < 150 - PAD["bottom"], (low, high)
    under = img[y1 : y1 + 40, x0:x1].astype(int)
    assert len(rows_of(under, c50)) and len(rows_of(under, c99)), "the legend's keys under the chart"
