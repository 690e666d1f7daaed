"""The live view's server: one thread draws and encodes the newest frame of each watched
source, and an HTTP server answers

- ``/``: a page with every source's live image, its figures (fps, end-to-end p50/p99,
  misses, ladder step, throttled) once a second and a latency chart of the last minute;
- ``/stream/<source>.mjpg``: multipart MJPEG of annotated frames at ``view.fps``;
- ``/snapshot/<source>.jpg``: the newest annotated frame;
- ``/api/health``: the latest heartbeat of each source, as JSON.

Many clients share one encoding: the encoder keeps only the newest JPEG of each source,
and each stream is sent whatever is newest when it has taken the previous part. A slow
client therefore skips frames, never queues them, and slows no one else. A source's tap is
active only while a stream is open on it (or for a moment after a snapshot was asked for).

The HTTP side is ``http_endpoint.HttpEndpoint``, the metrics' server: one thread, at most
MAX_CONNECTIONS connections, a deadline for each whole request head and for each part
taken, answers only to the names in ``view.allowed_hosts`` (with the loopback names and
``view.host``: DNS rebinding), and headers that keep the pages out of frames and caches.
Paths are percent-decoded (UTF-8): a source named ``süd`` is at ``/snapshot/s%C3%BCd.jpg``.
A port it cannot bind is logged with the setting named, and the agent runs on without the
view, as it does without the metrics: neither is needed for the results.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import cv2

from edge_agent.core.endpoint_config import ViewConfig
from edge_agent.core.exposure import on_loopback
from edge_agent.pipelines.view_tap import ViewFrame, ViewTap
from edge_agent.service.http_endpoint import HttpEndpoint
from edge_agent.service.http_request import Request
from edge_agent.service.http_response import Deferred, Response
from edge_agent.service.view.annotate import annotate
from edge_agent.service.view.page import page
from edge_agent.service.view.trails import Trails

log = logging.getLogger(__name__)

MAX_STREAMS = 16  # open MJPEG streams at most; more are refused (503)
MAX_CONNECTIONS = 32  # connections held at most; one more closes the oldest idle one
_REQUEST_TIMEOUT_S = 5.0  # a connection that sends no whole request in this time is closed
_SNAPSHOT_WAIT_S = 3.0
_WRITE_TIMEOUT_S = 10.0  # a client that takes no response or frame within this is dropped
_RESEND_S = 5.0  # no new frame (a camera down): the last again, so a vanished client is found out
_SEND_BUFFER = 64 * 1024
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
#: On every answer: no framing by other sites, no type sniffing, no referrer (the token is
#: in the URL), no caching of camera images.
SECURITY_HEADERS = (
    "X-Frame-Options: DENY",
    "X-Content-Type-Options: nosniff",
    "Referrer-Policy: no-referrer",
    "Cache-Control: no-store",
)
_WILDCARDS = ("", "0.0.0.0", "::")


def allowed_hosts(cfg: ViewConfig) -> frozenset[str]:
    """The names a request's Host may carry: loopback, view.host (unless all interfaces)
    and view.allowed_hosts."""
    bound = () if cfg.host in _WILDCARDS else (cfg.host,)
    return frozenset((*LOOPBACK_NAMES, *bound, *cfg.allowed_hosts))


@dataclass
class Encoded:
    seq: int
    jpeg: bytes
    width: int
    height: int
    frame_id: int
    at: float  # time.monotonic() when encoded


class ViewServer:
    """A lifecycle component (``start``/``stop``); ``tap(source)`` for the frame path."""

    def __init__(self, cfg: ViewConfig, heartbeats: Callable[[], dict[str, Any]], device: str = "") -> None:
        self.cfg = cfg
        self.device = device
        self.heartbeats = heartbeats
        self.taps: dict[str, ViewTap] = {}
        self.latest: dict[str, Encoded] = {}
        self._trails: dict[str, Trails] = {}  # by source: its tracks' recent centres (the encoder's)
        self.encoded = 0  # frames drawn and encoded (shared by every client)
        self.url = ""
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._streams: dict[str, int] = {}
        self._wanted_until: dict[str, float] = {}
        self._http: HttpEndpoint | None = None
        self._threads: list[threading.Thread] = []

    def tap(self, source: str, max_det: int) -> ViewTap:
        """The tap of ``source``'s lane (kept across reloads: a viewer keeps watching)."""
        with self._cond:
            if source not in self.taps:
                self.taps[source] = ViewTap(source, self.cfg.fps, max_det, self._wake)
            self.taps[source].grow(max_det)
            return self.taps[source]

    def keep(self, sources: set[str]) -> None:
        """After a reload: forget the taps of sources that are gone (their streams end)."""
        with self._cond:
            for source in [s for s in self.taps if s not in sources]:
                self.taps.pop(source).active = False
                self.latest.pop(source, None)
                self._trails.pop(source, None)
            self._cond.notify_all()
        self._wake_http()  # its streams end now

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        cfg = self.cfg
        self._http = HttpEndpoint(
            cfg.host,
            cfg.port,
            "/",
            handle=self._handle,
            name="view",
            setting="view",
            allowed_hosts=allowed_hosts(cfg),
            headers=SECURITY_HEADERS,
            max_connections=MAX_CONNECTIONS,
            request_timeout_s=_REQUEST_TIMEOUT_S,
            write_timeout_s=_WRITE_TIMEOUT_S,
        )
        self._http.start()  # a port it cannot bind: a warning naming view.host/view.port
        if not self._http.listening:
            return
        self._threads = [threading.Thread(target=self._encode_loop, name="view-encode")]
        for t in self._threads:
            t.start()
        host = cfg.host or "0.0.0.0"
        self.url = f"http://{f'[{host}]' if ':' in host else host}:{self._http.port}/"  # no token: the user's
        if not on_loopback(host):
            log.warning(
                "live view on %s: anyone who reaches the port sees the cameras%s",
                self.url,
                "" if cfg.token else " (set view.token, or bind view.host to 127.0.0.1)",
            )
            if cfg.host in _WILDCARDS and not cfg.allowed_hosts:
                log.warning(
                    "live view: view.allowed_hosts is empty, so a browser that reaches the view by "
                    "this machine's name or address is refused (421); list those in view.allowed_hosts"
                )
        log.info("live view on %s", self.url)

    def stop(self, timeout_s: float = 2.0) -> bool:
        self._stop.set()
        self._wake.set()
        with self._cond:
            for tap in self.taps.values():
                tap.active = False  # a stream still writing must not keep the capture copying
            self._cond.notify_all()
        if self._http is not None:
            self._http.close()
        for t in self._threads:
            t.join(timeout_s)
        return not any(t.is_alive() for t in self._threads)

    def _wake_http(self) -> None:
        if self._http is not None:
            self._http.wake()

    # -- who watches ----------------------------------------------------------------------

    def _set_active(self, source: str) -> None:
        tap = self.taps.get(source)
        if tap is not None and not self._stop.is_set():
            streams = self._streams.get(source, 0)
            tap.active = streams > 0 or time.monotonic() < self._wanted_until.get(source, 0)

    def watch(self, source: str, delta: int) -> bool:
        """A stream opens (+1; False when MAX_STREAMS are open) or closes (-1)."""
        with self._cond:
            if delta > 0 and sum(self._streams.values()) >= MAX_STREAMS:
                return False
            self._streams[source] = self._streams.get(source, 0) + delta
            self._set_active(source)
            return True

    def want(self, source: str) -> None:
        with self._cond:
            self._wanted_until[source] = time.monotonic() + _SNAPSHOT_WAIT_S
            self._set_active(source)

    # -- the encoder ----------------------------------------------------------------------

    def _encode_loop(self) -> None:
        frames: dict[str, ViewFrame] = {}
        seen: dict[str, int] = {}
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            try:
                for source, tap in list(self.taps.items()):  # a reload may add one meanwhile
                    frame = frames.get(source)
                    if frame is None or len(frame.det_score) < tap.max_det:  # new, or grown by a reload
                        frame = frames[source] = ViewFrame(tap.max_det)
                    seq = tap.take(frame, seen.get(source, 0))
                    if seq != seen.get(source, 0):
                        seen[source] = seq
                        self._publish(source, seq, frame)
                with self._cond:
                    for source in list(self.taps):
                        self._set_active(source)  # a snapshot's moment may have passed
            except Exception:  # a bad frame must not end the view
                log.exception("view: annotating a frame failed")

    def _publish(self, source: str, seq: int, frame: ViewFrame) -> None:
        image = frame.image[: frame.height, : frame.width]
        scale = 1.0
        if frame.width > self.cfg.max_width:
            scale = self.cfg.max_width / frame.width
            size = (self.cfg.max_width, max(1, round(frame.height * scale)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        else:
            image = image.copy()
        trails = self._trails.get(source)
        if trails is None:
            trails = self._trails[source] = Trails()
        annotate(image, frame, scale, trails.update(frame))
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.quality])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        with self._cond:
            self.latest[source] = Encoded(
                seq, jpeg.tobytes(), image.shape[1], image.shape[0], frame.frame_id, time.monotonic()
            )
            self.encoded += 1
            self._cond.notify_all()
        self._wake_http()  # streams and waiting snapshots take it

    # -- HTTP: in the server's thread, never blocking ------------------------------------

    def _handle(self, request: Request) -> Response | Deferred:
        token = self.cfg.token
        given = request.query.get("token", [""])[0]
        if token and not hmac.compare_digest(given.encode(), token.encode()):
            return Response(403, b"a token is needed: ?token=...\n")
        path = request.path
        if path == "/":
            with self._cond:  # a reload may change the taps meanwhile
                names = sorted(self.taps)
            body = page(names, self.cfg, self.device).encode()
            return Response(200, body, "text/html; charset=utf-8")
        if path == "/api/health":
            return Response(200, json.dumps(self.heartbeats(), default=str).encode(), "application/json")
        if path.startswith("/stream/") and path.endswith(".mjpg"):
            return self._stream(path[len("/stream/") : -len(".mjpg")])
        if path.startswith("/snapshot/") and path.endswith(".jpg"):
            return self._snapshot(path[len("/snapshot/") : -len(".jpg")])
        return Response(404, b"not found\n")

    def _snapshot(self, source: str) -> Response | Deferred:
        if source not in self.taps:
            return Response(404, f"no source {source!r}\n".encode())
        self.want(source)
        e = self.latest.get(source)
        if e is not None and time.monotonic() - e.at <= 2 / self.cfg.fps + 0.5:
            return Response(200, e.jpeg, "image/jpeg")
        seen, end = e.seq if e else -1, time.monotonic() + _SNAPSHOT_WAIT_S

        def newer() -> Response | None:  # nobody watched lately: the next frame, or 503 in time
            e = self.latest.get(source)
            if e is not None and e.seq != seen:
                return Response(200, e.jpeg, "image/jpeg")
            if self._stop.is_set() or source not in self.taps or time.monotonic() >= end:
                return Response(503, b"no frame yet\n")
            return None

        return newer

    def _stream(self, source: str) -> Response:
        if source not in self.taps:
            return Response(404, f"no source {source!r}\n".encode())
        if not self.watch(source, +1):
            return Response(503, b"too many viewers\n")
        return Response(
            200,
            content_type="multipart/x-mixed-replace; boundary=frame",
            stream=_Mjpeg(self, source),
            # Small: a client that reads slowly has a frame or so in the sockets, then gets the
            # newest frame each time it takes one, instead of working through a backlog.
            send_buffer=_SEND_BUFFER,
        )


class _Mjpeg:
    """One viewer's MJPEG stream: the newest frame whenever the last one was taken."""

    def __init__(self, view: ViewServer, source: str) -> None:
        self.view, self.source = view, source
        self.sent, self.last, self.last_at = -1, None, time.monotonic()
        self._closed = False

    def next_part(self) -> bytes | None:
        e, now = self.view.latest.get(self.source), time.monotonic()
        if e is None or e.seq == self.sent:
            if self.last is None or now - self.last_at < _RESEND_S:
                return None
            e = self.last
        self.sent, self.last, self.last_at = e.seq, e, now
        head = (
            f"--frame\r\nContent-Type: image/jpeg\r\nX-Frame-Id: {e.frame_id}\r\n"
            f"Content-Length: {len(e.jpeg)}\r\n\r\n"
        )
        return head.encode() + e.jpeg + b"\r\n"

    def done(self) -> bool:
        return self.view._stop.is_set() or self.source not in self.view.taps  # gone after a reload

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.view.watch(self.source, -1)
