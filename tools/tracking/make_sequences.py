"""Build the measurement's sequences into $TRACKING_WORK/seqs (default /tmp/tracking/seqs).

    /work/main/.venv-3.12/bin/python make_sequences.py --source noisy --seeds 1 2 3 4
    /work/main/.venv-3.12/bin/python make_sequences.py --source detector --seeds 1 2
    /work/main/.venv-3.12/bin/python make_sequences.py --source noisy --seeds 1 --scenes occlude pairs

Both in the agent's venv: the scene is its synthetic camera.

``noisy``: detections made from the truth with a detector's faults (common.noisy_detections).
``detector``: the bundled detector (models/shapes-det) run through the agent's own model
loading and per-frame path (edge_agent.evaluation.detect), score threshold 0.1 so the
low-score boxes a ByteTrack-class tracker uses are kept; needs the agent's venv.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from common import (
    SCENES,
    SEQ_DIR,
    load_sequence,
    noisy_detections,
    render_sequence,
    save_sequence,
    seq_name,
    write_mot,
)


def build_noisy(scene_name: str, seed: int, frames: int | None) -> str:
    scene = SCENES[scene_name]
    frames = frames or scene.frames
    truth = np.concatenate([rows for _, rows, _ in render_sequence(scene, seed, frames)])
    # the scene's place in SCENES (cross, crowd, fast first: their streams are unchanged)
    rng = np.random.default_rng([seed, list(SCENES).index(scene_name), 7])
    dets = noisy_detections(truth, frames, rng)
    name = seq_name("noisy", scene_name, seed)
    save_sequence(name, truth, dets, {"source": "noisy", "scene": scene_name, "seed": seed, "frames": frames})
    return f"{name}: {len(truth) / frames:.1f} truth boxes/frame, {len(dets) / frames:.1f} detections/frame"


def build_detector(scene_name: str, seed: int, frames: int | None, loaded) -> str:
    from edge_agent.checks.evaluation import detect

    scene = SCENES[scene_name]
    frames = frames or scene.frames
    truths = []

    def frames_iter():
        for _, rows, view in render_sequence(scene, seed, frames, with_images=True):
            truths.append(rows)
            yield np.ascontiguousarray(view)

    found = detect(loaded, frames_iter())
    dets = [
        np.column_stack([np.full(len(s), t), xyxy, s, c]) for t, (xyxy, s, c) in enumerate(found) if len(s)
    ]
    dets = np.concatenate(dets).astype(np.float64) if dets else np.zeros((0, 7))
    truth = np.concatenate(truths)
    name = seq_name("detector", scene_name, seed)
    meta = {"source": "detector", "scene": scene_name, "seed": seed, "frames": frames, "model": "shapes-det"}
    save_sequence(name, truth, dets, meta)
    return f"{name}: {len(truth) / frames:.1f} truth boxes/frame, {len(dets) / frames:.1f} detections/frame"


def write_mot_sequence(root: Path, name: str) -> None:
    """The saved sequence's truth in MOTChallenge layout (gt.txt and seqinfo.ini), for any
    MOT evaluator."""
    truth, _, meta = load_sequence(SEQ_DIR / f"{name}.npz")
    (root / name / "gt").mkdir(parents=True, exist_ok=True)
    write_mot(root / name / "gt" / "gt.txt", truth, True)
    (root / name / "seqinfo.ini").write_text(
        f"[Sequence]\nname={name}\nimDir=img1\nframeRate=30\nseqLength={meta['frames']}\n"
        "imWidth=640\nimHeight=480\nimExt=.jpg\n"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--source", choices=["noisy", "detector"], required=True)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--scenes", nargs="+", choices=list(SCENES), default=list(SCENES))
    p.add_argument("--frames", type=int, help="frames per sequence (default: each scene's own)")
    p.add_argument("--mot", metavar="DIR", help="also the truth as MOTChallenge files: DIR/<name>/gt/gt.txt")
    a = p.parse_args()
    loaded = None
    if a.source == "detector":
        from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
        from edge_agent.pipelines.model import load_model

        loaded = load_model(ModelConfig(score_threshold=0.1, max_detections=100), OnnxRuntimeConfig())
    for scene in a.scenes:
        for seed in a.seeds:
            t = time.perf_counter()
            msg = (
                build_noisy(scene, seed, a.frames)
                if loaded is None
                else build_detector(scene, seed, a.frames, loaded)
            )
            print(f"{msg}  ({time.perf_counter() - t:.1f} s)", flush=True)
            if a.mot:
                write_mot_sequence(Path(a.mot), seq_name(a.source, scene, seed))
    if loaded is not None:
        loaded.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
