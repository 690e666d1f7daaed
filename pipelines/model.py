"""Loading a model for the frame path: its manifest, backend, preprocessor and bound decoder,
checked against each other before any frame runs.

``load_model`` resolves the manifest (or the rules that read the ONNX), lets the input
adapter rewrite a float model for ONNX Runtime, opens the backend, and checks every tensor
against the manifest, naming the file and the mismatch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core.config import BackendConfig, ModelConfig
from edge_agent.models import adapter
from edge_agent.models.manifest import (
    InputFormat,
    InputSpec,
    ModelError,
    ModelManifest,
    ResolvedModel,
    resolve_model,
)
from edge_agent.pipelines.backends.base import InferenceBackend, TensorSpec
from edge_agent.pipelines.backends.registry import create_backend
from edge_agent.pipelines.decode import Decoded, DecodeParams, Decoder
from edge_agent.pipelines.preprocess import Preprocessor

log = logging.getLogger(__name__)

_DTYPE = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}


@dataclass
class LoadedModel:
    resolved: ResolvedModel
    backend: InferenceBackend
    preprocessor: Preprocessor
    decode: Decoder
    params: DecodeParams
    input_name: str
    adapted_from: str = ""  # the original model when the backend runs its input-adapted copy
    closed: bool = False

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give the backend's session back (once; later calls do nothing)."""
        if not self.closed:
            self.closed = True
            self.backend.close()

    @property
    def manifest(self) -> ModelManifest:
        return self.resolved.manifest

    def run_one(self, image_bgr: np.ndarray, io: Any, geo: Any) -> Decoded:
        """Preprocess, infer and decode one frame (tools and evaluation, not the hot path)."""
        self.preprocessor(image_bgr, io.inputs[self.input_name], geo)
        self.backend.infer(io)
        return self.decode(io.outputs, self.params)

    @property
    def output_index(self) -> int:
        """The (first) output the decoder reads."""
        return self.decode.outputs[0]


def check_io(
    m: ModelManifest,
    path: str,
    inputs: list[TensorSpec],
    outputs: list[TensorSpec],
    host: InputFormat | None = None,
) -> tuple[str, Decoder, bool]:
    """Check the model's tensors against its manifest; returns the input's name, the bound
    decoder and whether an RT-DETR output holds top-k rows (``check_outputs``).

    ``host`` is the format the host writes when the backend took normalisation over (its
    input is then the backend's own tensor). Raises ModelError naming the file.
    """
    spec = m.input
    if host is not None and host != spec.format():
        spec = InputSpec(name="", height=host.height, width=host.width, layout=host.layout, dtype=host.dtype)
    by_name = {t.name: t for t in inputs}
    if spec.name and spec.name not in by_name:
        raise ModelError(
            f"{path}: manifest input {spec.name!r} is not an input of the model ({list(by_name)})"
        )
    tin = by_name[spec.name] if spec.name else inputs[0]
    want = (None, spec.height, spec.width, 3) if spec.layout == "NHWC" else (None, 3, spec.height, spec.width)
    got = tin.shape
    if len(got) != 4 or any(w is not None and g is not None and w != g for w, g in zip(want, got)):
        raise ModelError(
            f"{path}: input {tin.name!r} has shape {got}, but the manifest says "
            f"{spec.layout} {spec.width}x{spec.height} with 3 channels"
        )
    if tin.dtype != np.dtype(_DTYPE[spec.dtype]):
        raise ModelError(f"{path}: input {tin.name!r} is {tin.dtype}, but the manifest says {spec.dtype}")
    decoder, topk = check_outputs(m, path, outputs)
    return tin.name, decoder, topk


def check_outputs(m: ModelManifest, path: str, outputs: list[TensorSpec]) -> tuple[Decoder, bool]:
    """The manifest's decoder bound to the outputs it reads, after checking their shapes;
    with whether an RT-DETR output holds the top-k rows (box, score, class) rather than
    per-class scores. Raises ModelError naming the file and the output."""
    names = [t.name for t in outputs]
    wanted = m.output.names()
    missing = [n for n in wanted if n and n not in names]
    if missing:
        raise ModelError(f"{path}: manifest output(s) {missing} are not outputs of the model ({names})")
    index = tuple(names.index(n) if n else 0 for n in wanted)
    dec, n = m.output.decoder, len(m.labels)
    shapes = [outputs[i].shape for i in index]

    def need(ok: bool, what: str, k: int = 0) -> None:
        if not ok:
            raise ModelError(
                f"{path}: output {names[index[k]]!r} has shape {shapes[k]}; the {dec} decoder with "
                f"{n} labels needs {what}"
            )

    shape = shapes[0]
    if dec != "efficient_nms":
        need(len(shape) == 3, "3 axes")
    if dec == "yolov8":
        need(shape[1] in (None, 4 + n), f"{4 + n} on axis 1")
    elif dec == "yolov5":
        need(shape[2] in (None, 5 + n), f"{5 + n} on axis 2")
    elif dec == "end2end":
        need(shape[2] == 6, "6 on axis 2 (x1, y1, x2, y2, score, class id)")
    elif dec == "rtdetr":
        need(shape[2] in (6, 4 + n), f"{4 + n} on axis 2 (box, class scores) or 6 (box, score, class id)")
    else:
        num, boxes, scores, classes = shapes
        need(len(num) in (1, 2) and num[-1] in (1, None), "[B, 1]", 0)
        need(len(boxes) == 3 and boxes[2] == 4, "[B, K, 4]", 1)
        need(len(scores) == 2 and scores[1] == boxes[1], f"[B, {boxes[1]}] (K of det_boxes)", 2)
        need(len(classes) == 2 and classes[1] == boxes[1], f"[B, {boxes[1]}] (K of det_boxes)", 3)
    # Ultralytics 8.4 exports RT-DETR's top-k rows; older ones per-class scores. With two
    # labels both are 6 wide: the current export is meant.
    return Decoder(dec, index), dec == "rtdetr" and shape[2] == 6


def load_model(model: ModelConfig, backend_config: BackendConfig) -> LoadedModel:
    """Resolve, load and check a model. Raises ModelError, ConfigError or BackendError."""
    resolved = resolve_model(model.path, model.manifest)
    for note in resolved.assumptions:
        log.warning("model %s has no manifest; assumed: %s", resolved.path, note)
    m = resolved.manifest
    backend = create_backend(backend_config)
    fmt = m.input.format()
    path = ""
    # TensorRT backends take the conversion onto the GPU or DLA themselves (host_format).
    if model.input_adapter == "auto" and backend.name == "onnxruntime":
        path = adapter.try_adapt(resolved.path, fmt, model.cache_dir, m.input.name)
    if path:
        fmt = adapter.host_format(fmt)
    backend.load(path or resolved.path, fmt)
    host = backend.host_format(fmt)
    input_name, decoder, topk = check_io(m, resolved.path, backend.inputs, backend.outputs, host)
    if decoder.name == "rtdetr" and m.input.resize != "stretch":
        log.warning(
            "model %s: an RT-DETR decoder with a letterboxed input; Ultralytics trains and runs RT-DETR "
            "on stretched frames (input.resize: stretch in its manifest)",
            resolved.path,
        )
    return LoadedModel(
        resolved,
        backend,
        Preprocessor(host),
        decoder,
        decode_params(model, m, topk),
        input_name,
        adapted_from=resolved.path if path else "",
    )


def decode_params(model: ModelConfig, m: ModelManifest, rtdetr_topk: bool = False) -> DecodeParams:
    """The decoder's settings: the config's thresholds over the manifest's."""
    return DecodeParams(
        score_threshold=model.score_threshold if model.score_threshold is not None else m.score_threshold,
        iou_threshold=model.iou_threshold if model.iou_threshold is not None else m.iou_threshold,
        max_detections=model.max_detections,
        input_w=m.input.width,
        input_h=m.input.height,
        rtdetr_topk=rtdetr_topk,
    )


class _Once(logging.Filter):
    """Each distinct message once."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, record.getMessage())
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


@contextlib.contextmanager
def model_notes_once() -> Iterator[None]:
    """What loading says about a model (e.g. the assumptions for one without a manifest),
    said once in the block: bench's phases and tune's candidates load the model again and
    again."""
    once = _Once()
    log.addFilter(once)
    try:
        yield
    finally:
        log.removeFilter(once)
