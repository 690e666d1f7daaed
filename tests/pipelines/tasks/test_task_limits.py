"""A pose, oriented-box or segmentation model's outputs as an attacker (or a broken export)
could make them: overflowing values, huge value counts, slivers of masks, checkerboard masks,
odd metadata. Each must give valid messages with bounded work, or a clear refusal at load."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from edge_agent.models.decoders.base import BoundDecoder, Decoded, DecodeParams, OutputMismatch
from edge_agent.models.decoders.heads import MAX_EXTRA
from edge_agent.models.decoders.obb import End2EndObb
from edge_agent.models.decoders.pose import End2EndPose, YoloV8Pose
from edge_agent.models.decoders.recognition import Seen, Tensor
from edge_agent.models.decoders.seg import End2EndSeg
from edge_agent.models.manifest import resolve_model
from edge_agent.models.testmodels import brightness_detector
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.preprocess import letterbox_geometry
from edge_agent.pipelines.slots import FrameSlot
from edge_agent.pipelines.tasks import masks as m
from edge_agent.pipelines.tasks.registry import task_for
from edge_agent.pipelines.tasks.segment import MAX_RLE_RUNS

IN = 64
P = DecodeParams(0.25, 0.45, 100, input_w=IN, input_h=IN)


def slot_for(task, outputs, src_w, src_h, max_det=8) -> FrameSlot:
    io = IOSet(inputs={"images": np.zeros((1, 3, IN, IN), np.float32)}, outputs=outputs)
    s = FrameSlot(0, io, "images", max_det, None, task)
    s.profile = SimpleNamespace(model=SimpleNamespace(task=task))
    letterbox_geometry(src_w, src_h, IN, IN, s.geo)
    return s


def decoded(xyxy, scores, classes, extra) -> Decoded:
    return Decoded(
        np.asarray(xyxy, np.float32).reshape(-1, 4),
        np.asarray(scores, np.float32),
        np.asarray(classes, np.int32),
        np.asarray(extra, np.float32).reshape(len(scores), -1),
    )


def message(s: FrameSlot) -> list[dict]:
    return json.loads(MessageBuilder("d", ("a", "b"), 50.0).detections_json(s))


def test_an_oriented_box_that_overflows_when_mapped_is_dropped_and_the_next_frame_is_not():
    task = task_for(BoundDecoder(End2EndObb().fit([(1, 300, 7)], 2), (0,)), P)
    s = slot_for(task, [np.zeros((1, 300, 7), np.float32)], 256, 256)  # scale 0.25: sizes x 4
    huge = [[10, 10, 2e38, 1, 0.0], [20, 20, 8, 4, 0.3]]
    s.fill(decoded([[0, 0, 20, 20], [16, 18, 24, 22]], [0.9, 0.8], [0, 1], huge))
    (det,) = message(s)  # valid JSON: the overflowing one is gone
    assert det["class_id"] == 1 and det["obb"]["size"] == [32.0, 16.0]
    s.fill(decoded([[5, 5, 15, 15]], [0.9], [0], [[10, 10, 5, 5, 0.3]]))
    assert s.det_count == 1, "a valid box is not dropped for the previous frame's values"


def test_an_infinite_score_is_dropped():
    task = task_for(BoundDecoder(End2EndPose().fit([(1, 300, 12)], 2), (0,)), P)
    s = slot_for(task, [np.zeros((1, 300, 12), np.float32)], 64, 64)
    kpts = np.ones((2, 6), np.float32)
    s.fill(decoded([[0, 0, 9, 9], [1, 1, 8, 8]], [np.inf, 0.5], [0, 1], kpts))
    assert [d["class_id"] for d in message(s)] == [1]


def test_a_model_claiming_too_many_values_per_detection_is_refused_at_load():
    with pytest.raises(OutputMismatch, match=f"at most {MAX_EXTRA}"):
        End2EndPose().fit([(1, 1, 6 + 3 * 1_000_000)], 1)
    with pytest.raises(OutputMismatch, match=f"at most {MAX_EXTRA}"):
        YoloV8Pose().fit([(1, 4 + 1 + MAX_EXTRA + 1, 8400)], 1)
    assert YoloV8Pose().fit([(1, 4 + 1 + 133 * 3, 8400)], 1).keypoints == 133  # a whole-body pose


def test_a_dynamic_prototype_count_is_refused_and_a_dynamic_prototype_size_taken():
    with pytest.raises(OutputMismatch, match="a fixed prototype count"):
        End2EndSeg().fit([(1, 300, 38), (1, None, 160, 160)], 80)
    assert End2EndSeg().fit([(1, 300, 38), (1, 32, None, None)], 80).extra == 32


def test_a_dynamic_anchor_axis_is_read_from_the_labels_and_the_metadata():
    """A ``dynamic=True`` pose export: axis 2 is open, axis 1 = 4 + labels + kpt_shape."""
    out = Tensor("output0", (None, 56, None), "float32")
    seen = Seen((out,), 1, 640, 640, lambda k: {"kpt_shape": [17, 3]}.get(k))
    guesses = list(YoloV8Pose().recognise(seen))
    assert guesses and "axis 2 dynamic" in guesses[0].rule


def test_a_mask_in_the_top_padding_gives_polygons_inside_the_frame():
    """A 64-wide frame in a 64 input (the identity resize): the mask reaches the padding's
    rows, which are outside the frame; its outline is clipped to it."""
    geo = SimpleNamespace(scale_x=1.0, scale_y=1.0, pad_x=0, pad_y=8)
    bitmap = np.zeros((20, 10), bool)
    bitmap[:, 2:8] = True
    polys = m.polygons(m.input_space((0, 5, bitmap), geo), 64, (64, 48))
    pts = np.concatenate(polys)
    assert pts[:, 1].min() == 0 and pts[:, 0].min() >= 0 and pts[:, 1].max() <= 48


def test_a_sliver_of_a_mask_gives_no_polygon_of_fewer_than_three_points():
    line = m.Mask(3, 4, np.ones((1, 12), bool))
    assert all(len(p) >= 3 for p in m.polygons(line, 64))
    assert m.polygons(m.Mask(3, 4, np.ones((1, 1), bool)), 64) == []


def test_a_checkerboard_mask_is_published_as_polygons_not_megabytes_of_rle():
    task = task_for(BoundDecoder(End2EndSeg().fit([(1, 300, 7), (1, 1, 16, 16)], 2), (0, 1)), P, "rle", 64)
    board = (np.indices((480, 640)).sum(axis=0) % 2).astype(bool)
    assert len(m.rle(m.Mask(0, 0, board), 480, 640)) > MAX_RLE_RUNS
    shape = task._published(m.Mask(0, 0, board), 480, 640)
    assert "polygons" in shape and sum(len(p) for p in shape["polygons"]) <= 64
    smooth = np.zeros((480, 640), bool)
    smooth[100:300, 50:600] = True
    assert "rle" in task._published(m.Mask(0, 0, smooth), 480, 640)


def test_metadata_kpt_shape_that_is_not_two_integers_is_noted_not_a_crash(tmp_path):
    out = np.zeros((1, 300, 57), np.float32)
    meta = {"task": "pose", "names": "{0: 'person'}", "imgsz": "[320, 320]", "end2end": "True"}
    path = brightness_detector(
        str(tmp_path / "pose.onnx"),
        {"output0": (out, np.zeros_like(out), 1)},
        metadata={**meta, "kpt_shape": "[17, None]"},
    )
    resolved = resolve_model(path)
    assert resolved.manifest.output.decoder == "end2end_pose" and resolved.manifest.output.kpt_shape == ()
    assert any("is not [keypoints, values]" in n for n in resolved.assumptions)
