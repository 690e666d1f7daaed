"""ONNX Runtime backend: CPU by default, CUDA or TensorRT providers where installed.

Outputs are bound to preallocated numpy arrays with an IOBinding per buffer set, so a
frame's inference writes straight into its slot and allocates nothing on our side.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnxruntime as ort

from edge_agent.core.config import OnnxRuntimeConfig
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
        self._inputs = [_spec(a) for a in self.session.get_inputs()]
        self._outputs = [_spec(a) for a in self.session.get_outputs()]

    def allocate(self, batch: int = 1) -> IOSet:
        if self.session is None:
            raise BackendError("allocate() before load()")
        binding = self.session.io_binding()
        inputs = {}
        for spec in self._inputs:
            arr = np.zeros(spec.concrete(batch), spec.dtype)
            binding.bind_input(spec.name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            inputs[spec.name] = arr
        outputs = []
        for spec, shape in zip(self._outputs, self._output_shapes(inputs, batch)):
            arr = np.zeros(shape, spec.dtype)
            binding.bind_output(spec.name, "cpu", 0, arr.dtype, arr.shape, arr.ctypes.data)
            outputs.append(arr)
        return IOSet(inputs, outputs, binding)

    def _output_shapes(self, inputs: dict[str, np.ndarray], batch: int) -> list[tuple[int, ...]]:
        try:
            return [spec.concrete(batch) for spec in self._outputs]
        except BackendError:
            # Exports with symbolic output axes: one probe run tells the real sizes.
            assert self.session is not None
            return [o.shape for o in self.session.run(None, inputs)]

    def infer(self, io: IOSet) -> None:
        assert self.session is not None
        self.session.run_with_iobinding(io.handle)

    def describe(self) -> dict[str, Any]:
        providers = self.session.get_providers() if self.session else list(self.config.providers)
        return {"backend": self.name, "providers": providers, "onnxruntime": ort.__version__}

    def close(self) -> None:
        self.session = None
