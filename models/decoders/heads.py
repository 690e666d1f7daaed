"""What the pose, oriented-box and segmentation decoders share: Ultralytics' two heads.

- The classic head (YOLOv8, YOLO11): ``[B, 4 + C + E, A]``, one column per anchor: cx, cy,
  w, h (input pixels), C class scores, then the task's E values; NMS here.
- The end-to-end head (YOLO26, and ``nms=True`` exports): ``[B, K, 6 + E]``, rows of
  x1, y1, x2, y2 (cx, cy, w, h for oriented boxes), score, class id, then the E values.

A task decoder says how many values E its model has (``expected_extra``) and what they
are; this module reads the rows and gives the rules that recognise the heads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from edge_agent.models.decoders import kernels
from edge_agent.models.decoders.base import Decoded, DecodeParams, Decoder, Shape, need, unbatched
from edge_agent.models.decoders.nms import keep_best, ranked
from edge_agent.models.decoders.recognition import (
    BY_ANCHORS,
    BY_LABELS,
    BY_METADATA,
    BY_ROWS,
    Guess,
    Seen,
    Tensor,
    is_true,
    rows_and_columns,
    shape_rule,
)

#: The most task values per detection a model may have (a whole-body pose has 133 x 3 =
#: 399; Ultralytics' masks 32 coefficients).
MAX_EXTRA = 4096


def classic_candidates(
    out: np.ndarray, classes: int, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A classic head's columns (one image, ``(4 + C + E, A)``) whose best class scores over
    ``threshold``: the candidates' rows ``(K, 4 + C + E)``, best scores and class ids."""
    best = out[4 : 4 + classes].max(axis=0)
    idx = np.flatnonzero(best > threshold)
    cand = out[:, idx].T  # one gather of the few candidates
    return cand, best[idx], cand[:, 4 : 4 + classes].argmax(axis=1)


def classic_with_values(pred: np.ndarray, classes: int, p: DecodeParams) -> Decoded:
    """A classic head's detections (NMS here), each with its task values: the columns after
    the class scores (keypoints, mask coefficients)."""
    out = unbatched(pred)
    fast = kernels.classic(out, 4, 4 + classes, p)
    if fast is not None:
        found, anchors = fast
        return found._replace(extra=np.ascontiguousarray(out[4 + classes :, anchors].T, np.float32))
    cand, best, cls = classic_candidates(out, classes, p.score_threshold)
    return keep_best(cand[:, :4], best, cls, p, cand[:, 4 + classes :])


def end_to_end_with_values(pred: np.ndarray, p: DecodeParams) -> Decoded:
    """An end-to-end head's rows (x1, y1, x2, y2, score, class id), each with its task
    values: the columns after the sixth."""
    out = unbatched(pred)
    fast = kernels.ranked(out, p)
    if fast is not None:
        found, rows = fast
        return found._replace(extra=np.ascontiguousarray(out[rows, 6:], np.float32))
    return ranked(out[:, :4], out[:, 4], out[:, 5], p, out[:, 6:])


@dataclass(frozen=True)
class TaskHead(Decoder):
    """A task's decoder for one of the two heads. ``classes`` and ``extra`` are set by
    ``fit`` from the output's shape."""

    classes: int = 0
    extra: int = 0
    end_to_end: ClassVar[bool] = False
    what: ClassVar[str] = ""  # the task's values, for messages: "17 x 3 keypoint values"

    def extra_width(self) -> int:
        return self.extra

    def fit_head(self, shape: Shape, n_labels: int) -> tuple[int, int]:
        """(classes, extra) read from the predictions' shape. Raises OutputMismatch."""
        need(len(shape) == 3, "3 axes")
        if self.end_to_end:
            width = shape[2]
            need(width is not None and width > 6, f"6 + the {self.task} values on axis 2")
            extra = int(width) - 6  # type: ignore[operator]
        else:
            rows = shape[1]
            wanted = f"4 + {n_labels} labels + the {self.task} values on axis 1"
            need(rows is not None and rows > 4 + n_labels, wanted)
            extra = int(rows) - 4 - n_labels  # type: ignore[operator]
        # Each value is kept per detection slot and written in every message: a model
        # claiming millions of them would make the agent allocate without bound.
        need(extra <= MAX_EXTRA, f"at most {MAX_EXTRA} {self.what} per detection, not {extra}")
        return n_labels, extra

    def expected_extra(self, seen: Seen) -> int | None:
        """The task values per detection the model's metadata or other outputs say it has
        (None: they do not say)."""
        return None

    def predictions(self, seen: Seen) -> Tensor | None:
        """The output holding the rows: the first with 3 axes."""
        return next((t for t in seen.outputs if len(t.shape) == 3), None)

    def read_outputs(self, seen: Seen, pred: Tensor) -> tuple[str, ...]:
        return (pred.name,)

    def recognise(self, seen: Seen) -> Iterator[Guess]:
        """Only asked for a model whose metadata names this task (``onnx_info.choose``)."""
        pred = self.predictions(seen)
        if pred is None:
            return
        axes = rows_and_columns(pred)
        if axes is None:
            return
        a, b = axes
        n, e = seen.n_labels, self.expected_extra(seen)
        outputs = self.read_outputs(seen, pred)
        if not outputs:
            return
        anchors = seen.anchors()
        if self.end_to_end:
            fits = b is not None and b > 6 and (e is None or b == 6 + e)
            args = seen.meta("args")
            if is_true(seen.meta("end2end")):
                yield Guess(BY_METADATA + 1, "metadata end2end=True (an end-to-end head)", outputs, fits)
            elif isinstance(args, dict) and is_true(args.get("nms")):
                yield Guess(BY_METADATA + 1, "metadata args nms=True (NMS in the graph)", outputs, fits)
            elif a is not None and a not in anchors and fits and (e is not None or b < a):  # type: ignore[operator]
                yield Guess(BY_ROWS, shape_rule(a, b, f"{a} rows of 6 + {b - 6} {self.task} values"), outputs)
            return
        fits = a is not None and a > 4 + n and (e is None or a == 4 + n + e)
        if b in anchors and fits:
            why = (
                f"{b} = the anchors of a YOLOv8-style head {seen.at}; "
                f"axis 1 = 4 + {n} labels + {a - 4 - n} {self.what}"
            )
            yield Guess(BY_ANCHORS, shape_rule(a, b, why), outputs)
        elif b is None and fits and e is not None and n:  # a dynamic=True export: the anchors axis is open
            why = f"axis 1 = 4 + {n} labels + {e} {self.what} (axis 2 dynamic)"
            yield Guess(BY_LABELS, shape_rule(a, b, why), outputs)

    def class_count(self, shape: Shape) -> int:
        return 0  # the task values share the axis: only the labels tell


def check_extra(found: int, wanted: int, what: str, index: int = 0) -> None:
    need(found == wanted, f"{wanted} {what}, not {found}", index)


def single(shapes: Sequence[Shape]) -> Shape:
    (shape,) = shapes
    return shape
