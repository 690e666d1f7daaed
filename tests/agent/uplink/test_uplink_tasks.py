"""Results of pose, oriented-box and segmentation models (issue 34) through the uplink's
checks and policies: frames the agent's own message builder makes from real frame slots
(JSON and msgpack), taken as the uplink takes a frame off the stream (size bound, decode,
``message_problem``), then forwarded whole by ``all`` (keypoints, rotated boxes and masks
unchanged) and counted by ``summary``; a frame bloated past ``MAX_FRAME_BYTES`` by its
masks is refused before it is decoded."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import jsonschema
import numpy as np
import pytest
from conftest import REPO

from edge_agent.core import stream_frames
from edge_agent.core.stamps import CAPTURED, N_STAMPS, PUBLISH
from edge_agent.models.decoders.base import DecodeParams
from edge_agent.models.decoders.rotated import bounds, corners
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.tasks.base import Task
from edge_agent.pipelines.tasks.masks import Mask
from edge_agent.pipelines.tasks.obb import ObbTask
from edge_agent.pipelines.tasks.pose import PoseTask
from edge_agent.pipelines.tasks.segment import SegmentTask
from edge_agent.service.uplink.forward import Forwarder, make_forwarder
from edge_agent.service.uplink.validate import (
    MAX_FRAME_BYTES,
    MessageError,
    frame_problem,
    message_problem,
    read_message,
)

V2 = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())
RESULTS = jsonschema.Draft202012Validator({"$defs": V2["$defs"], "$ref": "#/$defs/result"})
LABELS = ("person", "car")
W, H = 640, 480
T0 = 1764582000.25


def segment_task(form: str, max_points: int = 64) -> SegmentTask:
    decoder = SimpleNamespace(decoder=SimpleNamespace(extra_width=lambda: 32), outputs=[0, 1])
    return SegmentTask(decoder, DecodeParams(input_w=W, input_h=H), form, max_points)  # type: ignore[arg-type]


def disc(size: int, radius: float) -> np.ndarray:
    yy, xx = np.mgrid[:size, :size]
    return (yy - size / 2 + 0.5) ** 2 + (xx - size / 2 + 0.5) ** 2 <= radius**2


def task_slot(task: Task, n: int, size: tuple[int, int] = (W, H), seed: int = 0) -> FrameSlot:
    """A published frame slot of a model of ``task`` with ``n`` detections in source pixels,
    its task values as ``fill`` leaves them (keypoints, rotated boxes, masks)."""
    rng = np.random.default_rng(seed)
    io = IOSet({"images": np.zeros((1, 8, 8, 3), np.uint8)}, [])
    profile = SimpleNamespace(model=SimpleNamespace(task=task, manifest=SimpleNamespace(labels=LABELS)))
    slot = FrameSlot(0, io, "images", max(n, 1), profile, task)
    slot.geo.src_w, slot.geo.src_h = size
    slot.source, slot.frame_id, slot.det_count = "cam0", 42, n
    slot.stamps[:] = np.arange(N_STAMPS) * 1_000_000 + 5_000_000_000
    xy = rng.uniform(0, (size[0] - 100, size[1] - 100), (n, 2))
    slot.det_xyxy[:n] = np.hstack((xy, xy + 100))
    slot.det_score[:n] = rng.uniform(0.3, 1.0, n)
    slot.det_class[:n] = rng.integers(0, len(LABELS), n)
    if isinstance(task, PoseTask):
        kp = slot.det_extra[:n].reshape(n, task.keypoints, task.dims)
        kp[..., :2] = xy[:, None] + rng.uniform(0, 100, (n, task.keypoints, 2))
        if task.dims == 3:
            kp[..., 2] = rng.uniform(0, 1, (n, task.keypoints))
    elif isinstance(task, ObbTask):
        e = slot.det_extra[:n]
        e[:, :2], e[:, 2:4], e[:, 4] = xy + 50, (90, 30), rng.uniform(-math.pi / 2, math.pi / 2, n)
        corners(e[:, :5], out=e[:, 5:13].reshape(n, 4, 2))
        slot.det_xyxy[:n] = np.clip(bounds(e[:, :5]), 0, (*size, *size))
    elif task.masks:
        for i in range(n):
            slot.det_masks[i] = Mask(int(xy[i, 0]), int(xy[i, 1]), disc(100, 30 + 20 * rng.random()))
    return slot


def stream_frame(slot: FrameSlot, encoding: str = "json", tracks: bool = False) -> bytes:
    """The frame the agent publishes for ``slot`` (``det.<source> <body>``)."""
    builder = MessageBuilder("cam-1", LABELS, 50.0, encoding=encoding, tracks=tracks)
    message = builder.build(slot, 7, "yolo11n-task")
    message["latency_ms"] = builder.latencies(slot)
    message["deadline_missed"] = False
    assert slot.stamps[PUBLISH] > slot.stamps[CAPTURED]
    return b"det.cam0 " + builder.encode(message, slot)


def take(
    frame: bytes, fwd: Forwarder, now_s: float = T0
) -> tuple[str | None, list[tuple[str, dict[str, Any]]]]:
    """What the uplink does with a frame off the stream (``Uplink._take``): bounded, decoded,
    checked, offered to the policy. (why it is refused, what the policy sends)."""
    try:
        topic, body = read_message(frame, fwd.result_prefix)
    except MessageError as e:
        return str(e), []
    return None, fwd.offer(topic, body, now_s, wall_s=now_s)


TASKS = {
    "pose": lambda: PoseTask(SimpleNamespace(keypoints=17, dims=3)),
    "pose-2d": lambda: PoseTask(SimpleNamespace(keypoints=5, dims=2)),
    "obb": ObbTask,
    "segment-polygon": lambda: segment_task("polygon"),
    "segment-rle": lambda: segment_task("rle"),
}
KEY = {
    "pose": "keypoints",
    "pose-2d": "keypoints",
    "obb": "obb",
    "segment-polygon": "mask",
    "segment-rle": "mask",
}


@pytest.mark.parametrize("encoding", ["json", "msgpack"])
@pytest.mark.parametrize("tracks", [False, True])
@pytest.mark.parametrize("kind", list(TASKS))
def test_a_task_result_is_taken_and_forwarded_whole_by_all(kind, encoding, tracks):
    slot = task_slot(TASKS[kind](), 12)
    frame = stream_frame(slot, encoding, tracks)
    _, sent_body = stream_frames.decode(frame)
    dets = sent_body["detections"]
    assert len(dets) == 12 and all(KEY[kind] in d for d in dets), "the task's field on every detection"
    assert RESULTS.is_valid(sent_body), sorted(e.message for e in RESULTS.iter_errors(sent_body))
    problem, out = take(frame, make_forwarder("all", 1.0, 0.0))
    assert problem is None
    ((subtopic, body),) = out
    assert subtopic == "det/cam0"
    assert body == sent_body, "every field unchanged, the task's included"
    assert json.loads(json.dumps(body)) == sent_body, "and as the spool stores it (JSON)"


@pytest.mark.parametrize("kind", list(TASKS))
def test_task_results_are_counted_by_the_summary_and_kept_by_with_detections(kind):
    fwd = make_forwarder("summary", 1.0, 0.0)
    keep = make_forwarder("with_detections", 1.0, 0.0)
    labels: dict[str, int] = {}
    for k in range(3):
        slot = task_slot(TASKS[kind](), 5, seed=k)
        for c in slot.det_class[:5].tolist():
            labels[LABELS[c]] = labels.get(LABELS[c], 0) + 1
        frame = stream_frame(slot)
        assert take(frame, fwd, T0 + 0.1 * k) == (None, [])
        problem, out = take(frame, keep, T0 + 0.1 * k)
        assert problem is None and out[0][1]["detections"][0][KEY[kind]]
    (summary,) = [b for _, b in fwd.flush(T0 + 1.0, final=True)]
    assert summary["frames"] == 3 and summary["detections_by_label"] == labels


def test_a_frame_bloated_by_its_masks_is_refused_before_it_is_decoded():
    # Masks full of holes: the agent's RLE would be a run per pixel, so it outlines them
    # instead (segment.MAX_RLE_RUNS) and its frame stays small...
    slot = task_slot(segment_task("rle"), 16, size=(1920, 1080))
    rng = np.random.default_rng(1)
    for i in range(16):
        x0, y0 = min(slot.det_masks[i].x0, 1920 - 300), min(slot.det_masks[i].y0, 1080 - 300)
        slot.det_masks[i] = Mask(x0, y0, rng.random((300, 300)) < 0.5)
    assert len(stream_frame(slot)) < MAX_FRAME_BYTES // 4
    # ...and a frame that big from anyone else on the endpoint is refused undecoded.
    body = stream_frames.decode(stream_frame(task_slot(segment_task("rle"), 1)))[1]
    body["detections"] *= 16
    for d in body["detections"]:
        d["mask"]["rle"]["counts"] = [1] * 40_000
    frame = b"det.cam0 " + json.dumps(body).encode()
    assert len(frame) > MAX_FRAME_BYTES
    problem, out = take(frame, make_forwarder("all", 1.0, 0.0))
    assert problem == f"{len(frame)} bytes, over {MAX_FRAME_BYTES}" and out == []
    # A mask past the bound on its own, in msgpack too: refused, whatever the encoding.
    bloated = stream_frames.decode(stream_frame(task_slot(segment_task("rle"), 1)))[1]
    bloated["detections"][0]["mask"]["rle"]["counts"] = [1] * MAX_FRAME_BYTES
    import msgpack

    assert frame_problem(b"det.cam0 " + msgpack.packb(bloated)) is not None
    assert frame_problem(b"det.cam0 " + json.dumps(bloated).encode()) is not None


def test_the_most_detections_with_polygon_masks_fit_the_bound():
    """The default mask form (polygons of at most ``model.mask_points`` points) keeps a
    result of 300 detections on a 4K frame well under the uplink's frame bound."""
    slot = task_slot(segment_task("polygon"), 300, size=(3840, 2160))
    frame = stream_frame(slot, tracks=True)
    assert len(frame) < MAX_FRAME_BYTES // 4
    problem, out = take(frame, make_forwarder("all", 1.0, 0.0))
    assert problem is None and len(out[0][1]["detections"]) == 300


@pytest.mark.parametrize(
    "field, value",
    [
        ("keypoints", [[1.0, 2.0, 0.5]] * 17),
        ("obb", {"center": [1, 2], "size": [3, 4], "angle": 0.5, "corners": [[0, 0]] * 4}),
        ("mask", {"polygons": [[[0, 0], [1, 0], [1, 1]]]}),
        ("mask", {"rle": {"size": [H, W], "counts": [5, 3, W * H - 8]}}),
    ],
)
def test_message_problem_takes_any_task_field_on_a_detection(field, value):
    """The uplink checks the fields it uses (label, class_id); a task's field goes up as it
    is, whatever a newer agent puts in it."""
    body = {
        "schema": 2,
        "source": "cam0",
        "seq": 1,
        "latency_ms": {"total": 3.0},
        "detections": [
            {"label": "person", "class_id": 0, "score": 0.9, "box_xyxy": [0, 0, 1, 1], field: value}
        ],
    }
    assert message_problem("det.cam0", body, "det.") is None
    assert make_forwarder("all", 1.0, 0.0).offer("det.cam0", body, T0) == [("det/cam0", body)]
