"""The tracker's frame compiled: ``track_step`` does what ``ByteTracker``'s numpy path does
(``bytetrack.py``), on the same state arrays, in one native call a frame.

Its results equal the numpy path's exactly (tests/pipelines/tracking/test_tracker_kernels.py),
so every floating-point operation here is the numpy path's, in its order and its dtype: a
detection's width is float32 arithmetic there (the detections are float32), a score is
compared with a float32 threshold (numpy 2 casts a Python float to the array's dtype), a
lost track gives its journey to the surest new track first, ties in row order.

The optimal assignment stays ``lap.lapjv``'s (``assign.py``): where two tracks want one
detection, ``track_step`` writes the candidates' cost matrix to ``sub`` and returns the
stage it stopped at; the caller runs the solver on it and calls again with its answer.

Plain functions in numba's subset: ``track_step`` compiled by ``pipelines/jit.py``; it
calls the others by their module names, which ``bind`` points at compiled ones before its
first compile. Numba checks no bounds: ``track_step`` checks the sizes it is given first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

TENTATIVE, TRACKED, LOST = 0, 1, 2
#: BoT-SORT's noise: standard deviations as fractions of the box's width and height.
STD_POS = 1.0 / 20
STD_VEL = 1.0 / 160
#: A detection within this many pixels (and a tenth of its size) of the view's edge touches it.
EDGE_PX = 2.0
#: A lost track whose last detection touched the view's edge left the view: it ends after
#: this many frames (a truth counts an object that comes back in as another pass).
EDGE_LOST = 10.0
#: A track's size (for the journey gate) follows a shrinking box this slowly per detection:
#: an object sliding behind something keeps the size it had in the open.
SIZE_KEEP = 0.97
#: A journey's label: classes 0..62 each a bit of a track's mask, every higher one bit 63.
CLASS_BITS = 63

# the noise factors as the numpy path computes them (Python floats, constants once compiled)
_POS_VAR = STD_POS * STD_POS
_VEL_VAR = STD_VEL * STD_VEL
_NEW_POS_VAR = (2 * STD_POS) ** 2
_NEW_VEL_VAR = (10 * STD_VEL) ** 2

# The state blocks (``ByteTracker`` holds its named arrays as views of them): f4 (5, cap, 4)
F_POS, F_VEL, F_PP, F_PV, F_VV = range(5)
# f1 (3, cap)
S_SINCE, S_AGE, S_SIZE = range(3)
# i8 (4, cap)
I_IDS, I_HITS, I_LABELS, I_JOURNEY = range(4)
# cnt (4,)
C_N, C_NEXT_ID, C_OVERFLOW, C_LINKS = range(4)
# par (float64): the settings, and the view
P_MATCH_COST, P_LOW_COST, P_UNCONF_COST, P_CONFIRM, P_LOST, P_EDGE_LOST = range(6)
P_PER_CLASS, P_JOURNEYS, P_RADIUS, P_VIEW, P_VIEW_W, P_VIEW_H = range(6, 12)
N_PAR = 12
# thr (the scores' dtype): high, low, new track
T_HIGH, T_LOW, T_NEW = range(3)
# iw (int64, rows of max(cap, detections)): the frame's index lists, then its counts
W_HI, W_LO, W_LEFT, W_DET_OF, W_HIT, W_POOL, W_BEST = range(7)
W_SUBR, W_SUBC, W_MARK, W_LOST, W_ORDER, W_HDR = range(7, 13)
N_W = 13
H_M, H_NHI, H_NLO, H_NLEFT, H_NPOOL, H_A, H_B = range(7)
#: ``track_step``'s answers besides a stage waiting for the solver
DONE, MISFIT = -1, -2


def _max(a: float, b: float) -> float:
    """np.maximum: a NaN wins."""
    if a != a or a >= b:
        return a
    return b


def _min(a: float, b: float) -> float:
    """np.minimum: a NaN wins."""
    if a != a or a <= b:
        return a
    return b


def _label(c: int) -> int:
    """The journey label bit of class ``c`` (np.left_shift's 0 for a negative one)."""
    c = min(c, CLASS_BITS)
    if c < 0:
        return 0
    return np.int64(1) << np.int64(c)


def _cxcywh(xyxy: Any, j: int) -> tuple[float, float, float, float]:
    """Detection ``j`` as (cx, cy, w, h): its width in its own dtype, as
    ``boxes.xyxy_to_cxcywh``."""
    w = np.float64(xyxy[j, 2] - xyxy[j, 0])
    h = np.float64(xyxy[j, 3] - xyxy[j, 1])
    return w * 0.5 + xyxy[j, 0], h * 0.5 + xyxy[j, 1], w, h


def _predict(dt: float, f4: Any, state: Any, n: int) -> None:
    """The Kalman prediction of every track ``dt`` frames on (``ByteTracker._predict``)."""
    pos, vel, pp, pv, vv = f4[F_POS], f4[F_VEL], f4[F_PP], f4[F_PV], f4[F_VV]
    two_dt = 2.0 * dt
    dt2 = dt * dt
    q_pos = _POS_VAR * dt
    q_vel = _VEL_VAR * dt
    for i in range(n):
        if state[i] == LOST:
            vel[i, 2] = 0.0
            vel[i, 3] = 0.0
        sw = _max(pos[i, 2], 1e-3)
        sh = _max(pos[i, 3], 1e-3)
        sw *= sw
        sh *= sh
        for k in range(4):
            s = sw if k % 2 == 0 else sh
            pos[i, k] += vel[i, k] * dt
            pp[i, k] += pv[i, k] * two_dt
            pp[i, k] += vv[i, k] * dt2
            pv[i, k] += vv[i, k] * dt
            pp[i, k] += s * q_pos
            vv[i, k] += s * q_vel


def _correct(i: int, z: tuple[float, float, float, float], f4: Any) -> None:
    """The Kalman update of track ``i`` toward ``z`` (``ByteTracker._correct``)."""
    pos, vel, pp, pv, vv = f4[F_POS], f4[F_VEL], f4[F_PP], f4[F_PV], f4[F_VV]
    sw = _max(pos[i, 2], 1e-3)
    sh = _max(pos[i, 3], 1e-3)
    sw *= sw
    sh *= sh
    for k in range(4):
        s = (sw if k % 2 == 0 else sh) * _POS_VAR
        s += pp[i, k]
        gain = pp[i, k] / s
        dz = z[k] - pos[i, k]
        pos[i, k] += gain * dz
        vgain = pv[i, k] / s
        vel[i, k] += vgain * dz
        vv[i, k] -= vgain * pv[i, k]
        gain = 1.0 - gain
        pv[i, k] *= gain
        pp[i, k] *= gain


def _iou(xyxy: Any, classes: Any, par: Any, f4: Any, cls: Any, n: int, m: int, iou: Any) -> None:
    """Every track's predicted box against every detection (``boxes.box_iou``), 0 across
    classes when ``per_class``."""
    pos = f4[F_POS]
    per_class = par[P_PER_CLASS] != 0.0
    for i in range(n):
        hw = pos[i, 2] * 0.5
        hh = pos[i, 3] * 0.5
        a0 = pos[i, 0] - hw
        a1 = pos[i, 1] - hh
        a2 = pos[i, 0] + hw
        a3 = pos[i, 1] + hh
        area_a = (a2 - a0) * (a3 - a1)
        for j in range(m):
            ix = _min(a2, xyxy[j, 2]) - _max(a0, xyxy[j, 0])
            ix = _max(ix, 0.0)
            iy = _min(a3, xyxy[j, 3]) - _max(a1, xyxy[j, 1])
            iy = _max(iy, 0.0)
            ix *= iy
            area_b = (xyxy[j, 2] - xyxy[j, 0]) * (xyxy[j, 3] - xyxy[j, 1])
            union = area_a + area_b
            union -= ix
            union = _max(union, 1e-9)
            v = ix / union
            if per_class and cls[i] != classes[j]:
                v *= 0.0
            iou[i, j] = v


def _cost(iou: Any, scores: Any, i: int, j: int, fused: bool) -> float:
    """1 - IoU (times the detection's score when ``fused``), as ``ByteTracker._match``."""
    if fused:
        return 1.0 - iou[i, j] * scores[j]
    return 1.0 - iou[i, j]


def _stage_of(stage: int, par: Any, hdr: Any) -> tuple[int, int, float, bool]:
    """A stage's detections (row of ``iw``, count), cost limit and whether the score is fused."""
    if stage == 0:
        return W_HI, hdr[H_NHI], par[P_MATCH_COST], True
    if stage == 1:
        return W_LO, hdr[H_NLO], par[P_LOW_COST], False
    return W_LEFT, hdr[H_NLEFT], par[P_UNCONF_COST], True


def _pair(r: int, c: int, cols_row: int, iw: Any) -> None:
    """Pool row ``r`` took the stage's detection at ``c``."""
    i = iw[W_POOL, r]
    iw[W_HIT, i] = 1
    iw[W_DET_OF, i] = iw[cols_row, c]
    iw[W_MARK, c] = 1


def _paired(stage: int, iw: Any) -> None:
    """After stage 0 and 2: the high detections nobody took (``_without``), in order."""
    hdr = iw[W_HDR]
    if stage == 1:
        return
    src, nc = (W_HI, hdr[H_NHI]) if stage == 0 else (W_LEFT, hdr[H_NLEFT])
    k = 0
    for c in range(nc):
        if iw[W_MARK, c] == 0:
            iw[W_LEFT, k] = iw[src, c]
            k += 1
    hdr[H_NLEFT] = k


def _associate(stage: int, scores: Any, par: Any, state: Any, n: int, iou: Any, sub: Any, iw: Any) -> bool:
    """One stage of the association (``update``'s 1, 2, 3 and ``assign``): True when two
    tracks want one detection and the solver has to run on ``sub`` (a x b, in ``iw``'s
    header)."""
    hdr = iw[W_HDR]
    m = hdr[H_M]
    cols_row, nc, limit, fused = _stage_of(stage, par, hdr)
    if n == 0 or m == 0 or nc == 0:
        return False
    pool = iw[W_POOL]
    hit = iw[W_HIT]
    npool = 0
    for i in range(n):
        s = state[i]
        if stage == 0:
            take = s != TENTATIVE
        elif stage == 1:
            take = s == TRACKED and hit[i] == 0
        else:
            take = s == TENTATIVE
        if take:
            pool[npool] = i
            npool += 1
    if npool == 0:
        return False
    hdr[H_NPOOL] = npool
    cols = iw[cols_row]
    best = iw[W_BEST]
    mark = iw[W_MARK]
    for c in range(nc):
        mark[c] = 0
    pairs = 0
    clash = False
    for r in range(npool):
        i = pool[r]
        bc = 0
        bv = _cost(iou, scores, i, cols[0], fused)
        if bv == bv:  # argmin: the first smallest, or the first NaN
            for c in range(1, nc):
                v = _cost(iou, scores, i, cols[c], fused)
                if v < bv:
                    bc, bv = c, v
                elif v != v:
                    bc, bv = c, v
                    break
        if bv < limit:
            best[r] = bc
            pairs += 1
            mark[bc] += 1
            if mark[bc] > 1:
                clash = True
        else:
            best[r] = -1
    if not clash:  # each row's best pair is the optimal assignment
        for c in range(nc):
            mark[c] = 0
        for r in range(npool):
            if best[r] >= 0:
                _pair(r, best[r], cols_row, iw)
        _paired(stage, iw)
        return False
    # the rows and the columns with a pair under the limit, for the solver
    subr, subc = iw[W_SUBR], iw[W_SUBC]
    a = 0
    for r in range(npool):
        i = pool[r]
        for c in range(nc):
            if _cost(iou, scores, i, cols[c], fused) < limit:
                subr[a] = r
                a += 1
                break
    b = 0
    for c in range(nc):
        for r in range(npool):
            if _cost(iou, scores, pool[r], cols[c], fused) < limit:
                subc[b] = c
                b += 1
                break
    for ra in range(a):
        i = pool[subr[ra]]
        for cb in range(b):
            sub[ra * b + cb] = _cost(iou, scores, i, cols[subc[cb]], fused)
    hdr[H_A] = a
    hdr[H_B] = b
    return True


def _solved(stage: int, x: Any, par: Any, sub: Any, iw: Any) -> None:
    """The solver's answer ``x`` for ``stage``: its pairs under the limit (a pair costing
    exactly the limit ties with none, and lapjv may take it)."""
    hdr = iw[W_HDR]
    cols_row, nc, limit, _ = _stage_of(stage, par, hdr)
    a, b = hdr[H_A], hdr[H_B]
    for c in range(nc):
        iw[W_MARK, c] = 0
    for r in range(a):
        c = x[r]
        if c >= 0 and sub[r * b + c] < limit:
            _pair(iw[W_SUBR, r], iw[W_SUBC, c], cols_row, iw)
    _paired(stage, iw)


def _link(nb: int, par: Any, f4: Any, f1: Any, i8: Any, state: Any, edge: Any, cnt: Any, iw: Any) -> int:
    """Tracks ``iw[W_ORDER, :nb]`` (confirmed in this frame) continue lost tracks'
    journeys (``ByteTracker._link``); the lost ones whose journeys went on are marked in
    ``iw[W_MARK]`` (by row). Returns how many."""
    n = cnt[C_N]
    pos, vel = f4[F_POS], f4[F_VEL]
    since, age, size = f1[S_SINCE], f1[S_AGE], f1[S_SIZE]
    hits, labels, journey = i8[I_HITS], i8[I_LABELS], i8[I_JOURNEY]
    lost, born, taken = iw[W_LOST], iw[W_ORDER], iw[W_MARK]
    lost_frames = par[P_LOST]
    nl = 0
    for i in range(n):
        taken[i] = 0
        if state[i] == LOST and not edge[i] and since[i] <= lost_frames:
            lost[nl] = i
            nl += 1
    if nl == 0:
        return 0
    # the surest new track chooses first (a stable sort: ties in row order)
    for q in range(1, nb):
        b = born[q]
        p = q
        while p > 0 and hits[born[p - 1]] < hits[b]:
            born[p] = born[p - 1]
            p -= 1
        born[p] = b
    radius_k = par[P_RADIUS]
    count = 0
    for q in range(nb):
        b = born[q]
        best = -1
        best_dist = 0.0
        for k in range(nl):
            i = lost[k]
            if taken[i]:
                continue
            radius = radius_k * size[i] + math.hypot(vel[i, 0], vel[i, 1]) * since[i]
            dist = math.hypot(pos[i, 0] - pos[b, 0], pos[i, 1] - pos[b, 1]) / radius
            ratio = size[i] / size[b]
            if (
                ratio <= 2.0
                and ratio >= 0.5
                and dist <= 1.0
                and since[i] > age[b]
                and (labels[i] & labels[b]) != 0
                and (best < 0 or dist < best_dist)
            ):
                best, best_dist = i, dist
        if best >= 0:
            taken[best] = 1
            journey[b] = journey[best]
            cnt[C_LINKS] += 1
            count += 1
    return count


def _remove(gone: Any, f4: Any, f1: Any, i8: Any, cls: Any, state: Any, edge: Any, cnt: Any) -> None:
    """Drop the tracks marked in ``gone`` (by row), the others moving up in order."""
    n = cnt[C_N]
    k = 0
    for i in range(n):
        if gone[i]:
            continue
        if k != i:
            for a in range(5):
                for c in range(4):
                    f4[a, k, c] = f4[a, i, c]
            for a in range(3):
                f1[a, k] = f1[a, i]
            for a in range(4):
                i8[a, k] = i8[a, i]
            cls[k] = cls[i]
            state[k] = state[i]
            edge[k] = edge[i]
        k += 1
    cnt[C_N] = k


def _update_tracks(xyxy, classes, par, f4, f1, i8, cls, state, edge, cnt, iw, out_id, out_age, out_journey):
    """The hits (Kalman update, size, labels, ids, journeys), then the misses and the
    tracks that end (``update`` after the association)."""
    n = cnt[C_N]
    if n == 0:
        return
    pos = f4[F_POS]
    since, age, size = f1[S_SINCE], f1[S_AGE], f1[S_SIZE]
    ids, hits, labels, journey = i8[I_IDS], i8[I_HITS], i8[I_LABELS], i8[I_JOURNEY]
    hit, det_of, born = iw[W_HIT], iw[W_DET_OF], iw[W_ORDER]
    confirm = par[P_CONFIRM]
    nb = 0
    any_hit = False
    for i in range(n):
        if not hit[i]:
            continue
        any_hit = True
        d = det_of[i]
        z = _cxcywh(xyxy, d)
        _correct(i, z, f4)
        size[i] = _max(math.sqrt(z[2] * z[3]), SIZE_KEEP * size[i])
        labels[i] |= _label(classes[d])
        cls[i] = classes[d]
        hits[i] += 1
        since[i] = 0.0
        if state[i] != TENTATIVE or hits[i] >= confirm:
            if ids[i] == 0:
                ids[i] = journey[i] = cnt[C_NEXT_ID]
                cnt[C_NEXT_ID] += 1
                born[nb] = i
                nb += 1
            state[i] = TRACKED
    if any_hit:
        if par[P_JOURNEYS] != 0.0 and nb:
            taken = iw[W_MARK]
            if _link(nb, par, f4, f1, i8, state, edge, cnt, iw):
                for i in range(n):
                    if taken[i]:
                        since[i] = par[P_LOST] + 1.0  # it ends in this frame
        for i in range(n):
            if not hit[i]:
                continue
            d = det_of[i]
            if state[i] == TENTATIVE:
                out_id[d] = 0
                out_age[d] = 0
            else:
                out_id[d] = ids[i]
                out_age[d] = age[i] + 0.5  # whole frames (truncated by the int array)
            out_journey[d] = journey[i]
    # misses: tentative tracks go, tracked ones are lost, lost ones go after M frames (and a
    # lost one whose journey a new track took, at once: its ``since`` is past)
    view = par[P_VIEW] != 0.0
    gone = iw[W_MARK]
    anything = False
    for i in range(n):
        if state[i] == TRACKED and not hit[i]:
            state[i] = LOST
            if view:
                rw = pos[i, 2] * 0.6 + EDGE_PX
                rh = pos[i, 3] * 0.6 + EDGE_PX
                near_x = pos[i, 0] <= rw or pos[i, 0] >= par[P_VIEW_W] - rw
                near_y = pos[i, 1] <= rh or pos[i, 1] >= par[P_VIEW_H] - rh
                edge[i] = near_x or near_y
        g = (state[i] == TENTATIVE and not hit[i]) or since[i] > par[P_LOST]
        g = g or (state[i] == LOST and edge[i] and since[i] > par[P_EDGE_LOST])
        gone[i] = g
        anything = anything or g
    if anything:
        _remove(gone, f4, f1, i8, cls, state, edge, cnt)


def _add(xyxy, classes, par, f4, f1, i8, cls, state, edge, cnt, iw, k, out_id, out_journey):
    """New tracks from detections ``iw[W_POOL, :k]`` (``ByteTracker._add``)."""
    n = cnt[C_N]
    room = state.shape[0] - n
    if k > room:  # the later detections are refused: counted
        cnt[C_OVERFLOW] += k - room
        k = room
        if not k:
            return
    dets = iw[W_POOL]
    pos, vel, pp, pv, vv = f4[F_POS], f4[F_VEL], f4[F_PP], f4[F_PV], f4[F_VV]
    since, age, size = f1[S_SINCE], f1[S_AGE], f1[S_SIZE]
    ids, hits, labels, journey = i8[I_IDS], i8[I_HITS], i8[I_LABELS], i8[I_JOURNEY]
    tentative = par[P_CONFIRM] > 1
    for q in range(k):
        i = n + q
        j = dets[q]
        pos[i, 0], pos[i, 1], pos[i, 2], pos[i, 3] = _cxcywh(xyxy, j)
        size[i] = math.sqrt(pos[i, 2] * pos[i, 3])
        edge[i] = False
        labels[i] = _label(classes[j])
        sw = _max(pos[i, 2], 1e-3)
        sh = _max(pos[i, 3], 1e-3)
        sw *= sw
        sh *= sh
        for c in range(4):
            s = sw if c % 2 == 0 else sh
            vel[i, c] = 0.0
            pp[i, c] = s * _NEW_POS_VAR
            pv[i, c] = 0.0
            vv[i, c] = s * _NEW_VEL_VAR
        cls[i] = classes[j]
        hits[i] = 1
        since[i] = 0.0
        age[i] = 0.0
        if tentative:
            ids[i] = 0
            journey[i] = 0
            state[i] = TENTATIVE
        else:
            ids[i] = journey[i] = cnt[C_NEXT_ID] + q
            state[i] = TRACKED
    if tentative:
        cnt[C_N] = n + k  # last: a heartbeat counting meanwhile sees whole rows only
        return
    cnt[C_NEXT_ID] += k
    cnt[C_N] = n + k
    if par[P_JOURNEYS] != 0.0:
        born = iw[W_ORDER]
        for q in range(k):
            born[q] = n + q
        ended = _link(k, par, f4, f1, i8, state, edge, cnt, iw)
        if ended:
            _remove(iw[W_MARK], f4, f1, i8, cls, state, edge, cnt)
            n -= ended  # (the new rows moved up by as many: the ended ones were before them)
    for q in range(k):
        out_id[dets[q]] = ids[n + q]
        out_journey[dets[q]] = journey[n + q]


def track_step(
    resume: int,
    x: Any,
    dt: float,
    xyxy: Any,
    scores: Any,
    classes: Any,
    thr: Any,
    par: Any,
    f4: Any,
    f1: Any,
    i8: Any,
    cls: Any,
    state: Any,
    edge: Any,
    cnt: Any,
    iou: Any,
    sub: Any,
    iw: Any,
    out_id: Any,
    out_age: Any,
    out_journey: Any,
) -> int:
    """One frame of ``ByteTracker.update`` (``resume`` -1), or its rest after the solver
    answered ``x`` for stage ``resume``. Returns ``DONE``; a stage (0-2) waiting for the
    solver on ``sub`` (``iw[W_HDR, H_A]`` x ``iw[W_HDR, H_B]``, limit that stage's cost);
    or ``MISFIT`` before touching anything when the arrays' sizes do not fit (the numpy
    path runs the frame instead, and says what is wrong)."""
    hdr = iw[W_HDR]
    if resume < 0:
        m = scores.shape[0]
        n = cnt[C_N]
        if (
            xyxy.shape[0] != m
            or xyxy.shape[1] != 4
            or classes.shape[0] != m
            or out_id.shape[0] < m
            or out_age.shape[0] < m
            or out_journey.shape[0] < m
            or iou.shape[1] < m
            or iw.shape[1] < m
            or sub.shape[0] < iou.shape[0] * iou.shape[1]
        ):
            return MISFIT
        for j in range(m):
            out_id[j] = 0
            out_age[j] = 0
            out_journey[j] = 0
        if n:
            _predict(dt, f4, state, n)
            since, age = f1[S_SINCE], f1[S_AGE]
            for i in range(n):
                since[i] += dt
                age[i] += dt
        nhi = 0
        nlo = 0
        for j in range(m):
            s = scores[j]
            if s >= thr[T_HIGH]:
                iw[W_HI, nhi] = j
                iw[W_LEFT, nhi] = j
                nhi += 1
            elif s >= thr[T_LOW]:
                iw[W_LO, nlo] = j
                nlo += 1
        hdr[H_M] = m
        hdr[H_NHI] = nhi
        hdr[H_NLO] = nlo
        hdr[H_NLEFT] = nhi
        for i in range(n):
            iw[W_HIT, i] = 0
        if n and m:
            _iou(xyxy, classes, par, f4, cls, n, m, iou)
        stage = 0
    else:
        _solved(resume, x, par, sub, iw)
        stage = resume + 1
    n = cnt[C_N]
    while stage < 3:
        if _associate(stage, scores, par, state, n, iou, sub, iw):
            return stage
        stage += 1
    _update_tracks(xyxy, classes, par, f4, f1, i8, cls, state, edge, cnt, iw, out_id, out_age, out_journey)
    # 4: new tentative tracks from the high detections nobody took
    k = 0
    for q in range(hdr[H_NLEFT]):
        j = iw[W_LEFT, q]
        if scores[j] >= thr[T_NEW]:
            iw[W_POOL, k] = j
            k += 1
    if k:
        _add(xyxy, classes, par, f4, f1, i8, cls, state, edge, cnt, iw, k, out_id, out_journey)
    return DONE


#: What ``track_step`` calls: compiled with it, into its machine code (and its disk cache).
HELPERS: tuple[Callable[..., Any], ...] = (
    _max,
    _min,
    _label,
    _cxcywh,
    _predict,
    _correct,
    _iou,
    _cost,
    _stage_of,
    _pair,
    _paired,
    _associate,
    _solved,
    _link,
    _remove,
    _update_tracks,
    _add,
)
#: What ``jit.load`` compiles.
KERNELS: tuple[Callable[..., Any], ...] = (track_step,)


def bind() -> None:
    """Point this module's helper names at compiled versions, before ``track_step``
    compiles: numba resolves a kernel's calls by name then, and calls only compiled
    functions. They need no cache of their own: their code is linked into
    ``track_step``'s, which a cached start loads whole (the helpers then compile never)."""
    import numba  # (here only: called when jit.load has numba loaded)

    g = globals()
    for f in HELPERS:
        g[f.__name__] = numba.njit(nogil=True)(f)
