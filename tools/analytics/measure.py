"""Zone and line counts of the agent's analytics against ground truth, and a naive rule.

    .venv/bin/python tools/tracking/make_sequences.py --source noisy --seeds 1 2 3 4
    .venv/bin/python tools/tracking/make_sequences.py --source detector --seeds 1 2
    .venv/bin/python tools/analytics/measure.py

For each sequence of tools/tracking (the synthetic camera's objects entering, leaving,
crossing and hiding each other; the bundled detector's detections, or the truth with a
detector's faults), the detections go through what the agent runs per frame
(``agent_events``): its tracker (``ByteTracker``, default settings) and its analytics
(``Counter``) with the lines and zones of ``truth.py``: two lines (``vertical``,
``slanted``) and two zones on every scene, and a line ``behind`` through the first static
occluder on scenes that have one. The truth is counted from the true boxes by geometry
alone (``truth.truth_counts``): a crossing where a true anchor's step between two frames
passes through the segment (once per object pass and direction), an entry where it passes
into a polygon. Two more scenes are made here: ``jitter`` (objects that stop on a line and
jitter across it for 3 s) and ``stop`` (the same in a zone's edge). Beside the agent's
counts: what the naive rule most tools use (count every change of the box centre's side
of the line, on the tracker's ids) gives.

Prints one table row per sequence and the totals; dwell: each agent exit matched to a
true visit of the same zone, the largest difference in frame periods. Writes the agent's
line counts on tools/tracking's sequences (not the made scenes) to
``$TRACKING_WORK/results/counts-agent.jsonl`` (``truth.py``'s format, counter ``agent``, or
``agent+band=...`` with settings given), for ``compare_counts.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))  # common
sys.path.insert(0, str(Path(__file__).resolve().parent))  # truth
from common import FPS, VIEW_H, VIEW_W, list_sequences, load_sequence
from truth import (
    COUNTS_AGENT,
    HANDMADE_EXPECTED,
    LINES,
    ZONES,
    count_row,
    handmade,
    handmade_lines,
    lines_for,
    read_counts,
    true_crossings,
    truth_counts,
    write_counts,
)

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.configload import load
from edge_agent.core.source_config import TrackerConfig
from edge_agent.pipelines.analytics.counter import Counter
from edge_agent.pipelines.tracking.bytetrack import ByteTracker

LABELS = ("circle", "square", "triangle", "cross")


def analytics_config(lines=LINES, zones=ZONES, min_frames: int | None = None, band: float | None = None):
    """The agent's analytics config for truth.py's lines and zones; ``min_frames`` and
    ``band`` (None: the config's defaults) for every zone and line."""
    extra = {} if min_frames is None else {"min_frames": min_frames}
    return AnalyticsConfig(
        zones=tuple(ZoneConfig(name=z.name, points=z.points, **extra) for z in zones),
        lines=tuple(
            LineConfig(
                name=ln.name,
                points=ln.points,
                in_side=ln.in_side,
                **extra,
                **({} if band is None else {"band": band}),
            )
            for ln in lines
        ),
    )


def agent_events(
    dets: np.ndarray,
    frames: int,
    analytics: AnalyticsConfig,
    stride: int = 1,
    tracker_config: TrackerConfig | None = None,
) -> dict:
    """The detections (rows: frame, x1, y1, x2, y2, score, class) through what the agent
    runs per processed frame (every ``stride``-th): its tracker and its analytics
    (``Counter``). Also the naive centre rule on the tracker's ids.

    Returns ``<line>:in``, ``<line>:out``, ``<zone>:enter``, ``<zone>:exit`` (counts),
    ``naive`` (the naive rule's side changes, all lines), ``exits`` (each ``left`` exit's
    (zone, entry frame, exit frame)) and ``events`` (the Counter's events)."""
    tracker = ByteTracker(tracker_config or TrackerConfig())
    tracker.view = (float(VIEW_W), float(VIEW_H))  # as the agent's step tells it
    counter = Counter(analytics, LABELS, tracker.config.lost_frames, 512)
    ids = np.zeros(1024, np.int64)
    age = np.zeros(1024, np.int32)
    journeys = np.zeros(1024, np.int64)
    events: list[dict] = []
    naive = {ln.name: 0 for ln in analytics.lines}
    last_side: dict[tuple[str, int], float] = {}
    ends = [(ln.name, *(np.array(ln.points, float) * (VIEW_W, VIEW_H))) for ln in analytics.lines]
    idx = np.searchsorted(dets[:, 0], np.arange(frames + 1))
    for t in range(0, frames, stride):
        d = dets[idx[t] : idx[t + 1]]
        xyxy = np.ascontiguousarray(d[:, 1:5])
        scores = d[:, 5].astype(np.float32)
        classes = d[:, 6].astype(np.int32)
        tracker.update(xyxy, scores, classes, float(stride), ids, age, journeys)
        tid = ids[: len(d)].copy()
        counter.update(xyxy, classes, tid, journeys[: len(d)], t, t / FPS, VIEW_W, VIEW_H, events)
        for name, a, b in ends:  # every change of the centre's side, anywhere on the line's segment
            for box, i in zip(xyxy, tid):
                if not i:
                    continue
                c = ((box[0] + box[2]) / 2, (box[1] + box[3]) / 2)
                tt = ((c[0] - a[0]) * (b[0] - a[0]) + (c[1] - a[1]) * (b[1] - a[1])) / ((b - a) ** 2).sum()
                if not 0 <= tt <= 1:
                    continue
                side = np.sign((b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0]))
                prev = last_side.get((name, int(i)))
                if prev is not None and side and prev and side != prev:
                    naive[name] += 1
                if side:
                    last_side[(name, int(i))] = side
    counts = {
        f"{ln.name}:{d}": int(counter.crossed[k, j].sum())
        for k, ln in enumerate(analytics.lines)
        for j, d in enumerate(("in", "out"))
    }
    counts |= {f"{z.name}:enter": int(counter.entered[k].sum()) for k, z in enumerate(analytics.zones)}
    counts |= {f"{z.name}:exit": int(counter.exited[k].sum()) for k, z in enumerate(analytics.zones)}
    exits = [
        (e["zone"], e["entered_unix_s"] * FPS, e["at_unix_s"] * FPS)
        for e in events
        if e["kind"] == "exit" and e["reason"] == "left"
    ]
    return counts | {"naive": sum(naive.values()), "exits": exits, "events": events}


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


def selftest() -> int:
    """The agent (``agent_events``: tracker and Counter) on ``truth.handmade``'s tracks as
    detections (score 0.9), one line at a time, beside the truth."""
    print("| line | case | truth (in, out) | agent |")
    print("|---|---|---|---|")
    bad = 0
    for ln in handmade_lines():
        for case, rows in handmade(ln).items():
            frames = int(rows[:, 0].max()) + 5
            dets = np.column_stack([rows[:, 0], rows[:, 2:6], np.full(len(rows), 0.9), np.zeros(len(rows))])
            g = agent_events(dets, frames, analytics_config((ln,), ()))
            t = np.column_stack([rows, np.ones(len(rows)), np.zeros(len(rows))])
            tc = true_crossings(t, (ln,))[ln.name]
            truth, got = (tc["in"], tc["out"]), (g[f"{ln.name}:in"], g[f"{ln.name}:out"])
            bad += truth != HANDMADE_EXPECTED[case] or got != truth
            print(f"| {ln.name} | {case} | {truth} | {got}{' (same)' if got == truth else ''} |")
    return 1 if bad else 0


def tracker_settings(pairs: list[str]) -> TrackerConfig:
    """``["journeys=false", "lost_frames=30"]``: the tracker's config with those settings,
    read and checked as the agent reads a source's ``tracker`` block."""
    return load(TrackerConfig, "\n".join(pair.replace("=", ": ", 1) for pair in pairs), "--tracker")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", nargs="*", help="sequence name prefixes")
    p.add_argument("--min-frames", type=int, help="every zone's and line's (default: theirs)")
    p.add_argument("--band", type=float, help="every line's (default: theirs)")
    p.add_argument("--selftest", action="store_true", help="hand-made tracks only (truth.handmade)")
    p.add_argument(
        "--tracker",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="the tracker's settings as its config block takes them (journeys=false lost_frames=30)",
    )
    a = p.parse_args()
    if a.selftest:
        return selftest()
    settings = {"min_frames": a.min_frames or None, "band": a.band}
    tracker = tracker_settings(a.tracker)
    counter_name = "agent" + "".join(
        f"+{k}={v}"
        for k, v in (settings | dict(kv.split("=", 1) for kv in a.tracker)).items()
        if v is not None
    )
    runs = []  # (name, truth, dets, frames, lines, from tools/tracking)
    for path in list_sequences():
        if a.only and not any(path.stem.startswith(o) for o in a.only):
            continue
        truth, dets, meta = load_sequence(path)
        runs.append((path.stem, truth, dets, meta["frames"], lines_for(meta["scene"]), True))
    for kind in ("jitter", "stop"):
        for seed in (1, 2):
            truth, dets = made_scene(kind, seed)
            runs.append((f"{kind}-s{seed}", truth, dets, 600, LINES, False))
    all_lines = list(dict.fromkeys(ln.name for run in runs for ln in run[4]))
    keys = [f"{ln}:{d}" for ln in all_lines for d in ("in", "out")] + [
        f"{z.name}:{k}" for z in ZONES for k in ("enter", "exit")
    ]
    print(
        "| sequence | " + " | ".join(keys) + " | naive line changes | dwell: matched, worst error (frames) |"
    )
    print("|---" * (len(keys) + 3) + "|")
    groups: dict[str, dict] = {}
    rows: list[dict] = []
    for name, truth, dets, frames, lines, saved in runs:
        t = truth_counts(truth, lines, ZONES)
        g = agent_events(dets, frames, analytics_config(lines, ZONES, **settings), tracker_config=tracker)
        if saved:
            rows += [
                count_row("agent", counter_name, name, ln.name, g[f"{ln.name}:in"], g[f"{ln.name}:out"])
                for ln in lines
            ]
        worst, matched = dwell_error(t["visits"], g["exits"])
        cells = []
        for k in keys:
            if k not in g:
                cells.append("-")
                continue
            hid = f", {t[k + ':hidden']} hidden" if t[k + ":hidden"] else ""
            cells.append(f"{g[k]}" if g[k] == t[k] else f"**{g[k]}** (truth {t[k]}{hid})")
        mine = [k for k in keys if k in g]
        truth_lines = sum(t[k] for k in mine if ":in" in k or ":out" in k)
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
        group["exact"] += all(g[k] == t[k] for k in mine)
        group["matched"] += matched
        group["worst"] = max(group["worst"], worst or 0.0)
        group["naive"] = group.get("naive", 0) + g["naive"]
        for kind, part in (("crossings", (":in", ":out")), ("entries", (":enter",)), ("exits", (":exit",))):
            these = [k for k in mine if k.endswith(part)]
            for who, counts in (("agent", g), ("truth", t)):
                group[f"{kind} {who}"] = group.get(f"{kind} {who}", 0) + sum(counts[k] for k in these)
            group[f"{kind} hidden"] = group.get(f"{kind} hidden", 0) + sum(t[k + ":hidden"] for k in these)
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
    seqs = {r["seq"] for r in rows}
    if seqs:
        # this run's sequences replace theirs; other counters' rows stay
        old = [r for r in read_counts([COUNTS_AGENT]) if r["counter"] != counter_name or r["seq"] not in seqs]
        write_counts(COUNTS_AGENT, old + rows)
        print(f"\n{len(rows)} line counts ({counter_name}) in {COUNTS_AGENT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
