"""The emulated accelerator: a real model's recorded raw outputs, replayed, for measuring
the host side of the Jetson path on a machine without one. Never a default, never taken
for a real run: it warns when it loads, and ``describe`` (so metrics' model info and the
bench), the heartbeat (``emulated``) and every bench report name it.

On a Jetson, preprocessing and inference run on the GPU or DLA; from the host a frame is a
letterboxed uint8 frame written into a slot's buffer, then a wait, without a core or the
GIL, until the outputs are in the slot's (mapped) memory. This backend keeps that contract:

- **Slots and streams** as the TensorRT backend's: the host writes uint8 NHWC letterboxed
  frames (``host_format``: normalisation and the transpose are the device's), one set of
  buffers per frame slot, batches up to ``max_batch``.
- **The device's time**: each inference waits ``device_ms`` (plus ``device_ms_per_frame``
  for each frame of a batch past the first) in ``time.sleep``, which holds neither a core
  nor the GIL.
- **The outputs**: the recording's, for the very frame given. Each frame is recognised by
  its fingerprint (``recording.Fingerprint``: sampled bytes of its input) among the
  recorded ones, and its slot's outputs become read-only views of that frame's recorded
  outputs: the device "wrote" them, the host copied nothing. So decoding the replay gives
  exactly what ONNX Runtime gave on that frame (a test checks it), and tracks and counts
  are those of the real model. A frame the recording does not hold is given the next
  recorded one in turn, counted (``unmatched_frames``) and warned about once: its
  timings are still the device's, its detections not this frame's.
- **Batches** run from the frames' own slots (``infer_slots``): no batch set, no copies
  in or out. The TensorRT backend copies each frame into and out of a batch set; that
  cost is left out here (docs/figures.md gives it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from edge_agent.core.files import file_sha256
from edge_agent.core.model_config import EmulatedConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import recording
from edge_agent.pipelines.backends.base import (
    BackendError,
    InferenceBackend,
    IOSet,
    TensorSpec,
    device_format,
)

log = logging.getLogger(__name__)

FRAME_TENSOR = "frame"  # what the host writes, as the TensorRT backend's device preprocessing
DEVICE = "emulated accelerator (recorded outputs replayed; not a device)"


class EmulatedBackend(InferenceBackend):
    name = "emulated"
    off_cpu = True

    def __init__(self, config: EmulatedConfig) -> None:
        self.config = config
        self._host = InputFormat(height=640, width=640)
        self._input = FRAME_TENSOR  # the tensor the host writes: its name as check_io sees it
        self._rec: recording.Recording | None = None
        self._frames: list[list[np.ndarray]] = []  # per recorded frame: its outputs, batch axis 1
        self._index: dict[int, int] = {}
        self._finger: recording.Fingerprint | None = None
        self._next = 0  # the recorded frame an unmatched one gets
        self.unmatched = 0
        self._live = False  # set by ``prepare``: warm-up frames (blank) are no frame of the clip
        self._device_s = config.device_ms / 1e3
        self._per_frame_s = config.device_ms_per_frame / 1e3

    def load(self, model_path: str, input_format: InputFormat | None = None) -> None:
        fmt = input_format or InputFormat(height=640, width=640)
        self._host = device_format(fmt)
        try:
            sha = file_sha256(model_path)
        except OSError as e:
            raise BackendError(f"{model_path}: cannot read the model ({e.strerror})") from None
        # A model taking uint8 takes the host's frames itself (no device preprocessing, as
        # with TensorRT): the input is then the model's own, by its own name.
        self._input = FRAME_TENSOR if self._host != fmt else _input_name(model_path)
        try:
            rec = recording.read(self.config.recording, sha, self._host)
        except recording.RecordingError as e:
            raise BackendError(f"backend.recording: {e}") from None
        self._rec = rec
        h, w = self._host.height, self._host.width
        self._finger = recording.Fingerprint(h, w)
        self._index = rec.index()
        self._frames = [[a[i : i + 1] for a in rec.arrays] for i in range(rec.frames)]
        self._inputs = [TensorSpec(self._input, (None, h, w, 3), np.dtype(np.uint8))]
        self._outputs = [TensorSpec(o.name, (None, *o.shape), o.dtype) for o in rec.outputs]
        log.warning(
            "backend: EMULATED accelerator, for measurement only: %s replays %d recorded frames of %s,"
            " %.2f ms a batch (+%.2f ms a frame past the first); results are the recording's",
            rec.path,
            rec.frames,
            rec.model or model_path,
            self.config.device_ms,
            self.config.device_ms_per_frame,
        )

    def host_format(self, fmt: InputFormat) -> InputFormat:
        return self._host

    def batch_axis(self) -> tuple[int, bool]:
        return (self.config.max_batch, False)

    def allocate(self, batch: int = 1) -> IOSet:
        """A frame slot's set (``batch`` 1): an input the host writes, and outputs that
        stand for the device's until its first frame (the first recorded ones, read-only).
        A batch set: read-only zeros that take no memory, for the warm-up's timing only:
        batches run from the frames' own sets (``infer_slots``), never through one."""
        if self._rec is None:
            raise BackendError("allocate() before load()")
        h, w = self._host.height, self._host.width
        if batch == 1:
            return IOSet(
                inputs={self._input: np.zeros((1, h, w, 3), np.uint8)}, outputs=list(self._frames[0])
            )
        size = min(batch, self.config.max_batch) if self.config.max_batch else batch
        frames = np.broadcast_to(np.zeros((1, 1, 1, 1), np.uint8), (size, h, w, 3))
        outputs = [
            np.broadcast_to(np.zeros((1,) * (1 + len(o.shape)), o.dtype), (size, *o.shape))
            for o in self._rec.outputs
        ]
        return IOSet(inputs={self._input: frames}, outputs=outputs)

    def _recorded(self, image: np.ndarray) -> int:
        """The recorded frame ``image`` (one letterboxed input) is, or the next in turn."""
        assert self._finger is not None
        i = self._index.get(self._finger(image))
        if i is not None:
            return i
        if not self._live:
            return 0
        if not self.unmatched:
            log.warning(
                "backend: emulated: a frame the recording %s does not hold; such frames get recorded"
                " outputs in turn (counted as unmatched_frames): their detections are not theirs",
                self.config.recording,
            )
        self.unmatched += 1
        i = self._next
        self._next = (i + 1) % len(self._frames)
        return i

    def _wait(self, t0: float, frames: int) -> float:
        """Until the device would be done with ``frames`` frames begun at ``t0``; its ms."""
        device_s = self._device_s + self._per_frame_s * (frames - 1)
        left = t0 + device_s - time.perf_counter()
        if left > 0:
            time.sleep(left)  # no core, no GIL: what a wait on the device's event costs the host
        return device_s * 1e3

    def infer(self, io: IOSet) -> None:
        t0 = time.perf_counter()
        frames = io.inputs[self._input]
        if len(frames) == 1:
            io.outputs[:] = self._frames[self._recorded(frames[0])]
        io.extra["device_compute_ms"] = self._wait(t0, len(frames))

    def infer_slots(self, ios: list[IOSet]) -> bool:
        """A batch straight from the frames' own slots: one wait for all of them."""
        t0 = time.perf_counter()
        for io in ios:
            io.outputs[:] = self._frames[self._recorded(io.inputs[self._input][0])]
        ms = self._wait(t0, len(ios))
        for io in ios:
            io.extra["device_compute_ms"] = ms
        return True

    def timings(self, io: IOSet) -> dict[str, float]:
        ms = io.extra.get("device_compute_ms")
        return {"device_compute_ms": ms} if ms is not None else {}

    def prepare(self, io: IOSet) -> None:
        self._live = True  # after the warm-ups: from now on a frame is a frame of the source

    def describe(self) -> dict[str, Any]:
        rec = self._rec
        return {
            "backend": self.name,
            "device": DEVICE,
            "emulated": True,
            "recording": rec.path if rec else self.config.recording,
            "recorded_frames": rec.frames if rec else 0,
            "recorded_model": rec.model if rec else "",
            "device_ms": self.config.device_ms,
            "device_ms_per_frame": self.config.device_ms_per_frame,
            "preprocess": "device (emulated)",
            "unmatched_frames": self.unmatched,
        }


def _input_name(model_path: str) -> str:
    """The model's (first) input's name. Raises BackendError for an unreadable model."""
    from edge_agent.models import onnx_info

    try:
        return onnx_info.read(model_path).inputs[0].name
    except Exception as e:  # protobuf's DecodeError, OSError, IndexError (no input)
        raise BackendError(f"cannot read the input of {model_path}: {e}") from None


BACKENDS = (("emulated", EmulatedBackend),)  # what this module adds (the registry collects it)
