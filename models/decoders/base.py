"""The one interface every decoder implements, its parameters, and its binding to a model.

A decoder is everything the agent knows about one output layout: the outputs it reads and
the shapes they must have, whether the model already ran NMS, its own parameters (read
from the outputs' shapes), how to recognise it in an ONNX without a manifest, and
``decode``. Decoding is pure numpy: no state, no I/O; boxes are ``xyxy`` in model-input
pixels (the caller maps them to source pixels).
"""

from __future__ import annotations

import math
import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import numpy as np

from edge_agent.models.decoders.recognition import Guess, Seen

Shape = tuple[int | None, ...]  # None for a dynamic axis

#: The most values one output may hold per frame (its batch axis left out): 16 Mi, 64 MiB as
#: float32. Real exports stay below 11 M: YOLOv8 at 1280 has 84 x 33,600 = 2.8 M, its
#: segmentation prototypes 32 x 320 x 320 = 3.3 M, YOLOv5 at 1280 85 x 100,800 = 8.6 M, an
#: LVIS detector (1,203 classes) at 640 1,207 x 8,400 = 10.1 M. Past it a frame's output is
#: gigabytes to allocate and seconds to decode: a 632-byte graph expanding to [1, 56, 5e6]
#: took 4.5 GB and 2.3 s a frame.
MAX_OUTPUT_ELEMENTS = 16 * 2**20


def oversized(name: str, shape: Shape) -> str:
    """Why an output of ``shape`` is refused ("" when it is not): more than
    ``MAX_OUTPUT_ELEMENTS`` values per frame. Axis 0 (the batch, or the rows of a
    ``[N, K]`` output, bounded by its backend) is left out; an axis still open (None)
    counts as 1, so for a shape read before the first run this is a lower bound."""
    per_frame = math.prod(d or 1 for d in (shape[1:] if len(shape) > 1 else shape))
    if per_frame <= MAX_OUTPUT_ELEMENTS:
        return ""
    dims = ", ".join("?" if d is None else str(d) for d in shape)
    return (
        f"output {name!r} [{dims}] holds {per_frame:,} values per frame, more than the "
        f"{MAX_OUTPUT_ELEMENTS:,} the agent takes (real exports hold under 11 M: docs/models.md)"
    )


class Decoded(NamedTuple):
    """One image's detections, best first, in model-input pixels."""

    xyxy: np.ndarray  # (K, 4) float32
    scores: np.ndarray  # (K,) float32
    classes: np.ndarray  # (K,) int32
    # (K, E) float32: the task's values per detection (``Decoder.extra_width``); None for
    # a detector. Pose: x, y, confidence per keypoint; OBB: cx, cy, w, h, angle (radians);
    # segmentation: the mask coefficients.
    extra: np.ndarray | None = None


@dataclass(frozen=True)
class DecodeParams:
    """What every decoder is told per model: the thresholds, and the input size for
    decoders of normalised boxes (RT-DETR), which scale them to input pixels."""

    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100
    input_w: int = 0
    input_h: int = 0


class OutputMismatch(ValueError):
    """An output is not the decoder's layout; ``needs`` says what it must be and
    ``index`` which of the decoder's outputs (in its order) is wrong."""

    def __init__(self, needs: str, index: int = 0) -> None:
        super().__init__(needs)
        self.needs = needs
        self.index = index


def need(ok: bool, needs: str, index: int = 0) -> None:
    """For ``Decoder.fit``: raise OutputMismatch unless ``ok``."""
    if not ok:
        raise OutputMismatch(needs, index)


def unbatched(output: np.ndarray, rank: int = 2) -> np.ndarray:
    """One image's array: ``output`` without its batch axis of 1, when it has one."""
    return output[0] if output.ndim > rank else output


class Decoder(ABC):
    """One output layout. Subclasses are frozen dataclasses whose fields are the decoder's
    own parameters, set from the model's outputs by ``fit``; each module declares one
    instance as ``DECODER``, which the registry collects."""

    name: ClassVar[str]  # the manifest's output.decoder
    layout: ClassVar[str]  # the outputs it reads, for messages: e.g. "[B, 4+C, N]"
    nms_in_model: ClassVar[bool]  # NMS ran in the model (or none is needed): none runs here
    # The roles of the outputs it reads when it reads several: the manifest names each
    # (output.efficient_nms); empty for a decoder of one output (output.name).
    roles: ClassVar[tuple[str, ...]] = ()
    # What its detections are (``pipelines.tasks``): detect, pose, obb or segment.
    task: ClassVar[str] = "detect"
    resize: ClassVar[str] = "letterbox"  # how its models take the frame: or "stretch"
    resize_why: ClassVar[str] = ""  # why "stretch", for the log

    def output_names(self, name: str, named: Mapping[str, str]) -> tuple[str, ...]:
        """The outputs it reads, in its order, from the manifest's output section: ``name``
        ("" for the model's first) or, by role, ``named``."""
        return tuple(named[r] for r in self.roles) if self.roles else (name,)

    def output_section(self, outputs: tuple[str, ...]) -> tuple[str, dict[str, str]]:
        """The manifest's output name and names by role for the outputs a rule picked."""
        return outputs[0], (dict(zip(self.roles, outputs)) if self.roles else {})

    @abstractmethod
    def fit(self, shapes: Sequence[Shape], n_labels: int) -> Decoder:
        """This decoder set up for outputs of these shapes (in its order) and that many
        labels, its own parameters read from them. Raises OutputMismatch."""

    def refine(self, output: Any) -> Decoder:
        """This fitted decoder with the manifest's output section's own settings for it
        (``ModelManifest.output``; e.g. a pose model's ``kpt_shape``). Raises
        OutputMismatch when they contradict the outputs."""
        return self

    def extra_width(self) -> int:
        """Values per detection in ``Decoded.extra`` (0: none)."""
        return 0

    def recognise(self, seen: Seen) -> Iterable[Guess]:
        """Its rules' verdicts on a model without a manifest (none: never guessed)."""
        return ()

    def class_count(self, shape: Shape) -> int:
        """The class count its first output's shape tells (0: it does not)."""
        return 0

    def describe(self) -> str:
        """Its own parameters, for ``models check`` ("" when it has none)."""
        return ""

    @abstractmethod
    def decode(self, outputs: tuple[np.ndarray, ...], p: DecodeParams) -> Decoded:
        """One image's detections, best first, from the outputs it reads (in its order,
        each with or without its batch axis of 1)."""


@dataclass(frozen=True)
class BoundDecoder:
    """A decoder bound to the model outputs it reads (their indices in the backend's list):
    called with one frame's outputs, as the backend wrote them (batch axis of 1)."""

    decoder: Decoder
    outputs: tuple[int, ...]
    _pick: Callable[[Sequence[np.ndarray]], tuple] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.outputs) == 1:  # itemgetter of one index gives the item, not a tuple
            i = self.outputs[0]
            object.__setattr__(self, "_pick", lambda outs: (outs[i],))
        else:
            object.__setattr__(self, "_pick", operator.itemgetter(*self.outputs))

    @property
    def name(self) -> str:
        return self.decoder.name

    def __call__(self, outputs: Sequence[np.ndarray], p: DecodeParams) -> Decoded:
        return self.decoder.decode(self._pick(outputs), p)
