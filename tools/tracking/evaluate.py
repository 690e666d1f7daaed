"""Score every kept tracker output with TrackEval; print and save the accuracy tables.

    /tmp/trackvenv/bin/python evaluate.py            # after run_trackers.py in each venv

Writes $TRACKING_WORK/results/accuracy.jsonl (one line per candidate, sequence, stride)
and prints markdown tables: per detection source and stride, each candidate's HOTA, IDF1,
MOTA and ID switches as mean ± standard deviation over the sequences' seeds, per scene.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from common import OUT_DIR, RESULT_DIR, SEQ_DIR, load_sequence
from te import evaluate

ORDER = [
    "ours-lap",
    "ours-scipy",
    "ours-xywh",
    "ours-xywh+ul",
    "ours-xywh-statebox+ul",
    "trackers-bytetrack",
    "trackers-ocsort",
    "sv-bytetrack",
    "norfair",
    "norfair-hit",
    "ul-bytetrack",
    "ul-botsort",
    "ul-ocsort",
    "ul-deepocsort",
    "ul-fasttrack",
    "ul-tracktrack",
]


def _candidates(rows: list[dict]) -> list[str]:
    """The candidates scored, in ORDER, the agent's variants first."""
    seen = {r["candidate"] for r in rows}
    agent = sorted(c for c in seen if c == "agent" or c.startswith("agent+"))
    return agent + [c for c in ORDER if c in seen]


def score_all(only: list[str] | None = None) -> list[dict]:
    rows = []
    truths = {}
    for cand_dir in sorted(p for p in OUT_DIR.iterdir() if p.is_dir() and (not only or p.name in only)):
        for f in sorted(cand_dir.glob("*.npz")):
            seq, stride = f.stem.rsplit("-k", 1)
            if seq not in truths:
                truth, _, meta = load_sequence(SEQ_DIR / f"{seq}.npz")
                truths[seq] = (truth, meta)
            truth, meta = truths[seq]
            frames = list(range(0, meta["frames"], int(stride)))
            m = evaluate(truth, np.load(f)["rows"], frames)
            m.update(
                candidate=cand_dir.name,
                seq=seq,
                source=meta["source"],
                scene=meta["scene"],
                seed=meta["seed"],
                stride=int(stride),
            )
            rows.append(m)
    return rows


def tables(rows: list[dict]) -> str:
    groups = defaultdict(list)
    for r in rows:
        groups[(r["source"], r["stride"], r["scene"], r["candidate"])].append(r)
    sources = sorted({r["source"] for r in rows}, key=lambda s: s != "noisy")
    scenes = sorted({r["scene"] for r in rows})
    cands = _candidates(rows)
    out = []
    for source in sources:
        for stride in sorted({r["stride"] for r in rows}):
            seeds = sorted({r["seed"] for r in rows if r["source"] == source})
            out.append(f"\n#### {source} detections, stride {stride} (mean ± sd over seeds {seeds})\n")
            head = (
                "| candidate | "
                + " | ".join(f"{s} HOTA | {s} IDF1 | {s} MOTA | {s} IDSW" for s in scenes)
                + " | mean HOTA | mean IDF1 |"
            )
            out.append(head)
            out.append("|" + "---|" * (2 + 4 * len(scenes) + 1))
            for c in cands:
                cells, hs, i1s = [], [], []
                for s in scenes:
                    g = groups.get((source, stride, s, c), [])
                    if not g:
                        cells.append(" | | | ")
                        continue
                    h = np.array([x["HOTA"] for x in g]) * 100
                    i1 = np.array([x["IDF1"] for x in g]) * 100
                    mo = np.array([x["MOTA"] for x in g]) * 100
                    sw = np.array([x["IDSW"] for x in g])
                    hs.append(h.mean())
                    i1s.append(i1.mean())
                    cells.append(
                        f"{h.mean():.1f} ± {h.std():.1f} | {i1.mean():.1f} ± {i1.std():.1f} | "
                        f"{mo.mean():.1f} ± {mo.std():.1f} | {sw.mean():.1f} ± {sw.std():.1f}"
                    )
                out.append(f"| {c} | " + " | ".join(cells) + f" | {np.mean(hs):.1f} | {np.mean(i1s):.1f} |")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """Per source: each candidate's HOTA, IDF1, MOTA, ID switches at each stride, the mean
    over scenes and seeds, ± the standard deviation over seeds of the per-seed scene mean."""
    out = []
    cands = _candidates(rows)
    strides = sorted({r["stride"] for r in rows})
    for source in sorted({r["source"] for r in rows}, key=lambda s: s != "noisy"):
        seeds = sorted({r["seed"] for r in rows if r["source"] == source})
        out.append(f"\n#### {source} detections: mean over 3 scenes x {len(seeds)} seeds, ± sd over seeds\n")
        out.append(
            "| candidate | "
            + " | ".join(f"k={k} HOTA | k={k} IDF1 | k={k} MOTA | k={k} IDSW" for k in strides)
            + " |"
        )
        out.append("|---|" + "---|" * (4 * len(strides)))
        for c in cands:
            cells = []
            for k in strides:
                g = [r for r in rows if r["candidate"] == c and r["source"] == source and r["stride"] == k]
                for m, scale in (("HOTA", 100), ("IDF1", 100), ("MOTA", 100), ("IDSW", 1)):
                    per_seed = [np.mean([r[m] for r in g if r["seed"] == s]) * scale for s in seeds]
                    cells.append(f"{np.mean(per_seed):.1f} ± {np.std(per_seed):.1f}")
            out.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-jsonl", action="store_true", help="only print the tables of the saved scores")
    p.add_argument("--only", nargs="*", help="score these candidates; keep the saved scores of the others")
    a = p.parse_args()
    path = RESULT_DIR / "accuracy.jsonl"
    if a.from_jsonl:
        rows = [json.loads(x) for x in path.read_text().splitlines()]
    elif a.only:
        old = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        rows = [r for r in old if r["candidate"] not in a.only] + score_all(a.only)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        rows = score_all()
        RESULT_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = summary(rows) + "\n\n### Per scene\n" + tables(rows)
    (RESULT_DIR / "accuracy.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
