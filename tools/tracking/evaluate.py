"""Score every kept tracker output with TrackEval; print and save the accuracy tables.

    /tmp/trackvenv/bin/python evaluate.py            # after run_trackers.py in each venv
    /tmp/trackvenv/bin/python evaluate.py --only trackers-bytetrack norfair   # rescore some
    /tmp/trackvenv/bin/python evaluate.py --from-jsonl --scenes occlude turns  # tables only

Writes $TRACKING_WORK/results/accuracy.jsonl (one line per candidate, sequence, stride)
and prints markdown tables: per detection source, each candidate's HOTA, IDF1, MOTA and ID
switches at each stride, mean over the scenes and seeds; then per source and stride, one
table per metric with a column per scene (in SCENES order), mean ± standard deviation over
the sequences' seeds.

A candidate need not have outputs for every sequence (a group run on some scenes only, or
before new scenes were added): its outputs are scored, its means are over what it has, and
the tables say where that is less than the others have. Outputs whose sequence is no longer
in $TRACKING_WORK/seqs are skipped.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np
from common import OUT_DIR, RESULT_DIR, SCENES, SEQ_DIR, load_sequence

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
    """The candidates scored, in ORDER, the agent's variants first, any other last."""
    seen = {r["candidate"] for r in rows}
    agent = sorted(c for c in seen if c == "agent" or c.startswith("agent+"))
    return agent + [c for c in ORDER if c in seen] + sorted(seen - set(agent) - set(ORDER))


def score_all(only: list[str] | None = None) -> list[dict]:
    from te import evaluate  # (TrackEval: only to score, not for the tables)

    rows = []
    truths = {}
    skipped = 0
    for cand_dir in sorted(p for p in OUT_DIR.iterdir() if p.is_dir() and (not only or p.name in only)):
        for f in sorted(cand_dir.glob("*.npz")):
            seq, stride = f.stem.rsplit("-k", 1)
            if seq not in truths:
                if not (SEQ_DIR / f"{seq}.npz").exists():
                    skipped += 1
                    continue
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
    if skipped:
        print(f"(skipped {skipped} outputs whose sequence is not in {SEQ_DIR})")
    return rows


def _scenes(rows: list[dict]) -> list[str]:
    """The scenes scored, in SCENES order (any unknown one last)."""
    known = list(SCENES)
    return sorted({r["scene"] for r in rows}, key=lambda s: (known.index(s) if s in known else len(known), s))


METRICS = (("HOTA", 100), ("IDF1", 100), ("MOTA", 100), ("IDSW", 1))  # (name, scale)


def tables(rows: list[dict], metrics=METRICS) -> str:
    """Per source and stride, one table per metric: a row per candidate, a column per scene
    (mean ± sd over seeds), and the mean over the scenes the candidate has (marked * where
    it lacks a scene some other candidate has)."""
    groups = defaultdict(list)
    for r in rows:
        groups[(r["source"], r["stride"], r["scene"], r["candidate"])].append(r)
    sources = sorted({r["source"] for r in rows}, key=lambda s: s != "noisy")
    scenes = _scenes(rows)
    cands = _candidates(rows)
    out = []
    for source in sources:
        seeds = sorted({r["seed"] for r in rows if r["source"] == source})
        here = [s for s in scenes if any(r["source"] == source and r["scene"] == s for r in rows)]
        for stride in sorted({r["stride"] for r in rows}):
            for metric, scale in metrics:
                out.append(
                    f"\n#### {source} detections, stride {stride}: {metric} (mean ± sd over seeds {seeds})\n"
                )
                out.append("| candidate | " + " | ".join(here) + " | mean |")
                out.append("|---|" + "---|" * (len(here) + 1))
                for c in cands:
                    cells, means = [], []
                    for s in here:
                        g = groups.get((source, stride, s, c), [])
                        if not g:
                            cells.append("")
                            continue
                        v = np.array([x[metric] for x in g], float) * scale
                        means.append(v.mean())
                        n_all = len({r["seed"] for r in rows if r["source"] == source and r["scene"] == s})
                        short = "" if len(g) >= n_all else f" ({len(g)} of {n_all} seeds)"
                        cells.append(f"{v.mean():.1f} ± {v.std():.1f}{short}")
                    if not means:
                        continue
                    mean = f"{np.mean(means):.1f}" + ("*" if len(means) < len(here) else "")
                    out.append(f"| {c} | " + " | ".join(cells) + f" | {mean} |")
    return "\n".join(out)


def summary(rows: list[dict]) -> str:
    """Per source: each candidate's HOTA, IDF1, MOTA, ID switches at each stride, the mean
    over scenes and seeds, ± the standard deviation over seeds of the per-seed scene mean.
    A candidate with fewer (scene, seed) sequences than the source has is marked with
    how many it has: its means are over those."""
    out = []
    cands = _candidates(rows)
    strides = sorted({r["stride"] for r in rows})
    for source in sorted({r["source"] for r in rows}, key=lambda s: s != "noisy"):
        seeds = sorted({r["seed"] for r in rows if r["source"] == source})
        seqs = {(r["scene"], r["seed"]) for r in rows if r["source"] == source}
        scenes = [s for s in _scenes(rows) if any(x[0] == s for x in seqs)]
        out.append(
            f"\n#### {source} detections: mean over {len(scenes)} scenes ({', '.join(scenes)}) x "
            f"{len(seeds)} seeds, ± sd over seeds\n"
        )
        out.append(
            "| candidate | "
            + " | ".join(f"k={k} HOTA | k={k} IDF1 | k={k} MOTA | k={k} IDSW" for k in strides)
            + " |"
        )
        out.append("|---|" + "---|" * (4 * len(strides)))
        for c in cands:
            mine = [r for r in rows if r["candidate"] == c and r["source"] == source]
            if not mine:
                continue
            have = {(r["scene"], r["seed"]) for r in mine}
            cells = []
            for k in strides:
                g = [r for r in mine if r["stride"] == k]
                for m, scale in METRICS:
                    per_seed = [
                        np.mean([r[m] for r in g if r["seed"] == s]) * scale
                        for s in seeds
                        if any(r["seed"] == s for r in g)
                    ]
                    cells.append(f"{np.mean(per_seed):.1f} ± {np.std(per_seed):.1f}" if per_seed else "")
            name = c if have >= seqs else f"{c} ({len(have)} of {len(seqs)} sequences)"
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from-jsonl", action="store_true", help="only print the tables of the saved scores")
    p.add_argument("--only", nargs="*", help="score these candidates; keep the saved scores of the others")
    p.add_argument("--scenes", nargs="+", help="the tables for these scenes only (all are scored and saved)")
    a = p.parse_args()
    path = RESULT_DIR / "accuracy.jsonl"
    if a.from_jsonl:
        rows = [json.loads(x) for x in path.read_text().splitlines()]
    elif a.only:
        old = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        rows = [r for r in old if r["candidate"] not in a.only] + score_all(a.only)
        RESULT_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        rows = score_all()
        RESULT_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    if a.scenes:
        rows = [r for r in rows if r["scene"] in a.scenes]
    text = summary(rows) + "\n\n### Per scene\n" + tables(rows)
    if not a.scenes:  # (the tables of every scene)
        (RESULT_DIR / "accuracy.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
