"""Line counts per scene, line and direction: the truth, the agent and other counters.

    .venv/bin/python tools/analytics/measure.py                       # counts-agent.jsonl
    /tmp/trackvenv/bin/python tools/analytics/peers.py                 # counts-peers.jsonl (LineZone)
    YOLO_OFFLINE=1 /tmp/trackvenv-ul/bin/python tools/analytics/peers.py   # (Ultralytics)
    python tools/analytics/compare_counts.py [--best NAME] [--only PREFIX...]

numpy only. Reads the sequences' truth (``$TRACKING_WORK/seqs``; lines by
``truth.lines_for``) and every ``$TRACKING_WORK/results/counts-*.jsonl``. Prints:

1. per scene (source and scene, summed over the seeds) and line: the true crossings in /
   out (of which made while hidden), then each counter's in / out: the agent (its tracker
   and Counter), supervision's LineZone on the best peer's tracks, LineZone on every other
   candidate's tracks, Ultralytics' ObjectCounter on the tracks it was run on;
2. per counter: the per-direction error, the sum over sequences, lines and directions of
   |count - true count|, in all, as a percentage of the true crossings, on the ``behind``
   line alone, the net count - truth, and the error against the crossings not made while
   hidden (what a camera could see: sum of |count - (true - hidden)|).

The best peer: ``--best NAME``, else the candidate (not ``agent*`` or ``ours*``) with the
highest mean IDF1 at stride 1 over these sequences in ``results/accuracy.jsonl``
(``tools/tracking/evaluate.py``), else ``ul-botsort``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tracking"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULT_DIR, list_sequences, load_sequence
from truth import DIRECTIONS, lines_for, read_counts, true_crossings

NAMES = {"agent": "agent", "linezone": "LineZone", "ul": "UL ObjectCounter"}


def best_peer(seqs: set[str], default: str = "ul-botsort") -> tuple[str, str]:
    """(candidate, why): the highest mean IDF1 at stride 1 over ``seqs``."""
    path = RESULT_DIR / "accuracy.jsonl"
    if not path.exists():
        return default, "no accuracy.jsonl: the default"
    idf1 = defaultdict(list)
    for text in path.read_text().splitlines():
        r = json.loads(text)
        if r["stride"] == 1 and r["seq"] in seqs and not r["candidate"].startswith(("agent", "ours")):
            idf1[r["candidate"]].append(r["IDF1"])
    full = {c: sum(v) / len(v) for c, v in idf1.items() if len(v) == len(seqs)}
    if not full:
        return default, "no candidate scored on every sequence: the default"
    best = max(full, key=full.get)
    return best, f"highest mean IDF1 at stride 1 ({100 * full[best]:.1f})"


def column_name(counter: str, candidate: str) -> str:
    base = counter.split("+")[0]
    name = NAMES.get(base, base) + counter[len(base) :]
    return name if candidate == "agent" and base == "agent" else f"{name} on {candidate}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--best", help="the peer whose tracks LineZone counts first (default: highest IDF1)")
    p.add_argument("--only", nargs="*", help="sequence name prefixes")
    a = p.parse_args()

    truth: dict[tuple[str, str], dict] = {}  # (seq, line) -> in, out, in_hidden, out_hidden
    group_of: dict[str, str] = {}
    lines_of: dict[str, list[str]] = {}
    for path in list_sequences():
        if a.only and not any(path.stem.startswith(o) for o in a.only):
            continue
        rows, _, meta = load_sequence(path)
        lines = lines_for(meta["scene"])
        for name, c in true_crossings(rows, lines).items():
            truth[(path.stem, name)] = c
        group_of[path.stem] = re.sub(r"-s\d+$", "", path.stem)
        lines_of[path.stem] = [ln.name for ln in lines]
    if not truth:
        print("no sequences", file=sys.stderr)
        return 2
    counts = {
        (r["counter"], r["candidate"], r["seq"], r["line"]): r
        for r in read_counts()
        if (r["seq"], r["line"]) in truth
    }
    best, why = (a.best, "given") if a.best else best_peer(set(group_of))
    pairs = sorted({(k[0], k[1]) for k in counts})
    order = {"agent": 0, "linezone": 2, "ul": 3}

    def rank(pair):
        counter, cand = pair
        base = counter.split("+")[0]
        return (order.get(base, 4) - (base == "linezone" and cand == best), counter, cand)

    pairs.sort(key=rank)
    cols = [column_name(*pr) for pr in pairs]

    print(f"Best peer: {best} ({why}). Cells: in / out, summed over the seeds; truth: (hidden in / out).\n")
    print("| scene | line | truth | " + " | ".join(cols) + " |")
    print("|---" * (3 + len(cols)) + "|")
    groups = sorted(set(group_of.values()), key=lambda g: (not g.startswith("noisy"), g))
    for g in groups:
        seqs = [s for s in group_of if group_of[s] == g]
        for line in dict.fromkeys(ln for s in seqs for ln in lines_of[s]):
            have = [s for s in seqs if (s, line) in truth]
            t = {k: sum(truth[(s, line)][k] for s in have) for k in ("in", "out", "in_hidden", "out_hidden")}
            cells = []
            for counter, cand in pairs:
                got = [counts[(counter, cand, s, line)] for s in have if (counter, cand, s, line) in counts]
                if not got:
                    cells.append("-")
                    continue
                c = f"{sum(r['in'] for r in got)} / {sum(r['out'] for r in got)}"
                cells.append(c if len(got) == len(have) else f"{c} ({len(got)} of {len(have)} seqs)")
            print(
                f"| {g} | {line} | {t['in']} / {t['out']} ({t['in_hidden']} / {t['out_hidden']}) | "
                + " | ".join(cells)
                + " |"
            )

    print(
        "\n| counter | sequences | true crossings (hidden) | per-direction error | % of true"
        " | error on `behind` (of true there) | net count - truth | error against the seen crossings |"
    )
    print("|---" * 8 + "|")
    for (counter, cand), col in zip(pairs, cols):
        err = err_behind = net = true_n = hidden_n = true_behind = err_seen = 0
        seqs = set()
        for (seq, line), t in truth.items():
            r = counts.get((counter, cand, seq, line))
            if r is None:
                continue
            seqs.add(seq)
            for d in DIRECTIONS:
                e = abs(r[d] - t[d])
                err += e
                err_seen += abs(r[d] - (t[d] - t[f"{d}_hidden"]))
                net += r[d] - t[d]
                true_n += t[d]
                hidden_n += t[f"{d}_hidden"]
                if line == "behind":
                    err_behind += e
                    true_behind += t[d]
        pct = f"{100 * err / true_n:.1f} %" if true_n else "-"
        print(
            f"| {col} | {len(seqs)} | {true_n} ({hidden_n}) | {err} | {pct}"
            f" | {err_behind} ({true_behind}) | {net:+d} | {err_seen} |"
        )

    # per scene: each counter's per-direction error, summed over the scene's seeds and lines
    print("\n| scene | true crossings (hidden) | " + " | ".join(cols) + " |")
    print("|---" * (2 + len(cols)) + "|")
    for g in groups:
        keys = [(s, ln) for (s, ln) in truth if group_of[s] == g]
        true_n = sum(truth[k][d] for k in keys for d in DIRECTIONS)
        hidden_n = sum(truth[k][f"{d}_hidden"] for k in keys for d in DIRECTIONS)
        cells = []
        for counter, cand in pairs:
            rows = [(counts.get((counter, cand, *k)), truth[k]) for k in keys]
            if any(r is None for r, _ in rows):
                cells.append("-")
                continue
            err = sum(abs(r[d] - t[d]) for r, t in rows for d in DIRECTIONS)
            cells.append(f"{err} ({100 * err / max(true_n, 1):.1f} %)")
        print(f"| {g} | {true_n} ({hidden_n}) | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
