"""A ByteTrack-class multi-object tracker over one source's detections.

- Association in three stages (ByteTrack, with BoT-SORT's Kalman state): detections
  scored at least ``high_score`` against every confirmed track, tracked or lost, on IoU
  fused with the score; then those in [``low_score``, ``high_score``) against the tracked
  ones left,
  which keeps a track through an occlusion where the detector's score drops; then the new
  (tentative) tracks against the high detections left. A high detection nobody took, scored
  at least ``new_track_score``, starts a tentative track, confirmed after
  ``confirm_frames`` hits;
  a tentative track that misses a frame is dropped.
- Constant-velocity Kalman filter on (cx, cy, w, h), each coordinate with its velocity:
  with a diagonal process and measurement noise the covariance stays block-diagonal, so
  each track holds three numbers per coordinate (position variance, covariance, velocity
  variance) and the filter is a dozen array operations over all tracks, not a batch of
  8x8 matrix products; it equals the full filter exactly.
- Elapsed time: ``update`` takes the frames since the previous call (a lane that skipped
  frames, a ladder stride), and prediction, process noise and "lost for M frames" count in
  frames, not calls.
- Bounded state, preallocated: at most ``max_tracks`` live tracks in fixed arrays; a track
  lost for more than ``lost_frames`` is removed at once (nothing is kept of it), and
  a new track beyond the cap is refused and counted (``overflow``). Ids are never reused.
- Journeys (``journeys``): a track confirmed while a confirmed track is lost, near where
  the lost one's motion puts it, with a label it had, continues that track's journey (the
  lost track ends). A track keeps its own id; the
  journey carries the first track's id, which counting keys on (``analytics/counter.py``):
  an object whose track broke while hidden is counted once, on its journey's path.

- Compiled (``track_kernels.py``, loaded by ``pipelines/jit.py``): inside the agent a
  frame's tracking starts with caches the inference just filled, and the numpy path's
  ~150 small calls cost ~15 us each cold; one native call a frame (two or more where two
  tracks want one detection: the solver, ``lap``, runs between them) does the same work on
  the same arrays. The numpy path is the reference: the tests run both over the same
  frames and require equal results, state included. It runs where numba does not load
  (``EDGE_AGENT_KERNELS=numpy``, absent, or a kernel fails to compile: ``compiled`` is
  False, ``jit.state()`` says why), and for a frame whose arrays are not the dtypes the
  kernel was compiled for (float32 boxes and scores, int32 classes, C order).

Its settings are the source's ``TrackerConfig`` (``core/source_config.py``); costs and
accuracy measured (tools/tracking): docs/tracking.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines import jit
from edge_agent.pipelines.tracking import track_kernels as tk
from edge_agent.pipelines.tracking.assign import assign, solve
from edge_agent.pipelines.tracking.boxes import box_iou, xyxy_to_cxcywh
from edge_agent.pipelines.tracking.track_kernels import (
    CLASS_BITS,
    EDGE_LOST,
    EDGE_PX,
    LOST,
    SIZE_KEEP,
    STD_POS,
    STD_VEL,
    TENTATIVE,
    TRACKED,
)


class _Counter:
    """One of the tracker's counters: a number in the array the kernel updates (``_cnt``)."""

    def __init__(self, index: int) -> None:
        self.index = index

    def __get__(self, obj: ByteTracker | None, owner: type | None = None):
        return self if obj is None else int(obj._cnt[self.index])

    def __set__(self, obj: ByteTracker, value: int) -> None:
        obj._cnt[self.index] = value


class ByteTracker:
    """One source's tracks. ``update`` per frame; the arrays hold the live tracks in their
    first ``n`` rows. ``compiled``: whether its frames run the kernels (``compiled=False``:
    the numpy path, whatever loads)."""

    def __init__(self, config: TrackerConfig, *, compiled: bool = True) -> None:
        self._setup(config, _kernels() if compiled else None)

    def _setup(self, config: TrackerConfig, kernels: dict[str, Callable[..., Any]] | None) -> None:
        self.config = p = config
        self._match_cost = 1.0 - p.match_iou
        self._low_cost = 1.0 - p.low_match_iou
        self._unconf_cost = 1.0 - p.unconfirmed_iou
        cap = p.max_tracks
        # The state, in a few blocks the kernel takes whole (each argument of a compiled
        # call costs ~0.1 us); the named arrays are views of them.
        self._f4 = np.zeros((5, cap, 4))
        self._f1 = np.zeros((3, cap))
        self._i8 = np.zeros((4, cap), np.int64)
        self._cnt = np.zeros(4, np.int64)  # n, next_id, overflow, links (the properties)
        self.next_id = 1
        self.pos, self.vel = self._f4[tk.F_POS], self._f4[tk.F_VEL]  # cx, cy, w, h; their velocity
        self.p_pp = self._f4[tk.F_PP]  # per coordinate: position variance,
        self.p_pv = self._f4[tk.F_PV]  # position-velocity covariance,
        self.p_vv = self._f4[tk.F_VV]  # velocity variance
        self.since = self._f1[tk.S_SINCE]  # frames since the last hit
        self.age = self._f1[tk.S_AGE]  # frames since the first hit
        self.size = self._f1[tk.S_SIZE]  # its size, sqrt(w h), as it was seen whole lately
        self.ids = self._i8[tk.I_IDS]  # 0 until confirmed
        self.hits = self._i8[tk.I_HITS]
        self.labels = self._i8[tk.I_LABELS]  # the classes its detections had (a bit each)
        self.journey = self._i8[tk.I_JOURNEY]  # the journey it continues (0 until confirmed)
        self.cls = np.zeros(cap, np.int32)
        self.state = np.zeros(cap, np.int8)
        self.edge = np.zeros(cap, bool)  # lost on the view's edge (it left the view)
        self._arrays = (
            self.pos, self.vel, self.p_pp, self.p_pv, self.p_vv, self.ids, self.cls, self.hits,
            self.state, self.since, self.age, self.labels, self.journey, self.edge, self.size,
        )  # fmt: skip
        # the settings as the kernel reads them
        self._limits = (self._match_cost, self._low_cost, self._unconf_cost)  # per stage
        self._par = np.zeros(tk.N_PAR)
        self._par[[tk.P_MATCH_COST, tk.P_LOW_COST, tk.P_UNCONF_COST]] = self._limits
        self._par[tk.P_CONFIRM] = p.confirm_frames
        self._par[tk.P_LOST] = p.lost_frames
        self._par[tk.P_EDGE_LOST] = min(EDGE_LOST, p.lost_frames)
        self._par[tk.P_PER_CLASS] = p.per_class
        self._par[tk.P_JOURNEYS] = p.journeys
        self._par[tk.P_RADIUS] = p.journey_radius
        # (float32: numpy compares float32 scores with a setting cast to float32)
        self._thr = np.array([p.high_score, p.low_score, p.new_track_score], np.float32)
        # The view's size (pixels), when the caller knows it: a track whose last detection
        # touched its edge has left it when it is lost (neither recovered nor linked).
        self.view = None
        # scratch, reused every frame
        self._scale = np.zeros((cap, 4))
        self._tmp = np.zeros((cap, 4))
        self._box = np.zeros((cap, 4))  # predicted xyxy
        self._z = np.zeros((cap, 4))  # the matched detection per track (cx, cy, w, h)
        self._dets = np.zeros((cap, 4))  # the frame's detections (cx, cy, w, h)
        self._gain = np.zeros((cap, 4))
        self._hit = np.zeros(cap, bool)
        self._det_of = np.zeros(cap, np.intp)
        self._step = kernels["track_step"] if kernels is not None else None
        self.compiled = self._step is not None
        if self.compiled:  # the kernel's scratch; it grows once to the most detections a frame had
            self._room = 0
            self._grow(32)
            self._no_x = np.zeros(0, np.int32)

    def _grow(self, m: int) -> None:
        cap = len(self.ids)
        self._room = m = -(-m // 32) * 32
        self._iou = np.zeros((cap, m))  # each track's predicted box against each detection
        self._sub = np.zeros(cap * m)  # a cost matrix for the solver (a x b, flat)
        self._iw = np.zeros((tk.N_W, max(cap, m)), np.int64)  # index lists and counts
        self._no_journey = np.zeros(m, np.int64)  # out_journey when the caller has none

    # Counters: in an array the kernel updates; read and set as numbers.
    n = _Counter(tk.C_N)  # live tracks, in the arrays' first rows
    next_id = _Counter(tk.C_NEXT_ID)
    overflow = _Counter(tk.C_OVERFLOW)  # new tracks refused by the cap
    links = _Counter(tk.C_LINKS)  # tracks that continued a journey

    @property
    def view(self) -> tuple[float, float] | None:
        return self._view

    @view.setter
    def view(self, size: tuple[float, float] | None) -> None:
        self._view = None if size is None else (float(size[0]), float(size[1]))
        known = (1.0, *self._view) if self._view is not None else (0.0, 0.0, 0.0)
        self._par[[tk.P_VIEW, tk.P_VIEW_W, tk.P_VIEW_H]] = known

    @property
    def live(self) -> int:
        return self.n

    def counts(self) -> tuple[int, int, int]:
        """(tentative, tracked, lost) tracks now."""
        s = self.state[: self.n]
        return int((s == TENTATIVE).sum()), int((s == TRACKED).sum()), int((s == LOST).sum())

    # -- Kalman --------------------------------------------------------------------------

    def _wh(self, n: int) -> np.ndarray:
        """(n, 4): each coordinate's scale (w, h, w, h) of the current state, in scratch."""
        s = self._scale[:n]
        s[:, :2] = self.pos[:n, 2:]
        s[:, 2:] = self.pos[:n, 2:]
        np.maximum(s, 1e-3, out=s)
        return s

    def _predict(self, dt: float) -> None:
        n = self.n
        vel, pos = self.vel[:n], self.pos[:n]
        # a lost track's size stops changing (BoT-SORT)
        vel[self.state[:n] == LOST, 2:] = 0.0
        s = self._wh(n)
        np.square(s, out=s)
        tmp = self._tmp[:n]
        np.multiply(vel, dt, out=tmp)
        pos += tmp
        pp, pv, vv = self.p_pp[:n], self.p_pv[:n], self.p_vv[:n]
        # P' = F P F' + Q, per coordinate with F = [[1, dt], [0, 1]]
        np.multiply(pv, 2.0 * dt, out=tmp)
        pp += tmp
        np.multiply(vv, dt * dt, out=tmp)
        pp += tmp
        np.multiply(vv, dt, out=tmp)
        pv += tmp
        np.multiply(s, STD_POS * STD_POS * dt, out=tmp)
        pp += tmp
        np.multiply(s, STD_VEL * STD_VEL * dt, out=tmp)
        vv += tmp

    def _correct(self, hit: np.ndarray) -> None:
        """The Kalman update of every track hit (``hit``), toward ``self._z``."""
        n = self.n
        pos, vel = self.pos[:n], self.vel[:n]
        pp, pv, vv = self.p_pp[:n], self.p_pv[:n], self.p_vv[:n]
        s = self._wh(n)
        np.square(s, out=s)
        s *= STD_POS * STD_POS
        s += pp  # innovation variance
        gain, tmp, z = self._gain[:n], self._tmp[:n], self._z[:n]
        np.divide(pp, s, out=gain)
        gain[~hit] = 0.0
        z -= pos  # innovation (rows not hit: anything, their gain is 0)
        np.multiply(gain, z, out=tmp)
        pos += tmp
        np.divide(pv, s, out=s)  # velocity gain
        s[~hit] = 0.0
        np.multiply(s, z, out=tmp)
        vel += tmp
        np.multiply(s, pv, out=tmp)
        vv -= tmp
        np.subtract(1.0, gain, out=gain)
        pv *= gain
        pp *= gain

    # -- one frame -----------------------------------------------------------------------

    def update(
        self,
        xyxy: np.ndarray,
        scores: np.ndarray,
        classes: np.ndarray,
        dt: float,
        out_id: np.ndarray,
        out_age: np.ndarray,
        out_journey: np.ndarray | None = None,
    ) -> None:
        """One frame's detections (``xyxy`` (m, 4), ``scores``, ``classes``), ``dt`` frames
        after the previous update. Writes each detection's track id into ``out_id`` (0: not
        part of a confirmed track), its track's age in frames into ``out_age`` and its
        journey into ``out_journey`` (0 where the id is)."""
        if self._step is not None:
            journey = self._no_journey if out_journey is None else out_journey
            if len(scores) > self._room:
                self._grow(len(scores))
            args = (
                xyxy, scores, classes, self._thr, self._par, self._f4, self._f1, self._i8, self.cls,
                self.state, self.edge, self._cnt, self._iou, self._sub, self._iw, out_id, out_age, journey,
            )  # fmt: skip
            dt = float(dt)
            try:
                stage = self._step(-1, self._no_x, dt, *args)
            except TypeError:  # not the dtypes or layouts it was compiled for (nothing ran)
                stage = tk.MISFIT
            while stage >= 0:  # two tracks want one detection: the solver, then the rest
                hdr = self._iw[tk.W_HDR]
                a, b = int(hdr[tk.H_A]), int(hdr[tk.H_B])
                x = solve(self._sub[: a * b].reshape(a, b), self._limits[stage])
                stage = self._step(stage, x, dt, *args)
            if stage == tk.DONE:
                return
        self._update_numpy(xyxy, scores, classes, dt, out_id, out_age, out_journey)

    def _update_numpy(
        self,
        xyxy: np.ndarray,
        scores: np.ndarray,
        classes: np.ndarray,
        dt: float,
        out_id: np.ndarray,
        out_age: np.ndarray,
        out_journey: np.ndarray | None,
    ) -> None:
        """``update`` in numpy: the reference the kernel's results equal."""
        p = self.config
        m = len(scores)
        out_id[:m] = 0
        out_age[:m] = 0
        if out_journey is not None:
            out_journey[:m] = 0
        if self.n:
            self._predict(dt)
            self.since[: self.n] += dt
            self.age[: self.n] += dt
        n = self.n
        state = self.state[:n]
        box = self._box[:n]
        pos = self.pos[:n]
        np.multiply(pos[:, 2:], 0.5, out=box[:, 2:])
        np.subtract(pos[:, :2], box[:, 2:], out=box[:, :2])
        np.add(pos[:, :2], box[:, 2:], out=box[:, 2:])
        hi = (scores >= p.high_score).nonzero()[0]
        lo = ((scores >= p.low_score) & (scores < p.high_score)).nonzero()[0]
        hit, det_of = self._hit[:n], self._det_of[:n]
        hit[:] = False
        iou = box_iou(box, xyxy) if n and m else None
        if iou is not None and p.per_class:
            iou *= self.cls[:n, None] == classes[None, :]

        # 1: high detections against the confirmed tracks, tracked and lost
        hi_left = hi
        if iou is not None and len(hi):
            pool = (state != TENTATIVE).nonzero()[0]
            if len(pool):
                r, c = self._match(iou, pool, hi, scores, self._match_cost)
                hit[r] = True
                det_of[r] = hi[c]
                hi_left = _without(hi, c)
        # 2: low detections against the tracked tracks left (not the lost ones)
        if iou is not None and len(lo):
            pool = ((state == TRACKED) & ~hit).nonzero()[0]
            if len(pool):
                r, c = self._match(iou, pool, lo, None, self._low_cost)
                hit[r] = True
                det_of[r] = lo[c]
        # 3: tentative tracks against the high detections left
        if iou is not None and len(hi_left):
            pool = (state == TENTATIVE).nonzero()[0]
            if len(pool):
                r, c = self._match(iou, pool, hi_left, scores, self._unconf_cost)
                hit[r] = True
                det_of[r] = hi_left[c]
                hi_left = _without(hi_left, c)

        if n:
            rows = hit.nonzero()[0]
            if len(rows):
                d = det_of[rows]
                if m > len(self._dets):  # grows once to the most detections a frame had
                    self._dets = np.zeros((m, 4))
                xyxy_to_cxcywh(xyxy, self._dets[:m])
                z = self._dets[d]
                self._z[rows] = z
                self._correct(hit)
                self._observe(rows, z, classes[d])
                self.cls[rows] = classes[d]
                self.hits[rows] += 1
                self.since[rows] = 0.0
                confirmed = rows[(state[rows] != TENTATIVE) | (self.hits[rows] >= p.confirm_frames)]
                born = confirmed[self.ids[confirmed] == 0]
                for i in born:
                    self.ids[i] = self.journey[i] = self.next_id
                    self.next_id += 1
                state[confirmed] = TRACKED
                if p.journeys and len(born):
                    self.since[self._link(born)] = p.lost_frames + 1.0  # they end in this frame
                out_id[d] = self.ids[rows]
                out_age[d] = self.age[rows] + 0.5  # whole frames (truncated by the int array)
                if out_journey is not None:
                    out_journey[d] = self.journey[rows]
                unconfirmed = d[state[rows] == TENTATIVE]
                out_id[unconfirmed] = 0
                out_age[unconfirmed] = 0
            # misses: tentative tracks go, tracked ones are lost, lost ones go after M frames
            # (and a lost one whose journey a new track took, at once: its ``since`` is past)
            newly = ((state == TRACKED) & ~hit).nonzero()[0]
            state[newly] = LOST
            self._left_view(newly)
            gone = ((state == TENTATIVE) & ~hit) | (self.since[:n] > p.lost_frames)
            gone |= (state == LOST) & self.edge[:n] & (self.since[:n] > min(EDGE_LOST, p.lost_frames))
            if gone.any():
                self._remove(~gone)
        # 4: new tentative tracks from the high detections nobody took
        if len(hi_left):
            fresh = hi_left[scores[hi_left] >= p.new_track_score]
            if len(fresh):
                self._add(xyxy, classes, fresh, out_id, out_journey)

    def _match(
        self, iou: np.ndarray, rows: np.ndarray, cols: np.ndarray, scores: np.ndarray | None, limit: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The assignment of tracks ``rows`` to detections ``cols`` on 1 - IoU (times the
        detection's score when ``scores`` is given): (track rows, positions in ``cols``)."""
        sim = iou if len(rows) == len(iou) else iou[rows]
        if len(cols) != sim.shape[1]:
            sim = sim[:, cols]
        if scores is not None:
            sim = sim * scores[cols]
        r, c = assign(1.0 - sim, limit)
        return rows[r], c

    # -- observations and journeys -------------------------------------------------------

    def _observe(self, rows: np.ndarray, z: np.ndarray, classes: np.ndarray) -> None:
        """Tracks ``rows`` took detections ``z`` (cx, cy, w, h) of ``classes``: their size
        as seen whole lately and their labels, for the journey gate."""
        self.size[rows] = np.maximum(np.sqrt(z[:, 2] * z[:, 3]), SIZE_KEEP * self.size[rows])
        self.labels[rows] |= np.left_shift(1, np.minimum(classes, CLASS_BITS).astype(np.int64))

    def _left_view(self, rows: np.ndarray) -> None:
        """Whether tracks ``rows``, just lost, touch the view's edge (within ``EDGE_PX`` and a
        tenth of their size: a detector's box of a half-visible object wavers): they left it."""
        if self.view is None or not len(rows):
            return
        pos = self.pos[rows]
        reach = pos[:, 2:] * 0.6 + EDGE_PX  # half the box and its margin
        near = (pos[:, :2] <= reach) | (pos[:, :2] >= np.array(self.view) - reach)
        self.edge[rows] = near[:, 0] | near[:, 1]

    def _link(self, born: np.ndarray) -> np.ndarray:
        """Tracks ``born`` (confirmed in this frame) continue the journey of a lost track
        whose object they can be: it was last seen before they were first (no overlap in
        time), not on the view's edge, within ``lost_frames``; it had a label of theirs; its
        size (as seen whole lately) is within half to twice theirs; and they are within its
        gate: around where the Kalman filter puts it now (its last state moved on at its
        velocity), a radius of ``journey_radius`` of its size plus the way it would have
        gone (a stop, a turn or a change of speed behind an occluder lands within). The
        nearest (relative to its gate) wins, one each. Returns the lost tracks whose journeys
        went on: they end (the caller removes them)."""
        n = self.n
        p = self.config
        # (a lost track hit in this frame is tracked again by now)
        lost = ((self.state[:n] == LOST) & ~self.edge[:n] & (self.since[:n] <= p.lost_frames)).nonzero()[0]
        if not len(lost):
            return lost
        since = self.since[lost]
        vel = self.vel[lost, :2]
        at = self.pos[lost, :2]  # where the Kalman filter puts it now
        size = self.size[lost]
        radius = p.journey_radius * size + np.hypot(vel[:, 0], vel[:, 1]) * since
        c = self.pos[born, :2]
        dist = np.hypot(at[:, None, 0] - c[None, :, 0], at[:, None, 1] - c[None, :, 1]) / radius[:, None]
        ratio = size[:, None] / self.size[None, born]
        ok = (ratio <= 2.0) & (ratio >= 0.5) & (dist <= 1.0)
        ok &= since[:, None] > self.age[None, born]
        ok &= (self.labels[lost, None] & self.labels[None, born]) != 0
        taken = np.zeros(len(lost), bool)
        for j in np.argsort(-self.hits[born], kind="stable"):  # the surest new track chooses first
            can = ok[:, j] & ~taken
            if not can.any():
                continue
            k = int(np.flatnonzero(can)[dist[can, j].argmin()])
            taken[k] = True
            self.journey[born[j]] = self.journey[lost[k]]
            self.links += 1
        return lost[taken]

    def _remove(self, keep: np.ndarray) -> None:
        k = int(keep.sum())
        for a in self._arrays:
            a[:k] = a[: self.n][keep]
        self.n = k

    def _add(
        self,
        xyxy: np.ndarray,
        classes: np.ndarray,
        dets: np.ndarray,
        out_id: np.ndarray,
        out_journey: np.ndarray | None,
    ) -> None:
        """New tracks from detections ``dets``: tentative, or confirmed at once (with their
        ids written to ``out_id`` and journeys to ``out_journey``) when one hit confirms a
        track."""
        n, k = self.n, len(dets)
        room = len(self.ids) - n
        if k > room:  # the later detections are refused: counted
            self.overflow += k - room
            k = room
            if not k:
                return
        dets = dets[:k]
        new = slice(n, n + k)
        xyxy_to_cxcywh(xyxy[dets], self.pos[new])
        self.size[new] = np.sqrt(self.pos[new, 2] * self.pos[new, 3])
        self.edge[new] = False
        self.labels[new] = np.left_shift(1, np.minimum(classes[dets], CLASS_BITS).astype(np.int64))
        self.vel[new] = 0.0
        s = self._wh(n + k)[n:]
        np.square(s, out=s)
        np.multiply(s, (2 * STD_POS) ** 2, out=self.p_pp[new])
        self.p_pv[new] = 0.0
        np.multiply(s, (10 * STD_VEL) ** 2, out=self.p_vv[new])
        self.cls[new] = classes[dets]
        self.hits[new] = 1
        self.since[new] = 0.0
        self.age[new] = 0.0
        if self.config.confirm_frames > 1:
            self.ids[new] = 0
            self.journey[new] = 0
            self.state[new] = TENTATIVE
            self.n = n + k  # last: a heartbeat counting meanwhile sees whole rows only
            return
        self.ids[new] = self.journey[new] = np.arange(self.next_id, self.next_id + k)
        self.next_id += k
        self.state[new] = TRACKED
        self.n = n + k
        if self.config.journeys:
            ended = self._link(np.arange(n, n + k))
            if len(ended):
                keep = np.ones(self.n, bool)
                keep[ended] = False
                self._remove(keep)
                n -= len(ended)  # (the new rows moved up by as many: the ended ones were before them)
        new = slice(n, n + k)
        out_id[dets] = self.ids[new]
        if out_journey is not None:
            out_journey[dets] = self.journey[new]


def _without(index: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``index`` without the entries at ``positions``."""
    if not len(positions):
        return index
    keep = np.ones(len(index), bool)
    keep[positions] = False
    return index[keep]


def _kernels() -> dict[str, Callable[..., Any]] | None:
    return jit.load("tracker", tk.KERNELS, _warm)


def _warm(kernels: dict[str, Callable[..., Any]]) -> None:
    """Compile ``track_step`` (numba compiles at a first call) with the arrays a frame
    brings, on frames where two tracks want one detection (the solver's round trip); after
    it ``jit.load`` allows no other compile: a frame of other dtypes runs the numpy path."""
    tk.bind()
    t = ByteTracker.__new__(ByteTracker)
    t._setup(TrackerConfig(max_tracks=4, confirm_frames=1), kernels)
    t.view = (64.0, 64.0)
    ids, age, journey = np.zeros(4, np.int64), np.zeros(4, np.int32), np.zeros(4, np.int64)
    pair = np.array([[10, 10, 30, 30], [12, 10, 32, 30]], np.float32)
    for xyxy in (pair, pair[:1] + 1, pair + 2, pair[:0]):
        m = len(xyxy)
        t.update(xyxy, np.full(m, 0.9, np.float32), np.zeros(m, np.int32), 1.0, ids, age, journey)
