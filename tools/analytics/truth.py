"""The counting measurement's lines, zones and true counts: numpy only.

Shared by ``measure.py`` (the agent's counts, in the agent's venv) and by ``peers.py`` and
``compare_counts.py`` (other counters, in the side venvs of tools/tracking, which lack
``edge_agent``). Everything is in the view of tools/tracking's sequences (640x480).

- ``LINES``, ``ZONES``: what the agent's analytics is measured with, in fractions of the
  view, as the agent's config writes them (``in_side``: facing from the first point to the
  second, the side a crossing into counts as ``in``).
- ``lines_for(scene)``: the lines of a scene: ``LINES``, plus ``behind`` on a scene with
  static occluders (``common.occluders_in_view``): a segment along the first occluder's
  long axis, through its middle, from end to end. An object crosses it while behind the
  occluder: the failure issue 45 is about (a crossing no camera sees).
- ``anchor``: the bottom centre of a box, the agent's default anchor.
- ``truth_counts``: the true crossings and zone entries and exits, by geometry alone, with
  those made while hidden (visibility < ``HIDDEN``) counted apart.
- ``write_counts`` / ``append_counts`` / ``read_counts``: the counts files every counter
  writes, ``$TRACKING_WORK/results/counts-*.jsonl``: one JSON object a line,
  ``{candidate, counter, seq, line, in, out}``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
import common  # tools/tracking: numpy only at import
from common import RESULT_DIR, VIEW_H, VIEW_W

HIDDEN = 0.5  # a truth box's visibility below which the crossing or entry counts as unseen
DIRECTIONS = ("in", "out")


@dataclass(frozen=True)
class Line:
    """A counting line: a segment, in fractions of the view."""

    name: str
    points: tuple[tuple[float, float], tuple[float, float]]
    in_side: str = "left"  # facing from points[0] to points[1]: crossing into this side is "in"

    def px(self) -> tuple[np.ndarray, np.ndarray]:
        """The two end points in view pixels."""
        a, b = (np.array(p, float) * (VIEW_W, VIEW_H) for p in self.points)
        return a, b

    @property
    def sign(self) -> float:
        """The sign of (b - a) x (p - a) that is the in side (image coordinates, y down)."""
        return -1.0 if self.in_side == "left" else 1.0

    def in_normal(self) -> np.ndarray:
        """The unit vector (view pixels) from the line towards its in side."""
        a, b = self.px()
        e = (b - a) / np.hypot(*(b - a))
        right = np.array((-e[1], e[0]))  # facing along e in image coordinates: the right hand
        return right if self.in_side == "right" else -right


@dataclass(frozen=True)
class Zone:
    name: str
    points: tuple[tuple[float, float], ...]

    def px(self) -> np.ndarray:
        return np.array(self.points, float) * (VIEW_W, VIEW_H)


LINES = (
    Line("vertical", ((0.5, 0.1), (0.5, 0.9))),
    Line("slanted", ((0.1, 0.3), (0.9, 0.75)), in_side="right"),
)
ZONES = (
    Zone("box", ((0.15, 0.2), (0.4, 0.2), (0.4, 0.6), (0.15, 0.6))),
    Zone("ell", ((0.55, 0.15), (0.85, 0.15), (0.85, 0.4), (0.7, 0.4), (0.7, 0.85), (0.55, 0.85))),
)


def occluders(scene) -> list[tuple[float, float, float, float]]:
    """The scene's static occluders as view boxes (x1, y1, x2, y2 pixels): ``common``'s
    ``occluders_in_view`` where it exists, else none. ``scene``: a ``common.Scene`` or
    its name."""
    fn = getattr(common, "occluders_in_view", None)
    if fn is None:
        return []
    if isinstance(scene, str):
        scene = common.SCENES.get(scene)
        if scene is None:
            return []
    return [tuple(float(v) for v in box) for box in fn(scene)]


def behind_line(box: tuple[float, float, float, float], name: str = "behind") -> Line:
    """A line along the occluder's long axis, through its middle, end to end (clipped to the
    view). A post (taller than wide): top to bottom, so ``in`` is rightwards as on
    ``vertical``; a fence (wider than tall): right to left, so ``in`` is downwards."""
    x1, y1, x2, y2 = (
        min(max(box[0], 0.0), VIEW_W),
        min(max(box[1], 0.0), VIEW_H),
        min(max(box[2], 0.0), VIEW_W),
        min(max(box[3], 0.0), VIEW_H),
    )
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    if y2 - y1 >= x2 - x1:
        a, b = (cx, y1), (cx, y2)
    else:
        a, b = (x2, cy), (x1, cy)
    frac = tuple((round(p[0] / VIEW_W, 6), round(p[1] / VIEW_H, 6)) for p in (a, b))
    return Line(name, frac)


def lines_for(scene) -> tuple[Line, ...]:
    """The lines counted on a scene (a ``common.Scene`` or its name): ``LINES``, and
    ``behind`` through the first occluder where the scene has any."""
    occ = occluders(scene)
    return LINES + ((behind_line(occ[0]),) if occ else ())


def anchor(boxes: np.ndarray) -> np.ndarray:
    """Bottom centre of (k, 4) xyxy boxes."""
    boxes = np.asarray(boxes, float).reshape(-1, 4)
    return np.column_stack([(boxes[:, 0] + boxes[:, 2]) / 2, boxes[:, 3]])


def side_of(a, b, p, sign: float) -> int:
    """+1 on the line's in side, -1 on the other (on the line: out), as the agent counts."""
    return 1 if ((b[0] - a[0]) * (p[1] - a[1]) - (b[1] - a[1]) * (p[0] - a[0])) * sign > 0 else -1


def step_crosses(p, q, a, b, sign: float) -> int:
    """The step p -> q changes side of the line a-b where the line is the segment: the
    side it ends on (+1 in, -1 out), else 0."""
    sp, sq = side_of(a, b, p, sign), side_of(a, b, q, sign)
    if sp == sq:
        return 0
    # where the step meets the line, as a fraction along the segment
    d = np.subtract(q, p)
    e = np.subtract(b, a)
    den = e[0] * d[1] - e[1] * d[0]
    if den == 0:
        return 0
    u = ((p[0] - a[0]) * d[1] - (p[1] - a[1]) * d[0]) / den
    return sq if 0 <= u <= 1 else 0


def point_in(poly: np.ndarray, p) -> bool:
    inside = False
    for (x0, y0), (x1, y1) in zip(poly, np.roll(poly, -1, axis=0)):
        if (y0 > p[1]) != (y1 > p[1]) and p[0] < x0 + (p[1] - y0) * (x1 - x0) / (y1 - y0):
            inside = not inside
    return inside


def truth_counts(truth: np.ndarray, lines=LINES, zones=ZONES) -> dict:
    """Counts from the true boxes (rows: frame, id, x1, y1, x2, y2, visibility, ...).

    Lines: a crossing where a true anchor's step between two frames passes through the
    segment, once per object pass (truth id) and direction (as the agent counts once per
    track and direction); ``<line>:<dir>:hidden`` of them with the object mostly hidden
    (visibility < ``HIDDEN``) at either end of the step. Zones: an entry where the anchor
    passes into the polygon, an exit where it passes out (every time), hidden ones apart,
    and each completed visit's (zone, first frame inside, first frame outside) in
    ``visits``. Keys: ``<line>:in``, ``<line>:out``, ``<zone>:enter``, ``<zone>:exit``,
    each also with ``:hidden``."""
    counts = {f"{ln.name}:{d}{h}": 0 for ln in lines for d in DIRECTIONS for h in ("", ":hidden")}
    counts |= {f"{z.name}:{k}{h}": 0 for z in zones for k in ("enter", "exit") for h in ("", ":hidden")}
    visits = []
    geo = [(ln, *ln.px()) for ln in lines]
    polys = [(z, z.px()) for z in zones]
    for tid in np.unique(truth[:, 1]):
        rows = truth[truth[:, 1] == tid]
        pts = anchor(rows[:, 2:6])
        hidden = rows[:, 6] < HIDDEN  # the object mostly hidden: no camera sees it there
        done = set()
        for ln, a, b in geo:
            for i, (p, q) in enumerate(itertools.pairwise(pts)):
                side = step_crosses(p, q, a, b, ln.sign)
                d = "in" if side > 0 else "out"
                if side and (ln.name, d) not in done:
                    done.add((ln.name, d))
                    counts[f"{ln.name}:{d}"] += 1
                    counts[f"{ln.name}:{d}:hidden"] += bool(hidden[i] or hidden[i + 1])
        for z, poly in polys:
            inside = [point_in(poly, p) for p in pts]
            for i, now in enumerate(inside):
                before = inside[i - 1] if i else False
                if now and not before:
                    counts[f"{z.name}:enter"] += 1
                    counts[f"{z.name}:enter:hidden"] += bool(hidden[i])
                    start = rows[i, 0]
                if before and not now:
                    counts[f"{z.name}:exit"] += 1
                    counts[f"{z.name}:exit:hidden"] += bool(hidden[i])
                    visits.append((z.name, start, rows[i, 0]))
    return counts | {"visits": visits}


def true_crossings(truth: np.ndarray, lines) -> dict[str, dict[str, int]]:
    """Per line: ``in``, ``out`` and ``in_hidden``, ``out_hidden`` (of them, made while hidden)."""
    t = truth_counts(truth, lines, ())
    return {
        ln.name: {d: t[f"{ln.name}:{d}"] for d in DIRECTIONS}
        | {f"{d}_hidden": t[f"{ln.name}:{d}:hidden"] for d in DIRECTIONS}
        for ln in lines
    }


# -- the counts files ----------------------------------------------------------------------

COUNTS_AGENT = RESULT_DIR / "counts-agent.jsonl"
COUNTS_PEERS = RESULT_DIR / "counts-peers.jsonl"


def count_row(candidate: str, counter: str, seq: str, line: str, n_in: int, n_out: int) -> dict:
    return {
        "candidate": candidate,
        "counter": counter,
        "seq": seq,
        "line": line,
        "in": int(n_in),
        "out": int(n_out),
    }


def append_counts(path: Path, rows: list[dict]) -> None:
    """Append rows, each line in one ``write`` of a file opened ``O_APPEND``, so processes
    appending to the same file never interleave within a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for r in rows:
            os.write(fd, (json.dumps(r) + "\n").encode())
    finally:
        os.close(fd)


def write_counts(path: Path, rows: list[dict]) -> None:
    """Rewrite ``path`` with ``rows`` (through a temporary: a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tmp.replace(path)


def read_counts(paths=None) -> list[dict]:
    """Every row of the counts files (default: ``results/counts-*.jsonl``); a later row of
    the same (candidate, counter, seq, line) replaces an earlier one."""
    paths = sorted(RESULT_DIR.glob("counts-*.jsonl")) if paths is None else paths
    last: dict[tuple, dict] = {}
    for path in paths:
        if not Path(path).exists():
            continue
        for text in Path(path).read_text().splitlines():
            if text.strip():
                r = json.loads(text)
                last[(r["candidate"], r["counter"], r["seq"], r["line"])] = r
    return list(last.values())


# -- hand-made tracks, for checking a counter ----------------------------------------------

HANDMADE_CASES = ("cross in", "cross out", "round the end", "back and forth")
#: what a counter that counts as the truth does (once per track and direction) gives
HANDMADE_EXPECTED = {
    "cross in": (1, 0),
    "cross out": (0, 1),
    "round the end": (0, 0),
    "back and forth": (1, 1),
}


def _walk(waypoints, speed: float = 2.0, hold: int = 10) -> np.ndarray:
    """Points along the waypoints at ``speed`` px a frame, ``hold`` frames still at each."""
    pts = [np.asarray(waypoints[0], float)] * hold
    for p, q in itertools.pairwise(np.asarray(waypoints, float)):
        n = max(int(np.ceil(np.hypot(*(q - p)) / speed)), 1)
        pts += [p + (q - p) * k / n for k in range(1, n + 1)] + [q] * hold
    return np.array(pts)


def handmade(line: Line, size: float = 20.0) -> dict[str, np.ndarray]:
    """For each of ``HANDMADE_CASES``, one track's rows (frame, id, x1, y1, x2, y2): a
    ``size`` px square box whose bottom centre walks 40 px either side of the line, at 2 px
    a frame, standing 10 frames at each turn: across the middle into the in side, across
    it the other way, round the line's end (40 px beyond it, from the out side to the in
    side, never through the segment), and across, back, across and back."""
    a, b = line.px()
    length = np.hypot(*(b - a))
    e = (b - a) / length
    n = line.in_normal()
    mid = (a + b) / 2
    d = 40.0
    paths = {
        "cross in": [mid - d * n, mid + d * n],
        "cross out": [mid + d * n, mid - d * n],
        "round the end": [b - 20 * e - d * n, b + d * e - d * n, b + d * e + d * n, b - 20 * e + d * n],
        "back and forth": [mid - d * n, mid + d * n, mid - d * n, mid + d * n, mid - d * n],
    }
    out = {}
    for k, (case, way) in enumerate(paths.items()):
        p = _walk(way)
        boxes = np.column_stack([p[:, 0] - size / 2, p[:, 1] - size, p[:, 0] + size / 2, p[:, 1]])
        out[case] = np.column_stack([np.arange(len(p)), np.full(len(p), k + 1), boxes])
    return out


def handmade_lines() -> tuple[Line, ...]:
    """``LINES``, ``vertical`` with its in side on the left of the view (``in_side="right"``)
    and two ``behind`` lines: through a post (30 x 200 px) and a fence (250 x 30)."""
    flipped = Line("vertical-flipped", LINES[0].points, in_side="right")
    post = behind_line((300, 150, 330, 350), "behind-post")
    fence = behind_line((200, 300, 450, 330), "behind-fence")
    return (*LINES, flipped, post, fence)
