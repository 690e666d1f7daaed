"""``edge-agent record-outputs``: run a model over a clip or an image folder with ONNX
Runtime and record its raw outputs, one file, for the emulated accelerator
(``pipelines/backends/emulated.py``; the format: ``pipelines/backends/recording.py``).

Each frame is run exactly as ``edge-agent run`` runs it on ONNX Runtime (the same
preprocessing, input adapter and session settings), so replaying the recording decodes
to the detections a live run gives. Its fingerprint is taken over the frame letterboxed
as the device path's host writes it (uint8 NHWC), which is what the replay sees.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from edge_agent.core.files import file_sha256
from edge_agent.core.model_config import OnnxRuntimeConfig
from edge_agent.core.source_config import ImageFolderSourceConfig, VideoSourceConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import recording
from edge_agent.pipelines.backends.base import device_format
from edge_agent.pipelines.model import LoadedModel, load_model
from edge_agent.pipelines.preprocess import Letterbox, Preprocessor
from edge_agent.pipelines.sources.base import SourceError
from edge_agent.pipelines.sources.files import preload

#: Frames a recording holds by default (~2.8 MB each for a YOLOv8n at 640).
DEFAULT_FRAMES = 100


def clip(path: str, frames: int) -> list[np.ndarray]:
    """The first ``frames`` frames of a video file or an image folder, decoded."""
    if os.path.isdir(path):
        src: Any = ImageFolderSourceConfig(path=path)
    elif os.path.isfile(path):
        src = VideoSourceConfig(path=path)
    else:
        raise SourceError(f"{path}: no such video file or image folder")
    return preload(src, frames, max_mib=4096)


def record_outputs(model_cfg: Any, source: str, out: str, frames: int = DEFAULT_FRAMES) -> dict[str, Any]:
    """Record the model's outputs over the first ``frames`` frames of ``source`` into
    ``out`` (``core.files.atomic_write``); returns what was written."""
    images = clip(source, frames)
    model = load_model(model_cfg, OnnxRuntimeConfig())
    try:
        return _record(model, images, source, out)
    finally:
        model.close()


def _record(model: LoadedModel, images: list[np.ndarray], source: str, out: str) -> dict[str, Any]:
    fmt: InputFormat = model.manifest.input.format()
    device = device_format(fmt)
    finger = recording.Fingerprint(device.height, device.width)
    letterbox = Preprocessor(device)
    frame_in = np.zeros((1, device.height, device.width, 3), np.uint8)
    io = model.backend.allocate(1)
    tensor = io.inputs[model.input_name]
    geo = Letterbox()
    specs = [recording.OutputRecord(o.name, tuple(o.concrete(1)[1:]), o.dtype) for o in model.backend.outputs]
    rows: list[tuple[int, list[np.ndarray]]] = []
    for image in images:
        letterbox(image, frame_in, geo)
        model.preprocessor(image, tensor, geo)
        model.backend.infer(io)
        rows.append((finger(frame_in[0]), [o[0].copy() for o in io.outputs]))
    path = model.adapted_from or model.resolved.path
    size = recording.write(
        out, file_sha256(path), os.path.basename(path), device, specs, rows, os.path.abspath(source)
    )
    distinct = len({f for f, _ in rows})
    return {"recording": out, "model": path, "frames": len(rows), "distinct_frames": distinct, "bytes": size}
