"""Helpers of the TensorRT backend that need no engine: the process's one TensorRT logger,
the device part of the engine key, the calibration fingerprint, IO-shape checks.

Kept apart from ``tensorrt.py`` so each stays small. Only ``import_tensorrt`` imports
TensorRT (and pycuda); everything else takes the modules as arguments.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.core.files import file_sha256, read_text
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_build
from edge_agent.pipelines.backends.base import BackendError

log = logging.getLogger(__name__)

DEVICE_TREE_MODEL = "/proc/device-tree/model"

_loggers: dict[int, tuple[Any, Any]] = {}
_lock = threading.Lock()


def import_tensorrt() -> tuple[Any, Any]:
    """``tensorrt`` and ``pycuda.driver``, or a BackendError saying where to get them."""
    try:
        import tensorrt as trt
    except ImportError as e:
        raise BackendError(
            f"the tensorrt backend needs TensorRT's Python bindings ({e}); on a Jetson they "
            "come with JetPack (python3-libnvinfer): create the venv with --system-site-packages"
        ) from None
    try:
        import pycuda.driver as cuda
    except ImportError as e:
        raise BackendError(
            f"the tensorrt backend needs pycuda ({e}): pip install 'edge-agent[jetson]'"
        ) from None
    return trt, cuda


def shared_logger(trt: Any) -> Any:
    """One ``trt.Logger`` per process (per ``trt`` module): TensorRT keeps the first logger it
    is given for the whole process and warns about others (NVIDIA/TensorRT#1475)."""
    with _lock:
        held = _loggers.get(id(trt))
        if held is None or held[0] is not trt:
            held = (trt, trt.Logger(trt.Logger.WARNING))
            _loggers[id(trt)] = held  # keeps ``trt`` alive, so its id is not reused
        return held[1]


def device_description(cuda: Any, dev: Any, release: str) -> str:
    """The device part of the engine key: GPU name, compute capability, SM count, board, L4T.

    Orin modules share a compute capability (sm_87) and may share a CUDA device name while
    their SM counts differ (an Orin Nano's engine must not load on an AGX): the SM count
    and the device-tree model tell them apart. Whether Orin variants report distinct names
    is unconfirmed, so both are in the key.
    """
    major, minor = dev.compute_capability()
    parts = [f"{dev.name()} sm_{major}{minor}"]
    # An old pycuda without the attribute: the key is weaker, not wrong.
    with contextlib.suppress(Exception):
        parts.append(f"{int(dev.get_attribute(cuda.device_attribute.MULTIPROCESSOR_COUNT))} SMs")
    board = read_text(DEVICE_TREE_MODEL)
    if board:
        parts.append(board)
    if release:
        parts.append(release)
    return " ".join(parts)


def calibration_fingerprint(files: Iterable[str], fmt: InputFormat, shape: tuple[int, ...]) -> str:
    """What decides INT8 scales: the images' contents and the normalisation applied to them.

    Names and sizes are not enough (an image edited in place keeps both), and the same
    images under another mean/std/scale/colour give other scales.
    """
    h = hashlib.sha256()
    norm = (fmt.height, fmt.width, fmt.layout, fmt.dtype, fmt.color, fmt.scale, fmt.mean, fmt.std)
    h.update(repr((norm, fmt.resize, fmt.interpolation, fmt.pad_value, tuple(shape))).encode())
    for f in files:
        h.update(f"\n{file_sha256(f)}".encode())
    return h.hexdigest()


def known_shape(name: str, shape: tuple[int, ...], model: str, rows: bool = False) -> tuple[int, ...]:
    """``shape``, or a BackendError naming the tensor if a dimension is data-dependent (-1).

    ``rows``: an output whose first axis is a row count the frame decides (an NMS inside the
    graph, one row per kept box), served by an output allocator (``trt_outputs``); its other
    axes must be known, a row's size being fixed.
    """
    if any(d < 0 for d in shape[1 if rows else 0 :]):
        fixed = "after its first axis (the rows)" if rows else "(an NMS inside the graph?)"
        raise BackendError(
            f"{model}: output {name!r} has a data-dependent shape {shape} {fixed}; the agent takes "
            "fixed-size outputs, or rows of a fixed size: export with EfficientNMS_TRT (fixed top-k), "
            "with one row per detection, or without NMS"
        )
    return shape


def check_preprocessed(pre: Any, out_name: str, want_shape: tuple[int, ...], want_dtype: np.dtype, trt: Any):
    """The preprocessing engine's output must be exactly the model's input buffer."""
    shape = tuple(pre.get_tensor_shape(out_name))
    dtype = np.dtype(trt.nptype(pre.get_tensor_dtype(out_name)))
    if shape != tuple(want_shape) or dtype != want_dtype:
        raise BackendError(
            f"the preprocessing engine writes {dtype} {shape}, "
            f"the model takes {want_dtype} {tuple(want_shape)}"
        )


def calibration(
    modules: tuple[Any, Any, Any],
    folder: str,
    frames: int,
    fmt: InputFormat,
    cache_path: Callable[[str], Path],
    shape: tuple[int, ...],
    dtype: str,
) -> tuple[Any, str]:
    """A factory of the INT8 calibrator, and the calibration fingerprint.

    ``modules``: (tensorrt, pycuda.driver, the CUDA context); ``folder``, ``frames``: the
    images and how many of them; ``cache_path``: the calibration cache's path for a
    fingerprint; ``shape`` and ``dtype``: the model input's own (an fp16-input model takes
    fp16 bytes whatever the manifest says).
    """
    trt, cuda, cuda_ctx = modules
    files = sorted(
        str(p) for p in Path(folder).glob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png", ".bmp")
    )[:frames]
    if not files:
        raise BackendError(f"int8 calibration: no images in {folder}")
    # Contents and normalisation: both the engine key and the calibration cache's name.
    calib_sha = calibration_fingerprint(files, fmt, shape)
    cache = cache_path(calib_sha)
    np_dtype = np.dtype(dtype)

    def batches():
        from edge_agent.pipelines.images import ImageError, read_image_file
        from edge_agent.pipelines.preprocess import Letterbox, Preprocessor

        pre = Preprocessor(fmt)
        tensor = np.zeros(shape, np.dtype(fmt.dtype))
        fed = np.zeros(shape, np_dtype) if np_dtype != tensor.dtype else tensor
        for f in files:
            try:  # a calibration folder is outside input too: capped as a source's images
                img = read_image_file(f)
            except ImageError as e:
                log.warning("int8 calibration: skipping %s", e)
                continue
            pre(img, tensor, Letterbox())  # the same letterbox as live frames
            if fed is not tensor:
                fed[...] = tensor  # the model input's own type
            yield fed

    nbytes = int(np.prod(shape)) * np_dtype.itemsize

    def make() -> Any:
        # Called with the context current: the calibrator allocates its buffer there.
        return trt_build.make_calibrator(trt, cuda, batches, cache, nbytes, cuda_ctx)

    return make, calib_sha


def no_device_preprocessing(fmt: InputFormat, settings: Any, spec: Any, batch: tuple[int, bool]) -> str:
    """Why the device preprocessing engine cannot serve this model ("" if it can).

    ``spec``: the model engine's input (a TensorSpec); ``batch``: (largest batch, fixed).
    """
    if fmt.layout != "NCHW":
        return "the model takes float NHWC input (the device network writes NCHW)"
    if batch[1] and batch[0] > 1:
        # Its outputs would be sized for the one frame it takes while the model writes
        # all of its fixed batch into them: past the end of the buffers.
        return f"the model takes a fixed batch of {batch[0]}, the preprocessing engine one frame"
    if spec.shape[1:] != (3, fmt.height, fmt.width) or spec.dtype.kind != "f":
        says = f"{fmt.dtype} 3x{fmt.height}x{fmt.width}"
        return f"the model takes {spec.dtype} {spec.shape}, the manifest says {says}"
    if settings.dla_core >= 0 and not settings.gpu_fallback:
        # Would fail to build on every start: the DLA has no uint8 tensors.
        return "the uint8 → fp16 cast cannot run on the DLA and gpu_fallback is off"
    return ""


def bind(context: Any, name: str, address: int) -> None:
    # False: TensorRT refused the address (unknown name, misaligned); enqueueing anyway
    # would run with the previous slot's buffer.
    if not context.set_tensor_address(name, address):
        raise BackendError(f"TensorRT refused the address {address:#x} for tensor {name!r}")


def sized(shape: tuple[int, ...], batch: int) -> tuple[int, ...]:
    """``shape`` with its leading (batch) axis set to ``batch``."""
    return (batch, *shape[1:])


def ones(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if d < 0 else d for d in shape)
