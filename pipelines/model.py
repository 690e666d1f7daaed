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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.core.model_config import BackendConfig, ModelConfig
from edge_agent.core.text import printable
from edge_agent.models import adapter
from edge_agent.models.decoders import kernels as decode_kernels
from edge_agent.models.decoders import registry as decoders
from edge_agent.models.decoders.base import BoundDecoder, Decoded, DecodeParams, OutputMismatch, oversized
from edge_agent.models.manifest import (
    InputFormat,
    InputSpec,
    ModelError,
    ModelManifest,
    ResolvedModel,
    resolve_model,
)
from edge_agent.pipelines import jit
from edge_agent.pipelines.backends.base import InferenceBackend, TensorSpec
from edge_agent.pipelines.backends.registry import create_backend
from edge_agent.pipelines.preprocess import Preprocessor
from edge_agent.pipelines.tasks.base import Task
from edge_agent.pipelines.tasks.registry import task_for

log = logging.getLogger(__name__)

_DTYPE = {"float32": np.float32, "float16": np.float16, "uint8": np.uint8}


@dataclass
class LoadedModel:
    resolved: ResolvedModel
    backend: InferenceBackend
    preprocessor: Preprocessor
    decode: BoundDecoder
    params: DecodeParams
    input_name: str
    adapted_from: str = ""  # the original model when the backend runs its input-adapted copy
    closed: bool = False
    task: Task = field(default_factory=Task)  # what its detections carry beyond the box

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
) -> tuple[str, BoundDecoder]:
    """Check the model's tensors against its manifest; returns the input's name and the
    decoder bound to the outputs it reads (``check_outputs``).

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
    return tin.name, check_outputs(m, path, outputs)


def check_outputs(m: ModelManifest, path: str, outputs: list[TensorSpec]) -> BoundDecoder:
    """The manifest's decoder, set up for the model's outputs (their shapes checked by the
    decoder) and bound to the ones it reads. Raises ModelError naming the file and the output,
    also for any output past ``MAX_OUTPUT_ELEMENTS`` per frame (its open axes counted as 1:
    the backend checks them again once they are known)."""
    for t in outputs:
        why = oversized(t.name, t.shape)
        if why:
            raise ModelError(f"{path}: {why}")
    names = [t.name for t in outputs]
    wanted = m.output.names()
    missing = [n for n in wanted if n and n not in names]
    if missing:
        raise ModelError(f"{path}: manifest output(s) {missing} are not outputs of the model ({names})")
    index = tuple(names.index(n) if n else 0 for n in wanted)
    shapes = [outputs[i].shape for i in index]
    decoder = decoders.get(m.output.decoder)
    try:
        fitted = decoder.fit(shapes, len(m.labels)).refine(m.output)
    except OutputMismatch as e:
        k = e.index
        raise ModelError(
            f"{path}: output {names[index[k]]!r} has shape {shapes[k]}; the {decoder.name} decoder with "
            f"{len(m.labels)} labels needs {e.needs}"
        ) from None
    return BoundDecoder(fitted, index)


def load_model(model: ModelConfig, backend_config: BackendConfig) -> LoadedModel:
    """Resolve, load and check a model. Raises ModelError, ConfigError or BackendError."""
    resolved = resolve_model(model.path, model.manifest)
    for note in resolved.assumptions:  # they quote the model's own names: escaped
        log.warning("model %s has no manifest; assumed: %s", resolved.path, printable(note, None))
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
    input_name, decoder = check_io(m, resolved.path, backend.inputs, backend.outputs, host)
    # The decoders' compiled kernels (models/ may not import pipelines/: handed over here).
    decode_kernels.install(jit.load("decode", decode_kernels.FUNCTIONS, decode_kernels.warm))
    wants = decoder.decoder
    if wants.resize == "stretch" and m.input.resize != "stretch":
        log.warning(
            "model %s: the %s decoder with a letterboxed input; %s (input.resize: stretch in its manifest)",
            resolved.path,
            wants.name,
            wants.resize_why,
        )
    params = decode_params(model, m)
    return LoadedModel(
        resolved,
        backend,
        Preprocessor(host),
        decoder,
        params,
        input_name,
        adapted_from=resolved.path if path else "",
        task=task_for(decoder, params, model.masks, model.mask_points),
    )


def decode_params(model: ModelConfig, m: ModelManifest) -> DecodeParams:
    """What every decoder is told: the config's thresholds over the manifest's."""
    return DecodeParams(
        score_threshold=model.score_threshold if model.score_threshold is not None else m.score_threshold,
        iou_threshold=model.iou_threshold if model.iou_threshold is not None else m.iou_threshold,
        max_detections=model.max_detections,
        input_w=m.input.width,
        input_h=m.input.height,
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
