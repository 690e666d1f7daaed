"""The segmentation decoders: YOLOv8/YOLO11's classic head ``[B, 4+C+M, A]`` and the
end-to-end head ``[B, N, 6+M]``, each with the prototypes ``[B, M, H/4, W/4]`` as a second
output (models/decoders/seg.py), and how a segmentation ONNX is recognised."""

from __future__ import annotations

import numpy as np
import pytest
from decoder_checks import P, check_types, e2e_tensor

from edge_agent.models import onnx_info
from edge_agent.models.decoders import registry
from edge_agent.models.decoders.base import BoundDecoder, DecodeParams, OutputMismatch
from edge_agent.models.decoders.nms import MAX_CANDIDATES
from edge_agent.models.decoders.recognition import Tensor
from edge_agent.models.decoders.seg import PROTOS, End2EndSeg, YoloV8Seg

M = 4
PROTOS_ARRAY = np.random.default_rng(0).standard_normal((1, M, 16, 16)).astype(np.float32)


def coeffs_for(i: int, m: int = M) -> np.ndarray:
    """Mask coefficients unique to detection ``i``: a mix-up of rows shows."""
    return (100.0 * (i + 1) + np.arange(m)).astype(np.float32)


def classic(rows: list[tuple], classes: int, m: int = M, anchors: int = 64) -> np.ndarray:
    """[1, 4 + C + M, A]: each row (cx, cy, w, h, {class: score}, coefficients)."""
    out = np.zeros((1, 4 + classes + m, anchors), np.float32)
    for i, (cx, cy, w, h, cls, co) in enumerate(rows):
        out[0, :4, i] = (cx, cy, w, h)
        for c, s in cls.items():
            out[0, 4 + c, i] = s
        out[0, 4 + classes :, i] = co
    return out


def fitted(t: np.ndarray, labels: int, protos: tuple = PROTOS_ARRAY.shape) -> YoloV8Seg:
    return YoloV8Seg().fit([t.shape, protos], labels)


# -- the classic head ---------------------------------------------------------------------------


@pytest.mark.parametrize("batched", [True, False])
def test_classic_gives_boxes_and_each_ones_coefficients(batched):
    t = classic(
        [
            (100, 80, 40, 20, {1: 0.9}, coeffs_for(0)),
            (300, 200, 10, 30, {0: 0.3, 1: 0.6}, coeffs_for(1)),
            (500, 500, 10, 10, {0: 0.1}, coeffs_for(2)),  # under the threshold
        ],
        2,
    )
    d = fitted(t, 2)
    protos = PROTOS_ARRAY if batched else PROTOS_ARRAY[0]
    xyxy, scores, classes, extra = found = d.decode((t if batched else t[0], protos), P)
    check_types(found, 2)
    np.testing.assert_allclose(xyxy, [[80, 70, 120, 90], [295, 185, 305, 215]])
    np.testing.assert_allclose(scores, [0.9, 0.6], rtol=1e-6)
    assert classes.tolist() == [1, 1]
    assert extra.dtype == np.float32 and extra.shape == (2, M) == (2, d.extra_width())
    np.testing.assert_array_equal(extra, [coeffs_for(0), coeffs_for(1)])


def test_classic_with_and_without_the_batch_axis_agree():
    t = classic([(100, 80, 40, 20, {0: 0.9}, coeffs_for(0)), (50, 50, 8, 8, {0: 0.5}, coeffs_for(1))], 1)
    d = fitted(t, 1)
    for a, b in zip(d.decode((t, PROTOS_ARRAY), P), d.decode((t[0], PROTOS_ARRAY[0]), P)):
        np.testing.assert_array_equal(a, b)


def test_coefficients_travel_with_their_detection_through_nms():
    rng = np.random.default_rng(3)
    scores = rng.permutation(np.linspace(0.3, 0.95, 12)).astype(np.float32)
    rows = [
        (100 + 200 * (i % 3) + i, 100 + i, 60, 60, {i % 3: float(scores[i])}, coeffs_for(i))
        for i in range(12)
    ]
    t = classic(rows, 3)
    _, got, classes, extra = fitted(t, 3).decode((t, PROTOS_ARRAY), P)
    assert len(got) == 3
    for s, c, co in zip(got, classes, extra):
        i = int(np.flatnonzero(scores == s)[0])
        assert scores[i] == max(scores[j] for j in range(12) if j % 3 == i % 3)
        assert c == i % 3
        np.testing.assert_array_equal(co, coeffs_for(i))


def test_coefficients_travel_with_their_detection_past_the_candidate_cap():
    n = MAX_CANDIDATES + 50
    rng = np.random.default_rng(4)
    scores = rng.permutation(np.linspace(0.3, 0.99, n)).astype(np.float32)
    rows = [
        (8 + 16 * (i % 64), 8 + 16 * (i // 64), 10, 10, {0: float(scores[i])}, coeffs_for(i))
        for i in range(n)
    ]
    t = classic(rows, 1, anchors=n + 10)
    _, got, _, extra = fitted(t, 1).decode((t, PROTOS_ARRAY), DecodeParams(0.25, 0.45, 10_000))
    assert len(got) == MAX_CANDIDATES
    for s, co in zip(got, extra):
        np.testing.assert_array_equal(co, coeffs_for(int(np.flatnonzero(scores == s)[0])))


@pytest.mark.parametrize("max_detections", [1, 4])
def test_classic_max_detections_and_threshold(max_detections):
    scores = [0.3, 0.9, 0.5, 0.7, 0.24, 0.8, 0.6]
    rows = [(20 + 40 * i, 50, 10, 10, {0: s}, coeffs_for(i)) for i, s in enumerate(scores)]
    t = classic(rows, 1)
    _, got, _, extra = fitted(t, 1).decode((t, PROTOS_ARRAY), DecodeParams(0.25, 0.45, max_detections))
    best = sorted(range(7), key=lambda i: -scores[i])[:max_detections]
    np.testing.assert_allclose(got, [scores[i] for i in best], rtol=1e-6)
    np.testing.assert_array_equal(extra, [coeffs_for(i) for i in best])
    _, got, _, _ = fitted(t, 1).decode((t, PROTOS_ARRAY), P)
    assert len(got) == 6, "0.24 is under the threshold"


def test_classic_empty():
    t = classic([], 2)
    found = fitted(t, 2).decode((t, PROTOS_ARRAY), P)
    check_types(found, 0)
    assert found.extra.shape == (0, M)


# -- the end-to-end head ------------------------------------------------------------------------


def e2e(rows: list[tuple]) -> np.ndarray:
    return e2e_tensor(rows, M)


@pytest.mark.parametrize("batched", [True, False])
def test_end_to_end_ranks_rows_with_their_coefficients(batched):
    t = e2e(
        [
            (10, 10, 50, 50, 0.60, 2, coeffs_for(0)),
            (12, 12, 52, 52, 0.90, 2, coeffs_for(1)),  # overlaps: no NMS here
            (100, 100, 140, 160, 0.20, 0, coeffs_for(2)),  # under the threshold
            (200, 50, 260, 90, 0.75, 7, coeffs_for(3)),
        ]
    )
    d = End2EndSeg().fit([t.shape, PROTOS_ARRAY.shape], 8)
    protos = PROTOS_ARRAY if batched else PROTOS_ARRAY[0]
    xyxy, scores, classes, extra = found = d.decode((t if batched else t[0], protos), P)
    check_types(found, 3)
    np.testing.assert_allclose(scores, [0.90, 0.75, 0.60])
    assert classes.tolist() == [2, 7, 2]
    np.testing.assert_allclose(xyxy, [[12, 12, 52, 52], [200, 50, 260, 90], [10, 10, 50, 50]])
    np.testing.assert_array_equal(extra, [coeffs_for(1), coeffs_for(3), coeffs_for(0)])


def test_end_to_end_max_detections():
    rows = [(i, i, i + 10, i + 10, 0.3 + i / 1000, 0, coeffs_for(i)) for i in range(50)]
    d = End2EndSeg().fit([(1, 300, 6 + M), PROTOS_ARRAY.shape], 1)
    _, scores, _, extra = d.decode((e2e(rows), PROTOS_ARRAY), DecodeParams(0.25, 0.45, 3))
    np.testing.assert_allclose(scores, [0.349, 0.348, 0.347], rtol=1e-6)
    np.testing.assert_array_equal(extra, [coeffs_for(49), coeffs_for(48), coeffs_for(47)])


# -- fit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decoder", "pred", "protos", "labels"),
    [
        (YoloV8Seg(), (1, 116, 8400), (1, 32, 160, 160), 80),
        (YoloV8Seg(), (None, 116, None), (None, 32, 160, 160), 80),
        (YoloV8Seg(), (None, 116, None), (None, 32, None, None), 80),  # dynamic=True: the size per frame
        (End2EndSeg(), (1, 300, 38), (1, 32, 160, 160), 80),
        (End2EndSeg(), (None, None, 38), (None, 32, 80, 80), 1),
    ],
)
def test_fit_reads_classes_and_coefficients(decoder, pred, protos, labels):
    d = decoder.fit([pred, protos], labels)
    assert (d.classes, d.extra_width()) == (labels, 32) and type(d) is type(decoder)


@pytest.mark.parametrize(
    ("decoder", "pred", "protos", "needs", "index"),
    [
        (YoloV8Seg(), (1, 116, 8400), (1, 16, 160, 160), "16 mask coefficients .*not 32", 0),
        (End2EndSeg(), (1, 300, 38), (1, 31, 160, 160), "31 mask coefficients .*not 32", 0),
        (YoloV8Seg(), (1, 116, 8400), (1, 32, 160), "4 axes", 1),
        (YoloV8Seg(), (1, 116, 8400), (1, None, 160, 160), "a fixed prototype count", 1),
        (End2EndSeg(), (1, 300, 38), (1, None, None, None), "a fixed prototype count", 1),
        (
            YoloV8Seg(),
            (1, 84, 8400),
            (1, 32, 160, 160),
            "4 \\+ 80 labels \\+ the segment values on axis 1",
            0,
        ),
        (YoloV8Seg(), (116, 8400), (1, 32, 160, 160), "3 axes", 0),
        (End2EndSeg(), (1, 300, 6), (1, 32, 160, 160), "6 \\+ the segment values on axis 2", 0),
    ],
)
def test_fit_refuses_other_shapes_and_names_the_output(decoder, pred, protos, needs, index):
    with pytest.raises(OutputMismatch, match=needs) as e:
        decoder.fit([pred, protos], 80)
    assert e.value.index == index


def test_output_names_default_to_ultralytics_prototypes():
    d = registry.get("yolov8_seg")
    assert d.task == registry.get("end2end_seg").task == "segment"
    assert d.output_names("output0", {}) == ("output0", PROTOS) == ("output0", "output1")
    assert d.output_names("pred", {"protos": "p"}) == ("pred", "p")
    assert d.output_section(("pred", "p")) == ("pred", {"protos": "p"})


def test_a_bound_decoder_reads_the_predictions_and_ignores_the_order_of_outputs():
    t = e2e([(10, 10, 50, 50, 0.9, 1, coeffs_for(0))])
    d = End2EndSeg().fit([t.shape, PROTOS_ARRAY.shape], 2)
    bound = BoundDecoder(d, (1, 0))  # the backend lists the prototypes first
    _, scores, classes, extra = bound([PROTOS_ARRAY, t], P)
    assert scores.tolist() == pytest.approx([0.9]) and classes.tolist() == [1]
    np.testing.assert_array_equal(extra, [coeffs_for(0)])


# -- recognising a segmentation ONNX without a manifest -----------------------------------------


def info(outputs: list[Tensor], **meta: str) -> onnx_info.OnnxInfo:
    return onnx_info.OnnxInfo(
        inputs=(Tensor("images", (1, 3, 640, 640), "float32"),),
        outputs=tuple(outputs),
        metadata=dict(meta),
        ops=frozenset({"Conv"}),
    )


PROTOS_T = Tensor("output1", (1, 32, 160, 160), "float32")


def test_choose_picks_the_classic_seg_head_and_its_prototypes():
    c = onnx_info.choose(
        info([Tensor("output0", (1, 116, 8400), "float32"), PROTOS_T], task="segment"), 80, 640, 640
    )
    assert (c.decoder, c.outputs, c.ignored) == ("yolov8_seg", ("output0", "output1"), ())


def test_choose_finds_the_prototypes_listed_first():
    c = onnx_info.choose(
        info([PROTOS_T, Tensor("output0", (1, 116, 8400), "float32")], task="segment"), 80, 640, 640
    )
    assert (c.decoder, c.outputs) == ("yolov8_seg", ("output0", "output1"))


def test_choose_picks_the_end_to_end_seg_head():
    out = Tensor("output0", (1, 300, 38), "float32")
    c = onnx_info.choose(info([out, PROTOS_T], task="segment", end2end="True"), 80, 640, 640)
    assert (c.decoder, c.outputs) == ("end2end_seg", ("output0", "output1"))
    c = onnx_info.choose(info([out, PROTOS_T], task="segment"), 80, 640, 640)
    assert c.decoder == "end2end_seg", "300 rows of 6 + 32 (the prototypes' count)"


def test_choose_refuses_predictions_whose_coefficients_are_not_the_prototypes_count():
    other = Tensor("output1", (1, 16, 160, 160), "float32")
    i = info([Tensor("output0", (1, 116, 8400), "float32"), other], task="segment")
    with pytest.raises(onnx_info.UnsupportedModel, match="fits no decoder of task 'segment'"):
        onnx_info.choose(i, 80, 640, 640)


def test_choose_refuses_a_segmentation_export_without_its_task():
    i = info([Tensor("output0", (1, 116, 8400), "float32"), PROTOS_T])
    with pytest.raises(onnx_info.UnsupportedModel, match="mask prototypes"):
        onnx_info.choose(i, 80, 640, 640)


def test_choose_refuses_a_classification_model_with_its_reason():
    i = info([Tensor("output0", (1, 1000), "float32")], task="classify")
    with pytest.raises(onnx_info.UnsupportedModel, match=r"classification model .*scores the whole image"):
        onnx_info.choose(i, 1000, 224, 224)
