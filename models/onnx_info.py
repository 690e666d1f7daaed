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
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from edge_agent.models.decoders import registry as decoders
from edge_agent.models.decoders.recognition import BY_METADATA, Seen, Tensor

_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16"}
#: The Ultralytics tasks the agent runs (each has its decoders: ``Decoder.task``).
TASKS = ("detect", "pose", "obb", "segment")
_REFUSED = {
    "classify": "a classification model (Ultralytics metadata task='classify') scores the whole image, "
    "not objects in it: it has no boxes to publish, track or count; the agent runs detect, pose, obb "
    "and segment models",
}


class UnsupportedModel(ValueError):
    """The model is not one the agent can decode; the message says why."""


@dataclass(frozen=True)
class OnnxInfo:
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    metadata: dict[str, str]
    ops: frozenset[str]  # op types in the graph (plugins show here)

    def meta(self, key: str):
        """A metadata value as a Python literal (Ultralytics writes dicts and lists as
        their repr), the string itself when it is not one, or None."""
        text = self.metadata.get(key)
        if text is None:
            return None
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text


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
