"""The result stream: one ZeroMQ PUB message per frame, JSON, schema version 1.

A message is a single ZeroMQ frame: the topic (``det.<source>``), one space, then the
JSON body. One frame rather than a multipart message so that subscribers may use
CONFLATE (keep only the newest message), which does not support multipart messages.
PUB never blocks: a subscriber that falls ``send_hwm`` messages behind loses messages,
the agent does not wait for it.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import zmq

from edge_agent.pipelines.handoff import CAPTURED, N_STAMPS, PUBLISH, STAGES, FrameSlot

SCHEMA_VERSION = 1


class ZmqPublisher:
    def __init__(self, endpoint: str, send_hwm: int = 100) -> None:
        self.endpoint = endpoint
        self.send_hwm = send_hwm
        self._ctx: zmq.Context | None = None
        self._sock: zmq.Socket | None = None
        # Results come from the post thread and heartbeats from the health thread; a
        # ZeroMQ socket must not be used by two threads at once.
        self._lock = threading.Lock()
        self.sent = 0

    def open(self) -> None:
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.PUB)
        # Both only apply to later binds, so they are set first.
        sock.sndhwm = self.send_hwm
        sock.linger = 0
        try:
            sock.bind(self.endpoint)
        except zmq.ZMQError as e:
            sock.close()
            self._ctx.term()
            self._ctx = None
            raise OSError(f"cannot bind result stream to {self.endpoint}: {e}") from None
        self._sock = sock

    def send(self, topic: bytes, body: bytes) -> None:
        with self._lock:
            if self._sock is None:
                raise RuntimeError("result stream is not open")
            self._sock.send(topic + b" " + body, zmq.NOBLOCK)
            self.sent += 1

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None


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

    @staticmethod
    def encode(message: dict[str, Any]) -> bytes:
        return json.dumps(message, separators=(",", ":")).encode()
