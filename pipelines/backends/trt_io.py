"""The model engine's IO tensors as the pipeline sees them, read from an execution context.

The pipeline feeds one input. A dynamic input axis is set first (the shape the engine was
built for): output shapes resolve from the input's. An output whose first axis is still -1
then has a row count the frame decides (an NMS inside the graph, one row per kept box),
served by an output allocator (``trt_outputs``): each row of a fixed size, at most
``MAX_ROWS`` of them per frame, one frame at a time (the rows carry no batch axis). Any other
-1 is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.pipelines.backends import trt_outputs
from edge_agent.pipelines.backends.base import BackendError, TensorSpec
from edge_agent.pipelines.backends.trt_support import known_shape, ones, sized


@dataclass
class EngineIO:
    """What ``read_io`` found, and what it decided."""

    model_input: str  # the engine's input tensor
    input: TensorSpec  # its shape as set
    outputs: list[TensorSpec]  # a row output's first axis None
    rows: list[int]  # the outputs whose row count depends on the frame
    batch: tuple[int, bool]  # (largest, fixed): (1, True) with row outputs
    notes: list[str] = field(default_factory=list)


def read_io(
    trt: Any, engine: Any, context: Any, shape: tuple[int, ...] | None, batch: tuple[int, bool], model: str
) -> EngineIO:
    """The IO of ``engine`` through ``context`` (left with the input shape set): ``shape``
    is the input shape it was built for (None: ones for its dynamic axes), ``batch`` its
    (largest batch, fixed), ``model`` the file for messages."""
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    if len(inputs) != 1:
        raise BackendError(f"{model}: the pipeline feeds one input, the engine has {inputs}")
    name = inputs[0]
    declared = tuple(engine.get_tensor_shape(name))
    dynamic = any(d < 0 for d in declared)
    if dynamic:
        _set_input(context, name, shape or ones(declared), model)

    def spec(tensor: str, output: bool) -> TensorSpec:
        dims = tuple(context.get_tensor_shape(tensor))
        rows = output and bool(dims) and dims[0] < 0
        known = known_shape(tensor, dims, model, rows=rows)
        found: tuple[int | None, ...] = (None, *known[1:]) if rows else known
        return TensorSpec(tensor, found, np.dtype(trt.nptype(engine.get_tensor_dtype(tensor))))

    specs = [spec(n, True) for n in outputs]
    rows = [i for i, s in enumerate(specs) if s.shape and s.shape[0] is None]
    notes: list[str] = []
    if rows:
        first = specs[rows[0]].name
        trt_outputs.check_sizes(specs, rows, model)
        largest, fixed = batch
        if largest > 1 and (fixed or not dynamic):
            raise BackendError(
                f"{model}: output {first!r} has a row per detection and no batch axis, and the engine "
                f"takes a fixed batch of {largest}: export with batch 1 or set max_batch: 1"
            )
        if largest > 1:  # a batch profile: run it at 1
            _set_input(context, name, sized(shape or ones(declared), 1), model)
            specs = [spec(n, True) for n in outputs]
            notes.append(f"batch 1: output {first!r} has a row per detection, not a batch axis")
        batch = (1, True)
    return EngineIO(name, spec(name, False), specs, rows, batch, notes)


def _set_input(context: Any, name: str, shape: tuple[int, ...], model: str) -> None:
    if not context.set_input_shape(name, shape):
        raise BackendError(f"{model}: the engine refused input shape {shape}")
