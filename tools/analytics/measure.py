"""Zone and line counts of the agent's analytics against ground truth, and a naive rule.

    .venv/bin/python tools/tracking/make_sequences.py --source noisy --seeds 1 2 3 4
    .venv/bin/python tools/tracking/make_sequences.py --source detector --seeds 1 2
    .venv/bin/python tools/analytics/measure.py

For each sequence of tools/tracking (the synthetic camera's objects entering, leaving,
crossing and hiding each other; the bundled detector's detections, or the truth with a
detector's faults), the detections go through what the agent runs per frame: its tracker
(``ByteTracker``, default settings) and its analytics (``Counter``) with two lines and two
zones. The truth is counted from the true boxes by geometry alone: a crossing where a
true anchor's step between two frames passes through the segment (once per object pass
and direction), an entry where it passes into a polygon. Two more scenes are made here:
``jitter`` (objects that stop on a line and jitter across it for 3 s) and ``stop`` (the
same in a zone's edge). Beside the agent's counts: what the naive rule most tools use
(count every change of the box centre's side of the line, on the tracker's ids) gives.

Prints one table row per sequence and the totals; dwell: each agent exit matched to a
true visit of the same zone, the largest difference in frame periods.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
import itertools

from common import FPS, VIEW_H, VIEW_W, list_sequences, load_sequence

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.analytics.counter import Counter
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

LABELS = ("circle", "square", "triangle", "cross")
HIDDEN = 0.5  # a truth box's visibility below which the crossing or entry counts as unseen
LINES = (
    LineConfig(name="vertical", points=((0.5, 0.1), (0.5, 0.9))),
    LineConfig(name="slanted", points=((0.1, 0.3), (0.9, 0.75)), in_side="right"),
)
ZONES = (
    ZoneConfig(name="box", points=((0.15, 0.2), (0.4, 0.2), (0.4, 0.6), (0.15, 0.6))),
    ZoneConfig(
        name="ell", points=((0.55, 0.15), (0.85, 0.15), (0.85, 0.4), (0.7, 0.4), (0.7, 0.85), (0.55, 0.85))
    ),
)
CONFIG = AnalyticsConfig(zones=ZONES, lines=LINES)


def px(points) -> np.ndarray:
    return np.array(points, float) * (VIEW_W, VIEW_H)


def anchor(boxes: np.ndarray) -> np.ndarray:
    """Bottom centre of (k, 4) xyxy boxes."""
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


def truth_counts(truth: np.ndarray) -> dict:
    """Counts from the true boxes (rows: frame, id, x1, y1, x2, y2, ...): crossings once per
    pass and direction, entries and exits, and each completed visit's (zone, start, end)."""
    counts = {f"{ln.name}:{d}{h}": 0 for ln in LINES for d in ("in", "out") for h in ("", ":hidden")}
    counts |= {f"{z.name}:{k}{h}": 0 for z in ZONES for k in ("enter", "exit") for h in ("", ":hidden")}
    visits = []
    for tid in np.unique(truth[:, 1]):
        rows = truth[truth[:, 1] == tid]
        pts = anchor(rows[:, 2:6])
        hidden = rows[:, 6] < HIDDEN  # the object mostly hidden: no camera sees it there
        done = set()
        for ln in LINES:
            a, b = px(ln.points)
            sign = -1 if ln.in_side == "left" else 1
            for i, (p, q) in enumerate(itertools.pairwise(pts)):
                side = step_crosses(p, q, a, b, sign)
                d = "in" if side > 0 else "out"
                if side and (ln.name, d) not in done:
                    done.add((ln.name, d))
                    counts[f"{ln.name}:{d}"] += 1
                    counts[f"{ln.name}:{d}:hidden"] += bool(hidden[i] or hidden[i + 1])
        for z in ZONES:
            poly = px(z.points)
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


def agent_counts(dets: np.ndarray, frames: int) -> dict:
    """The detections (rows: frame, x1, y1, x2, y2, score, class) through the agent's
    tracker and analytics; also the naive centre rule on the tracker's ids."""
    tracker = ByteTracker(TrackerConfig())
    counter = Counter(CONFIG, LABELS, tracker.config.lost_frames, 512)
    ids = np.zeros(1024, np.int64)
    age = np.zeros(1024, np.int32)
    events: list[dict] = []
    naive = {ln.name: 0 for ln in LINES}
    last_side: dict[tuple[str, int], float] = {}
    idx = np.searchsorted(dets[:, 0], np.arange(frames + 1))
    for t in range(frames):
        d = dets[idx[t] : idx[t + 1]]
        xyxy = np.ascontiguousarray(d[:, 1:5])
        scores = d[:, 5].astype(np.float32)
        classes = d[:, 6].astype(np.int32)
        tracker.update(xyxy, scores, classes, 1.0, ids, age)
        tid = ids[: len(d)].copy()
        counter.update(xyxy, classes, tid, t, t / FPS, VIEW_W, VIEW_H, events)
        for ln in LINES:  # every change of the centre's side, anywhere on the line's segment
            a, b = px(ln.points)
            for box, i in zip(xyxy, tid):
                if not i:
                    continue
                c = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
                tt = ((c[0] - a[0]) * (b[0] - a[0]) + (c[1] - a[1]) * (b[1] - a[1])) / ((b - a) ** 2).sum()
                if not 0 <= tt <= 1:
                    continue
                side = np.sign((b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]))
                prev = last_side.get((ln.name, int(i)))
                if prev is not None and side and prev and side != prev:
                    naive[ln.name] += 1
                if side:
                    last_side[(ln.name, int(i))] = side
    counts = {
        f"{ln.name}:{d}": int(counter.crossed[k, j].sum())
        for k, ln in enumerate(LINES)
        for j, d in enumerate(("in", "out"))
    }
    counts |= {f"{z.name}:enter": int(counter.entered[k].sum()) for k, z in enumerate(ZONES)}
    counts |= {f"{z.name}:exit": int(counter.exited[k].sum()) for k, z in enumerate(ZONES)}
    exits = [
        (e["zone"], e["entered_unix_s"] * FPS, e["at_unix_s"] * FPS)
        for e in events
        if e["kind"] == "exit" and e["reason"] == "left"
    ]
    return counts | {"naive": sum(naive.values()), "exits": exits}


def dwell_error(truth_visits: list, exits: list) -> tuple[float | None, int]:
    """The largest |agent dwell - true dwell| in frames over agent exits matched to a true
    visit of the same zone (entry and exit within 3 frames), and how many matched."""
    worst, matched = None, 0
    for zone, start, end in exits:
        cands = [(abs(s - start) + abs(e - end), e - s) for z, s, e in truth_visits if z == zone]
        if not cands:
            continue
        dist, true_len = min(cands)
        if dist <= 6:
            matched += 1
            err = abs((end - start) - true_len)
            worst = err if worst is None else max(worst, err)
    return worst, matched


def made_scene(kind: str, seed: int, frames: int = 600) -> tuple[np.ndarray, np.ndarray]:
    """``jitter``: objects walk to the vertical line, stand on it for 3 s, and walk on;
    ``stop``: the same on the left edge of zone ``box``. The truth stands 1 px short of
    the border (one crossing, as it walks on); the detections sway +-4 px across it, plus
    1.5 px noise per corner, scored 0.9. Returns (truth rows, detections)."""
    rng = np.random.default_rng(seed)
    x_stop = 0.5 * VIEW_W if kind == "jitter" else 0.15 * VIEW_W
    rows, dets = [], []
    for obj in range(4):
        y = (0.25 + 0.1 * obj) * VIEW_H
        w = 40.0
        start = 20 + 80 * obj
        direction = 1 if obj % 2 == 0 else -1
        x0 = x_stop - direction * 150
        for t in range(frames):
            s = t - start
            if s < 0:
                continue
            if s < 75:  # walks 150 px, to 1 px short of the border
                x = x0 + direction * (2 * s - 1)
                sway = 0.0
            elif s < 165:  # stands, swaying across it
                x = x_stop - direction
                sway = 4 * np.sin(s * 1.7) + rng.normal(0, 1)
            else:
                x = x_stop + direction * (2 * (s - 165) + 1)
                sway = 0.0
            if not 20 < x < VIEW_W - 20:
                continue
            box = np.array((x - w / 2, y - 60, x + w / 2, y))
            rows.append((t, obj + 1, *box, 1.0, obj % 4))
            seen = box + np.array((sway, 0, sway, 0)) + rng.normal(0, 1.5, 4)
            dets.append((t, *seen, 0.9, obj % 4))
    truth, seen = np.array(rows, float), np.array(dets, float)
    return truth[truth[:, 0].argsort(kind="stable")], seen[seen[:, 0].argsort(kind="stable")]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="sequence name prefixes")
    p.add_argument("--min-frames", type=int, help="every zone's and line's (default: theirs)")
    p.add_argument("--band", type=float, help="every line's (default: theirs)")
    a = p.parse_args()
    global CONFIG
    zones, lines = ZONES, LINES
    if a.min_frames:
        zones = tuple(replace(z, min_frames=a.min_frames) for z in zones)
        lines = tuple(replace(ln, min_frames=a.min_frames) for ln in lines)
    if a.band is not None:
        lines = tuple(replace(ln, band=a.band) for ln in lines)
    CONFIG = AnalyticsConfig(zones=zones, lines=lines)
    runs = []
    for path in list_sequences():
        if a.only and not any(path.stem.startswith(o) for o in a.only):
            continue
        truth, dets, meta = load_sequence(path)
        runs.append((path.stem, truth, dets, meta["frames"]))
    for kind in ("jitter", "stop"):
        for seed in (1, 2):
            truth, dets = made_scene(kind, seed)
            runs.append((f"{kind}-s{seed}", truth, dets, 600))
    keys = [f"{ln.name}:{d}" for ln in LINES for d in ("in", "out")] + [
        f"{z.name}:{k}" for z in ZONES for k in ("enter", "exit")
    ]
    print(
        "| sequence | " + " | ".join(keys) + " | naive line changes | dwell: matched, worst error (frames) |"
    )
    print("|---" * (len(keys) + 3) + "|")
    groups: dict[str, dict] = {}
    for name, truth, dets, frames in runs:
        t, g = truth_counts(truth), agent_counts(dets, frames)
        worst, matched = dwell_error(t["visits"], g["exits"])
        cells = []
        for k in keys:
            hid = f", {t[k + ':hidden']} hidden" if t[k + ":hidden"] else ""
            cells.append(f"{g[k]}" if g[k] == t[k] else f"**{g[k]}** (truth {t[k]}{hid})")
        truth_lines = sum(t[k] for k in keys if ":in" in k or ":out" in k)
        worst_s = "-" if worst is None else f"{worst:.2f}"
        print(
            f"| {name} | "
            + " | ".join(cells)
            + f" | {g['naive']} (truth {truth_lines}) | {matched}, {worst_s} |"
        )
        group = groups.setdefault(
            name.split("-")[0], {"sequences": 0, "exact": 0, "matched": 0, "worst": 0.0}
        )
        group["sequences"] += 1
        group["exact"] += all(g[k] == t[k] for k in keys)
        group["matched"] += matched
        group["worst"] = max(group["worst"], worst or 0.0)
        group["naive"] = group.get("naive", 0) + g["naive"]
        for kind, part in (("crossings", (":in", ":out")), ("entries", (":enter",)), ("exits", (":exit",))):
            mine = [k for k in keys if k.endswith(part)]
            for who, counts in (("agent", g), ("truth", t)):
                group[f"{kind} {who}"] = group.get(f"{kind} {who}", 0) + sum(counts[k] for k in mine)
            group[f"{kind} hidden"] = group.get(f"{kind} hidden", 0) + sum(t[k + ":hidden"] for k in mine)
    print(
        "\n| sequences | crossings, agent / truth (hidden) | entries | exits"
        " | naive side changes / true crossings | exact sequences | dwell: exits matched, worst (frames) |"
    )
    print("|---" * 7 + "|")
    for name, g in groups.items():
        cells = [
            f"{g[f'{k} agent']} / {g[f'{k} truth']} ({g[f'{k} hidden']})"
            for k in ("crossings", "entries", "exits")
        ]
        print(
            f"| {g['sequences']} {name} | " + " | ".join(cells) + f" | {g['naive']} / {g['crossings truth']}"
            f" | {g['exact']} of {g['sequences']} | {g['matched']}, {g['worst']:.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
