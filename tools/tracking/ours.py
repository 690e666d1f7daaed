"""A compact ByteTrack-class tracker: the "our own" candidate of issue 32, for measuring.

- Two-stage association (ByteTrack): boxes scored >= ``high`` against every live track
  (tracked and lost); then boxes in [``low``, ``high``) against the tracked ones left,
  which keeps a track through an occlusion where the detector's score drops.
- Constant-velocity Kalman filter on (cx, cy, a, h) (ByteTrack's noise model) or on
  (cx, cy, w, h) (BoT-SORT's), batched over tracks in numpy. The time since the last
  update is given in frames (a float): a lane that processes every k-th frame passes
  ``dt=k``; prediction and process noise scale with it, and "kept M frames after its last
  hit" counts elapsed frames, not calls.
- IoU cost (optionally fused with the score, as ByteTrack does on MOT17); assignment by
  ``lap.lapjv`` or ``scipy.optimize.linear_sum_assignment``.
- A track is confirmed after ``n_init`` hits; an unconfirmed track that misses is dropped.
- Removed tracks are dropped at once (struct of arrays, compacted every update): state is
  the live tracks only; a cap on them, with a counted overflow.
"""

from __future__ import annotations

import numpy as np

TENTATIVE, TRACKED, LOST = 0, 1, 2
_STD_POS = 1.0 / 20
_STD_VEL = 1.0 / 160


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of every box in ``a`` (N, 4 xyxy) with every box in ``b`` (M, 4 xyxy)."""
    if len(a) == 0 or len(b) == 0:
        return np.zeros((len(a), len(b)))
    ix1 = np.maximum(a[:, None, 0], b[None, :, 0])
    iy1 = np.maximum(a[:, None, 1], b[None, :, 1])
    ix2 = np.minimum(a[:, None, 2], b[None, :, 2])
    iy2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(ix2 - ix1, 0, None) * np.clip(iy2 - iy1, 0, None)
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


def _assign_lap(cost: np.ndarray, limit: float):
    import lap

    _, x, _ = lap.lapjv(cost, extend_cost=True, cost_limit=limit)
    rows = np.flatnonzero(x >= 0)
    return rows, x[rows]


def _assign_scipy(cost: np.ndarray, limit: float):
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(cost)
    ok = cost[rows, cols] <= limit
    return rows[ok], cols[ok]


def _xyxy_to_xyah(b: np.ndarray) -> np.ndarray:
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    return np.column_stack([b[:, 0] + w / 2, b[:, 1] + h / 2, w / np.maximum(h, 1e-6), h])


def _xyah_to_xyxy(m: np.ndarray) -> np.ndarray:
    h = np.maximum(m[:, 3], 1e-6)
    w = m[:, 2] * h
    return np.column_stack([m[:, 0] - w / 2, m[:, 1] - h / 2, m[:, 0] + w / 2, m[:, 1] + h / 2])


def _xyxy_to_xywh(b: np.ndarray) -> np.ndarray:
    w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    return np.column_stack([b[:, 0] + w / 2, b[:, 1] + h / 2, w, h])


def _xywh_to_xyxy(m: np.ndarray) -> np.ndarray:
    w, h = np.maximum(m[:, 2], 1e-6), np.maximum(m[:, 3], 1e-6)
    return np.column_stack([m[:, 0] - w / 2, m[:, 1] - h / 2, m[:, 0] + w / 2, m[:, 1] + h / 2])


def _stds(z: np.ndarray, xywh: bool, pos: float, vel: float) -> np.ndarray:
    """Per-track standard deviations (n, 8) of a state: ByteTrack's (xyah: the aspect ratio
    gets fixed small values) or BoT-SORT's (xywh: width terms scale with the width)."""
    h = z[:, 3]
    w = z[:, 2] if xywh else h
    out = np.empty((len(z), 8))
    out[:, 0], out[:, 1], out[:, 3] = pos * w, pos * h, pos * h
    out[:, 4], out[:, 5], out[:, 7] = vel * w, vel * h, vel * h
    out[:, 2] = pos * w if xywh else 0.0
    out[:, 6] = vel * w if xywh else 0.0
    return out


class ByteTrackLite:
    """Per-source tracker. ``update`` returns the confirmed tracks hit in this frame."""

    def __init__(
        self,
        high: float = 0.5,
        low: float = 0.1,
        new_track: float = 0.6,
        match_iou: float = 0.2,
        low_match_iou: float = 0.5,
        unconfirmed_iou: float = 0.3,
        n_init: int = 2,
        max_lost_frames: float = 30.0,
        fuse_score: bool = True,
        max_tracks: int = 512,
        solver: str = "lap",
        state: str = "xyah",
    ) -> None:
        self.high, self.low, self.new_track = high, low, new_track
        self.match_cost = 1.0 - match_iou
        self.low_cost = 1.0 - low_match_iou
        self.unconf_cost = 1.0 - unconfirmed_iou
        self.n_init, self.max_lost = n_init, max_lost_frames
        self.fuse_score, self.max_tracks = fuse_score, max_tracks
        self._assign = _assign_lap if solver == "lap" else _assign_scipy
        self._xywh = state == "xywh"
        self._to_z = _xyxy_to_xywh if self._xywh else _xyxy_to_xyah
        self._to_box = _xywh_to_xyxy if self._xywh else _xyah_to_xyxy
        self.overflow = 0  # new tracks refused by the cap
        self._next_id = 1
        self._f = np.eye(8)
        self._alloc(0)

    # -- state: one row per live track ------------------------------------------------------
    def _alloc(self, n: int) -> None:
        self.mean = np.zeros((n, 8))
        self.cov = np.zeros((n, 8, 8))
        self.ids = np.zeros(n, np.int64)
        self.hits = np.zeros(n, np.int64)
        self.state = np.zeros(n, np.int8)
        self.since = np.zeros(n)  # frames since the last hit
        self.age = np.zeros(n)  # frames since the first hit

    def _keep(self, mask: np.ndarray) -> None:
        for k in ("mean", "cov", "ids", "hits", "state", "since", "age"):
            setattr(self, k, getattr(self, k)[mask])

    @property
    def live(self) -> int:
        return len(self.ids)

    # -- Kalman ------------------------------------------------------------------------------
    def _predict(self, dt: float) -> None:
        if not len(self.ids):
            return
        # ByteTrack: a lost track's height (BoT-SORT: and width) stops changing
        self.mean[self.state == LOST, 6 if self._xywh else 7 :] = 0.0
        f = self._f
        f[:4, 4:] = np.eye(4) * dt
        q = _stds(self.mean[:, :4], self._xywh, _STD_POS, _STD_VEL)
        if not self._xywh:
            q[:, 2], q[:, 6] = 1e-2, 1e-5
        self.mean = self.mean @ f.T
        self.cov = f @ self.cov @ f.T
        self.cov[:, np.arange(8), np.arange(8)] += q * q * dt

    def _correct(self, idx: np.ndarray, z: np.ndarray) -> None:
        r = _stds(self.mean[idx, :4], self._xywh, _STD_POS, 0.0)[:, :4]
        if not self._xywh:
            r[:, 2] = 1e-1
        p = self.cov[idx]
        s = p[:, :4, :4].copy()
        s[:, np.arange(4), np.arange(4)] += r * r
        k = p[:, :, :4] @ np.linalg.inv(s)  # (n, 8, 4)
        innov = z - self.mean[idx, :4]
        self.mean[idx] += (k @ innov[:, :, None])[:, :, 0]
        self.cov[idx] = p - k @ s @ k.transpose(0, 2, 1)

    def _new(self, boxes: np.ndarray) -> None:
        n = len(boxes)
        room = self.max_tracks - len(self.ids)
        if n > room:
            self.overflow += n - max(room, 0)
            boxes = boxes[: max(room, 0)]
            n = len(boxes)
        if not n:
            return
        z = self._to_z(boxes)
        mean = np.zeros((n, 8))
        mean[:, :4] = z
        std = _stds(z, self._xywh, 2 * _STD_POS, 10 * _STD_VEL)
        if not self._xywh:
            std[:, 2], std[:, 6] = 1e-2, 1e-5
        cov = np.zeros((n, 8, 8))
        cov[:, np.arange(8), np.arange(8)] = std * std
        self.mean = np.concatenate([self.mean, mean])
        self.cov = np.concatenate([self.cov, cov])
        self.ids = np.concatenate([self.ids, np.zeros(n, np.int64)])
        self.hits = np.concatenate([self.hits, np.ones(n, np.int64)])
        self.state = np.concatenate([self.state, np.full(n, TENTATIVE, np.int8)])
        self.since = np.concatenate([self.since, np.zeros(n)])
        self.age = np.concatenate([self.age, np.zeros(n)])

    # -- one frame ---------------------------------------------------------------------------
    def _match(
        self, tracks: np.ndarray, pred: np.ndarray, boxes: np.ndarray, scores, limit: float, fuse: bool
    ):
        if not len(tracks) or not len(boxes):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        sim = iou_matrix(pred[tracks], boxes)
        if fuse:
            sim = sim * scores[None, :]
        rows, cols = self._assign(1.0 - sim, limit)
        return tracks[rows], cols

    def update(self, xyxy: np.ndarray, scores: np.ndarray, dt: float = 1.0):
        """One frame's detections (N, 4 xyxy; N scores), ``dt`` frames after the last call.

        Returns (boxes (K, 4 xyxy, the filtered state), track ids (K,), detection index (K,),
        age in frames (K,)) for the confirmed tracks that a detection hit in this frame."""
        self._predict(dt)
        self.since += dt
        self.age += dt
        pred = self._to_box(self.mean[:, :4]) if len(self.ids) else np.zeros((0, 4))
        hi = np.flatnonzero(scores >= self.high)
        lo = np.flatnonzero((scores >= self.low) & (scores < self.high))
        matched_t: list[np.ndarray] = []
        matched_d: list[np.ndarray] = []

        # 1: high boxes against confirmed tracks, tracked and lost
        pool = np.flatnonzero(self.state != TENTATIVE)
        t1, c1 = self._match(pool, pred, xyxy[hi], scores[hi], self.match_cost, self.fuse_score)
        matched_t.append(t1)
        matched_d.append(hi[c1])
        hi_left = np.delete(hi, c1)
        # 2: low boxes against the tracked tracks left (not the lost ones)
        left = np.setdiff1d(pool[self.state[pool] == TRACKED], t1, assume_unique=True)
        t2, c2 = self._match(left, pred, xyxy[lo], scores[lo], self.low_cost, False)
        matched_t.append(t2)
        matched_d.append(lo[c2])
        # 3: tentative tracks against the high boxes left
        tent = np.flatnonzero(self.state == TENTATIVE)
        t3, c3 = self._match(tent, pred, xyxy[hi_left], scores[hi_left], self.unconf_cost, self.fuse_score)
        matched_t.append(t3)
        matched_d.append(hi_left[c3])
        hi_left = np.delete(hi_left, c3)

        mt = np.concatenate(matched_t)
        md = np.concatenate(matched_d)
        if len(mt):
            self._correct(mt, self._to_z(xyxy[md]))
            self.hits[mt] += 1
            self.since[mt] = 0.0
            newly = mt[(self.state[mt] == TENTATIVE) & (self.hits[mt] >= self.n_init)]
            for i in newly:
                self.ids[i] = self._next_id
                self._next_id += 1
            self.state[mt[self.state[mt] != TENTATIVE]] = TRACKED
            self.state[newly] = TRACKED
        hit = np.zeros(len(self.ids), bool)
        hit[mt] = True
        # misses: tentative ones go, tracked ones turn lost, lost ones go after max_lost frames
        keep = ~((self.state == TENTATIVE) & ~hit) & ~(
            (self.state != TENTATIVE) & (self.since > self.max_lost)
        )
        self.state[(self.state == TRACKED) & ~hit] = LOST
        out_rows = np.flatnonzero(hit & (self.state == TRACKED))
        det_of = np.full(len(self.ids), -1, np.int64)
        det_of[mt] = md
        result = (
            self._to_box(self.mean[out_rows, :4]),
            self.ids[out_rows].copy(),
            det_of[out_rows],
            self.age[out_rows].copy(),
        )
        self._keep(keep)
        # 4: new tentative tracks from the high boxes nobody took
        fresh = hi_left[scores[hi_left] >= self.new_track]
        self._new(xyxy[fresh])
        return result
