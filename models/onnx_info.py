"""What an ONNX file says about itself, and the rules that pick its decoder from that.

Read with ``onnx`` rather than an ONNX Runtime session, so a graph that only TensorRT can
run (the ``EfficientNMS_TRT`` plugin) is inspected too. The rules run in a fixed order,
and each decision comes with the rule that made it, for the log and ``models check``:

1. Ultralytics metadata ``task``: anything but ``detect`` is refused with that reason.
2. Output names: TensorRT's EfficientNMS outputs (``num_dets``, ``det_boxes``, ...), or
   four outputs shaped like them.
3. Ultralytics metadata: ``head: RTDETRDecoder`` (RT-DETR), ``end2end: True`` (YOLO26,
   YOLOv10), export ``args`` with ``nms: True`` (NMS exported into the graph).
4. The output's shape, against the anchor counts of the input size and the label count.

A shape no rule accepts is refused with the shapes seen and the decoders known.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

STRIDES = ((8, 16, 32), (8, 16, 32, 64))  # YOLO heads: P3-P5, and the P6 models
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 6: "int32", 7: "int64", 10: "float16"}
KNOWN_LAYOUTS = (
    "yolov8 [B, 4+C, N], yolov5 [B, N, 5+C], end2end [B, K, 6], rtdetr [B, K, 4+C] or [B, K, 6], "
    "efficient_nms (num_dets [B, 1], det_boxes [B, K, 4], det_scores [B, K], det_classes [B, K])"
)
#: TensorRT's EfficientNMS plugin's outputs, as its documentation names them.
NMS_OUTPUTS = ("num_dets", "det_boxes", "det_scores", "det_classes")
_TASKS = {"segment": "segmentation", "pose": "pose", "obb": "oriented-box", "classify": "classification"}


class UnsupportedModel(ValueError):
    """The model is not one the agent can decode; the message says why."""


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int | None, ...]  # None for a dynamic axis
    dtype: str  # numpy's name; "" for a type the agent does not read

    def show(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name} [{dims}] {self.dtype}"


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


def anchor_counts(height: int, width: int) -> set[int]:
    """Anchor-free heads' anchors (YOLOv8 and later) for an input size, P5 and P6 models."""
    return {sum(-(-height // s) * -(-width // s) for s in strides) for strides in STRIDES}


@dataclass(frozen=True)
class Choice:
    decoder: str
    output: str  # the output it reads (the first of efficient_nms' four)
    nms_names: tuple[str, ...] = ()  # efficient_nms: num_dets, boxes, scores, classes
    rule: str = ""
    ignored: tuple[str, ...] = ()  # outputs the decoder does not read


def _is_true(value) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _nms_shaped(outs: tuple[Tensor, ...]) -> tuple[str, ...]:
    """The four outputs in EfficientNMS order when their ranks and types fit it, else ()."""
    ints = [t for t in outs if t.dtype in ("int32", "int64")]
    floats = [t for t in outs if t.dtype.startswith("float")]
    num = [t for t in ints if len(t.shape) in (1, 2) and t.shape[-1] in (1, None)]
    cls = [t for t in ints if len(t.shape) == 2 and t not in num[:1]]
    boxes = [t for t in floats if len(t.shape) == 3 and t.shape[-1] == 4]
    scores = [t for t in floats if len(t.shape) == 2]
    if len(outs) != 4 or not (num and cls and len(boxes) == 1 and len(scores) == 1):
        return ()
    return (num[0].name, boxes[0].name, scores[0].name, cls[0].name)


def choose(info: OnnxInfo, n_labels: int, height: int, width: int) -> Choice:
    """Pick the decoder (the module's rules, in order). ``n_labels``: the labels the
    metadata names, 0 when it names none. Raises UnsupportedModel."""
    task = info.meta("task")
    if task is not None and task != "detect":
        raise UnsupportedModel(
            f"a {_TASKS.get(str(task), str(task))} model (Ultralytics metadata task={task!r}): "
            "the agent runs detection models (task 'detect') only"
        )
    outs = info.outputs
    names = NMS_OUTPUTS
    if set(names) <= {t.name for t in outs}:
        return Choice("efficient_nms", names[0], names, "outputs named like TensorRT's EfficientNMS")
    names = _nms_shaped(outs)
    if names:
        return Choice("efficient_nms", names[0], names, "four outputs shaped like TensorRT's EfficientNMS")
    masks = [t for t in outs if len(t.shape) == 4]
    if masks and task is None:  # with task=detect, an extra feature-map output is just unread
        raise UnsupportedModel(
            f"output {masks[0].show()} is an image-shaped tensor (mask prototypes: a segmentation "
            "export): the agent runs detection models only"
        )
    out = outs[0]
    ignored = tuple(t.name for t in outs[1:])
    args = info.meta("args")
    by_meta = ""
    if info.meta("head") == "RTDETRDecoder":
        by_meta, rule = "rtdetr", "metadata head=RTDETRDecoder (RT-DETR)"
    elif _is_true(info.meta("end2end")):
        by_meta, rule = "end2end", "metadata end2end=True (an end-to-end head)"
    elif isinstance(args, dict) and _is_true(args.get("nms")):
        by_meta, rule = "end2end", "metadata args nms=True (NMS in the graph)"
    if by_meta and _fits(by_meta, out.shape, n_labels):
        return Choice(by_meta, out.name, rule=rule, ignored=ignored)
    choice = _by_shape(out, outs, n_labels, height, width, ignored)
    if by_meta:  # the metadata said otherwise: say both
        rule = f"{choice.rule} ({rule}, but the output {out.show()} is not that layout)"
        return Choice(choice.decoder, choice.output, rule=rule, ignored=ignored)
    return choice


def _fits(decoder: str, shape: tuple[int | None, ...], n: int) -> bool:
    """Whether an output of ``shape`` can be the metadata's decoder's layout."""
    if len(shape) != 3:
        return False
    last = shape[2]
    if decoder == "rtdetr":
        return last is None or last == 6 or (n > 0 and last == 4 + n) or (n == 0 and last > 4)
    return last in (None, 6)


def _by_shape(out: Tensor, outs: tuple[Tensor, ...], n: int, h: int, w: int, ignored) -> Choice:
    def refuse(why: str) -> UnsupportedModel:
        seen = "; ".join(t.show() for t in outs)
        return UnsupportedModel(
            f"{why} (outputs: {seen}); the decoders known: {KNOWN_LAYOUTS}. A manifest beside the "
            "model names the decoder and labels (edge-agent models check MODEL --write-manifest)"
        )

    if len(out.shape) != 3 or (out.shape[1] is None and out.shape[2] is None):
        raise refuse(f"output {out.name!r} is not a [B, rows, columns] tensor with a fixed size")
    a, b = out.shape[1], out.shape[2]  # either may be dynamic (None): decided by the other
    v8 = anchor_counts(h, w)
    v5 = {3 * c for c in v8}
    at = f"at {w}x{h}"

    def pick(decoder: str, rule: str) -> Choice:
        dims = ", ".join("?" if d is None else str(d) for d in (a, b))
        return Choice(decoder, out.name, rule=f"shape [B, {dims}]: {rule}", ignored=ignored)

    if b in v8 and a is not None and a > 4 and (n == 0 or a == 4 + n):
        return pick("yolov8", f"{b} = the anchors of a YOLOv8-style head {at} on axis 2")
    if a in v5 and b is not None and b > 5 and (n == 0 or b == 5 + n):
        return pick("yolov5", f"{a} = the anchors of a YOLOv5 head {at} on axis 1")
    if b == 6 and a not in v8 | v5 and not (a is None and n == 1):  # [?, 6]: a 1-class YOLOv5 too
        k = "K" if a is None else a
        return pick("end2end", f"{k} rows of 6 (x1, y1, x2, y2, score, class), not an anchor count {at}")
    if n and a == 4 + n:
        return pick("yolov8", f"axis 1 = 4 + {n} labels")
    if n and b == 5 + n:
        return pick("yolov5", f"axis 2 = 5 + {n} labels")
    raise refuse(f"output {out.name!r} fits no decoder {at}" + (f" with {n} labels" if n else ""))
