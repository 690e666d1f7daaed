"""One source's zone and line counting over its confirmed tracks, and the events it raises.

The rules, each a guard against a count that is wrong:

- Only detections of confirmed tracks count (a track id): a flickering box that never
  became a track is never counted.
- A track's side of a line, and whether it is inside a zone, change only after its anchor
  was observed on the new side ``min_frames`` processed frames in a row: a box jittering
  on a border is not counted back and forth.
- A crossing needs a known side before it: a line's side is known only while the anchor
  projects onto the segment (not beyond its ends), so walking round a line's end is no
  crossing. It counts once per track and direction.
- State is per journey (the tracker's chain of tracks of one object, ``journeys``; a
  track alone is a journey of one) and kept while it is lost: a track recovered after an
  occlusion does not enter or cross again, and one that continues the journey of a track
  that broke is counted on the journey's path, from the last position before the break to
  the first after it: once. A journey not seen for longer than its tracker keeps lost
  tracks has ended: if it was inside a zone it exits (``reason: lost``).
- Times come from the frames' capture times: an entry is dated by the first frame inside,
  an exit by the first frame outside, so dwell is exact to a frame period at any frame rate
  or stride.

State lives in arrays of ``capacity`` rows (one per journey, sorted by id: a new journey
has the newest track's id, so it is appended), with the same cost per frame whatever
happened before.

Two paths run these rules on the same arrays: numpy (this file, the reference) and, where
numba loads, one compiled call a frame (``kernels.py``), which the tests hold to the
numpy path's results frame by frame. A frame whose arrays have dtypes the kernel was not
compiled for runs the numpy path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.pipelines import jit
from edge_agent.pipelines.analytics import kernels
from edge_agent.pipelines.analytics.geometry import Geometry

log = logging.getLogger(__name__)

#: Dwell histogram buckets (seconds, upper bounds; Prometheus ``le``), the last +Inf.
DWELL_BUCKETS_S = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0)
IN, OUT = 0, 1  # a line's directions, as indexed in its counts
_DIRECTION = {1: "in", -1: "out"}


class _Seen(NamedTuple):
    """One frame's tracked detections, as the zone and line passes take them."""

    rows: np.ndarray  # each one's journey row
    cls: np.ndarray  # its class (clipped into the model's)
    ids: np.ndarray  # its track id
    journeys: np.ndarray  # its journey
    frame_id: int
    t: float  # capture time, s
    out: list[dict]  # the events raised


class Counter:
    """A source's zones and lines (``config``) over tracks of the model's ``labels``.
    ``lost_frames``: the tracker's (a track unseen for longer has ended). ``compiled``:
    run the compiled kernel where it loads (``self.compiled`` says whether it did), else
    the numpy path."""

    def __init__(
        self,
        config: AnalyticsConfig,
        labels: tuple[str, ...],
        lost_frames: float,
        capacity: int,
        compiled: bool = True,
    ) -> None:
        self.config = config
        self.labels = labels
        self.zone_names = tuple(z.name for z in config.zones)
        self.line_names = tuple(ln.name for ln in config.lines)
        self.expire_frames = lost_frames + 1
        self.geometry: Geometry | None = None  # for the frame size, at the first frame
        n_cls = max(len(labels), 1)
        nz, nl = len(config.zones), len(config.lines)
        self.capacity = cap = capacity
        # the state: views of three flat buffers, which the compiled path takes whole
        self._state = st = kernels.state(cap, nz, nl, n_cls, len(DWELL_BUCKETS_S) + 1)
        a = st.arrays
        # per journey row (sorted by journey id)
        self.n = 0
        self.ids = a["ids"]  # journey ids
        self.last_seen = a["last_seen"]  # frame id
        self.track = a["track"]  # its track then
        self.seen_t = a["seen_t"]  # its capture time
        self.z_in = a["z_in"]  # (cap, zones) bool, settled: inside
        self.z_run = a["z_run"]  # frames in a row observed otherwise
        self.z_run_t = a["z_run_t"]  # capture time of that run's first frame
        self.z_enter_t = a["z_enter_t"]  # capture time of the first frame inside
        self.z_step = a["z_step"]  # dwell steps passed while inside
        self.z_cls = a["z_cls"]  # its label when it entered (counted under it)
        self.l_side = a["l_side"]  # (cap, lines) int8, settled: +1 in side, -1 out side, 0 unknown
        self.l_pend = a["l_pend"]  # the side observed otherwise
        self.l_run = a["l_run"]  # frames in a row on it
        self.l_run_t = a["l_run_t"]  # capture time of that run's first frame
        self.l_done = a["l_done"]  # (cap, lines, 2) bool, counted: in, out
        # counts, by label
        self.objects = a["objects"]  # (zones, labels) int64, inside now
        self.entered = a["entered"]
        self.exited = a["exited"]
        self.crossed = a["crossed"]  # (lines, 2, labels): [line, in/out, label]
        self.dwell_hist = a["dwell_hist"]  # (zones, buckets)
        self.dwell_sum = a["dwell_sum"]  # (zones,) float
        self.events = 0  # raised since it started
        self.overflow = 0  # journeys not followed: more at once than ``capacity``
        self._refused: set[int] = set()  # the journeys refused (each counted once), while seen
        self.version = 0  # moves on with every change of a count (the message block's cache)
        self._block: dict | None = None
        self._block_version = -1
        # the compiled path: its kernel, and its arguments after the frame's own (bound to
        # the geometry and the scratch, which grows with the most detections in a frame)
        self._kernel = load_kernel() if compiled else None
        self._expire_after = float(self.expire_frames)
        self._n_labels = len(labels)
        self._work: kernels.Work | None = None  # its geometry and scratch

    @property
    def compiled(self) -> bool:
        """Whether frames run the compiled kernel (else the numpy path)."""
        return self._kernel is not None

    # -- per frame -----------------------------------------------------------------------

    def update(
        self,
        xyxy: np.ndarray,
        classes: np.ndarray,
        track_ids: np.ndarray,
        journeys: np.ndarray,
        frame_id: int,
        t: float,
        width: int,
        height: int,
        out: list[dict],
    ) -> None:
        """One frame's detections (source pixels), their track ids (0: none) and journeys,
        captured at ``t`` (s). Appends the events raised to ``out``."""
        geo = self.geometry
        if geo is None or geo.width != width or geo.height != height:
            geo = self.geometry = Geometry(self.config, width, height, self.labels)
            outside = self.config.outside(width, height)
            if outside:  # pixels on a camera whose size the config does not state
                log.warning("analytics: %s (that part never counts)", outside)
            self._work = None
        kernel = self._kernel
        if kernel is not None:
            # inline, not a method: with the caches an inference left cold, each Python
            # call and lookup on this path costs about a microsecond
            w = self._work
            if w is None or w.m < len(track_ids):
                w = self._new_work(len(track_ids))
            st = self._state
            try:
                got = kernel(
                    xyxy, classes, track_ids, journeys, frame_id, t, self._expire_after, self.n, False,
                    self._n_labels, st.i64, st.f64, st.i8, w.i64, w.f64,
                )  # fmt: skip
            except TypeError:  # no compiled version for these arrays, and none compiles now
                pass
            else:
                if got:
                    self._after_kernel(got, xyxy, classes, track_ids, journeys, frame_id, t, out)
                return
        self._expire(frame_id, t, out)
        sel = (track_ids > 0).nonzero()[0]
        if not len(sel):
            return
        ids = track_ids[sel]
        jids = journeys[sel]
        rows = self._rows(jids, frame_id)
        keep = rows >= 0
        if not keep.all():  # beyond capacity: not followed
            sel, ids, jids, rows = sel[keep], ids[keep], jids[keep], rows[keep]
        boxes = xyxy[sel]
        cls = classes[sel].astype(np.int64)
        np.clip(cls, 0, self.objects.shape[1] - 1, out=cls)
        known = (classes[sel] >= 0) & (classes[sel] < len(self.labels))
        self.last_seen[rows] = frame_id
        self.seen_t[rows] = t
        self.track[rows] = ids
        if len(self.zone_names):
            inside = geo.inside(boxes)
            inside &= geo.z_labels[cls]
            inside &= known[:, None]
            self._zones(_Seen(rows, cls, ids, jids, frame_id, t, out), inside)
        if len(self.line_names):
            side = geo.sides(boxes)
            side *= geo.l_labels[cls] & known[:, None]
            self._lines(_Seen(rows, cls, ids, jids, frame_id, t, out), side)

    def _new_work(self, m: int) -> kernels.Work:
        """The kernel's geometry and scratch, for frames of ``m`` detections or more (the
        next power of two: it grows seldom)."""
        geo = self.geometry
        assert geo is not None
        size = max(32, 1 << max(m - 1, 0).bit_length())
        self._work = w = kernels.work(self._state, geo, size, DWELL_BUCKETS_S)
        return w

    def _after_kernel(
        self,
        got: int,
        xyxy: np.ndarray,
        classes: np.ndarray,
        track_ids: np.ndarray,
        journeys: np.ndarray,
        frame_id: int,
        t: float,
        out: list[dict],
    ) -> None:
        """What the kernel left to Python (``got``): a journey that ended or a new one (then
        the frame again), and the events it recorded."""
        w, st = self._work, self._state
        assert w is not None
        frame = (xyxy, classes, track_ids, journeys, frame_id, t, self._expire_after)
        state = (self._n_labels, st.i64, st.f64, st.i8, w.i64, w.f64)
        if got == kernels.NEED_EXPIRE:
            self._expire(frame_id, t, out)
            got = self._kernel(*frame, self.n, False, *state)
        if got == kernels.NEED_ROWS:  # its row, as the numpy path makes it; one refused stays out
            self._rows(journeys[track_ids > 0], frame_id)
            got = self._kernel(*frame, self.n, True, *state)
        if got > 0:
            self._raised(w, got, frame_id, out)

    def _raised(self, w: kernels.Work, count: int, frame_id: int, out: list[dict]) -> None:
        """The events the kernel recorded (its first ``count`` rows), as messages in
        ``out``, and the counters the numpy path moves with them."""
        flips = 0
        for (kind, k, tid, jid, c, direction), (at, f1, f2) in zip(
            w.ev_i[:count].tolist(), w.ev_f[:count].tolist()
        ):
            if kind == kernels.ENTER:
                out.append(self._event("enter", "zone", k, tid, jid, c, frame_id, at))
                flips = 1
            elif kind == kernels.EXIT:
                out.append(self._exit_event(k, tid, jid, c, frame_id, at, f1, f2, "left"))
                self.version += 1
                flips = 1
            elif kind == kernels.DWELL:
                event = self._event("dwell", "zone", k, tid, jid, c, frame_id, at)
                out.append(event | {"entered_unix_s": f1, "threshold_s": f2})
            else:
                event = self._event("cross", "line", k, tid, jid, c, frame_id, at)
                out.append(event | {"direction": _DIRECTION[direction]})
                self.version += 1
        self.version += flips
        self.events += count

    def _zones(self, f: _Seen, inside: np.ndarray) -> None:
        """Each tracked detection's observation (``inside``: (k, zones)) against its track's
        settled state: runs, entries, exits, dwell steps."""
        rows, cls, ids, jids, frame_id, t, out = f
        cur = self.z_in[rows]
        run = self.z_run[rows]
        other = inside != cur
        run += 1
        run *= other  # a frame on the settled side ends the run
        started = run == 1
        if started.any():
            run_t = self.z_run_t[rows]
            run_t[started] = t
            self.z_run_t[rows] = run_t
        geo = self.geometry
        flip = run >= geo.z_min
        if flip.any():
            run[flip] = 0
            self._zone_flips(f, flip, inside)
        self.z_run[rows] = run
        # dwell steps of the tracks inside
        settled = self.z_in[rows]
        if settled.any() and geo.z_dwell.shape[1] > 1:
            step = self.z_step[rows]
            due = geo.z_dwell[np.arange(len(geo.z_min)), step]  # (k, Z): each one's next step
            spent = t - self.z_enter_t[rows]
            fire = settled & (spent >= due)
            if fire.any():
                for i, z in zip(*fire.nonzero()):
                    out.append(
                        self._event(
                            "dwell", "zone", int(z), int(ids[i]), int(jids[i]), int(cls[i]), frame_id, t
                        )
                        | {
                            "entered_unix_s": float(self.z_enter_t[rows[i], z]),
                            "threshold_s": float(due[i, z]),
                        }
                    )
                    self.events += 1
                step[fire] += 1
                self.z_step[rows] = step

    def _zone_flips(self, f: _Seen, flip: np.ndarray, inside: np.ndarray) -> None:
        rows, cls, ids, jids, frame_id, _t, out = f
        for i, z in zip(*flip.nonzero()):
            r, c, tid = rows[i], cls[i], int(ids[i])
            at = float(self.z_run_t[r, z])
            if inside[i, z]:
                self.z_in[r, z] = True
                self.z_enter_t[r, z] = at
                self.z_step[r, z] = 0
                self.z_cls[r, z] = c
                self.objects[z, c] += 1
                self.entered[z, c] += 1
                out.append(self._event("enter", "zone", int(z), tid, int(jids[i]), int(c), frame_id, at))
            else:
                out.append(self._exit(r, int(z), tid, frame_id, at, "left"))
            self.events += 1
        self.version += 1

    def _exit(self, r: int, z: int, tid: int, frame_id: int, at: float, reason: str) -> dict:
        """Journey row ``r`` (its track ``tid`` now) leaves zone ``z``: counted under the
        label it entered with (a detector may name a half-hidden object otherwise)."""
        self.z_in[r, z] = False
        c = int(self.z_cls[r, z])
        dwell = max(0.0, at - float(self.z_enter_t[r, z]))
        self.objects[z, c] -= 1
        self.exited[z, c] += 1
        self.dwell_hist[z, np.searchsorted(DWELL_BUCKETS_S, dwell)] += 1
        self.dwell_sum[z] += dwell
        self.version += 1
        return self._exit_event(
            z, tid, int(self.ids[r]), c, frame_id, at, float(self.z_enter_t[r, z]), dwell, reason
        )

    def _exit_event(
        self,
        z: int,
        tid: int,
        jid: int,
        c: int,
        frame_id: int,
        at: float,
        entered: float,
        dwell: float,
        reason: str,
    ) -> dict:
        return self._event("exit", "zone", z, tid, jid, c, frame_id, at) | {
            "entered_unix_s": entered,
            "dwell_s": round(dwell, 4),
            "reason": reason,
        }

    def _lines(self, f: _Seen, side: np.ndarray) -> None:
        """Each tracked detection's side of each line (``side``: (k, lines), see
        ``Geometry.sides``) against its track's: runs, crossings."""
        rows, cls, ids, jids, frame_id, t, out = f
        cur = self.l_side[rows]
        pend = self.l_pend[rows]
        run = self.l_run[rows]
        cur[side == 0] = 0  # off the segment: no side known
        band = side == 2  # on neither side: the run so far neither grows nor ends
        moving = (side != 0) & (side != cur) & ~band
        grown = np.where(side == pend, run + 1, 1)
        run = np.where(band, run, grown * moving)
        pend = np.where(band, pend, side * moving).astype(np.int8)
        started = run == 1
        if started.any():
            run_t = self.l_run_t[rows]
            run_t[started] = t
            self.l_run_t[rows] = run_t
        flip = run >= self.geometry.l_min
        if flip.any():
            for i, k in zip(*flip.nonzero()):
                r, new = rows[i], int(side[i, k])
                was = int(cur[i, k])
                cur[i, k] = new
                run[i, k] = 0
                if not was:
                    continue  # the first side known: nothing crossed
                d = IN if new > 0 else OUT
                if self.l_done[r, k, d]:
                    continue  # once per track and direction
                self.l_done[r, k, d] = True
                self.crossed[k, d, cls[i]] += 1
                self.version += 1
                self.events += 1
                at = float(self.l_run_t[r, k])  # the first frame on the new side
                event = self._event(
                    "cross", "line", int(k), int(ids[i]), int(jids[i]), int(cls[i]), frame_id, at
                )
                out.append(event | {"direction": _DIRECTION[new]})
        self.l_side[rows] = cur
        self.l_pend[rows] = pend
        self.l_run[rows] = run

    def _event(
        self, kind: str, what: str, k: int, tid: int, jid: int, c: int, frame_id: int, t: float
    ) -> dict:
        names = self.zone_names if what == "zone" else self.line_names
        return {
            "kind": kind,
            what: names[k],
            "track_id": tid,
            "journey_id": jid,
            "label": self.labels[c] if c < len(self.labels) else str(c),
            "class_id": c,
            "frame_id": frame_id,
            "at_unix_s": t,
        }

    # -- track rows ----------------------------------------------------------------------

    def _rows(self, ids: np.ndarray, frame_id: int) -> np.ndarray:
        """Each journey id's row (-1: no room). A new journey is appended (its id is its
        newest track's); one below the live ones (the counter dropped it: it was refused,
        or unseen for longer than a track is kept) is put in its place."""
        n = self.n
        live = self.ids[:n]
        pos = np.searchsorted(live, ids)
        found = pos < n
        found[found] = live[pos[found]] == ids[found]
        if found.all():
            return pos
        new = np.unique(ids[~found])
        room = self.capacity - n
        if len(new) > room:
            refused = new[room:]
            fresh = [int(j) for j in refused if int(j) not in self._refused]
            self.overflow += len(fresh)  # once per journey, while it is seen
            self._refused.update(fresh)
            if len(self._refused) > 4 * self.capacity:  # bounded: forget the oldest
                self._refused = set(sorted(self._refused)[-2 * self.capacity :])
            new = new[:room]
        k = len(new)
        if k:
            if n and new[0] < live[-1]:  # not the newest: each into its place
                for j in new:
                    self._insert(int(j), frame_id)
            else:
                self._clear(slice(n, n + k))
                self.ids[n : n + k] = new
                self.last_seen[n : n + k] = frame_id
                self.n = n + k
        live = self.ids[: self.n]
        pos = np.searchsorted(live, ids)
        pos[pos >= self.n] = 0
        pos[live[pos] != ids] = -1
        return pos

    def _insert(self, jid: int, frame_id: int) -> None:
        """A row for journey ``jid`` at its sorted place (rows after it move down one)."""
        n = self.n
        at = int(np.searchsorted(self.ids[:n], jid))
        for a in self._track_arrays():
            a[at + 1 : n + 1] = a[at:n].copy()
        self._clear(slice(at, at + 1))
        self.ids[at] = jid
        self.last_seen[at] = frame_id
        self.n = n + 1

    def _clear(self, rows: slice) -> None:
        for a in self._track_arrays():
            a[rows] = 0

    def _track_arrays(self) -> tuple[np.ndarray, ...]:
        return (
            self.ids, self.last_seen, self.track, self.seen_t, self.z_in, self.z_run, self.z_run_t,
            self.z_enter_t, self.z_step, self.z_cls, self.l_side, self.l_pend, self.l_run, self.l_run_t,
            self.l_done,
        )  # fmt: skip

    def _expire(self, frame_id: int, t: float, out: list[dict]) -> None:
        """Tracks unseen for longer than their tracker keeps them have ended: out of their
        zones (an exit, ``reason: lost``, dated by the last frame they were seen in)."""
        n = self.n
        if not n:
            return
        gone = (frame_id - self.last_seen[:n]) > self.expire_frames
        if not gone.any():
            return
        for r in gone.nonzero()[0]:
            for z in self.z_in[r].nonzero()[0]:
                at = float(self.seen_t[r])
                out.append(self._exit(r, int(z), int(self.track[r]), frame_id, at, "lost"))
                self.events += 1
        keep = ~gone
        k = int(keep.sum())
        for a in self._track_arrays():
            a[:k] = a[:n][keep]
        self.n = k

    # -- readers -------------------------------------------------------------------------

    def block(self) -> dict:
        """The running counts for every result message (rebuilt only when one changed)."""
        if self._block_version != self.version or self._block is None:
            occ, ent, ex = (
                self.objects.sum(1).tolist(),
                self.entered.sum(1).tolist(),
                self.exited.sum(1).tolist(),
            )
            crossed = self.crossed.sum(2).tolist()
            self._block = {
                "zones": {
                    name: {"objects": occ[k], "entered": ent[k], "exited": ex[k]}
                    for k, name in enumerate(self.zone_names)
                },
                "lines": {
                    name: {"in": crossed[k][IN], "out": crossed[k][OUT]}
                    for k, name in enumerate(self.line_names)
                },
            }
            self._block_version = self.version
        return self._block


def load_kernel() -> Callable[..., int] | None:
    """The compiled ``kernels.analytics_frame`` (compiled, or loaded from the disk cache,
    and warmed once per process), or None: the numpy path runs (``jit.state`` says why)."""
    got = jit.load("analytics", [kernels.analytics_frame], _warm)
    if got is None:
        return None
    kernel = got["analytics_frame"]
    # a frame of other dtypes than warmed raises TypeError and runs the numpy path: a
    # compile takes seconds, never on a live frame
    kernel.disable_compile()
    return kernel


def _warm(compiled: dict[str, Callable[..., Any]]) -> None:
    """Compiles the kernel for the frames' arrays: a frame slot's dtypes (float32 boxes,
    int32 classes, int64 ids), and numpy's defaults (float64, int64)."""
    config = AnalyticsConfig(
        units="pixels",
        zones=(
            ZoneConfig(name="a", points=((0.0, 0.0), (60.0, 0.0), (60.0, 60.0)), dwell_s=(0.01,)),
            ZoneConfig(name="b", points=((0.0, 0.0), (60.0, 0.0), (0.0, 60.0)), anchor="center"),
        ),
        lines=(LineConfig(name="c", points=((0.0, 30.0), (60.0, 30.0)), min_frames=1),),
    )
    for box_dtype, class_dtype in ((np.float32, np.int32), (np.float64, np.int64)):
        counter = Counter(config, ("x",), 1, 4, compiled=False)
        counter._kernel = compiled["analytics_frame"]
        out: list[dict] = []
        for f, y in enumerate((10.0, 10.0, 40.0, 40.0, 40.0, 40.0)):
            xyxy = np.array([[30.0, y - 5.0, 35.0, y]], box_dtype)
            ids = np.array([1 + f // 4], np.int64)  # a new journey, then the old one expires
            classes = np.zeros(1, class_dtype)
            counter.update(xyxy, classes, ids, ids, f, f / 10, 64, 64, out)
    if len(compiled["analytics_frame"].signatures) < 2:  # update fell back to numpy
        raise RuntimeError("analytics_frame did not compile for the frames' dtypes")
