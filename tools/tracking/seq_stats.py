"""What the sequences hold: per scene and detection source, boxes per frame, identities,
occlusion (truth rows under 50 % visible; the longest run of one object under 10 %
visible), and the detections' make-up.

    python seq_stats.py
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from common import list_sequences, load_sequence


def longest_hidden(truth: np.ndarray, below: float = 0.1) -> int:
    best = 0
    for i in np.unique(truth[:, 1]):
        v = truth[truth[:, 1] == i]
        run = 0
        prev = None
        for f, vis in zip(v[:, 0], v[:, 6]):
            run = run + 1 if vis < below and (prev is None or f == prev + 1) else (1 if vis < below else 0)
            prev = f
            best = max(best, run)
    return best


def main() -> int:
    by = defaultdict(list)
    for p in list_sequences():
        truth, dets, meta = load_sequence(p)
        n = meta["frames"]
        by[(meta["source"], meta["scene"])].append(
            {
                "truth/frame": len(truth) / n,
                "ids": len(np.unique(truth[:, 1])),
                "vis<0.5 %": 100 * np.mean(truth[:, 6] < 0.5),
                "longest <10% visible (frames)": longest_hidden(truth),
                "dets/frame": len(dets) / n,
                "dets <0.5 score %": 100 * np.mean(dets[:, 5] < 0.5) if len(dets) else 0.0,
            }
        )
    keys = list(next(iter(by.values()))[0])
    print("| source | scene | sequences | " + " | ".join(keys) + " |")
    print("|---|---|---|" + "---|" * len(keys))
    for (src, scene), g in sorted(by.items()):
        cells = [
            f"{np.mean([x[k] for x in g]):.1f}" if "longest" not in k else f"{max(x[k] for x in g)}"
            for k in keys
        ]
        print(f"| {src} | {scene} | {len(g)} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
