"""Helpers the tests share: a subscriber to the result stream, videos to play (numbered
frames, damaged copies), systemd's notify socket, an agent running with metrics.

Shared fixtures are in conftest.py; these are plain functions and classes, imported by
name (``from helpers import Subscriber``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import cv2
import numpy as np
import zmq
from conftest import started, wait_until
from prometheus_client.parser import text_string_to_metric_families

from edge_agent import client
from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.pipelines.sources.synthetic import SceneSpec, SyntheticScene

# -- the result stream ---------------------------------------------------------------------


class Subscriber:
    """Collects the stream's messages on a background thread: the client's subscriber (a real
    SUB socket), each message decoded as the client decodes it. ``arrivals``, ``topics`` and
    ``messages`` grow in that order, so a reader that takes ``len(messages)`` first has
    a consistent prefix of all three."""

    def __init__(self, endpoint: str, topic: str = "", keep_all: bool = False) -> None:
        self.ctx = zmq.Context()  # its own, ended by close(): no other test can end it first
        # keep_all: no high-water mark, as a test counting seq gaps must not cause them
        self.stream = client.Subscriber(
            endpoint, (topic,), timeout_s=0.1, rcvhwm=0 if keep_all else None, context=self.ctx
        )
        self.messages: list[dict] = []
        self.topics: list[str] = []
        self.arrivals: list[float] = []  # time.monotonic() as each message arrived
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.stream.recv()
            if got is None:
                continue
            self.arrivals.append(time.monotonic())
            self.topics.append(got[0])
            self.messages.append(got[1])

    def wait_for(self, n: int, timeout_s: float = 30.0) -> None:
        """Until ``n`` messages have arrived; AssertionError after ``timeout_s``."""
        wait_until(
            lambda: len(self.messages) >= n,
            timeout_s,
            message=f"{n} messages expected, {len(self.messages)} arrived",
        )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.stream.close()
        self.ctx.term()


# -- files to play -------------------------------------------------------------------------


def write_video(path: Path, frames: int, size=(160, 120)) -> Path:
    w, h = size
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30.0, (w, h))
    assert vw.isOpened(), "OpenCV cannot write MJPG here"
    for i in range(frames):
        img = np.full((h, w, 3), (i * 20) % 250, np.uint8)
        cv2.putText(img, str(i), (10, 60), cv2.FONT_HERSHEY_SIMPLEX, 1.0, (255, 255, 255), 2)
        vw.write(img)
    vw.release()
    return path


# -- systemd's notify socket ---------------------------------------------------------------


class NotifySocket:
    """A real datagram socket standing where systemd's would; collects what arrives."""

    def __init__(self, tmp_path: Path, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"edge-agent-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            path = str(tmp_path / "notify.sock")
            self.sock.bind(path)
            self.address = path
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except OSError:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().splitlines())
            self.messages.append((time.monotonic(), fields))

    def names(self) -> list[str]:
        return [k for _, m in self.messages for k in m if k != "STATUS"]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


# -- a running agent with metrics ----------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_agent(const_model: Path, endpoint: str, metrics_port: int):
    """A started agent on the synthetic camera with metrics on ``metrics_port``."""
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=30),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint),
        metrics=MetricsConfig(port=metrics_port),
    )
    with started(cfg) as agent:
        yield agent


def scrape(port: int) -> dict[str, list]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def value(families: dict, family: str, sample: str, **labels) -> float:
    for s in families[family]:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise KeyError((family, sample, labels))


# -- videos with numbered frames, and damaged copies ---------------------------------------

FRAMES = 600


W, H = 160, 120


def frame(i: int) -> np.ndarray:
    img = np.full((H, W, 3), (i * 7) % 200 + 20, np.uint8)
    x = (i * 3) % (W - 20)
    img[60:80, x : x + 20] = (0, 0, 255)
    for bit in range(10):
        img[0:16, bit * 16 : (bit + 1) * 16] = 255 if (i >> bit) & 1 else 0
    return img


def write_numbered_video(path: Path, fourcc: str, frames: int = FRAMES, fps: float = 30.0) -> Path:
    vw = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (W, H))
    assert vw.isOpened(), f"OpenCV cannot write {fourcc} here"
    for i in range(frames):
        vw.write(frame(i))
    vw.release()
    return path


def damage(src: Path, dst: Path, start: float, end: float) -> Path:
    """``src`` with the bytes from ``start`` to ``end`` (fractions of its size) overwritten."""
    data = bytearray(src.read_bytes())
    lo, hi = int(len(data) * start), int(len(data) * end)
    data[lo:hi] = np.random.default_rng(7).integers(0, 256, hi - lo, dtype=np.uint8).tobytes()
    dst.write_bytes(bytes(data))
    return dst


def refused_handshake(
    ctx: zmq.Context, server_public: bytes, key_pair: tuple[bytes, bytes], endpoint: str
) -> None:
    """One real CURVE connection with ``key_pair`` (public, secret), until the server refused
    it. (libzmq does not retry a connection the server refused: a client that keeps trying
    opens new ones.)"""
    from zmq.utils.monitor import recv_monitor_message

    sock = ctx.socket(zmq.SUB)
    sock.linger = 0
    sock.curve_serverkey = server_public
    sock.curve_publickey, sock.curve_secretkey = key_pair
    sock.subscribe("det")
    monitor = sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    try:
        sock.connect(endpoint)
        assert monitor.poll(30_000), "the server refused the connection"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH
    finally:
        sock.disable_monitor()
        monitor.close(linger=0)
        sock.close(linger=0)


def write_frames(folder: Path, count: int, seed: int = 11, step: int = 9) -> list[np.ndarray]:
    """``count`` 640x480 frames of a synthetic scene as PNG files (lossless: what is read
    back is what was drawn), named in order; the frames."""
    folder.mkdir(parents=True, exist_ok=True)
    scene = SyntheticScene(SceneSpec(seed=seed))
    gt = np.zeros((scene.spec.num_objects, 6), np.float32)
    frames = []
    for i in range(count):
        img = np.empty((480, 640, 3), np.uint8)
        scene.render(i * step, img, gt)
        assert cv2.imwrite(str(folder / f"{i:03d}.png"), img)
        frames.append(img)
    return frames
