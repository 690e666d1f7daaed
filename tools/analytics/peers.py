"""Line counts by other tools' counters, on the trackers' saved outputs.

    /tmp/trackvenv/bin/python tools/analytics/peers.py                  # supervision's LineZone
    YOLO_OFFLINE=1 /tmp/trackvenv-ul/bin/python tools/analytics/peers.py   # Ultralytics' ObjectCounter
    /tmp/trackvenv/bin/python tools/analytics/peers.py --selftest       # hand-made tracks

For every sequence in ``$TRACKING_WORK/seqs`` and every candidate with an output
``$TRACKING_WORK/outputs/<candidate>/<seq>-k1.npz`` (rows: frame, id, x1, y1, x2, y2: a
tracker's published tracks), each line of ``truth.lines_for(scene)`` gets its own counter,
fed the tracks frame by frame (every frame of the sequence, empty ones too). Appends
``{candidate, counter, seq, line, in, out}`` to ``$TRACKING_WORK/results/counts-peers.jsonl``
(each line in one write, so the two venvs may run at once; a later row of the same key
replaces an earlier one when read). ``in`` and ``out`` are in our line's terms
(``truth.Line.in_side``), whatever the counter calls them.

``linezone``: supervision's ``LineZone`` (MIT; /tmp/trackvenv, supervision >= 0.26 as
``trackers`` installs it: 0.31.2 here).
  - Anchor: ``triggering_anchors=[Position.BOTTOM_CENTER]``, the point our truth and the
    agent count (its default is the four box corners, all of which must have changed side:
    a box straddling the line is skipped, so a crossing would count later than the agent's).
  - Direction: ``in`` is where the anchor's cross product with the line vector
    (end - start) x (anchor - start) is negative, i.e. the left of the vector in image
    coordinates, which is what our ``in_side="left"`` means. So start/end are our points
    for ``in_side="left"`` and swapped for ``"right"``; ``--selftest`` checks it.
  - Everything else its defaults: ``minimum_crossing_threshold=1`` (one observation on the
    new side makes a crossing; the agent's ``min_frames`` is 3 with a band). Its side is
    known only while the anchor is within the strip perpendicular to the segment (as the
    agent's). It counts every change of side of a track (not once per track and
    direction), and forgets a track absent for 2 frames in a row (its
    ``crossing_history_length``), after which the first side seen again is taken as given.

``ul``: Ultralytics' ``ObjectCounter`` (AGPL, a reference only; /tmp/trackvenv-ul, which
needs ``shapely`` too: ``/tmp/trackvenv-ul/bin/pip install shapely``; 2.2.0 here).
  - How it is run: its own ``__call__`` / ``process`` / ``store_tracking_history`` /
    ``count_objects``, per frame, on a blank 640x480 image; only ``extract_tracks`` (its
    ``model.track`` call) is overridden to hand over the saved tracks (class 0, conf 1).
    ``BaseSolution.__init__`` always builds a YOLO model: it gets ``model="yolov8n.yaml"``,
    built from the bundled config with random weights (no file, no download; never run).
    ``region`` is the line's two points in view pixels; ``show=False``, ``verbose=False``.
  - Anchor: the box centre (``store_tracking_history``: the mean of the box's corners), not
    the bottom centre; the step from the track's previous published centre to this one
    must intersect the segment (shapely ``intersects``).
  - Direction: by the motion, not by the side: on a line more vertical than horizontal
    ``IN`` is moving right, otherwise moving down. Mapped to ours per line: ``IN`` is our
    ``in`` when that motion points to our in side (``Line.in_normal``), else ``out``.
  - Once per track id and line, whichever direction first (``counted_ids``). Its
    ``forget_tracks`` is fed by the tracker's removed tracks, which a saved output does not
    hold: nothing is forgotten (the Ultralytics trackers never reuse an id in a run).
  - Default candidates: ``ul-botsort`` and the tracker ``model.track`` uses by default in
    the installed version (``DEFAULT_CFG.tracker``: ``tracktrack`` in 8.4.190).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import OUT_DIR, VIEW_H, VIEW_W, list_sequences, load_sequence
from truth import (
    COUNTS_PEERS,
    HANDMADE_CASES,
    HANDMADE_EXPECTED,
    Line,
    append_counts,
    count_row,
    handmade,
    handmade_lines,
    lines_for,
    true_crossings,
)

COUNTERS = ("linezone", "ul")


class LineZoneCounter:
    """supervision's LineZone on one line (see the module docstring)."""

    counter = "linezone"

    def __init__(self, line: Line) -> None:
        import supervision as sv

        self.sv = sv
        a, b = line.px()
        if line.in_side == "right":
            a, b = b, a
        self.zone = sv.LineZone(
            start=sv.Point(float(a[0]), float(a[1])),
            end=sv.Point(float(b[0]), float(b[1])),
            triggering_anchors=[sv.Position.BOTTOM_CENTER],
        )

    def step(self, boxes: np.ndarray, ids: np.ndarray) -> None:
        sv = self.sv
        if len(ids):
            det = sv.Detections(xyxy=boxes.astype(np.float32), tracker_id=ids.astype(int))
        else:
            det = sv.Detections.empty()
        self.zone.trigger(det)

    def counts(self) -> tuple[int, int]:
        return self.zone.in_count, self.zone.out_count


_UL = {}


def _ultralytics():
    """Ultralytics' ObjectCounter with ``extract_tracks`` fed from saved tracks (cached)."""
    if _UL:
        return _UL["cls"]
    import logging

    import torch
    from ultralytics.solutions import ObjectCounter
    from ultralytics.utils import LOGGER

    LOGGER.setLevel(logging.ERROR)  # its config dump and "no display" warning, per counter

    class FedCounter(ObjectCounter):
        """ObjectCounter whose tracks come from ``feed`` instead of ``model.track``."""

        def feed(self, boxes: np.ndarray, ids: np.ndarray) -> None:
            self._fed = (boxes, ids)

        def extract_tracks(self, im0):
            with self.profilers[0]:  # as the original (its __call__ reads the time)
                boxes, ids = self._fed
            self.boxes = torch.as_tensor(np.asarray(boxes, np.float32).reshape(-1, 4))
            self.track_ids = [int(i) for i in ids]
            self.clss = [0] * len(self.track_ids)
            self.confs = [1.0] * len(self.track_ids)

    _UL["cls"] = FedCounter
    return FedCounter


class UltralyticsCounter:
    """Ultralytics' ObjectCounter on one line (see the module docstring)."""

    counter = "ul"
    _image = np.zeros((VIEW_H, VIEW_W, 3), np.uint8)

    def __init__(self, line: Line) -> None:
        a, b = line.px()
        region = [(float(a[0]), float(a[1])), (float(b[0]), float(b[1]))]
        self.c = _ultralytics()(model="yolov8n.yaml", region=region, show=False, verbose=False)
        # its IN: moving right on a line more vertical than horizontal, else moving down
        vertical = abs(region[0][0] - region[1][0]) < abs(region[0][1] - region[1][1])
        motion_in = np.array((1.0, 0.0) if vertical else (0.0, 1.0))
        self.same = float(motion_in @ line.in_normal()) > 0

    def step(self, boxes: np.ndarray, ids: np.ndarray) -> None:
        self.c.feed(boxes, ids)
        self.c(self._image)

    def raw(self) -> tuple[int, int]:
        return self.c.in_count, self.c.out_count

    def counts(self) -> tuple[int, int]:
        n_in, n_out = self.raw()
        return (n_in, n_out) if self.same else (n_out, n_in)


def make(counter: str, line: Line):
    return LineZoneCounter(line) if counter == "linezone" else UltralyticsCounter(line)


def count_tracks(counter: str, rows: np.ndarray, frames: int, lines) -> dict[str, tuple[int, int]]:
    """Each line's (in, out) by ``counter`` on tracks (rows: frame, id, x1, y1, x2, y2)."""
    rows = rows[np.argsort(rows[:, 0], kind="stable")]
    idx = np.searchsorted(rows[:, 0], np.arange(frames + 1))
    made = [make(counter, ln) for ln in lines]
    for t in range(frames):
        r = rows[idx[t] : idx[t + 1]]
        boxes, ids = r[:, 2:6], r[:, 1].astype(np.int64)
        for c in made:
            c.step(boxes, ids)
    return {ln.name: c.counts() for ln, c in zip(lines, made)}


def available() -> list[str]:
    out = []
    try:
        import supervision  # noqa: F401

        out.append("linezone")
    except ImportError:
        pass
    try:
        import ultralytics  # noqa: F401

        out.append("ul")
    except ImportError:
        pass
    return out


def default_candidates(counter: str) -> list[str]:
    found = sorted(p.name for p in OUT_DIR.iterdir() if p.is_dir()) if OUT_DIR.exists() else []
    if counter == "linezone":
        return found
    from ultralytics.cfg import DEFAULT_CFG

    want = ["ul-botsort", "ul-" + Path(DEFAULT_CFG.tracker).stem]
    return [c for c in dict.fromkeys(want) if c in found]


def selftest(counters: list[str]) -> int:
    """Each counter on hand-made tracks (``truth.handmade``), beside the truth."""
    bad = 0
    head = " | ".join(counters)
    print(f"| line | case | truth (in, out) | {head} |")
    print("|---" * (3 + len(counters)) + "|")
    for ln in handmade_lines():
        for case, rows in handmade(ln).items():
            frames = int(rows[:, 0].max()) + 5
            t = np.column_stack([rows, np.ones(len(rows)), np.zeros(len(rows))])
            tc = true_crossings(t, (ln,))[ln.name]
            truth = (tc["in"], tc["out"])
            bad += truth != HANDMADE_EXPECTED[case]
            cells = []
            for counter in counters:
                got = count_tracks(counter, rows, frames, (ln,))[ln.name]
                cells.append(f"{got}" + (" (same)" if got == truth else ""))
            print(f"| {ln.name} | {case} | {truth} | " + " | ".join(cells) + " |")
    if "ul" in counters:  # the raw counts before mapping: which lines' IN is our out
        raw = []
        for ln in handmade_lines():
            c = UltralyticsCounter(ln)
            raw.append(f"{ln.name}: {'IN = in' if c.same else 'IN = out'}")
        print("\nUltralytics' IN on our lines: " + ", ".join(raw))
    assert set(HANDMADE_CASES) == set(HANDMADE_EXPECTED)
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--counter", choices=COUNTERS, nargs="*", help="default: those this venv can import")
    p.add_argument("--candidate", nargs="*", help="tracker outputs to count (default: see the docstring)")
    p.add_argument("--only", nargs="*", help="sequence name prefixes")
    p.add_argument("--selftest", action="store_true", help="hand-made tracks only; writes nothing")
    a = p.parse_args()
    counters = a.counter or available()
    if not counters:
        print("neither supervision nor ultralytics imports here", file=sys.stderr)
        return 2
    if a.selftest:
        return selftest(counters)
    seqs = [s for s in list_sequences() if not a.only or any(s.stem.startswith(o) for o in a.only)]
    for counter in counters:
        t0 = time.perf_counter()
        cands = a.candidate or default_candidates(counter)
        n = 0
        for cand in cands:
            for path in seqs:
                out = OUT_DIR / cand / f"{path.stem}-k1.npz"
                if not out.exists():
                    continue
                _, _, meta = load_sequence(path)
                lines = lines_for(meta["scene"])
                got = count_tracks(counter, np.load(out)["rows"], meta["frames"], lines)
                rows = [count_row(cand, counter, path.stem, name, i, o) for name, (i, o) in got.items()]
                append_counts(COUNTS_PEERS, rows)
                n += 1
        print(
            f"{counter}: {n} outputs of {len(cands)} candidates ({', '.join(cands)}) "
            f"in {time.perf_counter() - t0:.1f} s -> {COUNTS_PEERS}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
