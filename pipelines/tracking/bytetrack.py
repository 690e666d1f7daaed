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

Its settings are the source's ``TrackerConfig`` (``core/source_config.py``); costs and
accuracy measured (tools/tracking): docs/tracking.md.
"""

from __future__ import annotations

import numpy as np

from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.tracking.assign import assign

TENTATIVE, TRACKED, LOST = 0, 1, 2
#: BoT-SORT's noise: standard deviations as fractions of the box's width and height.
STD_POS = 1.0 / 20
STD_VEL = 1.0 / 160


class ByteTracker:
    """One source's tracks. ``update`` per frame; the arrays hold the live tracks in their
    first ``n`` rows."""

    def __init__(self, config: TrackerConfig) -> None:
        self.config = p = config
        self._match_cost = 1.0 - p.match_iou
        self._low_cost = 1.0 - p.low_match_iou
        self._unconf_cost = 1.0 - p.unconfirmed_iou
        cap = p.max_tracks
        self.n = 0
        self.next_id = 1
        self.overflow = 0  # new tracks refused by the cap
        self.pos = np.zeros((cap, 4))  # cx, cy, w, h
        self.vel = np.zeros((cap, 4))
        self.p_pp = np.zeros((cap, 4))  # per coordinate: position variance,
        self.p_pv = np.zeros((cap, 4))  # position-velocity covariance,
        self.p_vv = np.zeros((cap, 4))  # velocity variance
        self.ids = np.zeros(cap, np.int64)  # 0 until confirmed
        self.cls = np.zeros(cap, np.int32)
        self.hits = np.zeros(cap, np.int64)
        self.state = np.zeros(cap, np.int8)
        self.since = np.zeros(cap)  # frames since the last hit
        self.age = np.zeros(cap)  # frames since the first hit
        self._arrays = (
            self.pos, self.vel, self.p_pp, self.p_pv, self.p_vv,
            self.ids, self.cls, self.hits, self.state, self.since, self.age,
        )  # fmt: skip
        # scratch, reused every frame
        self._scale = np.zeros((cap, 4))
        self._tmp = np.zeros((cap, 4))
        self._box = np.zeros((cap, 4))  # predicted xyxy
        self._z = np.zeros((cap, 4))  # the matched detection per track (cx, cy, w, h)
        self._dets = np.zeros((cap, 4))  # the frame's detections (cx, cy, w, h)
        self._gain = np.zeros((cap, 4))
        self._hit = np.zeros(cap, bool)
        self._det_of = np.zeros(cap, np.intp)

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
    ) -> None:
        """One frame's detections (``xyxy`` (m, 4), ``scores``, ``classes``), ``dt`` frames
        after the previous update. Writes each detection's track id into ``out_id`` (0: not
        part of a confirmed track) and its track's age in frames into ``out_age``."""
        p = self.config
        m = len(scores)
        out_id[:m] = 0
        out_age[:m] = 0
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
        iou = _iou(box, xyxy) if n and m else None
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
                _xyxy_to_cxcywh(xyxy, self._dets[:m])
                self._z[rows] = self._dets[d]
                self._correct(hit)
                self.cls[rows] = classes[d]
                self.hits[rows] += 1
                self.since[rows] = 0.0
                confirmed = rows[(state[rows] != TENTATIVE) | (self.hits[rows] >= p.confirm_frames)]
                for i in confirmed[self.ids[confirmed] == 0]:
                    self.ids[i] = self.next_id
                    self.next_id += 1
                state[confirmed] = TRACKED
                out_id[d] = self.ids[rows]
                out_age[d] = self.age[rows] + 0.5  # whole frames (truncated by the int array)
                unconfirmed = d[state[rows] == TENTATIVE]
                out_id[unconfirmed] = 0
                out_age[unconfirmed] = 0
            # misses: tentative tracks go, tracked ones are lost, lost ones go after M frames
            state[(state == TRACKED) & ~hit] = LOST
            gone = ((state == TENTATIVE) & ~hit) | (self.since[:n] > p.lost_frames)
            if gone.any():
                self._remove(~gone)
        # 4: new tentative tracks from the high detections nobody took
        if len(hi_left):
            fresh = hi_left[scores[hi_left] >= p.new_track_score]
            if len(fresh):
                self._add(xyxy, classes, fresh, out_id)

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

    def _remove(self, keep: np.ndarray) -> None:
        k = int(keep.sum())
        for a in self._arrays:
            a[:k] = a[: self.n][keep]
        self.n = k

    def _add(self, xyxy: np.ndarray, classes: np.ndarray, dets: np.ndarray, out_id: np.ndarray) -> None:
        """New tracks from detections ``dets``: tentative, or confirmed at once (with their
        ids written to ``out_id``) when one hit confirms a track."""
        n, k = self.n, len(dets)
        room = len(self.ids) - n
        if k > room:  # the later detections are refused: counted
            self.overflow += k - room
            k = room
            if not k:
                return
        dets = dets[:k]
        new = slice(n, n + k)
        _xyxy_to_cxcywh(xyxy[dets], self.pos[new])
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
        if self.config.confirm_frames <= 1:
            self.ids[new] = np.arange(self.next_id, self.next_id + k)
            self.next_id += k
            self.state[new] = TRACKED
            out_id[dets] = self.ids[new]
        else:
            self.ids[new] = 0
            self.state[new] = TENTATIVE
        self.n = n + k  # last: a heartbeat counting meanwhile sees whole rows only


def _without(index: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """``index`` without the entries at ``positions``."""
    if not len(positions):
        return index
    keep = np.ones(len(index), bool)
    keep[positions] = False
    return index[keep]


def _xyxy_to_cxcywh(xyxy: np.ndarray, out: np.ndarray) -> None:
    np.subtract(xyxy[:, 2:], xyxy[:, :2], out=out[:, 2:])
    np.multiply(out[:, 2:], 0.5, out=out[:, :2])
    out[:, :2] += xyxy[:, :2]


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box of ``a`` (n, 4 xyxy) with every box of ``b`` (m, 4 xyxy)."""
    ix = np.minimum(a[:, None, 2], b[None, :, 2])
    ix -= np.maximum(a[:, None, 0], b[None, :, 0])
    np.maximum(ix, 0.0, out=ix)
    iy = np.minimum(a[:, None, 3], b[None, :, 3])
    iy -= np.maximum(a[:, None, 1], b[None, :, 1])
    np.maximum(iy, 0.0, out=iy)
    ix *= iy  # intersection
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :]
    union -= ix
    np.maximum(union, 1e-9, out=union)
    ix /= union
    return ix
