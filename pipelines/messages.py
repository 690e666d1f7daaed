"""The result message: the body of one frame's message on the result stream, in the
stream's encoding (JSON, or msgpack), schema ``core.schema.SCHEMA_VERSION``
(``pipelines/schema/message-v2.schema.json``). The socket is ``publish.py``'s.

A JSON message's detections (plain detection, with or without tracks) are written by a
compiled kernel (``pipelines.jit``, part ``messages``) straight into bytes: formatting five
floats a detection in Python was most of the message's cost (the whole message 93-128 us
at 52 detections a frame, 28-33 with the kernel; tools/decode_cost.py).
The ``%`` formatting below stays the reference, and the path for what the kernel leaves to
it: a task's values, a class beyond the labels, a number past 9e15.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.core.schema import SCHEMA_VERSION
from edge_agent.core.stamps import CAPTURED, N_STAMPS, PUBLISH, STAGES
from edge_agent.pipelines import jit
from edge_agent.pipelines.slots import FrameSlot

#: ``json.dumps(o, separators=(",", ":"))``, made once: ``dumps`` builds an encoder per call
#: when given separators.
_compact = json.JSONEncoder(separators=(",", ":")).encode


def packer(encoding: str):
    if encoding == "msgpack":
        try:
            import msgpack
        except ImportError:
            raise ValueError(
                "publish.encoding msgpack needs the msgpack package: pip install 'edge-agent[msgpack]'"
            ) from None
        return lambda message: msgpack.packb(message, use_bin_type=True)
    return lambda message: _compact(message).encode()


def _detection_head(label: str, class_id: int) -> str:
    """``{"label":"person","class_id":0,"score":`` (the label JSON-escaped)."""
    return _compact({"label": label, "class_id": class_id})[:-1] + ',"score":'


#: One detection in JSON, after its label's preformatted head (``{"label":..,"class_id":..,"score":``).
_DETECTION_JSON = '%s%.4f,"box_xyxy":[%.1f,%.1f,%.1f,%.1f]}'
#: The same with its track (a source that tracks): the id, or null when no track took it.
_TRACKED_JSON = '%s%.4f,"box_xyxy":[%.1f,%.1f,%.1f,%.1f],"track_id":%s,"track_age":%d}'

#: The kernel's fixed pieces, in one array: where each starts (the next one ends it).
_PIECES = (b',"box_xyxy":[', b',"track_id":', b',"track_age":', b"null")
_PIECE_BYTES = np.frombuffer(b"".join(_PIECES), np.uint8).copy()
_BOX, _TRACK, _AGE, _NULL, _END = np.cumsum([0] + [len(x) for x in _PIECES]).tolist()
#: The bytes a detection takes at most beyond its label's head: five numbers of at most
#: 18 bytes (sign, 16 digits, point), two integers of 20, the pieces and the brackets.
_MAX_NUMBERS = 5 * 18 + 2 * 20 + _END + 4


def json_detections(
    classes: np.ndarray,
    scores: np.ndarray,
    xyxy: np.ndarray,
    n: int,
    heads: np.ndarray,
    head_at: np.ndarray,
    tracks: bool,
    track: np.ndarray,
    age: np.ndarray,
    pieces: np.ndarray,
    digits: np.ndarray,
    buf: np.ndarray,
) -> int:
    """The first ``n`` detections as a JSON array, byte for byte what ``_DETECTION_JSON``
    (``_TRACKED_JSON`` when ``tracks``) formats, written into ``buf``: its length, or -1
    where the kernel leaves it to ``%`` (a class with no head, a number that is not finite
    or past 9e15).

    ``heads``: every label's head, ASCII, label ``c``'s at ``head_at[c]:head_at[c + 1]``;
    ``pieces``: ``_PIECE_BYTES``; ``digits``: scratch of 24 bytes; ``buf``: room for
    ``2 + n * (longest head + _MAX_NUMBERS)`` bytes.

    A float32 value times 10 or 10,000 is exact in double (24 + 14 bits), so rounding it
    to an integer, half to even, is what ``%.1f`` and ``%.4f`` do with the exact value;
    the sign is the value's own (``%.4f`` of -0.00001 is ``-0.0000``).
    """
    labels = head_at.shape[0] - 1
    pos = 0
    buf[pos] = 91  # [
    pos += 1
    for i in range(n):
        if i:
            buf[pos] = 44  # ,
            pos += 1
        c = classes[i]
        if c < 0 or c >= labels:
            return -1
        for b in range(head_at[c], head_at[c + 1]):
            buf[pos] = heads[b]
            pos += 1
        for f in range(5):
            if f == 0:
                x = np.float64(scores[i])
                scale = 10000.0
                places = 4
            else:
                x = np.float64(xyxy[i, f - 1])
                scale = 10.0
                places = 1
                if f == 1:
                    for b in range(_BOX, _TRACK):
                        buf[pos] = pieces[b]
                        pos += 1
                else:
                    buf[pos] = 44
                    pos += 1
            a = abs(x) * scale
            if not a < 9.0e15:  # NaN and inf too
                return -1
            q = np.int64(a)  # a >= 0: the floor
            rest = a - q
            if rest > 0.5 or (rest == 0.5 and q & 1):
                q += 1
            if np.signbit(x):
                buf[pos] = 45  # -
                pos += 1
            nd = 0
            while True:
                digits[nd] = 48 + q % 10
                q //= 10
                nd += 1
                if q == 0 and nd > places:
                    break
            for d in range(nd - 1, -1, -1):
                if d == places - 1:
                    buf[pos] = 46  # .
                    pos += 1
                buf[pos] = digits[d]
                pos += 1
        buf[pos] = 93  # ]
        pos += 1
        if tracks:
            for f in range(2):
                if f == 0:
                    for b in range(_TRACK, _AGE):
                        buf[pos] = pieces[b]
                        pos += 1
                    v = np.int64(track[i])
                    if v == 0:
                        for b in range(_NULL, _END):
                            buf[pos] = pieces[b]
                            pos += 1
                        continue
                else:
                    for b in range(_AGE, _NULL):
                        buf[pos] = pieces[b]
                        pos += 1
                    v = np.int64(age[i])
                if v < 0:
                    if v == -9223372036854775807 - 1:  # no positive twin
                        return -1
                    buf[pos] = 45
                    pos += 1
                    v = -v
                nd = 0
                while True:
                    digits[nd] = 48 + v % 10
                    v //= 10
                    nd += 1
                    if v == 0:
                        break
                for d in range(nd - 1, -1, -1):
                    buf[pos] = digits[d]
                    pos += 1
        buf[pos] = 125  # }
        pos += 1
    buf[pos] = 93  # ]
    return pos + 1


def _warm_json(k: dict[str, Callable[..., Any]]) -> None:
    """Every type a frame brings (``FrameSlot``'s arrays), with and without tracks."""
    heads = np.frombuffer(b'{"label":"a","class_id":0,"score":', np.uint8).copy()
    head_at = np.array([0, len(heads)], np.int64)
    xyxy = np.array([[1.25, -2.0, 3.5, 4.0]], np.float32)
    for tracks in (False, True):
        k["json_detections"](
            np.zeros(1, np.int32),
            np.array([0.5], np.float32),
            xyxy,
            1,
            heads,
            head_at,
            tracks,
            np.zeros(1, np.int64),
            np.ones(1, np.int32),
            _PIECE_BYTES,
            np.empty(24, np.uint8),
            np.empty(512, np.uint8),
        )


class MessageBuilder:
    """Turns a finished frame slot into the body of its result message.

    The detections of a JSON message are written by the ``json_detections`` kernel, or
    where it does not run (``EDGE_AGENT_KERNELS=numpy``, no numba, a task's values)
    formatted in one ``%`` operation over a flat tuple (each label's JSON head made once),
    not as a dict per detection through ``json.dumps``: the same bytes either way (tests
    compare), the same schema (scores to 4 decimals, boxes to 1).
    """

    def __init__(
        self,
        device_id: str,
        labels: tuple[str, ...],
        budget_ms: float,
        power: Any = None,
        encoding: str = "json",
        tracks: bool = False,
    ) -> None:
        """``tracks``: the source has a tracker; its detections carry their track."""
        self.device_id = device_id
        self.tracks = tracks
        self.power = power  # its ``throttled`` reasons tie a latency spike to a throttle
        self.labels = labels
        self.budget_ms = budget_ms  # the message's deadline_ms (the monitor decides "late")
        self.encoding = encoding
        self._pack = packer(encoding)
        self._heads = [_detection_head(label, c) for c, label in enumerate(labels)]
        self._templates: dict[str, str] = {}  # one detection's JSON template, by task tail
        # Monotonic stamps are converted to wall-clock time with one offset taken at start,
        # so a clock step (NTP) never makes latencies negative.
        self._unix_offset_ns = time.time_ns() - time.monotonic_ns()
        # The kernel's view of the heads (ASCII: json.dumps escapes the rest), compiled
        # here, at assembly, never on a live frame.
        kernels = jit.load("messages", (json_detections,), _warm_json) if encoding == "json" else None
        self._kernel = kernels["json_detections"] if kernels else None
        heads = [h.encode("ascii") for h in self._heads]
        self._head_bytes = np.frombuffer(b"".join(heads), np.uint8).copy()
        self._head_at = np.cumsum([0] + [len(h) for h in heads], dtype=np.int64)
        self._per_detection = max((len(h) for h in heads), default=0) + _MAX_NUMBERS
        self._local = threading.local()  # each thread's output buffer (grown, never shrunk)

    def detections(self, slot: FrameSlot) -> list[dict[str, Any]]:
        """The slot's detections as objects (msgpack, tools)."""
        n = slot.det_count
        out = [
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
        if self.tracks:
            for d, track, age in zip(out, slot.det_track[:n].tolist(), slot.det_track_age[:n].tolist()):
                d["track_id"] = track or None
                d["track_age"] = age
        task = slot.task
        if task.json_format:
            for i, d in enumerate(out):
                d.update(task.fields(slot, i))
        return out

    def detections_json(self, slot: FrameSlot) -> str:
        """The slot's detections as a JSON array."""
        return self.detections_bytes(slot).decode()

    def detections_bytes(self, slot: FrameSlot) -> bytes:
        """The slot's detections as a JSON array, UTF-8: by the kernel where it takes them,
        else by ``format_detections``."""
        n = slot.det_count
        kernel = self._kernel
        if kernel is not None and n and not slot.task.json_format:
            digits, buf = self._buffers(2 + n * self._per_detection)
            size = kernel(
                slot.det_class,
                slot.det_score,
                slot.det_xyxy,
                n,
                self._head_bytes,
                self._head_at,
                self.tracks,
                slot.det_track,
                slot.det_track_age,
                _PIECE_BYTES,
                digits,
                buf,
            )
            if size >= 0:
                return buf[:size].tobytes()
        return self.format_detections(slot).encode()

    def _buffers(self, size: int) -> tuple[np.ndarray, np.ndarray]:
        local = self._local
        buf = getattr(local, "buf", None)
        if buf is None or len(buf) < size:
            local.digits = np.empty(24, np.uint8)
            buf = local.buf = np.empty(max(size, 4096), np.uint8)
        return local.digits, buf

    def format_detections(self, slot: FrameSlot) -> str:
        """The slot's detections as a JSON array, formatted in one ``%`` operation (the
        reference the kernel matches, and the path for what it leaves)."""
        n = slot.det_count
        if not n:
            return "[]"
        heads, flat = self._heads, []
        rows = zip(slot.det_class[:n].tolist(), slot.det_score[:n].tolist(), slot.det_xyxy[:n].tolist())
        tracks = zip(slot.det_track[:n].tolist(), slot.det_track_age[:n].tolist()) if self.tracks else None
        task = slot.task
        tail = task.json_format
        values = iter(task.json_rows(slot, n)) if tail else None
        for c, s, box in rows:
            flat.append(heads[c] if 0 <= c < len(heads) else _detection_head(str(c), c))
            flat.append(s)
            flat.extend(box)
            if tracks is not None:
                track, age = next(tracks)
                flat.append(track or "null")
                flat.append(age)
            if values is not None:
                flat.extend(next(values))
        return "[" + ",".join([self._template(tail)] * n) % tuple(flat) + "]"

    def _template(self, tail: str) -> str:
        """One detection's JSON template with the task's fields (made once per task)."""
        one = self._templates.get(tail)
        if one is None:
            one = _TRACKED_JSON if self.tracks else _DETECTION_JSON
            self._templates[tail] = one = one[:-1] + tail + "}" if tail else one
        return one

    def encode(self, message: dict[str, Any], slot: FrameSlot) -> bytes:
        """The message (from ``build``, latencies filled in) with the slot's detections, as
        the stream's encoding says; ``detections`` is its last key."""
        if self.encoding != "json":
            return self._pack({**message, "detections": self.detections(slot)})
        head = _compact(message)
        return b"".join((head[:-1].encode(), b',"detections":', self.detections_bytes(slot), b"}"))

    def build(self, slot: FrameSlot, seq: int, model: str) -> dict[str, Any]:
        """The message without its latencies, which are filled in at the publish stamp, and
        without its detections, which ``encode`` adds."""
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
        }

    @staticmethod
    def latencies(slot: FrameSlot) -> dict[str, float]:
        """Per-stage and total milliseconds; the stages add up to the total."""
        st = slot.stamps.tolist()
        latency = {STAGES[i]: round((st[i + 1] - st[i]) / 1e6, 3) for i in range(N_STAMPS - 1)}
        latency["total"] = round((st[PUBLISH] - st[CAPTURED]) / 1e6, 3)
        return latency
