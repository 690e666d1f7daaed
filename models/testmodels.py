"""Small real ONNX models built with onnx.helper, for tests and load benchmarks.

They run in real ONNX Runtime sessions. A "load model" reports fixed boxes but costs real
compute, set by its input size and width, so latency behaviour (overload, the deadline
ladder) can be measured without a trained network of that size. Needs the ``onnx``
package (the ``test`` extra); the agent itself never imports this module.

    python -m edge_agent.models.testmodels --size 640 --channels 16 --out /tmp/load640
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def constant_detector(
    path: str,
    output: np.ndarray,
    height: int = 320,
    width: int = 320,
    layout: str = "NHWC",
    dtype: int = TensorProto.UINT8,
    input_name: str = "images",
    output_name: str = "output0",
    metadata: dict[str, str] | None = None,
    conv_channels: int = 0,
    batch: int | None = None,
) -> str:
    """A model whose output is ``output`` (its batch axis dynamic, or fixed at ``batch``)
    whatever the image.

    ``conv_channels`` > 0 adds a 3x3 convolution stack over the image whose result is
    multiplied by zero and added, so the output stays exact while the model costs real
    compute (a deliberately slow model, its cost set by its size).
    """
    b = batch or "batch"
    in_shape = [b, height, width, 3] if layout == "NHWC" else [b, 3, height, width]
    x = helper.make_tensor_value_info(input_name, dtype, in_shape)
    y = helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [b, *output.shape[1:]])
    const = numpy_helper.from_array(output[:1].astype(np.float32), "const")
    nodes = [helper.make_node("Cast", [input_name], ["xf"], to=TensorProto.FLOAT)]
    inits = [const, numpy_helper.from_array(np.array([0.0], np.float32), "zero")]
    src = "xf"
    if layout == "NHWC":
        nodes.append(helper.make_node("Transpose", ["xf"], ["xt"], perm=[0, 3, 1, 2]))
        src = "xt"
    if conv_channels:
        rng = np.random.default_rng(0)
        c_in = 3
        for i in range(4):
            w = rng.normal(0, 0.1, (conv_channels, c_in, 3, 3)).astype(np.float32)
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("Conv", [src, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
            src, c_in = f"c{i}", conv_channels
    nodes += [
        helper.make_node("ReduceMean", [src], ["m"], keepdims=0),
        helper.make_node("Mul", ["m", "zero"], ["z"]),
        helper.make_node("Add", ["const", "z"], ["one"]),
        # Expand the constant over the input's batch axis.
        helper.make_node("Shape", [input_name], ["s"], start=0, end=1),
        helper.make_node("Concat", ["s", "tail"], ["shape"], axis=0),
        helper.make_node("Expand", ["one", "shape"], [output_name]),
    ]
    inits.append(numpy_helper.from_array(np.array(output.shape[1:], np.int64), "tail"))
    return _save(helper.make_graph(nodes, "test-detector", [x], [y], inits), path, metadata)


def brightness_detector(
    path: str,
    outputs: dict[str, tuple[np.ndarray, np.ndarray, int]],
    height: int = 320,
    width: int = 320,
    metadata: dict[str, str] | None = None,
    batch: int | None = None,
) -> str:
    """A float32 NCHW model (an Ultralytics export's input) whose every output is
    ``base + m × slope``, cast to its ONNX type, where ``m`` is the mean of the input image
    (0..1): different frames give different, exactly known outputs, so a batch mix-up shows.

    ``outputs``: name → (base, slope, ONNX element type); base and slope have a leading axis
    of 1 that becomes the (dynamic, or fixed ``batch``) batch axis.
    """
    b = batch or "batch"
    x = helper.make_tensor_value_info("images", TensorProto.FLOAT, [b, 3, height, width])
    nodes = [helper.make_node("ReduceMean", ["images"], ["m"], axes=[1, 2, 3], keepdims=1)]  # [B,1,1,1]
    inits, outs = [], []
    for name, (base, slope, elem) in outputs.items():
        rank = base.ndim
        inits += [
            numpy_helper.from_array(base.astype(np.float32), f"{name}_base"),
            numpy_helper.from_array(slope.astype(np.float32), f"{name}_slope"),
            numpy_helper.from_array(np.array([-1] + [1] * (rank - 1), np.int64), f"{name}_shape"),
        ]
        nodes += [
            helper.make_node("Reshape", ["m", f"{name}_shape"], [f"{name}_m"]),  # [B, 1, ...]
            helper.make_node("Mul", [f"{name}_m", f"{name}_slope"], [f"{name}_ms"]),
            helper.make_node("Add", [f"{name}_ms", f"{name}_base"], [f"{name}_f"]),
            helper.make_node("Cast", [f"{name}_f"], [name], to=elem),
        ]
        outs.append(helper.make_tensor_value_info(name, elem, [b, *base.shape[1:]]))
    return _save(helper.make_graph(nodes, "brightness-detector", [x], outs, inits), path, metadata)


def _save(graph, path: str, metadata: dict[str, str] | None) -> str:
    """Check and write ``graph`` as an opset-17 model with ``metadata`` (as exporters write it)."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every ONNX Runtime since 1.10 reads
    for k, v in (metadata or {}).items():
        model.metadata_props.append(onnx.StringStringEntryProto(key=k, value=v))
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def efficient_nms_plugin_graph(path: Path, k: int = 10) -> Path:
    """An ONNX holding TensorRT's EfficientNMS_TRT plugin, as YOLOv7's ``--end2end`` writes
    it (with its manifest beside it): ONNX Runtime cannot load it; TensorRT's parser can,
    once the plugins are registered."""
    f, i32 = TensorProto.FLOAT, TensorProto.INT32
    x = helper.make_tensor_value_info("images", f, [1, 3, 32, 32])
    outs = [
        helper.make_tensor_value_info("num_dets", i32, [1, 1]),
        helper.make_tensor_value_info("det_boxes", f, [1, k, 4]),
        helper.make_tensor_value_info("det_scores", f, [1, k]),
        helper.make_tensor_value_info("det_classes", i32, [1, k]),
    ]
    node = helper.make_node(
        "EfficientNMS_TRT", ["images"], [o.name for o in outs], domain="TRT", score_threshold=0.25
    )
    graph = helper.make_graph([node], "plugin", [x], outs)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("TRT", 1)]
    )
    model.ir_version = 8
    onnx.save(model, str(path))
    path.with_suffix(".yaml").write_text(
        "name: p\ninput: {height: 32, width: 32}\noutput: {decoder: efficient_nms}\nlabels: [a, b, c, d]\n"
    )
    return path


def yolov8_output(
    boxes_cxcywh: list[tuple[float, float, float, float]],
    classes: list[int],
    scores: list[float],
    num_classes: int,
    anchors: int,
) -> np.ndarray:
    """A [1, 4 + C, N] tensor with the given boxes in its first anchors, zeros elsewhere."""
    out = np.zeros((1, 4 + num_classes, anchors), np.float32)
    for i, (box, c, s) in enumerate(zip(boxes_cxcywh, classes, scores)):
        out[0, :4, i] = box
        out[0, 4 + c, i] = s
    return out


def yolov5_output(
    boxes_cxcywh: list[tuple[float, float, float, float]],
    classes: list[int],
    obj: list[float],
    cls_prob: list[float],
    num_classes: int,
    anchors: int,
) -> np.ndarray:
    """A [1, N, 5 + C] tensor: box, objectness, class probabilities per anchor."""
    out = np.zeros((1, anchors, 5 + num_classes), np.float32)
    for i, (box, c, o, p) in enumerate(zip(boxes_cxcywh, classes, obj, cls_prob)):
        out[0, i, :4] = box
        out[0, i, 4] = o
        out[0, i, 5 + c] = p
    return out


LOAD_LABELS = ("circle", "square", "triangle", "cross")


def write_load_model(out_dir: str, size: int, channels: int) -> Path:
    """A load model with a manifest in ``out_dir``: uint8 NHWC BGR input of ``size``².

    Its output has the bundled detector's layout (4 labels, strides 8 and 16) with one box
    in the middle of the input.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    anchors = (size // 8) ** 2 + (size // 16) ** 2
    c = size / 2
    out = yolov8_output([(c, c, size / 8, size / 8)], [0], [0.9], len(LOAD_LABELS), anchors)
    constant_detector(str(d / "model.onnx"), out, height=size, width=size, conv_channels=channels)
    (d / "manifest.yaml").write_text(
        f"name: load-{size}-c{channels}\n"
        f"description: load model (fixed output, {channels}-channel 3x3 conv stack at {size}x{size})\n"
        f"input: {{name: images, height: {size}, width: {size}, layout: NHWC, dtype: uint8, color: bgr}}\n"
        "output: {name: output0, decoder: yolov8}\n"
        f"labels: [{', '.join(LOAD_LABELS)}]\n"
    )
    return d / "model.onnx"


def float_nchw_detector(out_dir: str) -> Path:
    """The bundled detector as Ultralytics exports models: float32 RGB in 0..1, NCHW.

    Its uint8 prologue (Transpose, Cast, Mul by the scale) is cut off and the first
    convolution's input channels are reordered and rescaled to match, so the model detects
    exactly what the bundled one does, through the input format users' models have.
    """
    from edge_agent.models.manifest import bundled_model_path

    model = onnx.load(bundled_model_path())
    g = model.graph
    ops = [n.op_type for n in g.node[:5]]
    if ops != ["Transpose", "Cast", "Constant", "Mul", "Conv"]:
        raise ValueError(f"unexpected bundled prologue {ops}")
    scale = float(numpy_helper.to_array(g.node[2].attribute[0].t))
    conv = g.node[4]
    weight = next(i for i in g.initializer if i.name == conv.input[1])
    w = numpy_helper.to_array(weight)
    # conv(W, bgr * scale) == conv(W[:, ::-1] * 255 * scale, rgb / 255)
    weight.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(w[:, ::-1] * (255.0 * scale)), weight.name))
    name = g.input[0].name
    conv.input[0] = name
    for _ in range(4):
        g.node.remove(g.node[0])
    g.input[0].CopyFrom(helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 3, 320, 320]))
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    onnx.checker.check_model(model)
    onnx.save(model, str(d / "model.onnx"))
    bundled = (Path(bundled_model_path()).parent / "manifest.yaml").read_text()
    (d / "manifest.yaml").write_text(
        bundled.replace("layout: NHWC", "layout: NCHW")
        .replace("dtype: uint8", "dtype: float32")
        .replace("color: bgr", "color: rgb")
    )
    return d / "model.onnx"


def main() -> None:
    p = argparse.ArgumentParser(description="write a load model (fixed output, real compute)")
    p.add_argument("--size", type=int, default=640, help="square input size")
    p.add_argument("--channels", type=int, default=16, help="width of the conv stack (cost grows ~ squared)")
    p.add_argument("--out", required=True, help="output folder (model.onnx + manifest.yaml)")
    a = p.parse_args()
    print(write_load_model(a.out, a.size, a.channels))


if __name__ == "__main__":
    main()
