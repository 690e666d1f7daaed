"""Optimal one-to-one assignment under a cost limit, cheap in the common case.

Taking a pair (r, c) saves ``limit - cost[r, c]`` against leaving both alone, so the best
assignment is the one that saves most, and no assignment saves more than every row's best
pair together. When the rows' best columns are all different, those pairs *are* an
assignment, hence the optimal one: a scene's usual frame (each track near its own
detection, even with other detections close by) costs an argmin and a count. Only when two
rows want the same column is the solver (``lap.lapjv``, Jonker-Volgenant) run, on the rows
and columns that have a candidate at all.
"""

from __future__ import annotations

import lap
import numpy as np

_NONE = (np.zeros(0, np.intp), np.zeros(0, np.intp))


def assign(cost: np.ndarray, limit: float) -> tuple[np.ndarray, np.ndarray]:
    """(rows, cols) of the assignment minimising the total cost, a pair only where its cost
    is below ``limit`` (lapjv's extended problem: leaving a row and a column unmatched costs
    ``limit``, so a pair costing less is always worth taking)."""
    if not cost.size:
        return _NONE
    best = cost.argmin(1)
    rows = (cost[_arange(len(cost)), best] < limit).nonzero()[0]
    cols = best[rows]
    if len(cols) < 2 or np.bincount(cols).max() == 1:
        return rows, cols
    cand = cost < limit
    rows = cand.any(1).nonzero()[0]
    cols = cand.any(0).nonzero()[0]
    sub = cost[rows][:, cols]
    x = solve(sub, limit)
    r = (x >= 0).nonzero()[0]
    # a pair costing exactly the limit ties with leaving both alone, and lapjv may take it
    r = r[sub[r, x[r]] < limit]
    return rows[r], cols[x[r]]


def solve(cost: np.ndarray, limit: float) -> np.ndarray:
    """The Jonker-Volgenant solver's column for each row of ``cost`` (-1: none), leaving a
    row or a column unmatched at ``limit``; a pair costing exactly ``limit`` may be taken
    (callers drop it). The tracker's compiled path calls it on the cost matrix its kernel
    wrote (``track_kernels.py``)."""
    return lap.lapjv(cost, extend_cost=True, cost_limit=limit)[1]


_RANGE = np.arange(1024)


def _arange(n: int) -> np.ndarray:
    return _RANGE[:n] if n <= len(_RANGE) else np.arange(n)
