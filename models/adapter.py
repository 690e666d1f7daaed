"""Input adapter: a copy of a float NCHW model that takes the letterboxed uint8 BGR frame.

Ultralytics exports take float32 RGB in 0..1, NCHW. Converting a 640x640 frame to that on
the CPU costs more than all the rest of the host's work per frame. The convolution that
reads the input is linear in it, so the colour swap (a permutation of its input channels)
and the 1/255 scale (a factor on its weights) fold into its weights exactly, up to float
rounding. What remains is the layout: Transpose (on uint8, NHWC -> NCHW) and Cast, which
ONNX Runtime runs for no measurable cost in front of a 640 model. The frame's
preprocessing is then the letterbox copy alone, as for the bundled detector.

A mean subtraction is not folded: the convolution's zero padding would then differ at
the borders. Such models keep the numpy path, as does any graph whose input feeds more
than one node or anything but a Conv with constant weights.

The adapted copy is written once into the cache folder, keyed by the model's hash, the
input format and this module's version; the original file is never modified.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np

from edge_agent.core.files import atomic_write, file_sha256
from edge_agent.models.manifest import InputFormat

log = logging.getLogger(__name__)

VERSION = 1  # bump when the rewrite changes: old copies are then not reused


class NotAdaptable(Exception):
    """The model cannot take the adapter; the message says why (it then runs unchanged)."""


def host_format(fmt: InputFormat) -> InputFormat:
    """What the host writes for an adapted model: the letterboxed frame as captured."""
    return replace(fmt, layout="NHWC", dtype="uint8", color="bgr", scale=1.0, mean=(0.0,) * 3, std=(1.0,) * 3)


def check_format(fmt: InputFormat) -> None:
    """Raise NotAdaptable unless the format is one the adapter folds exactly."""
    if fmt.layout != "NCHW" or fmt.dtype not in ("float32", "float16"):
        raise NotAdaptable(f"the input is {fmt.layout} {fmt.dtype}, not float NCHW")
    if any(m != 0.0 for m in fmt.mean):
        raise NotAdaptable("the input subtracts a mean (not exact to fold at padded borders)")


def cache_path(path: str, fmt: InputFormat, cache_dir: str) -> Path:
    key = f"{file_sha256(path)[:16]}-{fmt.color}-{fmt.scale:.9g}-{'-'.join(f'{s:.9g}' for s in fmt.std)}"
    return Path(cache_dir).expanduser() / f"{Path(path).stem}-{key}-adapter{VERSION}.onnx"


def adapt(path: str, fmt: InputFormat, cache_dir: str, input_name: str = "") -> str:
    """Return the path of the adapted copy of ``path``, writing it if missing.

    Raises NotAdaptable (the format or graph does not allow it) or OSError (the cache).
    """
    check_format(fmt)
    out = cache_path(path, fmt, cache_dir)
    if out.is_file():
        return str(out)
    try:
        import onnx
    except ImportError:
        raise NotAdaptable("the onnx package is not installed") from None
    model = onnx.load(path)
    rewrite(model, fmt, input_name)
    atomic_write(out, model.SerializeToString())  # whole or not at all, never through a symlink
    log.info("input adapter: wrote %s (from %s)", out, path)
    return str(out)


def rewrite(model, fmt: InputFormat, input_name: str = "") -> None:
    """Rewrite ``model`` (an onnx ModelProto) in place to take uint8 NHWC BGR frames."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in inits]
    inp = next((i for i in inputs if i.name == input_name), None) if input_name else inputs[0]
    if inp is None:
        raise NotAdaptable(f"no input named {input_name!r}")
    readers = [n for n in graph.node if inp.name in n.input]
    if len(readers) != 1 or readers[0].op_type != "Conv" or readers[0].input[0] != inp.name:
        ops = [n.op_type for n in readers]
        raise NotAdaptable(f"input {inp.name!r} feeds {ops}, not one convolution")
    conv = readers[0]
    group = next((a.i for a in conv.attribute if a.name == "group"), 1)
    weight = inits.get(conv.input[1])
    if weight is None or group != 1:
        raise NotAdaptable("the first convolution's weights are not a constant (or it is grouped)")
    if sum(conv.input[1] in n.input for n in graph.node) != 1:
        raise NotAdaptable("the first convolution's weights are shared with another node")
    w = numpy_helper.to_array(weight)
    if w.ndim != 4 or w.shape[1] != 3:
        raise NotAdaptable(f"the first convolution takes {w.shape[1] if w.ndim > 1 else '?'} channels, not 3")

    # Model channel c reads pixel * scale / std[c]; fold that factor into its weights, then
    # order the input channels as the frame has them (BGR).
    mul = np.float32(fmt.scale) / np.asarray(fmt.std, np.float32)
    folded = w.astype(np.float32) * mul[None, :, None, None]
    if fmt.color == "rgb":
        folded = folded[:, ::-1]
    weight.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(folded.astype(w.dtype)), weight.name))

    dims = inp.type.tensor_type.shape.dim
    batch = dims[0].dim_value if dims and dims[0].HasField("dim_value") else dims[0].dim_param or "batch"
    elem = inp.type.tensor_type.elem_type
    nhwc, nchw = f"{inp.name}__adapter_nchw_u8", f"{inp.name}__adapter_nchw"
    conv.input[0] = nchw
    graph.node.insert(0, helper.make_node("Cast", [nhwc], [nchw], to=elem, name="adapter_cast"))
    to_nchw = helper.make_node("Transpose", [inp.name], [nhwc], perm=[0, 3, 1, 2], name="adapter_nchw")
    graph.node.insert(0, to_nchw)
    new = helper.make_tensor_value_info(inp.name, TensorProto.UINT8, [batch, fmt.height, fmt.width, 3])
    inp.CopyFrom(new)
    model.doc_string = (model.doc_string + "\n" if model.doc_string else "") + (
        f"edge-agent input adapter v{VERSION}: uint8 NHWC BGR input, colour order and 1/255 folded "
        "into the first convolution"
    )


def try_adapt(path: str, fmt: InputFormat, cache_dir: str, input_name: str = "") -> str:
    """The adapted copy's path, or "" when the model runs unchanged (the reason is logged)."""
    try:
        return adapt(path, fmt, cache_dir, input_name)
    except NotAdaptable as e:
        if fmt.layout == "NCHW":  # a uint8 NHWC model needs no adapter: nothing to say
            log.info("input adapter: %s runs unchanged: %s", path, e)
    except OSError as e:
        log.warning("input adapter: cannot write into %s (%s); %s runs unchanged", cache_dir, e, path)
    except Exception as e:  # a graph the rewrite does not expect must not stop the agent
        log.warning("input adapter: %s runs unchanged: %s: %s", path, type(e).__name__, e)
    return ""
