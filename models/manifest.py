"""Model manifests: what a model expects as input and how to decode its output.

A model lives as ``<dir>/model.onnx`` beside ``<dir>/manifest.yaml``. Without a manifest
the agent reads what the ONNX carries (Ultralytics exports store ``names``, ``stride``
and ``imgsz`` in their metadata) and reports every assumption it made.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import yaml

from edge_agent.core import configload
from edge_agent.core.configfields import FieldError, check
from edge_agent.core.files import FileRefused, read_regular
from edge_agent.core.yamlnodes import ConfigError, Problem
from edge_agent.models import onnx_info
from edge_agent.models.decoders import registry as decoders
from edge_agent.models.decoders.efficient_nms import NMS_OUTPUTS
from edge_agent.models.decoders.pose import kpt_shape_of
from edge_agent.models.decoders.seg import PROTOS

# The labels' bounds hold for a manifest's labels and the metadata's names alike.
from edge_agent.models.onnx_info import MAX_LABEL_CHARS as MAX_LABEL_CHARS
from edge_agent.models.onnx_info import MAX_LABELS, label_problem

BUNDLED_DIR = Path(__file__).resolve().parent
BUNDLED_MODEL = "shapes-det"

#: A manifest is read whole, bounded before it is parsed: 10,000 labels of 100 characters fit.
MAX_MANIFEST_BYTES = 1 << 20
#: YAML nodes (scalars, lists, mappings) in a manifest, counted by libyaml's parser before the
#: document is composed (composing 500,000 nodes took 25 s): the labels and 2,000 more.
MAX_MANIFEST_NODES = MAX_LABELS + 2000
#: A model input's side in pixels: exports run at 320 to 1280, some at 2048 or 4096.
MAX_INPUT_SIDE = 8192


@dataclass(frozen=True)
class InputFormat:
    """What the host writes into the model input: the manifest's input section, or what a
    backend or the input adapter takes over (``host_format``)."""

    height: int
    width: int
    layout: str = "NCHW"  # or "NHWC"
    dtype: str = "float32"  # float32 | float16 | uint8
    color: str = "rgb"  # rgb | bgr
    scale: float = 1.0 / 255.0
    mean: tuple[float, float, float] = (0.0, 0.0, 0.0)
    std: tuple[float, float, float] = (1.0, 1.0, 1.0)
    pad_value: int = 114
    resize: str = "letterbox"  # or "stretch": the frame fills the input, aspect ratio not kept
    interpolation: str = "linear"  # or "area" (shrinking only)


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
    # letterbox: aspect ratio kept, borders of pad_value (YOLO); stretch: the frame fills the
    # input (Ultralytics resizes RT-DETR's input this way).
    resize: Literal["letterbox", "stretch"] = "letterbox"
    # linear: bilinear, as Ultralytics' predict resizes (its exports expect it); area: pixel
    # averaging when shrinking (the bundled detector was trained so).
    interpolation: Literal["linear", "area"] = "linear"

    def __post_init__(self) -> None:
        check(self.height > 0 and self.width > 0, "height", "input size must be positive")
        check(
            self.height <= MAX_INPUT_SIDE and self.width <= MAX_INPUT_SIDE,
            "height",
            f"input {self.width}x{self.height} is larger than {MAX_INPUT_SIDE} pixels a side",
        )
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
            resize=self.resize,
            interpolation=self.interpolation,
        )


@dataclass(frozen=True)
class NmsOutputs:
    """The outputs of a decoder that reads several, by role: TensorRT's EfficientNMS
    plugin's four (``efficient_nms``' roles), its documented names by default."""

    num_dets: str = NMS_OUTPUTS[0]
    boxes: str = NMS_OUTPUTS[1]
    scores: str = NMS_OUTPUTS[2]
    classes: str = NMS_OUTPUTS[3]


@dataclass(frozen=True)
class OutputSpec:
    name: str = ""  # empty: the model's first output (a decoder of one output)
    decoder: str = "yolov8"  # a registered decoder (models/decoders/)
    efficient_nms: NmsOutputs = field(default_factory=NmsOutputs)
    # Segmentation decoders: the output of mask prototypes [B, M, H/4, W/4].
    protos: str = PROTOS
    # Pose decoders: keypoints and values per keypoint (x, y[, confidence]), as
    # Ultralytics' metadata kpt_shape; empty: read from the output (3 values when they divide).
    kpt_shape: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        known = decoders.names()
        check(
            self.decoder in known,
            "decoder",
            f"unknown decoder {self.decoder!r} (one of {', '.join(map(repr, known))})",
        )
        check(
            not self.kpt_shape
            or (len(self.kpt_shape) == 2 and self.kpt_shape[0] > 0 and self.kpt_shape[1] in (2, 3)),
            "kpt_shape",
            "[keypoints, values per keypoint (2 or 3)]",
        )

    def names(self) -> tuple[str, ...]:
        """The outputs the decoder reads, in its order ("" for the model's first)."""
        return decoders.get(self.decoder).output_names(
            self.name, {**asdict(self.efficient_nms), "protos": self.protos}
        )


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
        check(
            len(self.labels) <= MAX_LABELS,
            "labels",
            f"{len(self.labels):,} labels (at most {MAX_LABELS:,})",
        )
        bad = next(((i, p) for i, p in enumerate(map(label_problem, self.labels)) if p), None)
        check(bad is None, "labels", f"label {bad[0]}: {bad[1]}" if bad else "")


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
        return ResolvedModel(path, load_manifest(manifest_path), manifest_path)
    manifest, notes = manifest_from_onnx(path)
    return ResolvedModel(path, manifest, "", tuple(notes))


def load_manifest(path: str) -> ModelManifest:
    """The manifest at ``path`` (``read_manifest``'s bounds, then the typed load). Raises
    ModelError for a file past its bounds, ConfigError for its content (file, line, key)."""
    text = read_manifest(path)
    try:
        return configload.load(ModelManifest, text, path)
    except FieldError as e:  # outside the builder: an empty document, whose defaults have no labels
        raise ConfigError([Problem(path, 0, 0, e.key, f"an empty manifest: {e}")]) from None


def read_manifest(path: str) -> str:
    """A manifest's text, read once and bounded before it is parsed: a regular file (a FIFO
    would block the read) of at most ``MAX_MANIFEST_BYTES``, UTF-8, whose YAML holds at most
    ``MAX_MANIFEST_NODES`` nodes. Raises ModelError naming the file and the bound."""
    try:
        data = read_regular(path, MAX_MANIFEST_BYTES)
    except FileRefused as e:
        raise ModelError(f"manifest {path}: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelError(f"manifest {path}: byte {e.start} is not UTF-8 (a manifest is YAML text)") from None
    nodes = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            nodes += isinstance(event, yaml.NodeEvent)
            if nodes > MAX_MANIFEST_NODES:
                raise ModelError(
                    f"manifest {path}: more than {MAX_MANIFEST_NODES:,} YAML nodes (room for "
                    f"{MAX_LABELS:,} labels and the other keys); is this a manifest?"
                )
    except yaml.YAMLError:
        pass  # composing it again names the line (configload)
    return text


def manifest_from_onnx(path: str) -> tuple[ModelManifest, list[str]]:
    """Build a manifest from the ONNX's shapes and metadata; returns it with the assumptions
    (each names the rule behind it). Raises ModelError for a model the agent cannot run,
    naming the file and, for metadata it cannot use, the key."""
    try:
        info = onnx_info.read(path)
    except Exception as e:  # protobuf's DecodeError, OSError, ...: the file is not a model
        raise ModelError(f"cannot load model {path}: {e}") from None
    return manifest_from_info(path, info)


def manifest_from_info(path: str, info: onnx_info.OnnxInfo) -> tuple[ModelManifest, list[str]]:
    """``manifest_from_onnx`` for what was read of the model at ``path``: every error of
    its metadata (and any input size out of range) is a ModelError naming the file."""
    try:
        return _from_info(path, info)
    except (onnx_info.UnsupportedModel, FieldError) as e:  # MetadataError, an input out of range
        key = f"{e.key}: " if isinstance(e, FieldError) else ""
        raise ModelError(f"{path}: {key}{e}") from None


def _from_info(path: str, info: onnx_info.OnnxInfo) -> tuple[ModelManifest, list[str]]:
    if not info.inputs or not info.outputs:
        raise ModelError(f"{path}: the graph has no input or no output")
    inp = info.inputs[0]
    notes: list[str] = []
    shape = list(inp.shape)
    nhwc = len(shape) == 4 and shape[3] == 3
    h, w = _input_size(info, shape, nhwc, notes)
    dtype = inp.dtype if inp.dtype in ("uint8", "float16") else "float32"
    color = "bgr" if dtype == "uint8" and nhwc else "rgb"
    scaling = "no scaling (uint8: normalisation in the graph)" if dtype == "uint8" else "scaled by 1/255"
    notes.append(f"input {inp.name!r} {'NHWC' if nhwc else 'NCHW'} {dtype}, {color.upper()}, {scaling}")
    labels = info.labels()
    choice = onnx_info.choose(info, len(labels), h, w)
    decoder = decoders.get(choice.decoder)
    notes.append(f"decoder {decoder.name}, chosen by {choice.rule}")
    if choice.ignored:
        notes.append(f"outputs {list(choice.ignored)} are not read")
    if decoder.resize == "stretch":
        notes.append(f"input stretched to the model's size, not letterboxed ({decoder.resize_why})")
    if labels:
        notes.append(f"{len(labels)} labels from metadata names")
    else:
        first = next(t.shape for t in info.outputs if t.name == choice.outputs[0])
        n_cls = max(decoder.class_count(first), 0)
        labels = tuple(f"class{i}" for i in range(n_cls or 80))
        notes.append(
            f"no label names in the model: using class0..class{len(labels) - 1}"
            + ("" if n_cls else " (the output does not tell the class count)")
        )
    name, named = decoder.output_section(choice.outputs)
    protos = named.pop("protos", PROTOS)
    said = info.meta("kpt_shape") if decoder.task == "pose" else None
    kpt_shape = kpt_shape_of(said) or ()
    if kpt_shape:
        notes.append(f"keypoints {kpt_shape[0]} x {kpt_shape[1]} values from metadata kpt_shape")
    elif said is not None:
        notes.append(f"metadata kpt_shape {said!r} is not [keypoints, values]: read from the output")
    manifest = ModelManifest(
        name=Path(path).stem,
        input=InputSpec(
            name=inp.name,
            height=h,
            width=w,
            layout="NHWC" if nhwc else "NCHW",
            dtype=dtype,
            color=color,
            resize=decoder.resize,  # type: ignore[arg-type]
        ),
        output=OutputSpec(
            name=name,
            decoder=decoder.name,
            efficient_nms=NmsOutputs(**named),
            protos=protos,
            kpt_shape=kpt_shape,
        ),
        labels=labels,
    )
    return manifest, notes


def _input_size(info: onnx_info.OnnxInfo, shape: list, nhwc: bool, notes: list[str]) -> tuple:
    """The input's height and width from its shape, else metadata imgsz, else 640x640 (noted)."""
    h, w = (shape[1], shape[2]) if nhwc else (shape[2], shape[3]) if len(shape) == 4 else (None, None)
    if not (h and w):
        imgsz = info.meta("imgsz")
        if isinstance(imgsz, (list, tuple)) and len(imgsz) == 2:
            if not all(type(v) is int and 0 < v <= MAX_INPUT_SIDE for v in imgsz):
                raise onnx_info.MetadataError(
                    f"metadata 'imgsz' {imgsz!r} is not [height, width] within 1..{MAX_INPUT_SIDE}"
                )
            h, w = imgsz
            notes.append(f"input size {w}x{h} from metadata imgsz")
        else:
            h = w = 640
            notes.append("input size unknown: assumed 640x640")
    return h, w
