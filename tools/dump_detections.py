"""Dump the agent's detections on a frame set, to compare with another loop's.

    .venv/bin/python tools/dump_detections.py --model yolov8n-busy-640.onnx \\
        --frames /tmp/bench-frames/frames.npy --iou 0.7 --out agent.npz [--input-adapter off]

Runs each frame through the agent's own per-frame path (a frame slot of the model: the
preprocessor, the backend, the model's decoder and NMS, ``FrameSlot.fill``, which maps
boxes and the task's values back to source pixels and makes the masks) with the config's
ONNX Runtime defaults. Writes one array per frame, ``arr_i``, rows ``x1 y1 x2 y2 score
class``, in the order of the frames: the layout of the ``--dump-dets`` files of the
reference loops, so a tool that compares those compares these too. A pose, oriented-box or
segmentation model adds, per frame, the layout ``tools/exports/ultralytics_predict.py``
writes: ``kpt_i`` (n, K, D) keypoints; ``obb_i`` (n, 5) cx, cy, w, h, angle; ``rle_i`` and
``rlen_i``, each mask's COCO RLE counts over the frame, concatenated, and their lengths
(``tools/compare_tasks.py`` compares them). ``--frames`` is a ``.npy`` of BGR frames
(N, H, W, 3) or a folder of images (sorted).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import replace

import numpy as np

from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.pipelines.images import ImageError, read_image_file
from edge_agent.pipelines.model import LoadedModel, load_model
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.sources.files import list_images
from edge_agent.pipelines.tasks import masks


def frames_of(path: str) -> Iterator[np.ndarray]:
    if path.endswith(".npy"):
        for frame in np.load(path, mmap_mode="r"):
            yield np.ascontiguousarray(frame)
        return
    files = list_images(path)
    if not files:
        raise SystemExit(f"{path}: no images")
    for f in files:
        try:
            yield read_image_file(f)
        except ImageError as e:
            raise SystemExit(f"cannot read the image {e}") from None


def dump(loaded: LoadedModel, frames: Iterator[np.ndarray]) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Each frame through a frame slot as the post stage fills it: the boxes per frame, and
    the task's arrays by name."""
    task = loaded.task
    slot = FrameSlot(
        0, loaded.backend.allocate(), loaded.input_name, loaded.params.max_detections, None, task
    )
    loaded.backend.warmup(slot.io)
    dets, extra = [], {}
    for i, image in enumerate(frames):
        loaded.preprocessor(image, slot.tensor, slot.geo)
        loaded.backend.infer(slot.io)
        slot.fill(loaded.decode(slot.io.outputs, loaded.params))
        n = slot.det_count
        dets.append(
            np.concatenate([slot.det_xyxy[:n], slot.det_score[:n, None], slot.det_class[:n, None]], 1)
        )
        if task.name == "pose":
            extra[f"kpt_{i}"] = slot.det_extra[:n].reshape(n, task.keypoints, task.dims).copy()  # type: ignore[attr-defined]
        elif task.name == "obb":
            extra[f"obb_{i}"] = slot.det_extra[:n, :5].copy()
        elif task.masks:
            h, w = slot.geo.src_h, slot.geo.src_w
            runs = [masks.rle(slot.det_masks[j], h, w) for j in range(n)]  # type: ignore[arg-type]
            extra[f"rle_{i}"] = np.concatenate(runs).astype(np.int32) if runs else np.zeros(0, np.int32)
            extra[f"rlen_{i}"] = np.array([len(r) for r in runs], np.int32)
    return dets, extra


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="ONNX file (manifest beside it, else read from the ONNX)")
    p.add_argument("--frames", required=True, help=".npy of BGR frames or a folder of images")
    p.add_argument("--out", required=True, help="the .npz to write")
    p.add_argument("--score", type=float, default=0.25, help="score threshold")
    p.add_argument("--iou", type=float, default=0.7, help="NMS IoU threshold (Ultralytics' default: 0.7)")
    p.add_argument("--max-det", type=int, default=300, help="detections kept per frame")
    p.add_argument("--input-adapter", choices=["auto", "off"], default="auto")
    p.add_argument("--cache-dir", default="~/.cache/edge-agent/models", help="for the adapted copy")
    p.add_argument(
        "--masks", choices=["polygon", "rle", "none"], default="", help="model.masks (default: polygon)"
    )
    a = p.parse_args()
    model = ModelConfig(
        path=a.model,
        score_threshold=a.score,
        iou_threshold=a.iou,
        max_detections=a.max_det,
        input_adapter=a.input_adapter,
        cache_dir=a.cache_dir,
    )
    if a.masks:
        model = replace(model, masks=a.masks)
    loaded = load_model(model, OnnxRuntimeConfig())
    with loaded:
        dets, extra = dump(loaded, frames_of(a.frames))
    np.savez_compressed(a.out, *dets, **extra)
    counts = [len(d) for d in dets]
    adapted = "adapted" if loaded.adapted_from else "original"
    mean = np.mean(counts)
    print(
        f"{a.out}: {len(dets)} frames ({adapted}, task {loaded.task.name}), "
        f"detections/frame mean {mean:.1f} max {max(counts)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
