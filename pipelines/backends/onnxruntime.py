"""ONNX Runtime backend: CPU by default, CUDA or TensorRT providers where installed.

Outputs are bound to preallocated numpy arrays with an IOBinding per buffer set, so a
frame's inference writes straight into its slot and allocates nothing on our side.

One exception: an output whose row count depends on the frame (an export with NMS inside
that gives one row per kept box, e.g. YOLOv7's ``--max-wh``: ``[N, 7]``, N not the batch)
has no size to bind. ONNX Runtime allocates it on each run; its rows are copied into a
slot of ``MAX_ROWS`` rows and the slot's output is the view of the rows given. Such a model
runs one frame at a time: its rows carry a batch id instead of a batch axis.

Every output is held to ``MAX_OUTPUT_ELEMENTS`` per frame once its size is known: at load
for the axes the graph or ONNX Runtime fixes (``pipelines.model.check_outputs``), here for
those only the probe run tells, before any slot is allocated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnxruntime as ort

from edge_agent.core.config import OnnxRuntimeConfig
from edge_agent.models.decoders.base import oversized
from edge_agent.models.manifest import ModelError
from edge_agent.pipelines.backends.base import BackendError, InferenceBackend, IOSet, TensorSpec

_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
}
_OPT_LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


MAX_ROWS = 1024  # rows kept of an output whose row count depends on the frame


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
        self.session: ort.InferenceSession | None = None
        self._inputs: list[TensorSpec] = []
        self._outputs: list[TensorSpec] = []
        self._rows: list[int] = []  # outputs whose first axis is a row count, not the batch
        self._path = ""

    def load(self, model_path: str, input_format: Any = None) -> None:
        c = self.config
        available = ort.get_available_providers()
        missing = [p for p in c.providers if p not in available]
        if missing:
            raise BackendError(
                f"execution provider(s) {missing} not in this onnxruntime build (available: {available})"
            )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = c.intra_op_threads
        opts.inter_op_num_threads = c.inter_op_threads
        opts.graph_optimization_level = _OPT_LEVELS[c.graph_optimization]
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
        return IOSet(inputs, outputs, binding, extra={"rows": rows} if rows else {})

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
        self.session.run_with_iobinding(io.handle)
        rows: list[_Rows] = io.extra.get("rows", ())
        if rows:
            given = io.handle.get_outputs()
            for r in rows:
                out = given[r.index].numpy()
                n = min(len(out), MAX_ROWS)
                r.slot[:n] = out[:n]
                io.outputs[r.index] = r.slot[:n]

    def describe(self) -> dict[str, Any]:
        providers = self.session.get_providers() if self.session else list(self.config.providers)
        return {"backend": self.name, "providers": providers, "onnxruntime": ort.__version__}

    def close(self) -> None:
        self.session = None
