"""The one interface every inference backend implements.

A backend owns the model session. The pipeline asks it for one set of preallocated IO
buffers per frame slot (``allocate``) and then calls ``infer`` on a slot's set; the
backend writes outputs into those arrays, so nothing is allocated per frame. Backends
that run on an accelerator keep per-set streams and device buffers in ``IOSet.handle``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.models.manifest import InputFormat

_NO_TIMINGS: dict[str, float] = {}
_NO_COUNTS: dict[str, int] = {}

#: Rows a backend keeps per frame of an output whose row count depends on the frame (an
#: export with NMS inside that gives one row per kept box); the rows past it are dropped and
#: counted (``counts``: ``rows_dropped``).
MAX_ROWS = 1024


def device_format(fmt: InputFormat) -> InputFormat:
    """What the host writes when the device normalises (TensorRT's device preprocessing,
    the emulated accelerator): letterboxed uint8 BGR, NHWC; a model taking uint8 already
    takes its own."""
    if fmt.dtype == "uint8":
        return fmt
    return InputFormat(
        height=fmt.height,
        width=fmt.width,
        layout="NHWC",
        dtype="uint8",
        color="bgr",
        pad_value=fmt.pad_value,
        resize=fmt.resize,
        interpolation=fmt.interpolation,
    )


class BackendError(RuntimeError):
    """The backend cannot load or run the model; the message says which file and why."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int | None, ...]  # None for a dynamic axis
    dtype: np.dtype

    def concrete(self, batch: int = 1) -> tuple[int, ...]:
        """The shape with a dynamic leading (batch) axis set to ``batch``.

        Raises BackendError when another axis is dynamic: the pipeline needs fixed sizes.
        """
        dims = list(self.shape)
        if dims and dims[0] is None:
            dims[0] = batch
        if any(d is None for d in dims):
            raise BackendError(
                f"tensor {self.name!r} has dynamic axes {self.shape}: export it with a fixed size"
            )
        return tuple(int(d) for d in dims)


@dataclass
class IOSet:
    """One preallocated set of model inputs and outputs (one per frame slot)."""

    inputs: dict[str, np.ndarray]
    outputs: list[np.ndarray]
    handle: Any = None  # backend-specific binding (ORT IOBinding, TensorRT stream, ...)
    extra: dict[str, Any] = field(default_factory=dict)


class InferenceBackend(ABC):
    """load → allocate (per slot) → warmup → infer (per frame) → close."""

    name: str = "backend"
    #: Inference runs on an accelerator, the host only waiting for it: the inference thread
    #: then hands every frame to the post thread and starts the next batch at once, instead
    #: of postprocessing a frame itself while the device idles (``stages.InferStage``).
    off_cpu: bool = False

    @abstractmethod
    def load(self, model_path: str, input_format: InputFormat | None = None) -> None:
        """Open the model. Raises BackendError naming the file on failure.

        ``input_format`` is the manifest's input format; a backend that moves
        normalisation onto the device needs it, and says so through ``host_format``.
        """

    def host_format(self, fmt: InputFormat) -> InputFormat:
        """The format the host must write frames in (default: the model's own)."""
        return fmt

    # Set by ``load``: the tensors the host writes and reads.
    _inputs: list[TensorSpec] = []  # noqa: RUF012 - replaced per instance in load()
    _outputs: list[TensorSpec] = []  # noqa: RUF012

    @property
    def inputs(self) -> list[TensorSpec]:
        return self._inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self._outputs

    @abstractmethod
    def allocate(self, batch: int = 1) -> IOSet:
        """A new set of input and output buffers bound to this backend, for ``batch`` frames
        (a model with a fixed batch axis always gets buffers of its own batch size)."""

    def batch_axis(self) -> tuple[int, bool]:
        """(largest batch, fixed): ``fixed`` when the model only runs its own batch size, so a
        smaller batch is padded up to it; (0, False) when any size runs (a dynamic axis)."""
        first = self.inputs[0].shape[0] if self.inputs and self.inputs[0].shape else 1
        return (0, False) if first is None else (int(first), True)

    @abstractmethod
    def infer(self, io: IOSet) -> None:
        """Run the model on ``io.inputs`` and write ``io.outputs`` in place."""

    def infer_slots(self, ios: list[IOSet]) -> bool:
        """Run a batch of frames straight from their own sets, writing each one's outputs
        there: True when this backend can (no batch set, no copies: the emulated one);
        False (the default), and the pipeline copies the frames through a batch set."""
        return False

    def upload(self, io: IOSet) -> None:  # noqa: B027 - host-memory backends need nothing
        """Capture thread, after preprocessing: start moving the input to the device.

        Runs on the capture thread so the copy of frame N+1 overlaps inference of frame N.
        """

    def timings(self, io: IOSet) -> dict[str, float]:
        """Milliseconds the backend measured inside the last ``infer`` on ``io`` (e.g. CUDA events)."""
        return _NO_TIMINGS

    def counts(self, io: IOSet) -> dict[str, int]:
        """What the backend counted in the last ``infer`` on ``io``, by name: ``rows_dropped``,
        the rows of a frame past ``MAX_ROWS`` in an output whose row count depends on the
        frame (only for models that have one: their ``infer`` leaves it in ``io.extra``).
        Nothing is made per frame for a model without one."""
        dropped = io.extra.get("rows_dropped")
        return _NO_COUNTS if dropped is None else {"rows_dropped": dropped}

    def prepare(self, io: IOSet) -> None:  # noqa: B027 - most backends need nothing
        """Before frames, for every buffer set, at a time inference may run (``prepare_profiles``
        with ``warm``; may come more than once): a backend with work to do per set does it
        here (TensorRT captures the set's CUDA graphs)."""

    def warmup(self, io: IOSet, runs: int = 3) -> None:
        # The first runs pay for lazy initialisation (memory arenas, kernel selection);
        # doing them before the first frame keeps that cost out of frame latencies.
        for _ in range(runs):
            self.infer(io)

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name}

    def close(self) -> None:  # noqa: B027 - optional for backends holding nothing
        pass
