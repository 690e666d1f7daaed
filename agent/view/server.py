"""The live view's server: one thread draws and encodes the newest frame of each watched
source, and an HTTP server answers

- ``/``: a page with every source's live image, its figures (fps, end-to-end p50/p99,
  misses, ladder step, throttled) once a second and a latency chart of the last minute;
- ``/stream/<source>.mjpg``: multipart MJPEG of annotated frames at ``view.fps``;
- ``/snapshot/<source>.jpg``: the newest annotated frame;
- ``/api/health``: the latest heartbeat of each source, as JSON.

Many clients share one encoding: the encoder keeps only the newest JPEG of each source,
and each client's thread sends whatever is newest when it is ready for more. A slow client
therefore skips frames, never queues them, and slows no one else. A source's tap is active
only while a stream is open on it (or for a moment after a snapshot was asked for).
"""

from __future__ import annotations

import hmac
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import cv2

from edge_agent.core.config import ViewConfig
from edge_agent.core.exposure import on_loopback
from edge_agent.pipelines.view_tap import ViewFrame, ViewTap
from edge_agent.view.annotate import annotate
from edge_agent.view.page import page

log = logging.getLogger(__name__)

MAX_STREAMS = 16  # open MJPEG streams at most; more are refused (503)
MAX_CONNECTIONS = 32  # connections being served at most; more are closed at once
_REQUEST_TIMEOUT_S = 5.0  # a connection that sends no whole request in this time is closed
_SNAPSHOT_WAIT_S = 3.0
_WRITE_TIMEOUT_S = 10.0  # a client that takes nothing for this long is dropped
_SEND_BUFFER = 64 * 1024


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
        self.encoded = 0  # frames drawn and encoded (shared by every client)
        self.url = ""
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._streams: dict[str, int] = {}
        self._wanted_until: dict[str, float] = {}
        self._httpd: ThreadingHTTPServer | None = None
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
            self._cond.notify_all()

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        server = self

        class Handler(_Handler):
            view = server

        self._httpd = _Server((self.cfg.host, self.cfg.port), Handler)
        host, port = self._httpd.server_address[:2]
        self.url = f"http://{host}:{port}/"  # the token is not logged: ?token=... is the user's
        self._threads = [
            threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.2}, name="view-http"
            ),
            threading.Thread(target=self._encode_loop, name="view-encode"),
        ]
        for t in self._threads:
            t.start()
        if not on_loopback(host):
            log.warning(
                "live view on %s: anyone who reaches the port sees the cameras%s",
                self.url,
                "" if self.cfg.token else " (set view.token, or bind view.host to 127.0.0.1)",
            )
        log.info("live view on %s", self.url)

    def stop(self, timeout_s: float = 2.0) -> bool:
        self._stop.set()
        self._wake.set()
        with self._cond:
            for tap in self.taps.values():
                tap.active = False  # a stream still writing must not keep the capture copying
            self._cond.notify_all()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        for t in self._threads:
            t.join(timeout_s)
        return not any(t.is_alive() for t in self._threads)

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
        annotate(image, frame, scale)
        ok, jpeg = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, self.cfg.quality])
        if not ok:
            raise RuntimeError("JPEG encoding failed")
        with self._cond:
            self.latest[source] = Encoded(
                seq, jpeg.tobytes(), image.shape[1], image.shape[0], frame.frame_id, time.monotonic()
            )
            self.encoded += 1
            self._cond.notify_all()

    def wait_newer(self, source: str, seq: int, timeout_s: float) -> Encoded | None:
        """The newest frame of ``source`` if it is newer than ``seq``, waiting for one."""
        end = time.monotonic() + timeout_s
        with self._cond:
            while not self._stop.is_set() and source in self.taps:
                e = self.latest.get(source)
                if e is not None and e.seq != seq:
                    return e
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)
        return None


class _Server(ThreadingHTTPServer):
    """At most MAX_CONNECTIONS served at once; handler threads are daemons (a stream that is
    still writing never holds up the agent's exit)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type) -> None:
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(address, handler)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        return self.slots.acquire(blocking=False)  # full: the connection is closed at once

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("view: a connection from %s failed", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    view: ViewServer
    protocol_version = "HTTP/1.0"  # one request per connection; a stream ends with it
    server_version = "edge-agent-view"
    timeout = _REQUEST_TIMEOUT_S  # for reading the request; a stream sets its own for writing

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("view: %s %s", self.address_string(), (format % args).split("?")[0])

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        view = self.view
        given = parse_qs(url.query).get("token", [""])[0]
        if view.cfg.token and not hmac.compare_digest(given.encode(), view.cfg.token.encode()):
            self._send(HTTPStatus.FORBIDDEN, b"a token is needed: ?token=...\n", "text/plain")
            return
        path = url.path
        if path == "/":
            self._send(
                HTTPStatus.OK,
                page(sorted(view.taps), view.cfg, view.device).encode(),
                "text/html; charset=utf-8",
            )
        elif path == "/api/health":
            body = json.dumps(view.heartbeats(), default=str).encode()
            self._send(HTTPStatus.OK, body, "application/json")
        elif path.startswith("/stream/") and path.endswith(".mjpg"):
            self._stream(path[len("/stream/") : -len(".mjpg")])
        elif path.startswith("/snapshot/") and path.endswith(".jpg"):
            self._snapshot(path[len("/snapshot/") : -len(".jpg")])
        else:
            self._send(HTTPStatus.NOT_FOUND, b"not found\n", "text/plain")

    def _send(self, status: HTTPStatus, body: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _known(self, source: str) -> bool:
        if source in self.view.taps:
            return True
        self._send(HTTPStatus.NOT_FOUND, f"no source {source!r}\n".encode(), "text/plain")
        return False

    def _snapshot(self, source: str) -> None:
        if not self._known(source):
            return
        view = self.view
        view.want(source)
        e = view.latest.get(source)
        if e is None or time.monotonic() - e.at > 2 / view.cfg.fps + 0.5:  # nobody watched lately
            e = view.wait_newer(source, e.seq if e else -1, _SNAPSHOT_WAIT_S)
        if e is None:
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"no frame yet\n", "text/plain")
            return
        self._send(HTTPStatus.OK, e.jpeg, "image/jpeg")

    def _stream(self, source: str) -> None:
        if not self._known(source):
            return
        view = self.view
        if not view.watch(source, +1):
            self._send(HTTPStatus.SERVICE_UNAVAILABLE, b"too many viewers\n", "text/plain")
            return
        try:
            self.connection.settimeout(_WRITE_TIMEOUT_S)
            # A small send buffer: a client that reads slowly holds up its own thread once the
            # sockets hold a frame (or a few small ones), then gets the newest frame each time
            # it reads, instead of working through a backlog in the kernel.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER)
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            sent, last = -1, None
            while not view._stop.is_set() and source in view.taps:  # gone after a reload: the end
                # No new frame for 5 s (a camera down): the last one again, so a client that
                # vanished is found out by the write timeout instead of holding a slot.
                e = view.wait_newer(source, sent, 5.0) or last
                if e is None:
                    continue
                head = (
                    f"--frame\r\nContent-Type: image/jpeg\r\nX-Frame-Id: {e.frame_id}\r\n"
                    f"Content-Length: {len(e.jpeg)}\r\n\r\n"
                )
                self.wfile.write(head.encode() + e.jpeg + b"\r\n")
                self.wfile.flush()
                sent, last = e.seq, e
        except OSError:  # the client went, or took nothing for _WRITE_TIMEOUT_S
            return
        finally:
            view.watch(source, -1)
