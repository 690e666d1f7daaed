"""The counter's per-frame work as one numba kernel (``pipelines/jit.py`` compiles it):
the same rules as ``Counter``'s numpy path (``counter.py``), the tested reference, step by
step and in the same order, so both give the same counts, events and state to the bit.

One call a frame does what the numpy path does in some 80 calls: it finds each tracked
detection's journey row, computes its anchors, which zones hold them and its side of each
line, and updates the runs, entries, exits, dwell steps and crossings in the counter's own
arrays (one set of state for both paths). It records the events raised, in the numpy
path's order, as rows of two arrays; the counter makes the messages. What is rare and
moves rows (a journey that ended, a new one) it leaves to the counter's Python: it returns
``NEED_EXPIRE`` or ``NEED_ROWS`` before it changes anything.

Why it is exact, not close:

- Anchors: the numpy path multiplies the box by a matrix of ``1 - f`` and ``f``, with
  ``f`` in {0, 0.5, 1}. Each product is exact, so the sum is one rounding in any order (the
  kernel forms the same four products).
- Every other quantity is the same float64 (or, for the box's height, input dtype)
  operation on the same operands; numba, without ``fastmath``, neither reorders nor fuses
  them into FMAs.
- State gathered for the detections before it is written back, and written back in
  detection order, as numpy's fancy indexing does (two detections of one journey in a
  frame behave the same on both paths).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from edge_agent.pipelines.analytics.geometry import Geometry

NEED_EXPIRE = -1  # a journey has ended: the counter expires it, then calls again
NEED_ROWS = -2  # a journey has no row: the counter makes its row, then calls again

# event records: ev_i columns (kind, item, track id, journey id, class, direction) and
# ev_f columns (at, entered at or dwell threshold, dwell)
ENTER, EXIT, DWELL, CROSS = 0, 1, 2, 3
EV_INTS, EV_FLOATS = 6, 3


def analytics_frame(
    xyxy, classes, track_ids, journeys, frame_id, t, expire_frames, n_rows, allow_missing, n_labels,
    s_i64, s_f64, s_i8, w_i64, w_f64,
):  # fmt: skip
    """One frame of ``Counter.update`` (see ``counter.py``) on the counter's arrays: the
    number of event records written to ``ev_i`` / ``ev_f``, or ``NEED_EXPIRE`` /
    ``NEED_ROWS`` (nothing changed). ``allow_missing``: a journey without a row is not
    followed (the counter refused it) instead of ``NEED_ROWS``. The counter's state is
    three flat buffers (``s_*``), its geometry and the scratch two (``w_*``), whose head
    says where each array lies (``State``, ``work``): a dozen arguments, not fifty, as
    each costs the call its type check, which is what a frame with cold caches pays most."""
    h = w_i64
    cap, nz, nl, n_cls = h[0], h[1], h[2], h[3]
    n_kinds, n_edges, n_steps, m, n_ev, n_b = h[4], h[5], h[6], h[7], h[8], h[9]
    o = h[HEAD : HEAD + N_OFFSETS]
    ids = s_i64[o[0] : o[0] + cap]
    last_seen = s_i64[o[1] : o[1] + cap]
    track = s_i64[o[2] : o[2] + cap]
    z_run = s_i64[o[3] : o[3] + cap * nz].reshape((cap, nz))
    z_step = s_i64[o[4] : o[4] + cap * nz].reshape((cap, nz))
    z_cls = s_i64[o[5] : o[5] + cap * nz].reshape((cap, nz))
    l_run = s_i64[o[6] : o[6] + cap * nl].reshape((cap, nl))
    objects = s_i64[o[7] : o[7] + nz * n_cls].reshape((nz, n_cls))
    entered = s_i64[o[8] : o[8] + nz * n_cls].reshape((nz, n_cls))
    exited = s_i64[o[9] : o[9] + nz * n_cls].reshape((nz, n_cls))
    crossed = s_i64[o[10] : o[10] + nl * 2 * n_cls].reshape((nl, 2, n_cls))
    dwell_hist = s_i64[o[11] : o[11] + nz * (n_b + 1)].reshape((nz, n_b + 1))
    seen_t = s_f64[o[12] : o[12] + cap]
    z_run_t = s_f64[o[13] : o[13] + cap * nz].reshape((cap, nz))
    z_enter_t = s_f64[o[14] : o[14] + cap * nz].reshape((cap, nz))
    l_run_t = s_f64[o[15] : o[15] + cap * nl].reshape((cap, nl))
    dwell_sum = s_f64[o[16] : o[16] + nz]
    z_in = s_i8[o[17] : o[17] + cap * nz].reshape((cap, nz))  # bool as int8
    l_done = s_i8[o[18] : o[18] + cap * nl * 2].reshape((cap, nl, 2))  # bool as int8
    l_side = s_i8[o[19] : o[19] + cap * nl].reshape((cap, nl))
    l_pend = s_i8[o[20] : o[20] + cap * nl].reshape((cap, nl))
    edges_i = w_i64[o[21] : o[21] + n_edges * 2].reshape((n_edges, 2))
    z_min = w_i64[o[22] : o[22] + nz]
    l_min = w_i64[o[23] : o[23] + nl]
    z_labels = w_i64[o[24] : o[24] + n_cls * nz].reshape((n_cls, nz))
    l_labels = w_i64[o[25] : o[25] + n_cls * nl].reshape((n_cls, nl))
    det_i = w_i64[o[26] : o[26] + 4 * m].reshape((4, m))
    zone_i = w_i64[o[27] : o[27] + 3 * m * nz].reshape((3, m, nz))
    line_i = w_i64[o[28] : o[28] + 4 * m * nl].reshape((4, m, nl))
    ev_i = w_i64[o[29] : o[29] + n_ev * EV_INTS].reshape((n_ev, EV_INTS))
    kinds_m = w_f64[o[30] : o[30] + 4 * 2 * n_kinds].reshape((4, 2 * n_kinds))
    edges_f = w_f64[o[31] : o[31] + n_edges * 4].reshape((n_edges, 4))
    z_dwell = w_f64[o[32] : o[32] + nz * n_steps].reshape((nz, n_steps))
    lines_f = w_f64[o[33] : o[33] + nl * 7].reshape((nl, 7))
    l_anchor_m = w_f64[o[34] : o[34] + 4 * 2 * nl].reshape((4, 2 * nl))
    buckets = w_f64[o[35] : o[35] + n_b]
    anchors = w_f64[o[36] : o[36] + 2 * n_kinds].reshape((2, n_kinds))
    zone_f = w_f64[o[37] : o[37] + m * nz].reshape((m, nz))
    line_f = w_f64[o[38] : o[38] + m * nl].reshape((m, nl))
    ev_f = w_f64[o[39] : o[39] + n_ev * EV_FLOATS].reshape((n_ev, EV_FLOATS))

    # -- the journeys' rows ------------------------------------------------------------------
    for r in range(n_rows):
        if (frame_id - last_seen[r]) > expire_frames:
            return NEED_EXPIRE
    # the tracked detections and their journeys' rows (a binary search, as searchsorted)
    sel, rows, cls, known = det_i[0], det_i[1], det_i[2], det_i[3]
    k = 0
    for j in range(track_ids.shape[0]):
        if track_ids[j] > 0:
            jid = journeys[j]
            lo, hi = 0, n_rows
            while lo < hi:
                mid = (lo + hi) >> 1
                if ids[mid] < jid:
                    lo = mid + 1
                else:
                    hi = mid
            if lo < n_rows and ids[lo] == jid:
                sel[k] = j
                rows[k] = lo
                k += 1
            elif not allow_missing:
                return NEED_ROWS
    if k == 0:
        return 0
    top = objects.shape[1] - 1
    for i in range(k):
        j, r = sel[i], rows[i]
        c = np.int64(classes[j])
        known[i] = 1 if (classes[j] >= 0 and classes[j] < n_labels) else 0
        cls[i] = 0 if c < 0 else (top if c > top else c)
        last_seen[r] = frame_id
        seen_t[r] = t
        track[r] = track_ids[j]
    ne = 0  # event records written

    # -- zones: which hold each anchor (Geometry.inside), then Counter._zones --------------
    if nz:
        inside, z_run_k, z_step_k = zone_i[0], zone_i[1], zone_i[2]
        n_kinds = anchors.shape[1]
        for i in range(k):
            j = sel[i]
            for q in range(n_kinds):
                anchors[0, q] = (
                    xyxy[j, 0] * kinds_m[0, q]
                    + xyxy[j, 1] * kinds_m[1, q]
                    + xyxy[j, 2] * kinds_m[2, q]
                    + xyxy[j, 3] * kinds_m[3, q]
                )
                anchors[1, q] = (
                    xyxy[j, 0] * kinds_m[0, n_kinds + q]
                    + xyxy[j, 1] * kinds_m[1, n_kinds + q]
                    + xyxy[j, 2] * kinds_m[2, n_kinds + q]
                    + xyxy[j, 3] * kinds_m[3, n_kinds + q]
                )
            for z in range(nz):
                inside[i, z] = 0
            for e in range(edges_f.shape[0]):
                q = edges_i[e, 0]
                px, py = anchors[0, q], anchors[1, q]
                y0 = edges_f[e, 1]
                if (y0 > py) != (edges_f[e, 2] > py):
                    x_at = py - y0
                    x_at = x_at * edges_f[e, 3]
                    x_at = x_at + edges_f[e, 0]
                    if px < x_at:
                        inside[i, edges_i[e, 1]] += 1
            counted = known[i] == 1
            c = cls[i]
            for z in range(nz):
                inside[i, z] = 1 if ((inside[i, z] & 1) == 1 and counted and z_labels[c, z] != 0) else 0
        # runs: frames in a row observed otherwise than settled
        started = False
        for i in range(k):
            r = rows[i]
            for z in range(nz):
                other = 1 if (inside[i, z] == 1) != (z_in[r, z] != 0) else 0
                run = (z_run[r, z] + 1) * other
                z_run_k[i, z] = run
                if run == 1:
                    started = True
        if started:  # gathered, then written back in order (fancy indexing's way)
            for i in range(k):
                for z in range(nz):
                    zone_f[i, z] = t if z_run_k[i, z] == 1 else z_run_t[rows[i], z]
            for i in range(k):
                for z in range(nz):
                    z_run_t[rows[i], z] = zone_f[i, z]
        # entries and exits (Counter._zone_flips and _exit), in (detection, zone) order
        for i in range(k):
            r = rows[i]
            for z in range(nz):
                if z_run_k[i, z] < z_min[z]:
                    continue
                z_run_k[i, z] = 0
                at = z_run_t[r, z]
                if inside[i, z] == 1:
                    c = cls[i]
                    z_in[r, z] = 1
                    z_enter_t[r, z] = at
                    z_step[r, z] = 0
                    z_cls[r, z] = c
                    objects[z, c] += 1
                    entered[z, c] += 1
                    ev_i[ne, 0], ev_i[ne, 1], ev_i[ne, 4] = ENTER, z, c
                    ev_i[ne, 3] = journeys[sel[i]]
                    ev_f[ne, 0] = at
                else:
                    z_in[r, z] = 0
                    c = z_cls[r, z]
                    spent = at - z_enter_t[r, z]
                    dwell = spent if spent > 0.0 else 0.0  # max(0.0, spent)
                    objects[z, c] -= 1
                    exited[z, c] += 1
                    b = 0
                    while b < buckets.shape[0] and buckets[b] < dwell:  # searchsorted, left
                        b += 1
                    dwell_hist[z, b] += 1
                    dwell_sum[z] += dwell
                    ev_i[ne, 0], ev_i[ne, 1], ev_i[ne, 4] = EXIT, z, c
                    ev_i[ne, 3] = ids[r]
                    ev_f[ne, 0], ev_f[ne, 1], ev_f[ne, 2] = at, z_enter_t[r, z], dwell
                ev_i[ne, 2] = track_ids[sel[i]]
                ev_i[ne, 5] = 0
                ne += 1
        for i in range(k):
            for z in range(nz):
                z_run[rows[i], z] = z_run_k[i, z]
        # dwell steps of the tracks inside
        if z_dwell.shape[1] > 1:
            fired = False
            for i in range(k):
                for z in range(nz):
                    z_step_k[i, z] = z_step[rows[i], z]
            for i in range(k):
                r = rows[i]
                for z in range(nz):
                    if z_in[r, z] == 0:
                        continue
                    due = z_dwell[z, z_step_k[i, z]]
                    if t - z_enter_t[r, z] >= due:
                        ev_i[ne, 0], ev_i[ne, 1], ev_i[ne, 2] = DWELL, z, track_ids[sel[i]]
                        ev_i[ne, 3], ev_i[ne, 4], ev_i[ne, 5] = journeys[sel[i]], cls[i], 0
                        ev_f[ne, 0], ev_f[ne, 1], ev_f[ne, 2] = t, z_enter_t[r, z], due
                        ne += 1
                        z_step_k[i, z] += 1
                        fired = True
            if fired:
                for i in range(k):
                    for z in range(nz):
                        z_step[rows[i], z] = z_step_k[i, z]

    # -- lines: each anchor's side (Geometry.sides), then Counter._lines --------------------
    if nl:
        side, cur, pend, run_k = line_i[0], line_i[1], line_i[2], line_i[3]
        started = False
        for i in range(k):
            j, r, c = sel[i], rows[i], cls[i]
            h = xyxy[j, 3] - xyxy[j, 1]  # in the boxes' dtype, as numpy takes it
            for m in range(nl):
                px = (
                    xyxy[j, 0] * l_anchor_m[0, m]
                    + xyxy[j, 1] * l_anchor_m[1, m]
                    + xyxy[j, 2] * l_anchor_m[2, m]
                    + xyxy[j, 3] * l_anchor_m[3, m]
                )
                py = (
                    xyxy[j, 0] * l_anchor_m[0, nl + m]
                    + xyxy[j, 1] * l_anchor_m[1, nl + m]
                    + xyxy[j, 2] * l_anchor_m[2, nl + m]
                    + xyxy[j, 3] * l_anchor_m[3, nl + m]
                )
                rx = px - lines_f[m, 0]
                ry = py - lines_f[m, 1]
                dx, dy = lines_f[m, 2], lines_f[m, 3]
                cross = dx * ry - dy * rx
                cross = cross * lines_f[m, 6]
                band = h * lines_f[m, 5]
                s = 2
                if cross > band:
                    s = 1
                if cross <= -band:
                    s = -1
                along = dx * rx + dy * ry
                if along < 0 or along > lines_f[m, 4]:
                    s = 0
                if not (known[i] == 1 and l_labels[c, m] != 0):
                    s = 0
                side[i, m] = s
                # the run on the observed side
                settled = np.int64(l_side[r, m])
                p = np.int64(l_pend[r, m])
                run = l_run[r, m]
                if s == 0:
                    settled = 0
                if s != 2:  # within the band the run neither grows nor ends
                    moving = s != 0 and s != settled
                    if moving:
                        run = run + 1 if s == p else 1
                        p = s
                    else:
                        run, p = 0, 0
                cur[i, m], pend[i, m], run_k[i, m] = settled, p, run
                if run == 1:
                    started = True
        if started:
            for i in range(k):
                for m in range(nl):
                    line_f[i, m] = t if run_k[i, m] == 1 else l_run_t[rows[i], m]
            for i in range(k):
                for m in range(nl):
                    l_run_t[rows[i], m] = line_f[i, m]
        # crossings, once per journey and direction, in (detection, line) order
        for i in range(k):
            r = rows[i]
            for m in range(nl):
                if run_k[i, m] < l_min[m]:
                    continue
                new = side[i, m]
                was = cur[i, m]
                cur[i, m] = new
                run_k[i, m] = 0
                if was == 0:
                    continue  # the first side known: nothing crossed
                d = 0 if new > 0 else 1
                if l_done[r, m, d] != 0:
                    continue
                l_done[r, m, d] = 1
                crossed[m, d, cls[i]] += 1
                ev_i[ne, 0], ev_i[ne, 1], ev_i[ne, 2] = CROSS, m, track_ids[sel[i]]
                ev_i[ne, 3], ev_i[ne, 4], ev_i[ne, 5] = journeys[sel[i]], cls[i], new
                ev_f[ne, 0], ev_f[ne, 1], ev_f[ne, 2] = l_run_t[r, m], 0.0, 0.0
                ne += 1
        for i in range(k):
            r = rows[i]
            for m in range(nl):
                l_side[r, m] = cur[i, m]
                l_pend[r, m] = pend[i, m]
                l_run[r, m] = run_k[i, m]
    return ne


# The counter's state, by dtype, in the order of the offsets in ``analytics_frame``; bool
# arrays are int8 underneath (a numpy bool view: only 0 and 1 are ever stored)
STATE_I64 = (
    "ids", "last_seen", "track", "z_run", "z_step", "z_cls", "l_run",
    "objects", "entered", "exited", "crossed", "dwell_hist",
)  # fmt: skip
STATE_F64 = ("seen_t", "z_run_t", "z_enter_t", "l_run_t", "dwell_sum")
STATE_I8 = ("z_in", "l_done", "l_side", "l_pend")
BOOLS = ("z_in", "l_done")
WORK_I64 = ("edges_i", "z_min", "l_min", "z_labels", "l_labels", "det_i", "zone_i", "line_i", "ev_i")
WORK_F64 = (
    "kinds_m",
    "edges_f",
    "z_dwell",
    "lines_f",
    "l_anchor_m",
    "buckets",
    "anchors",
    "zone_f",
    "line_f",
    "ev_f",
)
HEAD = 10  # w_i64 starts with the sizes (cap, nz, nl, n_cls, n_kinds, n_edges, n_steps, m, n_ev, n_b)
N_OFFSETS = len(STATE_I64) + len(STATE_F64) + len(STATE_I8) + len(WORK_I64) + len(WORK_F64)


def _flat(
    dtype: type, shapes: dict[str, tuple[int, ...]], start: int = 0
) -> tuple[np.ndarray, dict, list[int]]:
    """Arrays of ``shapes`` laid end to end in one zeroed buffer (from ``start``): the
    buffer, each as a C-contiguous view of it, and where each begins."""
    offsets, at = [], start
    for shape in shapes.values():
        offsets.append(at)
        at += int(np.prod(shape, dtype=np.int64))
    buf = np.zeros(max(at, 1), dtype)
    views = {
        name: buf[o : o + int(np.prod(shape, dtype=np.int64))].reshape(shape)
        for (name, shape), o in zip(shapes.items(), offsets)
    }
    return buf, views, offsets


class State(NamedTuple):
    """A counter's state arrays (``arrays``, by name), views of three flat buffers."""

    i64: np.ndarray
    f64: np.ndarray
    i8: np.ndarray
    arrays: dict[str, np.ndarray]
    sizes: tuple[int, int, int, int, int]  # cap, zones, lines, classes, dwell buckets
    offsets: list[int]


def state(cap: int, nz: int, nl: int, n_cls: int, n_hist: int) -> State:
    """Zeroed state for ``cap`` journeys, ``nz`` zones, ``nl`` lines, ``n_cls`` classes and
    ``n_hist`` dwell buckets; shapes as ``Counter`` documents them."""
    shapes = {
        "ids": (cap,), "last_seen": (cap,), "track": (cap,), "z_run": (cap, nz), "z_step": (cap, nz),
        "z_cls": (cap, nz), "l_run": (cap, nl), "objects": (nz, n_cls), "entered": (nz, n_cls),
        "exited": (nz, n_cls), "crossed": (nl, 2, n_cls), "dwell_hist": (nz, n_hist),
        "seen_t": (cap,), "z_run_t": (cap, nz), "z_enter_t": (cap, nz), "l_run_t": (cap, nl),
        "dwell_sum": (nz,),
        "z_in": (cap, nz), "l_done": (cap, nl, 2), "l_side": (cap, nl), "l_pend": (cap, nl),
    }  # fmt: skip
    i64, a, oa = _flat(np.int64, {k: shapes[k] for k in STATE_I64})
    f64, b, ob = _flat(np.float64, {k: shapes[k] for k in STATE_F64})
    i8, c, oc = _flat(np.int8, {k: shapes[k] for k in STATE_I8})
    arrays = a | b | c
    for name in BOOLS:
        arrays[name] = arrays[name].view(bool)
    return State(i64, f64, i8, arrays, (cap, nz, nl, n_cls, n_hist - 1), oa + ob + oc)


class Work(NamedTuple):
    """``analytics_frame``'s geometry and scratch (for frames of up to ``m`` detections)."""

    i64: np.ndarray
    f64: np.ndarray
    m: int
    ev_i: np.ndarray  # the event records
    ev_f: np.ndarray


def work(st: State, geo: Geometry, m: int, buckets: tuple[float, ...]) -> Work:
    """The geometry ``geo`` as ``analytics_frame`` takes it, scratch for frames of up to
    ``m`` detections, the dwell ``buckets``, and the head that says where each of them
    and ``st``'s arrays lie."""
    cap, nz, nl, n_cls, n_b = st.sizes
    n_kinds, n_edges = len(geo.kinds), len(geo.e_x0)
    n_steps = geo.z_dwell.shape[1]
    n_ev = m * (2 * nz + nl)  # at most an entry or exit, and a dwell step, per zone
    ints = {
        "edges_i": (n_edges, 2), "z_min": (nz,), "l_min": (nl,), "z_labels": (n_cls, nz),
        "l_labels": (n_cls, nl),
        "det_i": (4, m), "zone_i": (3, m, nz), "line_i": (4, m, nl), "ev_i": (n_ev, EV_INTS),
    }  # fmt: skip
    floats = {
        "kinds_m": (4, 2 * n_kinds), "edges_f": (n_edges, 4), "z_dwell": (nz, n_steps), "lines_f": (nl, 7),
        "l_anchor_m": (4, 2 * nl), "buckets": (n_b,), "anchors": (2, n_kinds), "zone_f": (m, nz),
        "line_f": (m, nl), "ev_f": (n_ev, EV_FLOATS),
    }  # fmt: skip
    w_i64, wi, oi = _flat(np.int64, ints, HEAD + N_OFFSETS)
    w_f64, wf, of = _flat(np.float64, floats)
    w_i64[:HEAD] = cap, nz, nl, n_cls, n_kinds, n_edges, n_steps, m, n_ev, n_b
    w_i64[HEAD : HEAD + N_OFFSETS] = st.offsets + oi + of
    if geo.e_kind is not None:
        wi["edges_i"][:, 0] = geo.e_kind
    if nz:
        wi["edges_i"][:, 1] = geo.e_zone.argmax(1)
    wi["z_min"][:] = geo.z_min
    wi["l_min"][:] = geo.l_min
    wi["z_labels"][:] = geo.z_labels
    wi["l_labels"][:] = geo.l_labels
    wf["kinds_m"][:] = geo.kinds_m
    wf["edges_f"][:] = np.stack([geo.e_x0, geo.e_y0, geo.e_y1, geo.e_slope], 1).reshape(-1, 4)
    wf["z_dwell"][:] = geo.z_dwell
    band = geo.l_band * np.sqrt(geo.l_len2)  # as Geometry.sides forms it
    columns = [geo.la[:, 0], geo.la[:, 1], geo.l_dir[:, 0], geo.l_dir[:, 1], geo.l_len2, band, geo.l_sign]
    wf["lines_f"][:] = np.stack(columns, 1).reshape(-1, 7)
    wf["l_anchor_m"][:] = geo.l_anchor_m
    wf["buckets"][:] = buckets
    return Work(w_i64, w_f64, m, wi["ev_i"], wf["ev_f"])
