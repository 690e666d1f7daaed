"""The result stream: one ZeroMQ PUB message per frame, JSON, schema version 1.

A message is a single ZeroMQ frame: the topic (``det.<source>``), one space, then the
JSON body. One frame rather than a multipart message so that subscribers may use
CONFLATE (keep only the newest message), which does not support multipart messages.
PUB never blocks: a subscriber that falls ``send_hwm`` messages behind loses messages,
the agent does not wait for it.

The socket is an XPUB, a PUB that also hands the application the subscriptions it
receives: ZeroMQ drops every message sent before a subscriber's subscription arrived,
so for a file (every frame matters) the agent can wait for its subscribers first.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

import zmq

from edge_agent.pipelines.handoff import CAPTURED, N_STAMPS, PUBLISH, STAGES, FrameSlot

SCHEMA_VERSION = 1
CLOSE_LINGER_MS = 200  # at most this long to flush queued messages when the socket closes

log = logging.getLogger(__name__)


class ZmqPublisher:
    """The PUB socket. With CURVE, only clients whose public key is in the allowed folder
    can connect (a ZAP authenticator in the socket's own context checks them)."""

    def __init__(
        self,
        endpoint: str,
        send_hwm: int = 100,
        encoding: str = "json",
        curve_server_key: str = "",
        curve_clients_dir: str = "",
        topic: str = "det",
    ) -> None:
        self.endpoint = endpoint
        self._results = f"{topic}.".encode()  # results go out as "<topic>.<source>"
        self.send_hwm = send_hwm
        self.encoding = encoding
        self.curve_server_key = curve_server_key
        self.curve_clients_dir = curve_clients_dir
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        self._auth: Any = None
        # Results come from the post thread and heartbeats from the health thread; a
        # ZeroMQ socket must not be used by two threads at once.
        self._lock = threading.Lock()
        self.sent = 0
        self.subscriptions = 0  # to results (not heartbeats only): subscribed minus unsubscribed
        self._pack = _packer(encoding)

    def encode(self, message: dict[str, Any]) -> bytes:
        return self._pack(message)

    def open(self) -> None:
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.XPUB)
        # Both only apply to later binds, so they are set first.
        sock.sndhwm = self.send_hwm
        sock.linger = 0
        # Every subscriber's subscriptions and unsubscriptions (a disconnect included), not
        # only a topic's first and last: wait_for_subscribers counts them.
        try:
            sock.setsockopt(zmq.XPUB_VERBOSER, 1)
        except (AttributeError, zmq.ZMQError):  # libzmq < 4.3: no unsubscriptions counted
            sock.setsockopt(zmq.XPUB_VERBOSE, 1)
        try:
            if self.curve_server_key:
                self._curve(sock)
            elif not _loopback(self.endpoint):
                log.warning(
                    "result stream on %s without CURVE: anyone who can reach it reads it "
                    "(set publish.curve_server_key and curve_clients_dir)",
                    self.endpoint,
                )
            sock.bind(self.endpoint)
        except (zmq.ZMQError, OSError, ValueError) as e:
            sock.close()
            self._stop_auth()
            self._ctx.term()
            self._ctx = None
            raise OSError(f"cannot bind result stream to {self.endpoint}: {e}") from None
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT) or self.endpoint
        self._sock = sock

    def _curve(self, sock: zmq.Socket) -> None:
        import zmq.auth
        from zmq.auth.thread import ThreadAuthenticator

        public, secret = zmq.auth.load_certificate(self.curve_server_key)
        if secret is None:
            raise ValueError(f"{self.curve_server_key} holds no secret key (use the .key_secret file)")
        if not os.path.isdir(self.curve_clients_dir):
            raise ValueError(f"allowed-clients folder not found: {self.curve_clients_dir}")
        self._auth = ThreadAuthenticator(self._ctx)
        self._auth.start()
        self.refresh_clients()
        sock.curve_secretkey = secret
        sock.curve_publickey = public
        sock.curve_server = True  # before bind

    def refresh_clients(self) -> None:
        """Re-read the allowed-clients folder (the authenticator reads it only when told)."""
        if self._auth is not None:
            self._auth.configure_curve(domain="*", location=self.curve_clients_dir)

    def _stop_auth(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    def wait_for_subscribers(
        self, count: int, timeout_s: float, interrupt: threading.Event | None = None
    ) -> int:
        """Wait until ``count`` subscriptions to results have arrived, ``timeout_s`` passed
        or ``interrupt`` is set; returns how many arrived. A subscriber that was waiting for
        the agent connects within ZeroMQ's reconnect interval (100 ms), so its subscription
        is here well inside a second. A client that CURVE refuses never subscribes."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self._sock is None:
                    return self.subscriptions
                self._drain()
                left_s = deadline - time.monotonic()
                if self.subscriptions >= count or left_s <= 0:
                    return self.subscriptions
                # Short slices: the lock is the socket's, and the heartbeat may want it.
                self._sock.poll(min(left_s, 0.05) * 1000, zmq.POLLIN)
            if interrupt is not None and interrupt.is_set():
                return self.subscriptions

    def poll_subscriptions(self) -> int:
        """Take the subscription messages queued so far (XPUB keeps them until read, without
        a bound, so the heartbeat calls this); returns the current count."""
        with self._lock:
            if self._sock is not None:
                self._drain()
            return self.subscriptions

    def _drain(self) -> None:
        assert self._sock is not None
        while True:
            try:
                msg = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            prefix = msg[1:]
            # A subscription to "", "d", "det" or "det.cam0" receives results; "health" not.
            if not (self._results.startswith(prefix) or prefix.startswith(self._results)):
                continue
            if msg[:1] == b"\x01":
                self.subscriptions += 1
            elif msg[:1] == b"\x00":
                self.subscriptions = max(0, self.subscriptions - 1)

    def send(self, topic: bytes, body: bytes) -> None:
        with self._lock:
            if self._sock is None:
                # Closed for a rebind or the stop: the message is dropped, not an error.
                log.debug("result stream closed: message on %s dropped", topic[:40])
                return
            self._sock.send(topic + b" " + body, zmq.NOBLOCK)
            self.sent += 1

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                # The last results and the final heartbeat may still be queued for the
                # network: a bounded linger sends them, and keeps the stop short.
                self._sock.close(linger=CLOSE_LINGER_MS)
                self._sock = None
        self._stop_auth()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


def _loopback(endpoint: str) -> bool:
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = endpoint.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("localhost", "::1") or host.startswith("127.")


def _packer(encoding: str):
    if encoding == "msgpack":
        try:
            import msgpack
        except ImportError:
            raise ValueError(
                "publish.encoding msgpack needs the msgpack package: pip install 'edge-agent[msgpack]'"
            ) from None
        return lambda message: msgpack.packb(message, use_bin_type=True)
    return lambda message: json.dumps(message, separators=(",", ":")).encode()


class MessageBuilder:
    """Turns a finished frame slot into the JSON body of its result message."""

    def __init__(self, device_id: str, labels: tuple[str, ...], budget_ms: float, power: Any = None) -> None:
        self.device_id = device_id
        self.power = power  # its ``throttled`` reasons tie a latency spike to a throttle
        self.labels = labels
        self.budget_ms = budget_ms
        self.budget_ns = int(budget_ms * 1e6)
        # Monotonic stamps are converted to wall-clock time with one offset taken at start,
        # so a clock step (NTP) never makes latencies negative.
        self._unix_offset_ns = time.time_ns() - time.monotonic_ns()

    def build(self, slot: FrameSlot, seq: int, model: str) -> dict[str, Any]:
        """The message without its latencies, which are filled in at the publish stamp."""
        n = slot.det_count
        dets = [
            {
                "label": self.labels[c] if 0 <= c < len(self.labels) else str(c),
                "class_id": c,
                "score": round(s, 4),
                "box_xyxy": [round(v, 1) for v in box],
            }
            for c, s, box in zip(
                slot.det_class[:n].tolist(), slot.det_score[:n].tolist(), slot.det_xyxy[:n].tolist()
            )
        ]
        captured = int(slot.stamps[CAPTURED])
        return {
            "schema": SCHEMA_VERSION,
            "device": self.device_id,
            "source": slot.source,
            "seq": seq,
            "frame_id": slot.frame_id,
            "capture_mono_ns": captured,
            "capture_unix_s": round((captured + self._unix_offset_ns) / 1e9, 6),
            "image_wh": [slot.geo.src_w, slot.geo.src_h],
            "model": model,
            "batch_size": slot.batch,
            "latency_ms": {},
            "deadline_ms": self.budget_ms,
            "deadline_missed": False,
            "throttled": bool(self.power is not None and self.power.throttled),
            "detections": dets,
        }

    @staticmethod
    def latencies(slot: FrameSlot) -> dict[str, float]:
        """Per-stage and total milliseconds; the stages add up to the total."""
        st = slot.stamps.tolist()
        latency = {STAGES[i]: round((st[i + 1] - st[i]) / 1e6, 3) for i in range(N_STAMPS - 1)}
        latency["total"] = round((st[PUBLISH] - st[CAPTURED]) / 1e6, 3)
        return latency
