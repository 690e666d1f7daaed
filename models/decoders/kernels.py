"""Compiled decode and NMS for the two Ultralytics heads (``pipelines.jit``): the numpy path
(``heads.classic_candidates`` and ``nms.keep_best``; ``nms.ranked``) stays the reference,
and these give exactly its detections (boxes, scores, classes, order, task values;
tests/test_decode_kernels.py compares them on recorded outputs).

Why: a busy YOLOv8n at 640 gives 100-200 candidates a frame; the numpy path is about 20
calls around OpenCV's NMS, some 130 us a frame beside the one pass over the class scores
that neither path can avoid (2.7 MB read: 100-250 us on its own, as the output is in cache
or not). Here the pass, the threshold, the argmax of the candidates, the boxes and the
greedy NMS are one call (tools/decode_cost.py measures both).

The rule is the reference's: candidates are the anchors whose best class score is above
the score threshold (a NaN anywhere in the column excludes it, as numpy's max does); they
are ranked by score, ties in anchor order (a stable sort, as OpenCV's); a candidate is
dropped when a kept one of its class overlaps it by more than the IoU threshold, the
overlap computed as OpenCV's ``NMSBoxesBatched`` computes it (in double, the distance
rounded to float). Where the reference takes another road the kernels say so by returning
-1 and the numpy path runs: more than ``nms.MAX_CANDIDATES`` candidates (its cut is
numpy's partition), an end-to-end class id that is not a finite integer-valued float.
Outputs that are not C-ordered, writable float32 (float16 engines) never reach them: a
new type would compile on a live frame.

The frame path compiles them at model load (``jit.load("decode", FUNCTIONS, warm)``;
``pipelines.jit``, a layer above, so it hands them over by ``install``); until then, and
where that gives None (``EDGE_AGENT_KERNELS=numpy``, no numba, a failed compile), the
decoders run the numpy path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.models.decoders.base import Decoded, DecodeParams
from edge_agent.models.decoders.nms import MAX_CANDIDATES

# -- kernels (numba's subset; plain Python where numba is off) ---------------------------------


def classic_decode(
    out: np.ndarray,
    lo: int,
    hi: int,
    thr: np.float32,
    iou: np.float32,
    max_det: int,
    best: np.ndarray,
    cand: np.ndarray,
    cand_f: np.ndarray,
    kept_f: np.ndarray,
    kept_i: np.ndarray,
) -> int:
    """A classic head's detections (one image, ``(4 + C + E, A)``, classes in rows
    ``lo:hi``): how many were kept (-1: too many candidates, run the numpy path).

    Scratch: ``best`` (A,) float32 per anchor; ``cand`` (M,) int64 and ``cand_f`` (M, 6)
    float32 per candidate (M = MAX_CANDIDATES). Written: ``kept_f``
    (max_det, 6) float32 rows x1, y1, x2, y2, score, class; ``kept_i`` (max_det,) int64
    each kept detection's anchor (its column).
    """
    n = out.shape[1]
    # The best score per anchor, row by row (contiguous, vectorised reads: the one pass over
    # all the class scores, which bounds the decode); a NaN may or may not stick here.
    for j in range(n):
        best[j] = out[lo, j]
    for r in range(lo + 1, hi):
        for j in range(n):
            best[j] = max(best[j], out[r, j])
    k = 0
    limit = cand.shape[0]
    for j in range(n):
        if best[j] > thr:
            if k == limit:
                return -1
            cand[k] = j
            k += 1
    # The candidates' best class (the first of equal scores, as argmax), again row by row;
    # a NaN in a column makes numpy's max NaN, which no threshold passes.
    for i in range(k):
        cand_f[i, 4] = out[lo, cand[i]]
        cand_f[i, 5] = 0
    for r in range(lo + 1, hi):
        c = r - lo
        for i in range(k):
            v = out[r, cand[i]]
            if v > cand_f[i, 4] or v != v:
                cand_f[i, 4] = v
                cand_f[i, 5] = c
    half = np.float32(0.5)
    kk = 0
    for i in range(k):
        s = cand_f[i, 4]
        if s != s:
            continue
        j = cand[i]
        cx = out[0, j]
        cy = out[1, j]
        hw = out[2, j] * half
        hh = out[3, j] * half
        cand[kk] = j
        cand_f[kk, 0] = cx - hw
        cand_f[kk, 1] = cy - hh
        cand_f[kk, 2] = cx + hw
        cand_f[kk, 3] = cy + hh
        cand_f[kk, 4] = s
        cand_f[kk, 5] = cand_f[i, 5]
        kk += 1
    k = kk
    # Greedy NMS, best score first (ties in anchor order), boxes of one class only.
    order = np.argsort(-cand_f[:k, 4], kind="mergesort")
    m = 0
    one = np.float32(1.0)
    for oi in range(k):
        if m == max_det:
            break
        i = order[oi]
        ax1 = np.float64(cand_f[i, 0])
        ay1 = np.float64(cand_f[i, 1])
        ax2 = np.float64(cand_f[i, 2])
        ay2 = np.float64(cand_f[i, 3])
        aw = ax2 - ax1
        ah = ay2 - ay1
        area_a = aw * ah
        cls = cand_f[i, 5]
        keep = True
        for q in range(m):
            if kept_f[q, 5] != cls:
                continue
            bx1 = np.float64(kept_f[q, 0])
            by1 = np.float64(kept_f[q, 1])
            bw = np.float64(kept_f[q, 2]) - bx1
            bh = np.float64(kept_f[q, 3]) - by1
            area_b = bw * bh
            # OpenCV's jaccardDistance: boxes of no area together overlap fully.
            if area_a + area_b <= 2.220446049250313e-16:
                overlap = one
            else:
                inter = 0.0
                if aw > 0 and ah > 0 and bw > 0 and bh > 0:
                    iw = min(ax2, bx1 + bw) - max(ax1, bx1)
                    ih = min(ay2, by1 + bh) - max(ay1, by1)
                    if iw > 0 and ih > 0:
                        inter = iw * ih
                overlap = one - np.float32(1.0 - inter / (area_a + area_b - inter))
            if overlap > iou:
                keep = False
                break
        if keep:
            for c in range(6):
                kept_f[m, c] = cand_f[i, c]
            kept_i[m] = cand[i]
            m += 1
    return m


def ranked_rows(
    rows: np.ndarray, thr: np.float32, max_det: int, cand: np.ndarray, kept_f: np.ndarray, kept_i: np.ndarray
) -> int:
    """An end-to-end head's rows (one image, ``(K, 6 + E)``: x1, y1, x2, y2, score, class)
    over the score threshold, best first (ties in row order), at most ``max_det``: how many
    (-1: a kept row's class id is not an int32 the cast gives alike, run the numpy path).
    Scratch ``cand`` (K,) int64; written: ``kept_f`` rows as ``classic_decode``'s (the
    class as its float), ``kept_i`` the rows."""
    k = 0
    for r in range(rows.shape[0]):
        if rows[r, 4] > thr:
            cand[k] = r
            k += 1
    order = np.argsort(-rows[cand[:k], 4], kind="mergesort")
    m = min(k, max_det)
    for oi in range(m):
        r = cand[order[oi]]
        c = rows[r, 5]
        if not (-2147483648.0 < c < 2147483648.0):  # NaN, inf, past int32: numpy's cast decides
            return -1
        for q in range(6):
            kept_f[oi, q] = rows[r, q]
        kept_i[oi] = r
    return m


FUNCTIONS = (classic_decode, ranked_rows)

# -- the calls the decoders make -----------------------------------------------------------

_kernels: dict[str, Callable[..., Any]] | None = None
_local = threading.local()  # per thread: the scratch (post stages decode on their own threads)


def install(compiled: dict[str, Callable[..., Any]] | None) -> bool:
    """Have the decoders run ``compiled`` (``FUNCTIONS`` compiled and warmed by ``warm``:
    ``jit.load("decode", FUNCTIONS, warm)``, which the frame path calls at model load; this
    layer does not import it); None: the numpy path. True: the kernels run."""
    global _kernels
    _kernels = compiled
    return compiled is not None


def active() -> bool:
    return _kernels is not None


def warm(k: dict[str, Callable[..., Any]]) -> None:
    """Run each kernel once on a tiny frame (numba compiles on the first call)."""
    # Every type a frame can bring (ints as Python ints, thresholds as float32), so nothing
    # compiles on a live frame.
    out = np.zeros((6, 16), np.float32)
    out[0:4, :] = 8.0
    out[4, :3] = (0.9, 0.8, 0.9)
    scratch = _Scratch(16, 4)
    rows = np.zeros((4, 6), np.float32)
    rows[:, 4] = (0.9, 0.1, 0.8, 0.9)
    # Writable (an accelerator's buffers) and read-only outputs (the emulated accelerator's
    # views of its recording) are two types to numba: both compiled.
    for writable in (True, False):
        out.flags.writeable = rows.flags.writeable = writable
        k["classic_decode"](out, 4, 6, np.float32(0.25), np.float32(0.45), 4, *scratch.classic())
        k["ranked_rows"](rows, np.float32(0.25), 4, *scratch.ranked())


class _Scratch:
    """One thread's buffers for one anchor count and ``max_detections``."""

    def __init__(self, anchors: int, max_det: int) -> None:
        self.best = np.empty(anchors, np.float32)
        self.cand = np.empty(max(MAX_CANDIDATES, anchors), np.int64)
        self.cand_c = self.cand[:MAX_CANDIDATES]  # the classic head's: past it, numpy's cut
        self.cand_f = np.empty((MAX_CANDIDATES, 6), np.float32)
        self.kept_f = np.empty((max_det, 6), np.float32)
        self.kept_i = np.empty(max_det, np.int64)

    def classic(self) -> tuple[np.ndarray, ...]:
        return self.best, self.cand_c, self.cand_f, self.kept_f, self.kept_i

    def ranked(self) -> tuple[np.ndarray, ...]:
        return self.cand, self.kept_f, self.kept_i


def _scratch(anchors: int, max_det: int) -> _Scratch:
    """This thread's scratch for these shapes (a dict per thread: a post thread may decode
    for several models)."""
    mine = getattr(_local, "scratch", None)
    if mine is None:
        mine = _local.scratch = {}
    s = mine.get((anchors, max_det))
    if s is None:
        s = mine[anchors, max_det] = _Scratch(anchors, max_det)
    return s


def _fits(out: np.ndarray) -> bool:
    """An output the warmed kernels take as they are (anything else would compile)."""
    return out.dtype == np.float32 and out.ndim == 2 and out.flags.c_contiguous


def _decoded(s: _Scratch, m: int) -> Decoded:
    # Copies: the scratch is overwritten by the thread's next frame, a Decoded may outlive it.
    kept = s.kept_f[:m]
    return Decoded(kept[:, :4].copy(), kept[:, 4].copy(), kept[:, 5].astype(np.int32))


def classic(out: np.ndarray, lo: int, hi: int, p: DecodeParams) -> tuple[Decoded, np.ndarray] | None:
    """A classic head's detections and their anchors (columns) by the kernel; None: run
    the numpy path (kernels off, an output they do not take, too many candidates)."""
    k = _kernels
    if k is None or not _fits(out) or hi <= lo:
        return None
    s = _scratch(out.shape[1], p.max_detections)
    thr, iou = np.float32(p.score_threshold), np.float32(p.iou_threshold)
    m = k["classic_decode"](out, lo, hi, thr, iou, p.max_detections, *s.classic())
    if m < 0:
        return None
    return _decoded(s, m), s.kept_i[:m].copy()


def ranked(rows: np.ndarray, p: DecodeParams) -> tuple[Decoded, np.ndarray] | None:
    """An end-to-end head's detections and their rows by the kernel; None: run the numpy
    path."""
    k = _kernels
    if k is None or not _fits(rows) or rows.shape[1] < 6:
        return None
    s = _scratch(rows.shape[0], p.max_detections)
    m = k["ranked_rows"](rows, np.float32(p.score_threshold), p.max_detections, *s.ranked())
    if m < 0:
        return None
    return _decoded(s, m), s.kept_i[:m].copy()
