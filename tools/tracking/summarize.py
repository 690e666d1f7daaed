"""Tables of the cost and soak runs (results/costs.jsonl, results/soak.jsonl) and the
accuracy per scene (results/accuracy.jsonl, from evaluate.py), as markdown.

python summarize.py
python summarize.py --accuracy --source detector --strides 1 2   # accuracy only
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from common import RESULT_DIR


def cost_table() -> str:
    path = RESULT_DIR / "costs.jsonl"
    if not path.exists():
        return ""
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    ref = {
        (r["group"], r["round"], r["boxes"]): r for r in recs if r["candidate"].split("@")[0] == "ours-lap"
    }
    by = defaultdict(list)
    for r in recs:
        by[(r["candidate"], r["boxes"])].append(r)
    rounds = len({r["round"] for r in recs})
    out = [
        f"Per-frame cost, µs (median over {rounds} runs of each candidate, one per round, "
        "of each run's p50 and p99; range of the p50s in brackets; "
        "ratio: p50 / ours-lap's p50 in the same run)\n",
        "| candidate | venv | 10 boxes p50 | 10 boxes p99 | 10 boxes ratio "
        "| 72 boxes p50 | 72 boxes p99 | 72 boxes ratio |",
        "|---|---|---|---|---|---|---|---|",
    ]
    names = []
    for r in recs:
        if r["candidate"] not in names:
            names.append(r["candidate"])
    for name in names:
        cells = []
        for n in (10, 72):
            g = by[(name, n)]
            p50 = np.array([x["p50_us"] for x in g])
            p99 = np.array([x["p99_us"] for x in g])
            ratio = np.array([x["p50_us"] / ref[(x["group"], x["round"], n)]["p50_us"] for x in g])
            cells.append(
                f"{np.median(p50):.0f} [{p50.min():.0f}–{p50.max():.0f}] | {np.median(p99):.0f} | "
                f"{np.median(ratio):.2f}"
            )
        out.append(f"| {name} | {by[(name, 10)][0]['group']} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def soak_table() -> str:
    path = RESULT_DIR / "soak.jsonl"
    if not path.exists():
        return ""
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    by = defaultdict(list)
    for r in recs:
        by[r["candidate"]].append(r)
    out = [
        "| candidate | frames | stored tracks: first → last (max) | RSS MiB: first → last | "
        "mean µs/frame: first → last window | ids issued | objects present (mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, g in by.items():
        g = sorted(g, key=lambda r: r["frame"])
        a, z = g[0], g[-1]
        out.append(
            f"| {name} | {z['frame']} | {a['stored_tracks']} → {z['stored_tracks']} "
            f"({max(r['stored_tracks'] for r in g)}) | {a['rss_mib']} → {z['rss_mib']} | "
            f"{a['mean_us']} → {z['mean_us']} | {z['max_track_id']} | "
            f"{np.mean([r['objects_present_mean'] for r in g]):.1f} |"
        )
    return "\n".join(out)


def accuracy_table(sources: list[str] | None = None, strides: list[int] | None = None) -> str:
    """Per source and stride: each candidate's HOTA / IDF1 / ID switches per scene (means
    over the seeds; evaluate.py has them with their spread, and MOTA)."""
    from evaluate import _candidates, _scenes

    path = RESULT_DIR / "accuracy.jsonl"
    if not path.exists():
        return ""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    by = defaultdict(list)
    for r in rows:
        by[(r["source"], r["stride"], r["scene"], r["candidate"])].append(r)
    out = []
    for source in sorted({r["source"] for r in rows}, key=lambda s: s != "noisy"):
        if sources and source not in sources:
            continue
        scenes = [s for s in _scenes(rows) if any(k[0] == source and k[2] == s for k in by)]
        seeds = sorted({r["seed"] for r in rows if r["source"] == source})
        for k in sorted({r["stride"] for r in rows}):
            if strides and k not in strides:
                continue
            out.append(
                f"\n{source} detections, stride {k}: HOTA / IDF1 / IDSW per scene (mean over seeds {seeds})\n"
            )
            out.append("| candidate | " + " | ".join(scenes) + " |")
            out.append("|---|" + "---|" * len(scenes))
            for c in _candidates(rows):
                cells = []
                for s in scenes:
                    g = by.get((source, k, s, c), [])
                    h, i1, sw = (np.mean([x[m] for x in g]) if g else 0.0 for m in ("HOTA", "IDF1", "IDSW"))
                    cells.append(f"{100 * h:.1f} / {100 * i1:.1f} / {sw:.1f}" if g else "")
                if any(cells):
                    out.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(out)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--accuracy", action="store_true", help="only the accuracy per scene")
    p.add_argument("--source", nargs="+", help="accuracy: these detection sources only")
    p.add_argument("--strides", type=int, nargs="+", help="accuracy: these strides only")
    a = p.parse_args()
    if not a.accuracy:
        print(cost_table())
        print()
        print(soak_table())
        print()
    print(accuracy_table(a.source, a.strides))
