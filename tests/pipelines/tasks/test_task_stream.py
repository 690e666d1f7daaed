"""Pose, oriented-box and segmentation models in a real agent's stream: each detection's
keypoints, rotated box or mask in source pixels, in the schema; a consumer that reads only
boxes (the client, a detection model's messages against the schema before these fields)
keeps working; msgpack carries the same values.

The models are real ONNX graphs read without a manifest, from Ultralytics' metadata and
shapes, whose outputs are constants chosen so every expected value is known: a 640x480
synthetic camera letterboxed into 320x320 is scaled by 0.5 with 40 rows of padding on top.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import REPO, free_endpoint, started, wait_until
from helpers import Subscriber

from edge_agent.client import parse
from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import ModelConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig, TrackerConfig
from edge_agent.models.testmodels import brightness_detector
from edge_agent.service.runner import Agent

V2 = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())
F = 1  # ONNX float
SCALE, PAD_Y = 0.5, 40  # 640x480 into 320x320


def still(base: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    return base, np.zeros_like(base), F


def meta(task: str, **more: str) -> dict[str, str]:
    return {"task": task, "names": "{0: 'person', 1: 'car'}", "imgsz": "[320, 320]", **more}


def to_source(x: float, y: float) -> tuple[float, float]:
    return x / SCALE, (y - PAD_Y) / SCALE


KPTS = [(100 + 4 * j, 120 + 2 * j, 0.8) for j in range(16)] + [(150, 10, 0.1)]  # the last in the padding


def pose_model(path: Path) -> str:
    """YOLO26-pose's end-to-end head [1, 300, 6 + 17 x 3]: one person."""
    out = np.zeros((1, 300, 57), np.float32)
    out[0, 0, :6] = (100, 100, 180, 200, 0.9, 0)
    out[0, 0, 6:] = np.array(KPTS, np.float32).ravel()
    return brightness_detector(
        str(path), {"output0": still(out)}, metadata=meta("pose", kpt_shape="[17, 3]", end2end="True")
    )


OBB = (160.0, 160.0, 80.0, 40.0, 0.5)  # cx, cy, w, h, angle in input pixels


def obb_model(path: Path) -> str:
    """YOLOv8-obb's classic head [1, 4 + 2 + 1, 2100]: one car, rotated."""
    out = np.zeros((1, 7, 2100), np.float32)
    cx, cy, w, h, angle = OBB
    out[0, :, 0] = (cx, cy, w, h, 0.0, 0.9, angle)
    out[0, :, 1] = (cx, cy, w, h, 0.0, 0.6, angle + 0.01)  # the same box a little turned: NMS drops it
    return brightness_detector(str(path), {"output0": still(out)}, metadata=meta("obb"))


SEG_BOX = (80, 80, 240, 200)  # input pixels
BLOB = (25, 45, 25, 55)  # proto rows and columns (stride 4) where the mask is on: input 100..180 x 100..220


def seg_model(path: Path) -> str:
    """YOLO26-seg's end-to-end head [1, 300, 6 + 32] and its prototypes [1, 32, 80, 80]."""
    out = np.zeros((1, 300, 38), np.float32)
    out[0, 0, :6] = (*SEG_BOX, 0.9, 1)
    out[0, 0, 6] = 1.0  # the first prototype alone
    out[0, 1, :6] = (250, 250, 300, 300, 0.8, 0)  # a box where the mask is empty: dropped
    out[0, 1, 6] = 1.0
    protos = np.full((1, 32, 80, 80), -1.0, np.float32)
    r0, r1, c0, c1 = BLOB
    protos[0, 0, r0:r1, c0:c1] = 1.0
    return brightness_detector(
        str(path), {"output0": still(out), "output1": still(protos)}, metadata=meta("segment", end2end="True")
    )


def stream(
    model: str, masks: str = "polygon", encoding: str = "json", n: int = 6, tracker: str = "none"
) -> list[tuple[str, dict]]:
    cfg = AgentConfig(
        device_id="task-device",
        source=SyntheticSourceConfig(fps=50, seed=1, name="cam0", tracker=TrackerConfig(type=tracker)),  # type: ignore[arg-type]
        model=ModelConfig(path=model, masks=masks),  # type: ignore[arg-type]
        publish=PublishConfig(
            endpoint=free_endpoint(), health_interval_s=0.2, wait_for_subscribers=1, encoding=encoding
        ),  # type: ignore[arg-type]
    )
    sub = Subscriber(cfg.publish.endpoint)
    try:
        with started(Agent(cfg), clean=True):
            wait_until(lambda: sum(t.startswith("det.") for t in sub.topics) >= n, 60, message=f"{n} results")
    finally:
        sub.close()
    return [(t, m) for t, m in zip(sub.topics, sub.messages) if t.startswith("det.")]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("tasks")
    return {
        "pose": pose_model(tmp / "pose.onnx"),
        "obb": obb_model(tmp / "obb.onnx"),
        "seg": seg_model(tmp / "seg.onnx"),
    }


def valid(messages: list[tuple[str, dict]]) -> None:
    validator = jsonschema.Draft202012Validator(V2)
    for _, m in messages:
        assert validator.is_valid(m), sorted(e.message for e in validator.iter_errors(m))


def test_pose_keypoints_in_source_pixels_clipped_to_the_frame_with_their_track(models):
    messages = stream(models["pose"], tracker="bytetrack")
    valid(messages)
    (det,) = messages[-1][1]["detections"]
    assert det["track_id"] == 1 and det["track_age"] > 0, "the tracker follows the person's box"
    assert det["label"] == "person" and det["box_xyxy"] == [200.0, 120.0, 360.0, 320.0]
    kpts = det["keypoints"]
    assert len(kpts) == 17 and all(len(k) == 3 for k in kpts)
    for (x, y, c), got in zip(KPTS[:16], kpts):
        assert got == pytest.approx([*to_source(x, y), c], abs=0.06)
    assert kpts[16][:2] == [300.0, 0.0], "a keypoint in the letterbox's padding is clipped to the frame's top"
    # what a consumer of boxes reads, and what the client gives
    r = parse(*messages[-1])
    assert [d.box_xyxy for d in r.detections] == [tuple(det["box_xyxy"])]
    assert r.detections[0].keypoints[0] == pytest.approx((200.0, 160.0, 0.8))


def test_an_oriented_box_with_its_corners_and_its_axis_aligned_bounds(models):
    messages = stream(models["obb"])
    valid(messages)
    (det,) = messages[-1][1]["detections"]  # the turned duplicate was suppressed
    cx, cy, w, h, angle = OBB
    o = det["obb"]
    assert det["label"] == "car" and det["score"] == pytest.approx(0.9)
    assert o["center"] == pytest.approx(list(to_source(cx, cy)), abs=0.05)
    assert o["size"] == pytest.approx([w / SCALE, h / SCALE], abs=0.05) and o["angle"] == pytest.approx(
        angle, abs=1e-4
    )
    c, s = math.cos(angle), math.sin(angle)
    X, Y = to_source(cx, cy)
    hw, hh = w / SCALE / 2, h / SCALE / 2
    want = [
        (X + sx * hw * c - sy * hh * s, Y + sx * hw * s + sy * hh * c)
        for sx, sy in ((1, 1), (1, -1), (-1, -1), (-1, 1))
    ]
    assert np.allclose(o["corners"], want, atol=0.06)
    xs, ys = [p[0] for p in o["corners"]], [p[1] for p in o["corners"]]
    assert det["box_xyxy"] == pytest.approx([min(xs), min(ys), max(xs), max(ys)], abs=0.06)


def _mask_rect() -> tuple[float, float, float, float]:
    """Where the mask is on, in source pixels (the blob's input pixels, within the box)."""
    r0, r1, c0, c1 = BLOB
    x0, y0 = to_source(c0 * 4, r0 * 4)
    x1, y1 = to_source(c1 * 4, r1 * 4)
    return x0, y0, x1, y1


def test_a_mask_as_polygons_and_as_rle_and_an_empty_mask_dropped(models):
    x0, y0, x1, y1 = _mask_rect()
    polys = stream(models["seg"])
    valid(polys)
    (det,) = polys[-1][1]["detections"]  # the second box's mask is empty there: dropped as Ultralytics does
    assert det["label"] == "car" and "keypoints" not in det and "obb" not in det
    (poly,) = det["mask"]["polygons"]
    xs, ys = [p[0] for p in poly], [p[1] for p in poly]
    assert (min(xs), min(ys), max(xs), max(ys)) == pytest.approx((x0, y0, x1 - 1, y1 - 1), abs=4)
    assert len(poly) <= 64
    rles = stream(models["seg"], masks="rle")
    valid(rles)
    (det,) = rles[-1][1]["detections"]
    rle = det["mask"]["rle"]
    assert rle["size"] == [480, 640] and sum(rle["counts"]) == 480 * 640
    values = np.zeros(len(rle["counts"]), bool)
    values[1::2] = True
    mask = np.repeat(values, rle["counts"]).reshape(640, 480).T  # column-major, as COCO
    rows, cols = np.nonzero(mask)
    assert (cols.min(), rows.min(), cols.max() + 1, rows.max() + 1) == pytest.approx((x0, y0, x1, y1), abs=4)
    assert mask.sum() == pytest.approx((x1 - x0) * (y1 - y0), rel=0.1)
    boxes = stream(models["seg"], masks="none")
    valid(boxes)
    dets = boxes[-1][1]["detections"]
    assert len(dets) == 2 and not any("mask" in d for d in dets), "no masks made: every box is kept"


def test_msgpack_carries_the_same_task_values(models):
    (_, m_json), (_, m_pack) = stream(models["pose"])[-1], stream(models["pose"], encoding="msgpack")[-1]
    a, b = m_json["detections"][0], m_pack["detections"][0]
    assert np.allclose(a["keypoints"], b["keypoints"], atol=1e-3) and a["box_xyxy"] == b["box_xyxy"]
    (_, seg) = stream(models["seg"], encoding="msgpack")[-1]
    assert seg["detections"][0]["mask"]["polygons"]


def test_a_detection_models_messages_are_unchanged(tmp_path):
    """A consumer of the schema before the task fields (its copy from before them): a
    detection model's messages still validate against it (its detection objects allowed no
    other keys)."""
    old = json.loads((REPO / "tests/data/message-v2-before-tasks.schema.json").read_text())
    out = np.zeros((1, 6, 2100), np.float32)
    out[0, :, 0] = (160, 160, 40, 40, 0.9, 0.0)
    model = brightness_detector(str(tmp_path / "det.onnx"), {"output0": still(out)}, metadata=meta("detect"))
    messages = stream(model)
    validator = jsonschema.Draft202012Validator(old)
    for _, m in messages:
        assert validator.is_valid(m), sorted(e.message for e in validator.iter_errors(m))
