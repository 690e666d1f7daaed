"""What the rules that pick a decoder for an ONNX without a manifest see, and what they say.

Each decoder gives its own rules (``Decoder.recognise``) as ``Guess``es; ``models.onnx_info``
takes the first that fits, in the order of ``Guess.order``. The orders below are that
sequence, so a rule's place is one number, not a position in a chain of ``if``s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: The orders rules run in (lower first); a decoder with two rules at one step adds 1.
BY_NAME = 10  # outputs named as the decoder names them (EfficientNMS)
BY_OUTPUTS = 20  # a set of outputs shaped and typed as the decoder's
BY_METADATA = 30  # the exporter's metadata names the layout (and the output fits it)
BY_ANCHORS = 40  # an axis is the anchor count of the input size
BY_ROWS = 50  # rows of a fixed width that is no anchor count
BY_LABELS = 60  # an axis is the label count plus the box columns

STRIDES = ((8, 16, 32), (8, 16, 32, 64))  # YOLO heads: P3-P5, and the P6 models


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int | None, ...]  # None for a dynamic axis
    dtype: str  # numpy's name; "" for a type the agent does not read

    def show(self) -> str:
        dims = ", ".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.name} [{dims}] {self.dtype}"


@dataclass(frozen=True)
class Seen:
    """A model as the rules see it."""

    outputs: tuple[Tensor, ...]
    n_labels: int  # the labels its metadata names; 0 when it names none
    height: int  # the input's, in pixels
    width: int
    meta: Callable[[str], Any]  # a metadata value as a Python literal, or None

    @property
    def at(self) -> str:
        return f"at {self.width}x{self.height}"

    def anchors(self) -> set[int]:
        """Anchor-free heads' anchor counts (YOLOv8 and later) for the input size."""
        return anchor_counts(self.height, self.width)


@dataclass(frozen=True)
class Guess:
    """One rule's verdict: the outputs it would read and why. ``fits`` is False where the
    metadata names the decoder but the output is not its layout (said beside the rule
    that then decides)."""

    order: int
    rule: str
    outputs: tuple[str, ...]
    fits: bool = True


def anchor_counts(height: int, width: int) -> set[int]:
    """Anchor-free heads' anchors (YOLOv8 and later) for an input size, P5 and P6 models."""
    return {sum(-(-height // s) * -(-width // s) for s in strides) for strides in STRIDES}


def rows_and_columns(t: Tensor) -> tuple[int | None, int | None] | None:
    """Axes 1 and 2 of a ``[B, rows, columns]`` output with at least one of them fixed, else None."""
    if len(t.shape) != 3 or (t.shape[1] is None and t.shape[2] is None):
        return None
    return t.shape[1], t.shape[2]


def shape_rule(a: int | None, b: int | None, why: str) -> str:
    dims = ", ".join("?" if d is None else str(d) for d in (a, b))
    return f"shape [B, {dims}]: {why}"


def is_true(value: Any) -> bool:
    """A metadata flag: True, or the string "true" in any case."""
    return value is True or (isinstance(value, str) and value.lower() == "true")
