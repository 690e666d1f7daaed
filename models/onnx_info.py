"""What an ONNX file says about itself, and the rules that pick its decoder from that.

Read with ``onnx`` rather than an ONNX Runtime session, so a graph that only TensorRT can
run (the ``EfficientNMS_TRT`` plugin) is inspected too. Each decoder brings its own rules
(``Decoder.recognise``, in its module under ``models/decoders/``); they run in the order
``models.decoders.recognition`` numbers, and each decision comes with the rule that made
it, for the log and ``models check``:

1. Ultralytics metadata ``task``: anything but ``detect`` is refused with that reason.
2. Output names, or a set of outputs shaped like a decoder's (TensorRT's EfficientNMS).
3. Ultralytics metadata naming the layout (``head: RTDETRDecoder``, ``end2end: True``,
   export ``args`` with ``nms: True``), when the output fits it.
4. The output's shape, against the anchor counts of the input size and the label count.

A shape no rule accepts is refused with the shapes seen and the decoders known.

Metadata is the model author's text: each value read is bounded in length before it is
parsed, and parsed by a scanner of flat literals (``models/literals.py``) that cannot recurse
or grow past its bounds, where ``ast.literal_eval`` overflowed the stack on a deep expression
(a RecursionError, or a segfault on Python 3.10) and the parser's own stack on a long one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge_agent.models.decoders import registry as decoders
from edge_agent.models.decoders.recognition import BY_METADATA, Seen, Tensor
from edge_agent.models.literals import NotLiteral, literal

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16"}
#: The Ultralytics tasks the agent runs (each has its decoders: ``Decoder.task``).
TASKS = ("detect", "pose", "obb", "segment")
_REFUSED = {
    "classify": "a classification model (Ultralytics metadata task='classify') scores the whole image, "
    "not objects in it: it has no boxes to publish, track or count; the agent runs detect, pose, obb "
    "and segment models",
}


#: Bounds on the metadata values the agent reads, checked before a value is parsed. ``names``:
#: room for ``MAX_LABELS`` labels of up to 90 characters as Ultralytics writes them
#: (``{0: 'aerosol_can', ...}``: LVIS' 1,203 take 30 KB); read in about 0.1 s.
MAX_NAMES_CHARS = 1 << 20
#: ``args``, the export's arguments: about 300 characters.
MAX_ARGS_CHARS = 4096
#: Any other key read (task, imgsz, kpt_shape, end2end, head): a word or a short list.
MAX_VALUE_CHARS = 256
_MAX_CHARS = {"names": MAX_NAMES_CHARS, "args": MAX_ARGS_CHARS}
#: Labels, from the metadata or a manifest: LVIS has 1,203 classes, Objects365 365, Open
#: Images 601; 10,000 leaves room for any detector's label set (its output's class axis is
#: bounded separately: ``decoders.base.MAX_OUTPUT_ELEMENTS``). A label goes into every
#: detection of every message: 128 characters hold the longest real ones (LVIS' are under 40).
MAX_LABELS = 10_000
MAX_LABEL_CHARS = 128
#: Containers within containers in a metadata literal (``args`` holds lists in a dict).
MAX_DEPTH = 3


class UnsupportedModel(ValueError):
    """The model is not one the agent can decode; the message says why."""


class MetadataError(UnsupportedModel):
    """A metadata value the agent reads is past its bounds or not what exporters write; the
    message names the key (the caller adds the file)."""


def label_problem(label: object) -> str:
    """Why ``label`` cannot be a label ("" when it can): not a string, longer than
    ``MAX_LABEL_CHARS``, or not encodable as UTF-8 (a lone surrogate, which no message could
    carry). Control characters are kept: every terminal path escapes them (``core.text``)."""
    if not isinstance(label, str):
        return f"{type(label).__name__} {label!r} is not a string"
    if len(label) > MAX_LABEL_CHARS:
        return f"{len(label)} characters (at most {MAX_LABEL_CHARS} characters)"
    try:
        label.encode("utf-8")
    except UnicodeEncodeError:
        return f"{label!r} is not UTF-8 text (a lone surrogate)"
    return ""


def _bounded(key: str, text: str) -> str:
    limit = _MAX_CHARS.get(key, MAX_VALUE_CHARS)
    if len(text) > limit:
        raise MetadataError(f"metadata {key!r} is {len(text):,} characters (at most {limit:,})")
    return text.strip()


def parse_value(key: str, text: str) -> Any:
    """Metadata ``key``'s value ``text`` as the literal it spells (Ultralytics writes dicts
    and lists as their repr: ``parse_names``' grammar), or the text itself when it spells none
    (``detect``, ``RTDETRDecoder``). Raises MetadataError when ``text`` is past its bound."""
    s = _bounded(key, text)
    try:
        return literal(s, MAX_LABELS, MAX_DEPTH)
    except Exception:  # NotLiteral, or anything else the scan raised: not a literal, as before
        return text


def parse_names(text: str) -> tuple[str, ...]:
    """Labels from metadata ``names``: a dict of class ids (ints from 0) to labels, as
    Ultralytics writes it, or a list of labels (older YOLOv5 exports), in class-id order.
    Raises MetadataError naming the key: past ``MAX_NAMES_CHARS``, more than ``MAX_LABELS``,
    a label past ``label_problem``'s bounds, or not such a literal."""
    s = _bounded("names", text)
    try:
        value = literal(s, MAX_LABELS, MAX_DEPTH)
    except NotLiteral as e:
        raise MetadataError(f"metadata 'names' is not a flat dict or list of labels: {e}") from None
    except Exception as e:  # whatever else the scan raised: a refusal, never a traceback
        raise MetadataError(f"metadata 'names' could not be read ({type(e).__name__})") from None
    if isinstance(value, dict):
        bad = next((k for k in value if type(k) is not int or k < 0), None)
        if bad is not None:
            raise MetadataError(f"metadata 'names' has {bad!r} among its class ids (ints from 0)")
        labels = tuple(value[k] for k in sorted(value))
    elif isinstance(value, (list, tuple)):
        labels = tuple(value)
    else:
        raise MetadataError(
            f"metadata 'names' is a {type(value).__name__}, not a dict of class ids to labels"
        )
    if not labels:
        raise MetadataError("metadata 'names' holds no labels")
    for i, label in enumerate(labels):
        problem = label_problem(label)
        if problem:
            raise MetadataError(f"metadata 'names': label {i}: {problem}")
    return labels


@dataclass(frozen=True)
class OnnxInfo:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    metadata: dict[str, str]
    ops: frozenset[str]  # op types in the graph (plugins show here)

    def meta(self, key: str) -> Any:
        """A metadata value as a Python literal (Ultralytics writes dicts and lists as
        their repr), the string itself when it is not one, or None. Raises MetadataError
        for a value past its bound (``parse_value``)."""
        text = self.metadata.get(key)
        return None if text is None else parse_value(key, text)

    def labels(self) -> tuple[str, ...]:
        """The labels metadata ``names`` gives, () without it. Raises MetadataError."""
        text = self.metadata.get("names")
        return () if text is None else parse_names(text)


def read(path: str) -> OnnxInfo:
    """The graph's inputs, outputs, metadata and op types (no weights are interpreted).
    Raises whatever ``onnx`` raises for an unreadable file."""
    import onnx

    proto = onnx.load(path, load_external_data=False)
    g = proto.graph
    inits = {i.name for i in g.initializer}

    def tensor(vi) -> Tensor:
        tt = vi.type.tensor_type
        dims = tuple(
            d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tt.shape.dim
        )
        return Tensor(vi.name, dims, _ONNX_DTYPES.get(tt.elem_type, ""))

    return OnnxInfo(
        inputs=tuple(tensor(vi) for vi in g.input if vi.name not in inits),
        outputs=tuple(tensor(vi) for vi in g.output),
        metadata={p.key: p.value for p in proto.metadata_props},
        ops=frozenset(n.op_type for n in g.node),
    )


@dataclass(frozen=True)
class Choice:
    decoder: str
    outputs: tuple[str, ...]  # the outputs it reads, in its order
    rule: str = ""
    ignored: tuple[str, ...] = ()  # outputs the decoder does not read


def choose(info: OnnxInfo, n_labels: int, height: int, width: int) -> Choice:
    """Pick the decoder (the module's rules, in order). ``n_labels``: the labels the
    metadata names, 0 when it names none. Raises UnsupportedModel."""
    task = info.meta("task")
    if task is not None and task not in TASKS:
        raise UnsupportedModel(
            _REFUSED.get(
                str(task),
                f"Ultralytics metadata task={task!r} is not a task the agent runs ({', '.join(TASKS)})",
            )
        )
    outs = info.outputs
    seen = Seen(outs, n_labels, height, width, info.meta)
    # A model's task picks the decoders that may read it; without one, the detectors.
    candidates = [d for d in decoders.registered() if d.task == (task or "detect")]
    found = [(g, d.name) for d in candidates for g in d.recognise(seen)]
    guesses = sorted(found, key=lambda x: (x[0].order, x[1]))
    best = next(((g, name) for g, name in guesses if g.fits), None)
    masks = [t for t in outs if len(t.shape) == 4]
    # With task=detect, an extra feature-map output is just unread.
    if masks and task is None and (best is None or best[0].order >= BY_METADATA):
        raise UnsupportedModel(
            f"output {masks[0].show()} is an image-shaped tensor (mask prototypes: a segmentation "
            "export without Ultralytics' metadata task): name its decoder (yolov8_seg or end2end_seg) "
            "and labels in a manifest"
        )
    if best is None:
        at = f"at {width}x{height}" + (f" with {n_labels} labels" if n_labels else "")
        of = f" of task {task!r}" if task else ""
        raise _refuse(f"output {outs[0].name!r} fits no decoder{of} {at}", outs, candidates)
    guess, name = best
    rule = guess.rule
    claim = next((g for g, _ in guesses if not g.fits and g.order < guess.order), None)
    if claim is not None:  # the metadata said otherwise: say both
        rule = f"{rule} ({claim.rule}, but the output {outs[0].show()} is not that layout)"
    ignored = tuple(t.name for t in outs if t.name not in guess.outputs)
    return Choice(name, guess.outputs, rule, ignored)


def _refuse(why: str, outs: tuple[Tensor, ...], candidates: list) -> UnsupportedModel:
    seen = "; ".join(t.show() for t in outs)
    known = "; ".join(f"{d.name} {d.layout}" for d in candidates)
    return UnsupportedModel(
        f"{why} (outputs: {seen}); the decoders known: {known}. A manifest beside the "
        "model names the decoder and labels (edge-agent models check MODEL --write-manifest)"
    )
