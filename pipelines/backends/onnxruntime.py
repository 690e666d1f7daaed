"""ONNX Runtime backend: CPU by default, CUDA or TensorRT providers where installed.

Outputs are bound to preallocated numpy arrays with an IOBinding per buffer set, so a
frame's inference writes straight into its slot and allocates nothing on our side.

One exception: an output whose row count depends on the frame (an export with NMS inside
that gives one row per kept box, e.g. YOLOv7's ``--max-wh``: ``[N, 7]``, N not the batch)
has no size to bind. ONNX Runtime allocates it on each run; its first ``MAX_ROWS`` rows are
copied into a slot of that many rows and the slot's output is the view of the rows kept.
The rows past ``MAX_ROWS`` are dropped and counted: ``counts(io)["rows_dropped"]`` for the
frame, ``describe()["rows_dropped"]`` since load. Such a model runs one frame at a time:
its rows carry a batch id instead of a batch axis.

Every output is held to ``MAX_OUTPUT_ELEMENTS`` per frame once its size is known: at load
for the axes the graph or ONNX Runtime fixes (``pipelines.model.check_outputs``), here for
those only the probe run tells, before any slot is allocated.

``onnxruntime`` itself is imported by ``load``: the backend registry imports this module
with every backend's, and a TensorRT-only device need not load ONNX Runtime's library.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core.model_config import OnnxRuntimeConfig
from edge_agent.models.decoders.base import oversized
from edge_agent.models.manifest import ModelError
from edge_agent.pipelines.backends.base import MAX_ROWS, BackendError, InferenceBackend, IOSet, TensorSpec

log = logging.getLogger(__name__)

_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}
_OPT_LEVELS = {  # names in ort.GraphOptimizationLevel
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}


def import_onnxruntime() -> Any:
    """The ``onnxruntime`` module, or a BackendError saying how to get it."""
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendError(
            f"the onnxruntime backend needs the onnxruntime package ({e}): pip install onnxruntime"
        ) from None
    return onnxruntime


@dataclass
class _Rows:
    """An output with a row count per frame: its slot and the rows last given."""

    index: int  # in the backend's outputs
    name: str
    slot: np.ndarray  # (MAX_ROWS, ...)


def _row_shape(spec: TensorSpec) -> tuple[int, ...]:
    """One row of an output with a row count per frame (BackendError: a row's size is dynamic)."""
    return TensorSpec(spec.name, (1, *spec.shape[1:]), spec.dtype).concrete()


def _spec(arg: Any) -> TensorSpec:
    if arg.type not in _DTYPES:
        raise BackendError(f"tensor {arg.name!r} has unsupported type {arg.type}")
    shape = tuple(d if isinstance(d, int) and d > 0 else None for d in arg.shape)
    return TensorSpec(arg.name, shape, np.dtype(_DTYPES[arg.type]))


class OnnxRuntimeBackend(InferenceBackend):
    name = "onnxruntime"

    def __init__(self, config: OnnxRuntimeConfig) -> None:
        self.config = config
        self.ort: Any = None  # the onnxruntime module, imported by load
        self.session: Any = None  # ort.InferenceSession
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._rows: list[int] = []  # outputs whose first axis is a row count, not the batch
        self._path = ""
        self.rows_dropped = 0  # rows past MAX_ROWS in row outputs, since load

    def load(self, model_path: str, input_format: Any = None) -> None:
        c = self.config
        self.ort = ort = import_onnxruntime()
        available = ort.get_available_providers()
        missing = [p for p in c.providers if p not in available]
        if missing:
            raise BackendError(
                f"execution provider(s) {missing} not in this onnxruntime build (available: {available})"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = c.intra_op_threads
        opts.inter_op_num_threads = c.inter_op_threads
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _OPT_LEVELS[c.graph_optimization])
        opts.execution_mode = (
            ort.ExecutionMode.ORT_PARALLEL
            if c.execution_mode == "parallel"
            else ort.ExecutionMode.ORT_SEQUENTIAL
        )
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if c.allow_spinning else "0")
        opts.add_session_config_entry("session.inter_op.allow_spinning", "1" if c.allow_spinning else "0")
        opts.log_severity_level = 3
        if not os.path.isfile(model_path):
            raise BackendError(f"model file not found: {model_path}")
        self._path = model_path
        try:
            self.session = ort.InferenceSession(model_path, sess_options=opts, providers=list(c.providers))
        except Exception as e:  # ORT raises Fail/InvalidGraph/... for unreadable models
            hint = ""
            if "EfficientNMS_TRT" in str(e):
                hint = (
                    " (the graph holds TensorRT's EfficientNMS_TRT plugin, which only the tensorrt "
                    "backend runs: for ONNX Runtime, export the model without it)"
                )
            raise BackendError(f"cannot load model {model_path}: {e}{hint}") from None
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        self._inputs = [_spec(a) for a in inputs]
        self._outputs = [_spec(a) for a in outputs]
        # Rows per frame: a 2-D output ([N, K]) whose first axis is dynamic while the input's
        # batch is fixed (a dynamic first axis of any other output is the batch, whatever
        # its name: exporters name unknown axes each their own way).
        fixed_batch = bool(inputs) and bool(inputs[0].shape) and isinstance(inputs[0].shape[0], int)
        self._rows = [
            i
            for i, spec in enumerate(self._outputs)
            if fixed_batch and len(spec.shape) == 2 and spec.shape[0] is None and spec.shape[1] is not None
        ]

    def batch_axis(self) -> tuple[int, bool]:
        if self._rows:
            return (1, True)  # rows of every frame in one tensor: one frame at a time
        return super().batch_axis()

    def allocate(self, batch: int = 1) -> IOSet:
        if self.session is None:
            raise BackendError("allocate() before load()")
        binding = self.session.io_binding()
        inputs = {}
        for spec in self._inputs:
            arr = np.zeros(spec.concrete(batch), spec.dtype)
            binding.bind_input(spec.name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            inputs[spec.name] = arr
        outputs, rows = [], []
        for i, (spec, shape) in enumerate(zip(self._outputs, self._output_shapes(inputs, batch))):
            if i in self._rows:
                slot = np.zeros((MAX_ROWS, *shape[1:]), spec.dtype)
                binding.bind_output(spec.name, "cpu")  # ORT allocates it on each run
                rows.append(_Rows(i, spec.name, slot))
                outputs.append(slot[:0])
                continue
            arr = np.zeros(shape, spec.dtype)
            binding.bind_output(spec.name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            outputs.append(arr)
        return IOSet(inputs, outputs, binding, extra={"rows": rows, "rows_dropped": 0} if rows else {})

    def _output_shapes(self, inputs: dict[str, np.ndarray], batch: int) -> list[tuple[int, ...]]:
        """The outputs' shapes for ``batch`` frames (a row output's: one row); ModelError for
        one past ``MAX_OUTPUT_ELEMENTS`` per frame, its rows' slot counted whole."""
        try:
            shapes = [
                _row_shape(spec) if i in self._rows else spec.concrete(batch)
                for i, spec in enumerate(self._outputs)
            ]
        except BackendError:
            # Exports with symbolic output axes: one probe run tells the real sizes (its
            # outputs are ONNX Runtime's, given back at once; the slots are not made).
            assert self.session is not None
            shapes = [o.shape for o in self.session.run(None, inputs)]
        for i, (spec, shape) in enumerate(zip(self._outputs, shapes)):
            # A row output's slot holds MAX_ROWS rows of one frame.
            why = oversized(spec.name, (1, MAX_ROWS, *shape[1:]) if i in self._rows else shape)
            if why:
                raise ModelError(f"{self._path}: {why}")
        return shapes

    def infer(self, io: IOSet) -> None:
        assert self.session is not None
        rows: list[_Rows] = io.extra.get("rows", ())
        for r in rows:
            # Unallocated again: the binding keeps the last run's value, whose row count a
            # run with another count refuses ("the computed output shape for this run is ...").
            io.handle.bind_output(r.name, "cpu")
        self.session.run_with_iobinding(io.handle)
        if rows:
            given = io.handle.get_outputs()
            dropped = 0
            for r in rows:
                out = given[r.index].numpy()
                n = min(len(out), MAX_ROWS)
                r.slot[:n] = out[:n]
                io.outputs[r.index] = r.slot[:n]
                dropped += len(out) - n
            io.extra["rows_dropped"] = dropped
            if dropped:
                self._dropped(dropped)

    def _dropped(self, n: int) -> None:
        if not self.rows_dropped:
            log.warning(
                "onnxruntime: %s: a frame gave more than %d rows in an output whose row count depends "
                "on the frame; the rows past them are dropped (counted as rows_dropped)",
                self._path,
                MAX_ROWS,
            )
        self.rows_dropped += n

    def describe(self) -> dict[str, Any]:
        providers = self.session.get_providers() if self.session else list(self.config.providers)
        d = {
            "backend": self.name,
            "providers": providers,
            "onnxruntime": getattr(self.ort, "__version__", ""),
        }
        if self._rows:
            d["rows_dropped"] = self.rows_dropped
        return d

    def close(self) -> None:
        self.session = None


BACKENDS = (("onnxruntime", OnnxRuntimeBackend),)  # what this module adds (the registry collects it)
