"""Tables of the cost and soak runs (results/costs.jsonl, results/soak.jsonl), as markdown.

python summarize.py
"""

from __future__ import annotations

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


if __name__ == "__main__":
    print(cost_table())
    print()
    print(soak_table())
