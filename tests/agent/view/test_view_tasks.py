"""The live view of pose, oriented-box and segmentation models (issue 34): the tap copies a
slot's task values (keypoints, rotated boxes) and hands its masks over, and ``annotate``
draws skeletons, rotated outlines and tinted masks where they are, at the view's scale.
Real frame slots filled as the post stage fills them, real OpenCV drawing, asserted on
pixels."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import cv2
import numpy as np
import pytest

from edge_agent.core.stamps import CAPTURED, PUBLISH
from edge_agent.models.decoders.base import Decoded, DecodeParams
from edge_agent.models.decoders.rotated import bounds, corners
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.sources.base import SourceFrame
from edge_agent.pipelines.tasks.base import Task
from edge_agent.pipelines.tasks.masks import Mask
from edge_agent.pipelines.tasks.obb import ObbTask
from edge_agent.pipelines.tasks.pose import PoseTask
from edge_agent.pipelines.tasks.segment import SegmentTask
from edge_agent.pipelines.view_tap import ViewFrame, ViewTap
from edge_agent.service.view.annotate import KEYPOINT_COLOURS, LIMB_COLOURS, SKELETON, annotate, colour

W, H = 320, 240  # the source frames; the model input is twice that (a letterbox of scale 2)
GREY = 90  # the frames' pixels: every drawn pixel differs from it
LABELS = ("a", "b", "c")


def pose_task(keypoints: int = 17, dims: int = 3) -> PoseTask:
    return PoseTask(SimpleNamespace(keypoints=keypoints, dims=dims))


def segment_task(form: str = "polygon") -> SegmentTask:
    decoder = SimpleNamespace(decoder=SimpleNamespace(extra_width=lambda: 32), outputs=[0, 1])
    return SegmentTask(decoder, DecodeParams(input_w=2 * W, input_h=2 * H), form, 64)  # type: ignore[arg-type]


def lane_slot(task: Task | None, max_det: int = 4) -> FrameSlot:
    """A frame slot of a model of ``task`` (None: a profile that names no task, as a plain
    detector's in older tests), its frame letterboxed into an input twice its size."""
    io = IOSet({"images": np.zeros((1, 8, 8, 3), np.uint8)}, [])
    model = SimpleNamespace(manifest=SimpleNamespace(labels=LABELS))
    if task is not None:
        model.task = task
    slot = FrameSlot(0, io, "images", max_det, SimpleNamespace(model=model), task)
    g = slot.geo
    g.src_w, g.src_h, g.scale_x, g.scale_y, g.new_w, g.new_h = W, H, 2.0, 2.0, 2 * W, 2 * H
    return slot


def fill(slot: FrameSlot, boxes: list, classes: list[int], extra: np.ndarray | None = None) -> FrameSlot:
    """The post stage's ``fill``: ``boxes`` (source pixels) and the task's values (model-input
    pixels) mapped to source pixels by the slot's task."""
    n = len(boxes)
    found = Decoded(
        np.asarray(boxes, np.float32).reshape(n, 4) * 2,
        np.full(n, 0.9, np.float32),
        np.asarray(classes, np.int32),
        None if extra is None else np.asarray(extra, np.float32),
    )
    slot.fill(found)
    return slot


def through_tap(tap: ViewTap, slot: FrameSlot, frame_id: int, into: ViewFrame | None = None) -> ViewFrame:
    """One frame through the tap as the lane's stages hand it over; what the view takes."""
    slot.frame_id = frame_id
    slot.stamps[CAPTURED], slot.stamps[PUBLISH] = 1_000_000 * frame_id, 1_000_000 * frame_id + 2_000_000
    source_frame = SourceFrame()
    source_frame.image, source_frame.frame_id = np.full((H, W, 3), GREY, np.uint8), frame_id
    tap._next_ns = 0  # due now: the view's rate is not what is tested here
    tap.offer_pixels(source_frame)
    tap.offer_result(slot, False)
    into = into if into is not None else ViewFrame(tap.max_det)
    assert tap.take(into, -1) == tap.ready_seq, "a frame is ready"
    return into


def draw(f: ViewFrame, scale: float = 1.0) -> np.ndarray:
    """What the view's encoder does with a frame: resized (``scale``), then annotated."""
    image = f.image[: f.height, : f.width]
    if scale != 1.0:
        image = cv2.resize(
            image, (round(f.width * scale), round(f.height * scale)), interpolation=cv2.INTER_AREA
        )
    else:
        image = image.copy()
    return annotate(image, f, scale)


def at(image: np.ndarray, x: float, y: float, scale: float) -> np.ndarray:
    """The pixel at source point (x, y) in an image drawn at ``scale``."""
    return image[round(y * scale), round(x * scale)].astype(int)


def near(
    image: np.ndarray, x: float, y: float, scale: float, c: tuple[int, int, int], r: int = 1, tol: int = 2
) -> bool:
    """Whether a pixel within ``r`` of source point (x, y), at ``scale``, is of colour ``c``
    (within ``tol``: an antialiased line's pixels are not quite its colour)."""
    cx, cy = round(x * scale), round(y * scale)
    patch = image[cy - r : cy + r + 1, cx - r : cx + r + 1].reshape(-1, 3).astype(int)
    return bool((np.abs(patch - c).max(axis=1) <= tol).any())


def grey(px: np.ndarray) -> bool:
    return bool((px == GREY).all())


# -- pose ------------------------------------------------------------------------------------------


def keypoints(points: dict[int, tuple[float, float, float]], k: int = 17, dims: int = 3) -> np.ndarray:
    """One detection's keypoints in model-input pixels: ``points`` (source x, y, conf) by
    index, every other one invisible (conf 0.1) at (250, 60)."""
    kp = np.tile(np.array([250.0, 60.0, 0.1][:dims], np.float32), (k, 1))
    for j, p in points.items():
        kp[j] = p[:dims]
    kp[:, :2] *= 2
    return kp.reshape(1, -1)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_visible_keypoints_are_dotted_and_a_limb_joins_two_visible_ones_only(scale):
    # COCO's nose (0) and eyes (1, 2): the eyes are each joined to the nose, and to each other.
    nose, left_eye, right_eye = (100, 100, 0.9), (200, 100, 0.9), (150, 180, 0.2)
    slot = fill(
        lane_slot(pose_task()), [(40, 40, 280, 220)], [0], keypoints({0: nose, 1: left_eye, 2: right_eye})
    )
    f = through_tap(ViewTap("cam0", 10.0, 4, threading.Event()), slot, 1)
    assert f.task == "pose" and (f.keypoints, f.dims) == (17, 3)
    image = draw(f, scale)
    for x, y, _ in (nose, left_eye):
        assert (at(image, x, y, scale) == KEYPOINT_COLOURS[0]).all(), "a visible keypoint's dot"
    limb = [tuple(p) for p in SKELETON.tolist()].index((0, 1))
    assert near(image, 150, 100, scale, LIMB_COLOURS[limb], tol=20), "the limb between nose and eye"
    assert grey(at(image, *right_eye[:2], scale)), "a keypoint seen below 0.5: no dot"
    assert grey(at(image, 125, 140, scale)) and grey(at(image, 175, 140, scale)), "no limb to it"
    assert grey(at(image, 250, 60, scale)), "nor for the other invisible ones"
    assert grey(at(image, 225, 80, scale)), "nor between two of those and a visible one"


def test_other_keypoints_than_cocos_are_dots_in_the_box_colour_without_limbs():
    slot = lane_slot(pose_task(keypoints=4, dims=2))
    fill(slot, [(40, 40, 280, 220)], [1], keypoints({0: (100, 100, 0), 1: (200, 100, 0), 2: (0, 0, 0)}, 4, 2))
    f = through_tap(ViewTap("cam0", 10.0, 4, threading.Event()), slot, 1)
    image = draw(f)
    assert (at(image, 100, 100, 1) == colour(1)).all() and (at(image, 200, 100, 1) == colour(1)).all()
    assert (at(image, 250, 60, 1) == colour(1)).all(), "without confidences every keypoint is drawn"
    assert grey(at(image, 150, 100, 1)), "no skeleton for a model that is not COCO's 17"


def test_a_pose_frame_without_visible_keypoints_draws_its_boxes_as_a_detector_does():
    boxes, classes = [(40, 40, 280, 220), (10, 150, 90, 230)], [0, 2]
    pose = fill(lane_slot(pose_task()), boxes, classes, np.zeros((2, 51), np.float32))
    plain = fill(lane_slot(None), boxes, classes)
    tap, other = ViewTap("cam0", 10.0, 4, threading.Event()), ViewTap("cam1", 10.0, 4, threading.Event())
    assert np.array_equal(draw(through_tap(tap, pose, 1)), draw(through_tap(other, plain, 1)))


# -- oriented boxes --------------------------------------------------------------------------------


def rotated(cx: float, cy: float, w: float, h: float, angle: float) -> tuple[list, np.ndarray, np.ndarray]:
    """A decoder's oriented box (source pixels given): its axis-aligned bounds (source), its
    values (model-input pixels) and its corners (source)."""
    xywhr = np.array([[cx, cy, w, h, angle]], np.float32)
    source_bounds = bounds(xywhr)[0].tolist()
    extra = xywhr.copy()
    extra[:, :4] *= 2
    return [source_bounds], extra, corners(xywhr)[0]


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_an_oriented_box_is_outlined_along_its_corners_and_labelled_at_its_top(scale):
    box, extra, quad = rotated(160, 120, 160, 40, math.pi / 6)
    slot = fill(lane_slot(ObbTask()), box, [0], extra)
    f = through_tap(ViewTap("cam0", 10.0, 4, threading.Event()), slot, 1)
    assert f.task == "obb" and np.allclose(f.det_extra[0, 5:13].reshape(4, 2), quad, atol=1e-3)
    image = draw(f, scale)
    c = colour(0)
    for a, b in zip(quad, np.roll(quad, -1, axis=0)):
        for t in (0.25, 0.5, 0.75):
            x, y = a + (b - a) * t
            assert near(image, x, y, scale, c), f"the rotated edge {a} -> {b} at {t}"
    x1, y1, x2, y2 = box[0]
    # The axis-aligned bounds' corners lie outside the rotated box: nothing drawn there.
    for x, y in ((x1 + 3, y1 + 3), (x1 + 3, y2 - 3), (x2 - 3, y2 - 3)):
        assert grey(at(image, x, y, scale)), (x, y)
    assert grey(at(image, (x1 + x2) / 2, y2 - 1, scale)), "no axis-aligned rectangle"
    top = quad[np.argmin(quad[:, 1])]
    label = image[round(top[1] * scale) - 1, round(top[0] * scale) + 1]
    assert (label == c).all(), "the label sits on the top-most corner"


# -- masks -----------------------------------------------------------------------------------------


def disc(size: int, radius: float) -> np.ndarray:
    yy, xx = np.mgrid[:size, :size]
    return (yy - size / 2 + 0.5) ** 2 + (xx - size / 2 + 0.5) ** 2 <= radius**2


def segment_slot(masks: list[Mask | None], boxes: list, classes: list[int]) -> FrameSlot:
    """A segmentation model's slot after ``fill`` (the masks as ``SegmentTask`` makes them)."""
    slot = lane_slot(segment_task())
    n = len(boxes)
    slot.det_xyxy[:n] = boxes
    slot.det_score[:n] = 0.9
    slot.det_class[:n] = classes
    slot.det_masks[:n] = masks
    slot.det_count = n
    return slot


def test_a_mask_tints_exactly_its_pixels_in_its_box_colour():
    bitmap = disc(100, 45)
    masks = [Mask(60, 60, bitmap), Mask(250, 150, disc(70, 40))]  # the second one cut by the frame
    boxes, classes = [(40, 40, 200, 200), (245, 145, 320, 240)], [2, 1]
    tap = ViewTap("cam0", 10.0, 4, threading.Event())
    f = through_tap(tap, segment_slot(masks, boxes, classes), 1)
    assert f.task == "segment" and f.det_masks[0] is masks[0]
    tinted = draw(f)
    bare = draw(through_tap(tap, segment_slot([None, None], boxes, classes), 1))  # the same stamp
    changed = (tinted != bare).any(axis=2)
    want = np.zeros((H, W), bool)
    want[60:160, 60:160] = bitmap
    want[150:220, 250:320] = disc(70, 40)[:, :70][: H - 150, : W - 250]
    _, xs = np.nonzero(want & ~changed)
    # The second box's outline and label are drawn over its mask; the first mask is clear of its box.
    assert all(x >= 244 for x in xs), "every pixel of the first mask is tinted"
    assert not (changed & ~want).any(), "nothing outside the masks"
    expected = np.round(GREY * 0.6 + np.array(colour(2)) * 0.4)
    assert np.abs(tinted[110, 110].astype(int) - expected).max() <= 1, "40 % of its box's colour"
    assert grey(tinted[45, 45]) and grey(tinted[190, 60]), "inside the box, outside the mask: unchanged"


def test_a_mask_scales_with_the_view():
    masks, box = [Mask(120, 110, disc(100, 45))], [(100, 100, 260, 230)]  # its label clear of the stamp
    tap = ViewTap("cam0", 10.0, 4, threading.Event())
    tinted = draw(through_tap(tap, segment_slot(masks, box, [2]), 1), 0.5)
    bare = draw(through_tap(tap, segment_slot([None], box, [2]), 1), 0.5)
    changed = (tinted != bare).any(axis=2)
    ys, xs = np.nonzero(changed)
    assert (ys.min(), xs.min()) >= (55, 60) and (ys.max(), xs.max()) < (105, 110), "within its scaled crop"
    assert changed[80, 85] and not changed[57, 62], "the disc's centre, not the crop's corner"
    assert abs(changed.sum() - math.pi * 22.5**2) < 0.05 * math.pi * 22.5**2


def test_a_segmentation_model_without_masks_draws_boxes():
    slot = lane_slot(segment_task("none"))
    slot.det_xyxy[0], slot.det_class[0], slot.det_count = (40, 40, 200, 200), 0, 1
    f = through_tap(ViewTap("cam0", 10.0, 4, threading.Event()), slot, 1)
    assert f.task == "segment" and len(f.det_masks) == 0
    image = draw(f)
    assert (image[120, 40] == colour(0)).all() and grey(image[120, 120])


# -- the tap ---------------------------------------------------------------------------------------


def test_the_tap_copies_the_slots_task_values_into_its_own_buffers():
    tap = ViewTap("cam0", 10.0, 4, threading.Event())
    slot = fill(lane_slot(pose_task()), [(40, 40, 280, 220)], [0], keypoints({0: (100, 100, 0.9)}))
    into = ViewFrame(4)
    for frame_id in (1, 2):  # each of the tap's two buffers makes its array for the model once
        through_tap(tap, slot, frame_id, into)
    want = slot.det_extra[:1].copy()
    buffers = {id(tap._ready.det_extra), id(tap._filling.det_extra)}
    kept = into.det_extra
    assert not np.shares_memory(tap._ready.det_extra, slot.det_extra)
    assert not np.shares_memory(into.det_extra, tap._ready.det_extra)
    # The slot goes back to its pool and is filled with the next frame: what the view took stays.
    for frame_id in range(3, 7):
        slot.det_extra[:] = -1.0
        assert np.array_equal(into.det_extra[:1], want)
        fill(slot, [(40, 40, 280, 220)], [0], keypoints({0: (100 + frame_id, 100, 0.9)}))
        through_tap(tap, slot, frame_id, into)
        assert into.det_extra[0, 0] == 100 + frame_id
        want = slot.det_extra[:1].copy()
    assert {id(tap._ready.det_extra), id(tap._filling.det_extra)} == buffers, "no array made per frame"
    assert into.det_extra is kept
    # A segmentation frame: its own list of the slot's masks (the slot's list is reused).
    masks = [Mask(60, 60, disc(100, 45))]
    seg = segment_slot(masks, [(40, 40, 200, 200)], [0])
    through_tap(tap, seg, 7, into)
    seg.det_masks[0] = Mask(0, 0, disc(10, 4))
    assert into.det_masks[0] is masks[0] and into.det_masks is not seg.det_masks


def test_a_reload_to_models_of_other_widths_keeps_the_tap_working():
    tap = ViewTap("cam0", 10.0, 4, threading.Event())
    into = ViewFrame(4)
    box, obb_extra, _ = rotated(160, 120, 160, 40, math.pi / 6)
    person = [(40.0, 40.0, 280.0, 220.0)]

    def posed(task: PoseTask, x: float) -> FrameSlot:
        return fill(lane_slot(task), person, [0], keypoints({0: (x, 100, 0.9)}, task.keypoints, task.dims))

    steps = [
        (posed(pose_task(), 100), "pose", 51),
        (posed(pose_task(17, 2), 100), "pose", 34),
        (fill(lane_slot(ObbTask()), box, [0], obb_extra), "obb", 13),
        (fill(lane_slot(None), person, [0]), "detect", 0),
        (segment_slot([Mask(60, 60, disc(100, 45))], [(40, 40, 200, 200)], [0]), "segment", 0),
        (posed(pose_task(), 120), "pose", 51),
    ]
    for frame_id, (slot, task, width) in enumerate(steps, 1):
        for k in range(2):  # both of the tap's buffers see the new model
            f = through_tap(tap, slot, 10 * frame_id + k, into)
            assert (f.task, f.det_extra.shape, f.det_count) == (task, (4, width), 1)
            assert np.array_equal(f.det_extra[:1], slot.det_extra[:1, :width])
            image = draw(f)
            assert not grey(image[120, 40]) or task == "obb", "its box drawn"
    assert (image[100, 120] == KEYPOINT_COLOURS[0]).all(), "the last pose frame's keypoint"
    # A reload that also raises max_detections: new buffers, the same widths taken lazily.
    tap.grow(8)
    big = ViewFrame(8)
    f = through_tap(tap, steps[2][0], 100, big)
    assert f.task == "obb" and f.det_extra.shape == (8, 13)
