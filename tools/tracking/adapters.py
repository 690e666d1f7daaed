"""Every candidate behind one small interface, for the measurement scripts.

``make(name, stride)`` returns an object with
  ``step(dets, frame) -> (xyxy (K, 4), ids (K,))``: one processed frame; ``dets`` rows are
      x1, y1, x2, y2, score, class (view pixels); ``frame`` the frame index (a lane with
      stride k sees every k-th one). The output is what a user of that library publishes:
      its confirmed tracks in this frame.
  ``stored() -> int``: track objects the tracker holds (live, lost and any kept history),
      for the memory check.

Candidates live in three side venvs (their requirements do not fit one): see README.md.
Each library runs with its own defaults, except where a default needs a camera image
(global motion compensation: off, the synthetic camera does not move), or where a stride
has to be told as a frame rate (the library has no elapsed-time input, but scales its
lost-track buffer by the frame rate; ``FPS / stride`` is given then).
"""

from __future__ import annotations

import numpy as np

FPS = 30.0
GROUPS = {
    # /tmp/trackvenv: numpy 2 (trackers needs numpy >= 2.0.2)
    "np2": [
        "ours-lap",
        "ours-xywh",
        "ours-xywh+ul",
        "ours-xywh-statebox+ul",
        "ours-scipy",
        "trackers-bytetrack",
        "trackers-ocsort",
    ],
    # /tmp/trackvenv-np1: numpy 1.26 (norfair needs numpy < 2); supervision 0.30.9 (the last with ByteTrack)
    "np1": ["ours-lap@np1", "sv-bytetrack", "norfair", "norfair-hit"],
    # /tmp/trackvenv-ul: Python 3.11 + the peer venv's Ultralytics 8.4 + lap (AGPL: reference only)
    # the agent's own venv (.venv): the tracker the agent runs (pipelines/tracking), variants
    # named agent[+<setting>=<value>...]; compiled=0: its numpy path (the kernels' reference)
    "agent": ["agent", "agent+compiled=0", "agent+floor=0.1"],
    "ul": [
        "ours-lap@ul",
        "ul-bytetrack",
        "ul-botsort",
        "ul-ocsort",
        "ul-deepocsort",
        "ul-fasttrack",
        "ul-tracktrack",
    ],
}
_EMPTY = (np.zeros((0, 4)), np.zeros(0, np.int64))


class Ours:
    """Publishes the detector's own boxes with the track ids (issue 32: "each detection
    gains track_id"); ``box="state"`` publishes the filtered state instead, as ByteTrack."""

    def __init__(self, stride: int, solver: str = "lap", box: str = "det", **kw) -> None:
        from ours import ByteTrackLite

        self.t = ByteTrackLite(solver=solver, **kw)
        self.dt = float(stride)
        self.det_box = box == "det"

    def step(self, dets, frame):
        boxes, ids, det_index, _ = self.t.update(dets[:, 0:4], dets[:, 4], self.dt)
        return (dets[det_index, 0:4] if self.det_box else boxes), ids

    def stored(self):
        return self.t.live


class Agent:
    """The agent's tracker (``edge_agent.pipelines.tracking``) as the post step runs it:
    the detector's boxes of the detections a confirmed track took, with its id."""

    def __init__(self, stride: int, floor: float = 0.25, compiled: bool = True, **kw) -> None:
        from edge_agent.core.source_config import TrackerConfig
        from edge_agent.pipelines.tracking.bytetrack import ByteTracker

        # The model's score threshold: decoding keeps nothing below it (the bundled
        # detector's manifest: 0.25), so the tracker never sees those boxes.
        self.floor = floor
        # (compiled=0: the numpy path; an earlier tree has no other)
        self.t = ByteTracker(TrackerConfig(**kw), **({} if compiled else {"compiled": False}))
        if hasattr(self.t, "view"):  # (an earlier agent's tracker has none)
            self.t.view = (640.0, 480.0)  # the step tells it the source's frame size
        self.dt = float(stride)
        self.ids = np.zeros(1024, np.int64)
        self.age = np.zeros(1024, np.int32)

    def step(self, dets, frame):
        dets = dets[dets[:, 4] >= self.floor]
        m = len(dets)
        xyxy = np.ascontiguousarray(dets[:, 0:4], np.float32)
        self.t.update(
            xyxy, dets[:, 4].astype(np.float32), dets[:, 5].astype(np.int32), self.dt, self.ids, self.age
        )
        hit = np.flatnonzero(self.ids[:m] > 0)
        return dets[hit, 0:4], self.ids[hit].copy()

    def stored(self):
        return self.t.live


#: Short names in variant names (kept: the saved outputs are named with them).
_ALIASES = {"high": "high_score", "low": "low_score", "new_track": "new_track_score"}


def _agent_params(name: str) -> dict:
    """``agent+high=0.25+per_class=1``: the agent's tracker with those settings (the
    source's ``tracker`` keys, or their short names above; ``floor``: the model's score
    threshold, 0.25 unless given)."""
    kw = {}
    for part in name.split("+")[1:]:
        key, value = part.split("=")
        key = _ALIASES.get(key, key)
        kw[key] = bool(int(value)) if key in ("per_class", "journeys", "compiled") else float(value)
    return kw


class RoboflowTrackers:
    def __init__(self, stride: int, kind: str) -> None:
        import supervision as sv
        import trackers

        self.sv = sv
        self.t = trackers.ByteTrackTracker() if kind == "bytetrack" else trackers.OCSORTTracker()

    def step(self, dets, frame):
        d = self.sv.Detections(
            xyxy=dets[:, 0:4].astype(np.float32),
            confidence=dets[:, 4].astype(np.float32),
            class_id=dets[:, 5].astype(int),
        )
        r = self.t.update(d, timestamp=frame / FPS)  # elapsed time: the library's own input
        keep = r.tracker_id >= 0
        return r.xyxy[keep], r.tracker_id[keep]

    def stored(self):
        return len(self.t.tracks)


class SupervisionByteTrack:
    def __init__(self, stride: int) -> None:
        import warnings

        import supervision as sv

        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        self.sv = sv
        self.t = sv.ByteTrack(frame_rate=FPS / stride)

    def step(self, dets, frame):
        d = self.sv.Detections(
            xyxy=dets[:, 0:4].astype(np.float32),
            confidence=dets[:, 4].astype(np.float32),
            class_id=dets[:, 5].astype(int),
        )
        r = self.t.update_with_detections(d)
        if len(r) == 0:
            return _EMPTY
        keep = r.tracker_id >= 0
        return r.xyxy[keep], r.tracker_id[keep]

    def stored(self):
        t = self.t
        return len(t.tracked_tracks) + len(t.lost_tracks) + len(t.removed_tracks)


class Norfair:
    """IoU distance, a track coasts ``hit_counter_max`` frames; boxes scored below
    ``min_score`` are not given (norfair has no low-score stage). ``only_hit``: publish
    only the objects a detection hit in this frame (as ByteTrack does), not the coasting
    estimates norfair returns by default."""

    def __init__(self, stride: int, only_hit: bool, min_score: float = 0.5) -> None:
        import norfair

        self.nf = norfair
        self.t = norfair.Tracker(distance_function="iou", distance_threshold=0.8, hit_counter_max=30)
        self.period, self.only_hit, self.min_score = stride, only_hit, min_score

    def step(self, dets, frame):
        nf = self.nf
        d = dets[dets[:, 4] >= self.min_score]
        objs = [nf.Detection(points=r[0:4].reshape(2, 2), scores=np.array([r[4], r[4]])) for r in d]
        out = self.t.update(detections=objs, period=self.period)
        if self.only_hit:
            now = {id(o) for o in objs}
            out = [o for o in out if o.last_detection is not None and id(o.last_detection) in now]
        if not out:
            return _EMPTY
        boxes = np.array([o.estimate.reshape(4) for o in out])
        return boxes, np.array([o.id for o in out], np.int64)

    def stored(self):
        return len(self.t.tracked_objects)


class UltralyticsTracker:
    def __init__(self, stride: int, kind: str) -> None:
        from pathlib import Path

        import ultralytics
        from ultralytics.engine.results import Boxes
        from ultralytics.trackers.track import TRACKER_MAP
        from ultralytics.utils import YAML, IterableSimpleNamespace

        cfg = YAML.load(Path(ultralytics.__file__).parent / "cfg" / "trackers" / f"{kind}.yaml")
        if "gmc_method" in cfg:
            cfg["gmc_method"] = "none"  # a fixed camera; the default needs the image
        cfg["with_reid"] = False
        cfg["track_buffer"] = max(1, round(cfg["track_buffer"] / stride))  # no elapsed-time input
        self.t = TRACKER_MAP[kind](IterableSimpleNamespace(**cfg))
        self.Boxes = Boxes
        self.img = np.zeros((480, 640, 3), np.uint8)

    def step(self, dets, frame):
        data = np.concatenate([dets[:, 0:4], dets[:, 4:5], dets[:, 5:6]], 1).astype(np.float32)
        r = self.t.update(self.Boxes(data, (480, 640)), self.img)
        if len(r) == 0:
            return _EMPTY
        return r[:, 0:4], r[:, 4].astype(np.int64)

    def stored(self):
        t = self.t
        return len(t.tracked_stracks) + len(t.lost_stracks) + len(t.removed_stracks)


def make(name: str, stride: int):
    base = name.split("@")[0]
    if base == "ours-lap":
        return Ours(stride, "lap")
    if base == "ours-scipy":
        return Ours(stride, "scipy")
    if base.startswith("ours-xy"):
        # variants: ours-{xyah|xywh}[-statebox][+ul] (+ul: Ultralytics' thresholds, 0.25 for
        # the first stage and for a new track, instead of ByteTrack's 0.5 and 0.6)
        kw = {"state": "xywh" if base.startswith("ours-xywh") else "xyah"}
        if "-statebox" in base:
            kw["box"] = "state"
        if base.endswith("+ul"):
            kw.update(high=0.25, new_track=0.25)
        return Ours(stride, "lap", **kw)
    if base.split("+")[0] in ("agent", "agent-before"):
        # agent-before: the same, run with an earlier tree's edge_agent on PYTHONPATH
        return Agent(stride, **_agent_params(base))
    if base.startswith("trackers-"):
        return RoboflowTrackers(stride, base.split("-", 1)[1])
    if base == "sv-bytetrack":
        return SupervisionByteTrack(stride)
    if base == "norfair":
        return Norfair(stride, only_hit=False)
    if base == "norfair-hit":
        return Norfair(stride, only_hit=True)
    if base.startswith("ul-"):
        return UltralyticsTracker(stride, base[3:])
    raise KeyError(name)
