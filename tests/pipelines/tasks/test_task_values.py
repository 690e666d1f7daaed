"""Task values mapped to source pixels by ``FrameSlot.fill`` (pipelines/slots.py) and the
tasks (pipelines/tasks/): pose keypoints, oriented boxes, segmentation masks.

The geometry is a real ``Letterbox``: a 128x96 frame in a 64x64 input is scaled by 0.5 with
8 rows of padding on top; a 96x128 frame by 0.5 with 8 columns on the left.
"""

from __future__ import annotations

import json
import math

import cv2
import numpy as np
import pytest

from edge_agent.models.decoders.base import BoundDecoder, Decoded, DecodeParams
from edge_agent.models.decoders.obb import YoloV8Obb
from edge_agent.models.decoders.pose import End2EndPose
from edge_agent.models.decoders.rotated import bounds
from edge_agent.models.decoders.seg import End2EndSeg
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.preprocess import letterbox_geometry
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.tasks.base import Task
from edge_agent.pipelines.tasks.masks import Mask, input_mask, source_mask
from edge_agent.pipelines.tasks.obb import ObbTask
from edge_agent.pipelines.tasks.pose import PoseTask
from edge_agent.pipelines.tasks.registry import task_for
from edge_agent.pipelines.tasks.segment import SegmentTask

IN = 64
P = DecodeParams(0.25, 0.45, 100, input_w=IN, input_h=IN)


def slot(task: Task, outputs: list[np.ndarray], src_w: int, src_h: int, max_det: int = 8) -> FrameSlot:
    io = IOSet(inputs={"images": np.zeros((1, 3, IN, IN), np.float32)}, outputs=outputs)
    s = FrameSlot(0, io, "images", max_det, None, task)
    letterbox_geometry(src_w, src_h, IN, IN, s.geo)
    return s


def to_source(x, y, geo):
    return (np.asarray(x, np.float64) - geo.pad_x) / geo.scale_x, (
        np.asarray(y, np.float64) - geo.pad_y
    ) / geo.scale_y


def found(xyxy, scores, classes, extra) -> Decoded:
    return Decoded(
        np.asarray(xyxy, np.float32).reshape(-1, 4),
        np.asarray(scores, np.float32),
        np.asarray(classes, np.int32),
        np.asarray(extra, np.float32).reshape(len(scores), -1)
        if len(scores)
        else np.asarray(extra, np.float32),
    )


# -- pose ---------------------------------------------------------------------------------------


def pose_task(k: int, d: int) -> PoseTask:
    dec = End2EndPose().fit([(1, 300, 6 + k * d)], 1).refine(type("O", (), {"kpt_shape": (k, d)})())
    task = task_for(BoundDecoder(dec, (0,)), P)
    assert isinstance(task, PoseTask) and task.width == k * d
    return task


@pytest.mark.parametrize(("src_w", "src_h"), [(128, 96), (96, 128), (64, 48)])
def test_pose_keypoints_map_to_the_frame_and_are_clipped(src_w, src_h):
    task = pose_task(4, 3)
    kpts = np.array(
        [
            [[10, 20, 0.9], [63, 60, 0.8], [5, 2, 0.1], [70, -3, 0.05]],  # the last two: padding, outside
            [[32, 32, 0.5], [0, 0, 0.4], [64, 64, 0.3], [40.5, 30.25, 0.2]],
        ],
        np.float32,
    )
    s = slot(task, [np.zeros((1, 300, 18), np.float32)], src_w, src_h)
    s.fill(found([[8, 10, 40, 50], [20, 20, 44, 44]], [0.9, 0.8], [0, 0], kpts.reshape(2, -1)))
    assert s.det_count == 2
    got = s.det_extra[:2].reshape(2, 4, 3)
    x, y = to_source(kpts[..., 0], kpts[..., 1], s.geo)
    np.testing.assert_allclose(got[..., 0], np.clip(x, 0, src_w), rtol=1e-6)
    np.testing.assert_allclose(got[..., 1], np.clip(y, 0, src_h), rtol=1e-6)
    np.testing.assert_array_equal(got[..., 2], kpts[..., 2])
    bx, by = to_source([8, 40, 20, 44], [10, 50, 20, 44], s.geo)
    want = np.stack([np.clip(bx, 0, src_w), np.clip(by, 0, src_h)], axis=1).reshape(2, 2, 2)
    np.testing.assert_allclose(s.det_xyxy[:2].reshape(2, 2, 2), want, rtol=1e-6)


def test_pose_with_two_values_per_keypoint():
    task = pose_task(3, 2)
    kpts = np.array([[10, 20, 63, 60, 70, 4]], np.float32)  # x, y pairs
    s = slot(task, [np.zeros((1, 300, 12), np.float32)], 128, 96)
    s.fill(found([[8, 10, 40, 50]], [0.9], [0], kpts))
    np.testing.assert_allclose(s.det_extra[0], [20, 24, 126, 96, 128, 0])
    assert task.fields(s, 0) == {"keypoints": [[20.0, 24.0], [126.0, 96.0], [128.0, 0.0]]}


def test_detections_with_nan_or_infinite_values_are_dropped_and_the_message_stays_json():
    """A broken export's NaN keypoint or infinite box would make the message invalid JSON
    ("nan" is no JSON): such a detection is dropped, the others kept in order."""
    from edge_agent.pipelines.messages import MessageBuilder

    task = pose_task(2, 3)
    kpts = np.array(
        [[10, 20, 0.9, 30, 40, 0.8], [10, np.nan, 0.9, 30, 40, 0.8], [1, 2, 0.5, 3, 4, 0.5]], np.float32
    )
    boxes = [[8, 10, 40, 50], [8, 10, 40, 50], [0, 0, np.inf, 9]]
    s = slot(task, [np.zeros((1, 300, 12), np.float32)], 128, 96)
    s.profile = type("Profile", (), {"model": type("Model", (), {"task": task})()})()
    s.fill(found(boxes, [0.9, 0.8, 0.7], [0, 1, 2], kpts))
    assert s.det_count == 1 and s.det_score[0] == pytest.approx(0.9)
    builder = MessageBuilder("d", ("a", "b", "c"), 50.0)
    (det,) = json.loads(builder.detections_json(s))
    assert det["keypoints"] == [[20.0, 24.0, 0.9], [60.0, 64.0, 0.8]]
    plain = slot(Task(), [np.zeros((1, 300, 6), np.float32)], 128, 96)
    plain.fill(found([[1, 2, np.nan, 4], [8, 10, 40, 50]], [0.9, 0.8], [0, 1], np.zeros((2, 0))))
    assert plain.det_count == 1 and plain.det_class[0] == 1


def test_fill_keeps_at_most_the_slots_detections():
    task = pose_task(1, 3)
    s = slot(task, [np.zeros((1, 300, 9), np.float32)], 64, 48, max_det=2)
    kpts = np.array([[1, 9, 0.1], [2, 10, 0.2], [3, 11, 0.3]], np.float32)
    s.fill(found([[0, 8, 4, 12]] * 3, [0.9, 0.8, 0.7], [0, 1, 2], kpts))
    assert s.det_count == 2 and s.det_class.tolist() == [0, 1]
    np.testing.assert_allclose(s.det_extra, [[1, 1, 0.1], [2, 2, 0.2]], rtol=1e-6)


# -- oriented boxes -----------------------------------------------------------------------------


def obb_task() -> ObbTask:
    task = task_for(BoundDecoder(YoloV8Obb().fit([(1, 6, 84)], 1), (0,)), P)
    assert isinstance(task, ObbTask) and task.width == 13
    return task


def expected_corners(cx, cy, w, h, a):
    """Ultralytics' ``xywhr2xyxyxyxy``: centre + v1 + v2, + v1 - v2, - v1 - v2, - v1 + v2."""
    v1 = np.array([w / 2 * math.cos(a), w / 2 * math.sin(a)])
    v2 = np.array([-h / 2 * math.sin(a), h / 2 * math.cos(a)])
    c = np.array([cx, cy])
    return np.array([c + v1 + v2, c + v1 - v2, c - v1 - v2, c - v1 + v2])


@pytest.mark.parametrize(("src_w", "src_h"), [(128, 96), (96, 128), (64, 48)])
def test_obb_centre_size_angle_and_corners_map_to_the_frame_unclipped(src_w, src_h):
    task = obb_task()
    xywhr = np.array([[30, 30, 20, 10, 0.4], [60, 4, 30, 12, 1.2], [2, 62, 16, 16, -0.3]], np.float32)
    s = slot(task, [np.zeros((1, 6, 84), np.float32)], src_w, src_h)
    s.fill(found(bounds(xywhr), [0.9, 0.8, 0.7], [0, 0, 0], xywhr))
    assert s.det_count == 3
    geo = s.geo
    for i, (cx, cy, w, h, a) in enumerate(xywhr.tolist()):
        mx, my = to_source(cx, cy, geo)
        mw, mh = w / geo.scale_x, h / geo.scale_y
        np.testing.assert_allclose(s.det_extra[i, :5], [mx, my, mw, mh, a], rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(
            s.det_extra[i, 5:13].reshape(4, 2), expected_corners(mx, my, mw, mh, a), rtol=1e-5, atol=1e-3
        )
    corners = s.det_extra[:3, 5:13].reshape(3, 4, 2)
    assert (
        (corners[..., 0] < 0).any()
        or (corners[..., 0] > src_w).any()
        or (corners[..., 1] < 0).any()
        or (corners[..., 1] > src_h).any()
    ), "the case has corners outside the frame: they stay there"
    # The axis-aligned box: the rotated box's bounds, mapped and clipped to the frame.
    b = bounds(xywhr).astype(np.float64)
    x1, y1 = to_source(b[:, 0], b[:, 1], geo)
    x2, y2 = to_source(b[:, 2], b[:, 3], geo)
    want = np.stack(
        [np.clip(x1, 0, src_w), np.clip(y1, 0, src_h), np.clip(x2, 0, src_w), np.clip(y2, 0, src_h)], 1
    )
    np.testing.assert_allclose(s.det_xyxy[:3], want, rtol=1e-5, atol=1e-4)
    fields = task.fields(s, 0)["obb"]
    assert fields["angle"] == round(0.4, 4) and len(fields["corners"]) == 4


# -- segmentation -------------------------------------------------------------------------------

M = 3
# Prototypes of a 64x64 input (16x16): each is +1 in its own quarter-ish region, -1 elsewhere.
PROTOS = -np.ones((1, M, 16, 16), np.float32)
PROTOS[0, 0, 0:8, 0:8] = 1  # input 0..32 x 0..32 (top left)
PROTOS[0, 1, 0:8, 8:16] = 1  # top right
PROTOS[0, 2, 8:16, :] = 1  # bottom half

ROWS = [  # box (input pixels), score, class, coefficients
    ((2, 10, 30, 30), 0.9, 0, (1, 0, 0)),  # its mask: top left
    ((0, 0, 64, 64), 0.8, 1, (0, 0, 0)),  # logits 0 everywhere: empty, dropped
    ((36, 10, 60, 28), 0.7, 2, (0, 1, 0)),  # top right
    ((34, 2, 62, 30), 0.6, 3, (0, 0, 1)),  # the bottom half's prototype in a top box: empty, dropped
    ((5, 40, 50, 60.5), 0.5, 4, (0, 0, 1)),  # bottom
]


def seg_task(form: str) -> SegmentTask:
    dec = End2EndSeg().fit([(1, 300, 6 + M), PROTOS.shape], 5)
    task = task_for(BoundDecoder(dec, (1, 0)), P, form, 64)  # the prototypes listed first
    assert isinstance(task, SegmentTask) and task.width == M
    return task


def seg_slot(task: SegmentTask, src_w: int, src_h: int) -> FrameSlot:
    s = slot(task, [PROTOS.copy(), np.zeros((1, 300, 6 + M), np.float32)], src_w, src_h)
    boxes, scores, classes, coeffs = zip(*ROWS)
    s.fill(found(boxes, scores, classes, coeffs))
    return s


def placed(mask: Mask, h: int, w: int) -> np.ndarray:
    out = np.zeros((h, w), bool)
    bh, bw = mask.bitmap.shape
    out[mask.y0 : mask.y0 + bh, mask.x0 : mask.x0 + bw] = mask.bitmap
    return out


@pytest.mark.parametrize(("src_w", "src_h"), [(128, 96), (64, 48), (96, 128)])
def test_segmentation_drops_empty_masks_and_keeps_the_rest_in_order(src_w, src_h):
    task = seg_task("rle")  # the masks kept in the frame's pixels
    s = seg_slot(task, src_w, src_h)
    kept = [0, 2, 4]
    assert s.det_count == 3
    assert s.det_class[:3].tolist() == kept
    np.testing.assert_allclose(s.det_score[:3], [ROWS[i][1] for i in kept], rtol=1e-6)
    np.testing.assert_array_equal(s.det_extra[:3], [ROWS[i][3] for i in kept])
    geo = s.geo
    for j, i in enumerate(kept):
        box = np.array(ROWS[i][0], np.float64)
        x1, y1 = to_source(box[0], box[1], geo)
        x2, y2 = to_source(box[2], box[3], geo)
        want_box = [
            np.clip(x1, 0, src_w),
            np.clip(y1, 0, src_h),
            np.clip(x2, 0, src_w),
            np.clip(y2, 0, src_h),
        ]
        np.testing.assert_allclose(s.det_xyxy[j], want_box, rtol=1e-6)
        # Its own mask, made from its own coefficients and input-space box.
        want = source_mask(
            input_mask(
                np.array(ROWS[i][3], np.float32), PROTOS[0], np.array(ROWS[i][0], np.float32), (IN, IN)
            ),
            geo,
        )
        got = s.det_masks[j]
        assert isinstance(got, Mask)
        np.testing.assert_array_equal(placed(got, src_h, src_w), placed(want, src_h, src_w))
        frame = placed(got, src_h, src_w)
        ys, xs = np.nonzero(frame)
        assert len(ys), "a kept detection's mask has pixels"
        # ...inside its box, in the region of its prototype
        assert xs.min() >= math.floor(want_box[0]) - 1 and xs.max() <= math.ceil(want_box[2])
        assert ys.min() >= math.floor(want_box[1]) - 1 and ys.max() <= math.ceil(want_box[3])
        region = {0: (0, 32, 0, 32), 2: (32, 64, 0, 32), 4: (0, 64, 32, 64)}[i]  # input x0, x1, y0, y1
        rx0, ry0 = to_source(region[0], region[2], geo)
        rx1, ry1 = to_source(region[1], region[3], geo)
        assert xs.min() >= rx0 - 2 and xs.max() <= rx1 + 2 and ys.min() >= ry0 - 2 and ys.max() <= ry1 + 2


def test_segmentation_masks_are_published_as_rle_of_the_frame():
    task = seg_task("rle")
    s = seg_slot(task, 128, 96)
    for j in range(s.det_count):
        rle = task.fields(s, j)["mask"]["rle"]
        assert rle["size"] == [96, 128]
        counts = rle["counts"]
        flat = np.zeros(96 * 128, bool)
        pos, value = 0, False
        for c in counts:
            flat[pos : pos + c] = value
            pos, value = pos + c, not value
        assert pos == 96 * 128
        np.testing.assert_array_equal(flat.reshape(128, 96).T, placed(s.det_masks[j], 96, 128))
        assert json.loads(task.json_rows(s, j + 1)[j][0]) == {"rle": rle}


def test_segmentation_polygons_are_in_source_pixels():
    task = seg_task("polygon")
    s = seg_slot(task, 128, 96)
    polys = task.fields(s, 0)["mask"]["polygons"]
    assert polys and sum(len(p) for p in polys) <= 64
    # Outlined at the input's resolution (half the frame's here) and mapped, as Ultralytics'
    # masks.xy: each point within one input pixel (2 frame pixels) of the frame-sized mask.
    box, _, _, co = ROWS[0]
    want = source_mask(
        input_mask(np.array(co, np.float32), PROTOS[0], np.array(box, np.float32), (IN, IN)), s.geo
    )
    near = cv2.dilate(placed(want, 96, 128).astype(np.uint8), np.ones((5, 5), np.uint8)).astype(bool)
    pts = np.rint(np.array(polys[0])).astype(int)
    assert near[np.clip(pts[:, 1], 0, 95), np.clip(pts[:, 0], 0, 127)].all(), "outline points lie on the mask"
    xs, ys = pts[:, 0], pts[:, 1]
    fx, fy = np.nonzero(placed(want, 96, 128).T)
    assert abs(xs.min() - fx.min()) <= 2 and abs(xs.max() - fx.max()) <= 2, "the outline spans the mask"
    assert abs(ys.min() - fy.min()) <= 2 and abs(ys.max() - fy.max()) <= 2


def test_masks_none_keeps_every_detection_and_makes_no_mask():
    task = seg_task("none")
    assert task.masks is False and task.json_format == "" and task.width == M
    s = seg_slot(task, 128, 96)
    assert s.det_count == len(ROWS)
    assert s.det_masks == []
    assert s.det_class[: len(ROWS)].tolist() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(s.det_extra[: len(ROWS)], [r[3] for r in ROWS])
    assert task.fields(s, 0) == {}


def test_segmentation_of_no_detections():
    task = seg_task("polygon")
    s = slot(task, [PROTOS.copy(), np.zeros((1, 300, 6 + M), np.float32)], 128, 96)
    s.fill(found(np.zeros((0, 4)), [], [], np.zeros((0, M))))
    assert s.det_count == 0


def test_a_slot_reused_for_a_frame_with_fewer_masks():
    task = seg_task("rle")
    s = seg_slot(task, 128, 96)
    assert s.det_count == 3
    box, score, cls, co = ROWS[4]
    s.fill(found([box], [score], [cls], [co]))
    assert s.det_count == 1 and s.det_class[0] == 4
    want = source_mask(
        input_mask(np.array(co, np.float32), PROTOS[0], np.array(box, np.float32), (IN, IN)), s.geo
    )
    np.testing.assert_array_equal(placed(s.det_masks[0], 96, 128), placed(want, 96, 128))
