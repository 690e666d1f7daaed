"""Model manifests: what a model expects as input and how to decode its output.

A model lives as ``<dir>/model.onnx`` beside ``<dir>/manifest.yaml``. Without a manifest
the agent reads what the ONNX carries (Ultralytics exports store ``names``, ``stride``
and ``imgsz`` in their metadata) and reports every assumption it made.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from edge_agent import configload
from edge_agent.configload import check
from edge_agent.pipelines.preprocess import InputFormat

BUNDLED_DIR = Path(__file__).resolve().parent
BUNDLED_MODEL = "shapes-det"


class ModelError(RuntimeError):
    """A model file or its manifest cannot be used; the message names the file."""


@dataclass(frozen=True)
class InputSpec:
    name: str = ""  # empty: the model's only input
    height: int = 640
    width: int = 640
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    dtype: Literal["float32", "float16", "uint8"] = "float32"
    color: Literal["rgb", "bgr"] = "rgb"
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    pad_value: int = 114

    def __post_init__(self) -> None:
        check(self.height > 0 and self.width > 0, "height", "input size must be positive")
        check(all(s > 0 for s in self.std), "std", "must be > 0")
        check(0 <= self.pad_value <= 255, "pad_value", "must be within 0..255")

    def format(self) -> InputFormat:
        return InputFormat(
            height=self.height,
            width=self.width,
            layout=self.layout,
            dtype=self.dtype,
            color=self.color,
            scale=self.scale,
            mean=self.mean,
            std=self.std,
            pad_value=self.pad_value,
        )


@dataclass(frozen=True)
class OutputSpec:
    name: str = ""  # empty: the model's first output
    decoder: Literal["yolov8", "yolov5"] = "yolov8"


@dataclass(frozen=True)
class ModelManifest:
    name: str = "model"
    description: str = ""
    input: InputSpec = field(default_factory=InputSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    labels: tuple[str, ...] = ()
    score_threshold: float = 0.25
    iou_threshold: float = 0.45

    def __post_init__(self) -> None:
        check(len(self.labels) > 0, "labels", "at least one class label")


@dataclass(frozen=True)
class ResolvedModel:
    path: str
    manifest: ModelManifest
    manifest_path: str  # empty when read from the ONNX itself
    assumptions: tuple[str, ...] = ()


def bundled_model_path(name: str = BUNDLED_MODEL) -> str:
    return str(BUNDLED_DIR / name / "model.onnx")


def resolve_model(path: str, manifest_path: str = "") -> ResolvedModel:
    """Find the ONNX file and its manifest; an empty ``path`` is the bundled detector.

    Raises ``ModelError`` for a missing or unreadable file and ``ConfigError`` for a bad
    manifest (with its file and line).
    """
    path = path or bundled_model_path()
    if not os.path.isfile(path):
        raise ModelError(f"model file not found: {path}")
    if not os.access(path, os.R_OK):
        raise ModelError(f"model file not readable: {path}")
    if not manifest_path:
        for candidate in (Path(path).with_suffix(".yaml"), Path(path).parent / "manifest.yaml"):
            if candidate.is_file():
                manifest_path = str(candidate)
                break
    if manifest_path:
        manifest = configload.load_file(ModelManifest, manifest_path)
        return ResolvedModel(path, manifest, manifest_path)
    manifest, notes = manifest_from_onnx(path)
    return ResolvedModel(path, manifest, "", tuple(notes))


def manifest_from_onnx(path: str) -> tuple[ModelManifest, list[str]]:
    """Build a manifest from the ONNX's shapes and metadata; returns it with the assumptions."""
    import onnxruntime as ort  # the inspection needs only a CPU session

    try:
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as e:  # ORT raises its own exception types for bad files
        raise ModelError(f"cannot load model {path}: {e}") from None
    meta = sess.get_modelmeta().custom_metadata_map
    inp, out = sess.get_inputs()[0], sess.get_outputs()[0]
    notes: list[str] = []
    shape = list(inp.shape)
    nhwc = len(shape) == 4 and shape[3] == 3
    h, w = (shape[1], shape[2]) if nhwc else (shape[2], shape[3]) if len(shape) == 4 else (0, 0)
    if not (isinstance(h, int) and isinstance(w, int) and h > 0 and w > 0):
        imgsz = _literal(meta.get("imgsz"))
        if isinstance(imgsz, (list, tuple)) and len(imgsz) == 2:
            h, w = int(imgsz[0]), int(imgsz[1])
            notes.append(f"input size {w}x{h} from metadata imgsz")
        else:
            h = w = 640
            notes.append("input size unknown: assumed 640x640")
    dtype = {"tensor(uint8)": "uint8", "tensor(float16)": "float16"}.get(inp.type, "float32")
    color = "bgr" if dtype == "uint8" and nhwc else "rgb"
    scaling = "no scaling (uint8: normalisation in the graph)" if dtype == "uint8" else "scaled by 1/255"
    notes.append(f"input {inp.name!r} {'NHWC' if nhwc else 'NCHW'} {dtype}, {color.upper()}, {scaling}")
    names = _literal(meta.get("names"))
    oshape = list(out.shape)
    decoder = "yolov8"
    if len(oshape) == 3 and all(isinstance(d, int) for d in oshape[1:]) and oshape[1] > oshape[2]:
        decoder = "yolov5"
    notes.append(f"output {out.name!r} {oshape} decoded as {decoder}")
    if isinstance(names, dict) and names:
        labels = tuple(str(names[k]) for k in sorted(names))
        notes.append(f"{len(labels)} labels from metadata names")
    else:
        n_cls = _class_count(oshape, decoder)
        labels = tuple(f"class{i}" for i in range(max(n_cls, 1)))
        notes.append(f"no label names in the model: using class0..class{len(labels) - 1}")
    manifest = ModelManifest(
        name=Path(path).stem,
        input=InputSpec(
            name=inp.name,
            height=h,
            width=w,
            layout="NHWC" if nhwc else "NCHW",
            dtype=dtype,
            color=color,
        ),
        output=OutputSpec(name=out.name, decoder=decoder),
        labels=labels,
    )
    return manifest, notes


def _class_count(shape: list, decoder: str) -> int:
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape[1:]):
        return 0
    return shape[1] - 4 if decoder == "yolov8" else shape[2] - 5


def _literal(text: str | None):
    if not text:
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
