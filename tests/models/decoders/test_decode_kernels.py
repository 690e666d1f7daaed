"""The compiled decode and message kernels against their numpy and ``%`` references
(models/decoders/kernels.py, pipelines/messages.py): the same detections (boxes, scores,
classes, task values, order) and the same message bytes, and the fallbacks.

The recorded outputs (tests/data/yolov8n-busy-640-candidates.npz) are four frames of an
Ultralytics YOLOv8n export at 640 made busy (/tmp/peer-models/yolov8n-busy-640.onnx, run
by ONNX Runtime on /tmp/bench-png 010, 064, 074 and 090; 169-213 candidates over 0.25 and
91-100 detections each): per anchor whose best class scored over 0.05 its box and its
three best classes (float16, enough for a frame as busy; the rest of the output is rebuilt
as zeros and low noise).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from decoder_checks import v8_tensor

from edge_agent.models.decoders import kernels
from edge_agent.models.decoders.base import Decoded, DecodeParams
from edge_agent.models.decoders.end2end import End2End
from edge_agent.models.decoders.nms import MAX_CANDIDATES
from edge_agent.models.decoders.pose import End2EndPose, YoloV8Pose
from edge_agent.models.decoders.yolov8 import YoloV8
from edge_agent.pipelines import jit
from edge_agent.pipelines.backends.base import IOSet
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.slots import FrameSlot

RECORDED = Path(__file__).parents[2] / "data" / "yolov8n-busy-640-candidates.npz"
FRAMES = (10, 64, 74, 90)
CLASSES = 80
ANCHORS = 8400


@pytest.fixture(scope="module")
def compiled():
    if jit.mode() == "numpy":
        pytest.skip("EDGE_AGENT_KERNELS=numpy: no kernels to compare")
    got = jit.load("decode", kernels.FUNCTIONS, kernels.warm)
    assert got is not None, f"the decode kernels did not load: {jit.state()}"
    return got


@pytest.fixture(autouse=True)
def numpy_path_after():
    yield
    kernels.install(None)


def recorded(frame: int) -> np.ndarray:
    """One recorded frame's output, (1, 84, 8400) float32."""
    with np.load(RECORDED) as d:
        anchors = d[f"f{frame}_anchors"].astype(np.int64)
        out = np.random.default_rng(frame).uniform(0, 0.02, (1, 4 + CLASSES, ANCHORS)).astype(np.float32)
        out[0, :4] = np.random.default_rng(frame + 1).uniform(0, 640, (4, ANCHORS)).astype(np.float32)
        out[0, :4, anchors] = d[f"f{frame}_cxcywh"].astype(np.float32).T
        classes, scores = d[f"f{frame}_classes"].astype(np.int64), d[f"f{frame}_scores"].astype(np.float32)
        for row in range(classes.shape[0]):
            out[0, 4 + classes[row], anchors] = scores[row]
    return out


def both(decoder, outputs: tuple[np.ndarray, ...], p: DecodeParams, compiled) -> tuple[Decoded, Decoded]:
    """(numpy path, kernel path) of one decode."""
    kernels.install(None)
    reference = decoder.decode(outputs, p)
    kernels.install(compiled)
    return reference, decoder.decode(outputs, p)


def same(a: Decoded, b: Decoded) -> None:
    for name, x, y in zip(Decoded._fields, a, b):
        if x is None or y is None:
            assert x is None and y is None, f"{name}: {x} vs {y}"
            continue
        assert (x.dtype, x.shape) == (y.dtype, y.shape), f"{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
        assert np.array_equal(x, y), f"{name} differs:\n{x}\nvs\n{y}"


def v8(rows: list[tuple]) -> np.ndarray:
    """A 3-class, 64-anchor YOLOv8 output of ``rows`` (``decoder_checks.v8_tensor``)."""
    return v8_tensor(rows, 3, 64)


def clusters(
    seed: int, objects: int, classes: int = 5, anchors: int = 2000, tie_scores: bool = False
) -> np.ndarray:
    """A detector's output as it looks: a few anchors around each object, jittered boxes,
    scores and a runner-up class; low scores elsewhere."""
    rng = np.random.default_rng(seed)
    out = np.zeros((1, 4 + classes, anchors), np.float32)
    out[0, :4] = rng.uniform(0, 640, (4, anchors))
    out[0, 4:] = rng.uniform(0, 0.1, (classes, anchors))
    cols = rng.permutation(anchors)
    at = 0
    for _ in range(objects):
        cx, cy, w, h = rng.uniform(0, 640), rng.uniform(0, 640), rng.uniform(4, 200), rng.uniform(4, 200)
        c = int(rng.integers(classes))
        for _ in range(int(rng.integers(1, 6))):
            j = cols[at]
            at += 1
            out[0, :4, j] = np.array((cx, cy, w, h)) + rng.normal(0, 3, 4)
            score = rng.integers(1, 8) / 8 if tie_scores else rng.uniform(0.2, 1.0)
            out[0, 4 + c, j] = score
            out[0, 4 + (c + 1) % classes, j] = score * rng.uniform(0.3, 1.0)
    return out


# -- the classic head (YOLOv8, YOLO11) -------------------------------------------------------


@pytest.mark.parametrize("frame", FRAMES)
@pytest.mark.parametrize(
    "p",
    [
        DecodeParams(0.25, 0.45, 100),
        DecodeParams(0.25, 0.7, 300),
        DecodeParams(0.5, 0.45, 100),
        DecodeParams(0.05, 0.45, 300),  # hundreds of candidates
        DecodeParams(0.25, 0.0, 100),  # any overlap suppresses
        DecodeParams(0.25, 1.0, 100),  # nothing suppresses
        DecodeParams(0.25, 0.45, 10),  # more boxes than are kept
        DecodeParams(0.3, 0.45, 1),
    ],
    ids=lambda p: f"s{p.score_threshold}-iou{p.iou_threshold}-max{p.max_detections}",
)
def test_recorded_frames_decode_alike(compiled, frame, p):
    out = recorded(frame)
    reference, fast = both(YoloV8(), (out,), p, compiled)
    assert kernels.classic(out[0], 4, 4 + CLASSES, p) is not None, "the kernel left this frame to numpy"
    same(reference, fast)
    if p == DecodeParams(0.25, 0.45, 100):
        assert 80 <= len(fast.scores) <= 100, "a busy frame, as recorded"


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("tie_scores", [False, True], ids=["distinct", "tied-scores"])
def test_clustered_outputs_decode_alike(compiled, seed, tie_scores):
    out = clusters(seed, objects=40, tie_scores=tie_scores)
    for p in (DecodeParams(0.25, 0.45, 100), DecodeParams(0.25, 0.6, 20)):
        same(*both(YoloV8(), (out,), p, compiled))


P = DecodeParams(0.25, 0.45, 100)


@pytest.mark.parametrize(
    ("rows", "p"),
    [
        pytest.param([], P, id="no-boxes"),
        pytest.param([(100, 100, 20, 20, {0: 0.25})], P, id="score-equal-to-threshold"),
        # float32(0.3) is above 0.3: the threshold is compared as float32, as numpy does
        pytest.param(
            [(100, 100, 20, 20, {0: np.float32(0.3)})], DecodeParams(0.3, 0.45, 100), id="float32-threshold"
        ),
        pytest.param([(100, 100, 40, 40, {0: 0.9}), (102, 100, 40, 40, {1: 0.8})], P, id="other-class-kept"),
        pytest.param(
            [(100, 100, 40, 40, {0: 0.9}), (102, 100, 40, 40, {0: 0.8})], P, id="same-class-suppressed"
        ),
        pytest.param([(100, 100, 40, 40, {0: 0.7}), (100, 100, 40, 40, {0: 0.7})], P, id="tie-keeps-first"),
        pytest.param(
            [(300, 100, 40, 40, {0: 0.7}), (100, 100, 40, 40, {0: 0.7})], P, id="tie-in-anchor-order"
        ),
        pytest.param([(100, 100, 40, 40, {0: 0.6, 1: 0.6, 2: 0.6})], P, id="class-tie-first-class"),
        pytest.param(
            [(1, 1, 2, 2, {0: 0.9}), (2, 1, 2, 2, {0: 0.8})], DecodeParams(0.25, 1 / 3, 100), id="iou-equal"
        ),
        pytest.param([(-10, -5, 40, 30, {0: 0.9}), (-8, -5, 40, 30, {0: 0.8})], P, id="negative-coordinates"),
        pytest.param([(100, 100, 0, 0, {0: 0.9}), (100, 100, 0, 0, {0: 0.8})], P, id="no-area-boxes"),
        pytest.param([(100, 100, 0, 20, {0: 0.9}), (100, 100, 20, 20, {0: 0.8})], P, id="no-width-box"),
        pytest.param([(100, 100, 20, 20, {0: np.nan, 1: 0.9})], P, id="nan-class-score"),
        pytest.param(
            [(100, 100, 20, 20, {0: 0.9, 2: np.nan}), (300, 300, 9, 9, {1: 0.5})], P, id="nan-after-max"
        ),
        pytest.param(
            [(i * 30.0, 50, 20, 20, {i % 3: 0.5 + i / 200}) for i in range(60)],
            DecodeParams(0.25, 0.45, 7),
            id="max-kept",
        ),
    ],
)
def test_table_decodes_alike(compiled, rows, p):
    out = v8(rows)
    same(*both(YoloV8(), (out,), p, compiled))
    assert kernels.classic(out[0], 4, 7, p) is not None


def test_more_candidates_than_the_cut_run_the_numpy_path(compiled):
    rng = np.random.default_rng(3)
    n = MAX_CANDIDATES + 300
    out = np.zeros((1, 6, n), np.float32)
    out[0, :4] = rng.uniform(0, 640, (4, n))
    out[0, 4:] = rng.uniform(0.3, 1.0, (2, n))
    p = DecodeParams(0.25, 0.45, 300)
    kernels.install(compiled)
    assert kernels.classic(out[0], 4, 6, p) is None
    same(*both(YoloV8(), (out,), p, compiled))


@pytest.mark.parametrize(
    "out",
    [
        pytest.param(v8([(100, 100, 20, 20, {0: 0.9})]).astype(np.float16), id="float16"),
        pytest.param(v8([(100, 100, 20, 20, {0: 0.9})]).astype(np.float64), id="float64"),
        pytest.param(np.asfortranarray(v8([(100, 100, 20, 20, {0: 0.9})])[0]), id="not-c-ordered"),
    ],
)
def test_outputs_the_kernel_does_not_take_run_the_numpy_path(compiled, out):
    kernels.install(compiled)
    assert kernels.classic(out if out.ndim == 2 else out[0], 4, 7, P) is None
    same(*both(YoloV8(), (out,), P, compiled))


def test_classic_head_with_values(compiled):
    """A pose head (YOLOv8-pose): the task values of each kept anchor come with it."""
    out = clusters(5, objects=30, classes=2)
    values = np.random.default_rng(9).standard_normal((1, 51, out.shape[2])).astype(np.float32)
    pose = np.ascontiguousarray(np.concatenate((out, values), axis=1))
    decoder = YoloV8Pose().fit([pose.shape], 2)
    reference, fast = both(decoder, (pose,), P, compiled)
    same(reference, fast)
    assert fast.extra.shape == (len(fast.scores), 51) and fast.extra.flags.c_contiguous


# -- the end-to-end head (YOLO26, nms=True exports) -------------------------------------------


def e2e(rows: list[tuple], extra: int = 0, n: int = 300) -> np.ndarray:
    out = np.zeros((1, n, 6 + extra), np.float32)
    for i, row in enumerate(rows):
        out[0, i, : len(row)] = row
    return out


@pytest.mark.parametrize(
    ("rows", "p"),
    [
        pytest.param([], P, id="no-rows"),
        pytest.param(
            [(0, 0, 10, 10, 0.9, 1), (5, 5, 10, 10, 0.5, 0), (1, 1, 2, 2, 0.25, 0)], P, id="threshold"
        ),
        pytest.param(
            [(0, 0, 10, 10, 0.5, 1), (5, 5, 10, 10, 0.5, 0), (1, 1, 2, 2, 0.9, 2)], P, id="ties-row-order"
        ),
        pytest.param(
            [(0, 0, 1, 1, 0.4 + i / 1000, i % 4) for i in range(200)], DecodeParams(0.25, 0.45, 50), id="max"
        ),
        pytest.param([(0, 0, 10, 10, 0.9, 2.7), (0, 0, 10, 10, 0.8, -0.5)], P, id="class-truncated"),
        pytest.param([(0, 0, 10, 10, np.nan, 1), (0, 0, 10, 10, 0.8, 3)], P, id="nan-score"),
    ],
)
def test_end_to_end_rows_alike(compiled, rows, p):
    out = e2e(rows)
    same(*both(End2End(), (out,), p, compiled))
    kernels.install(compiled)
    assert kernels.ranked(out[0], p) is not None


@pytest.mark.parametrize("bad", [np.nan, np.inf, 3e9])
def test_end_to_end_class_ids_numpy_casts_its_own_way_run_the_numpy_path(compiled, bad):
    out = e2e([(0, 0, 10, 10, 0.9, 1), (0, 0, 10, 10, 0.8, bad)])
    kernels.install(compiled)
    assert kernels.ranked(out[0], P) is None
    with np.errstate(invalid="ignore"):
        same(*both(End2End(), (out,), P, compiled))


def test_end_to_end_with_values(compiled):
    rng = np.random.default_rng(4)
    rows = [
        (*rng.uniform(0, 600, 4), rng.integers(0, 8) / 8, rng.integers(0, 3), *rng.standard_normal(51))
        for _ in range(250)
    ]
    out = e2e(rows, extra=51)
    decoder = End2EndPose().fit([out.shape], 3)
    same(*both(decoder, (out,), DecodeParams(0.25, 0.45, 100), compiled))


# -- loading --------------------------------------------------------------------------------


def broken_kernel(out, lo, hi, thr, iou, max_det, best, cand, cand_f, kept_f, kept_i):
    return out.no_such_attribute  # numba cannot type it: the compile fails


broken_kernel.__name__ = "classic_decode"


def test_a_failing_compile_falls_back_with_its_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("EDGE_AGENT_KERNEL_CACHE", str(tmp_path / "kernels"))
    jit.reset()
    try:
        got = jit.load("decode", (broken_kernel,), kernels.warm)
        assert got is None
        state = jit.state()
        assert state["parts"]["decode"] == "numpy"
        assert state["fallback"]["decode"].startswith("TypingError"), state
        assert kernels.install(got) is False
        out = v8([(100, 100, 20, 20, {0: 0.9})])
        assert kernels.classic(out[0], 4, 7, P) is None
        assert YoloV8().decode((out,), P).classes.tolist() == [0]
    finally:
        jit.reset()


def test_kernels_off_by_the_environment(monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_KERNELS", "numpy")
    jit.reset()
    try:
        assert kernels.install(jit.load("decode", kernels.FUNCTIONS, kernels.warm)) is False
        assert jit.state()["fallback"]["decode"] == "EDGE_AGENT_KERNELS=numpy"
        assert MessageBuilder("d", ("a",), 50.0)._kernel is None
    finally:
        jit.reset()


# -- the message ----------------------------------------------------------------------------

LABELS = ("person", 'say "cheese"', "back\\slash", "naïve", "car")


def old_encode(builder: MessageBuilder, message: dict, slot: FrameSlot) -> bytes:
    """The message as it was built before the kernel (``json.dumps`` and ``%``), verbatim."""
    n = slot.det_count
    if not n:
        dets = "[]"
    else:
        flat = []
        labels = builder.labels
        rows = zip(slot.det_class[:n].tolist(), slot.det_score[:n].tolist(), slot.det_xyxy[:n].tolist())
        tracks = zip(slot.det_track[:n].tolist(), slot.det_track_age[:n].tolist()) if builder.tracks else None
        for c, s, box in rows:
            label = labels[c] if 0 <= c < len(labels) else str(c)
            flat.append(json.dumps({"label": label, "class_id": c}, separators=(",", ":"))[:-1] + ',"score":')
            flat.append(s)
            flat.extend(box)
            if tracks is not None:
                track, age = next(tracks)
                flat.append(track or "null")
                flat.append(age)
        one = '%s%.4f,"box_xyxy":[%.1f,%.1f,%.1f,%.1f]}'
        if builder.tracks:
            one = '%s%.4f,"box_xyxy":[%.1f,%.1f,%.1f,%.1f],"track_id":%s,"track_age":%d}'
        dets = "[" + ",".join([one] * n) % tuple(flat) + "]"
    head = json.dumps(message, separators=(",", ":"))
    return f'{head[:-1]},"detections":{dets}}}'.encode()


def empty_slot(capacity: int, rng: np.random.Generator) -> FrameSlot:
    io = IOSet(inputs={"images": np.zeros((1, 3, 8, 8), np.float32)}, outputs=[])
    slot = FrameSlot(0, io, "images", capacity)
    slot.source, slot.frame_id = "cam-0", int(rng.integers(1 << 40))
    slot.stamps[:] = np.sort(rng.integers(10**12, 10**13, len(slot.stamps)))
    slot.geo.src_w, slot.geo.src_h = 1920, 1080
    return slot


def slot_with(n: int, rng: np.random.Generator, labels: int = len(LABELS)) -> FrameSlot:
    """A slot of ``n`` random detections of classes below ``labels``, some tracked."""
    slot = empty_slot(max(n, 1), rng)
    slot.det_count = n
    slot.det_xyxy[:n] = rng.uniform(-50, 1970, (n, 4))
    slot.det_score[:n] = rng.uniform(0, 1, n)
    slot.det_class[:n] = rng.integers(0, labels, n)
    slot.det_track[:n] = rng.integers(0, 4, n) * rng.integers(1, 1 << 40, n)
    slot.det_track_age[:n] = rng.integers(0, 10**6, n)
    return slot


def messages_alike(builder: MessageBuilder, slot: FrameSlot, seq: int = 7) -> bytes:
    message = builder.build(slot, seq, "yolov8n")
    message["latency_ms"] = builder.latencies(slot)
    message["tracking"] = {"tracks": 3, "journeys": [1, 2]}  # a step's block rides in the head
    got = builder.encode(message, slot)
    assert got == old_encode(builder, message, slot)
    return got


@pytest.mark.parametrize("tracks", [False, True], ids=["plain", "tracked"])
def test_messages_are_byte_identical_on_many_frames(tracks):
    builder = MessageBuilder("dev-1", LABELS, 50.0, tracks=tracks)
    if jit.mode() != "numpy":
        assert builder._kernel is not None, jit.state()
    rng = np.random.default_rng(11)
    for i in range(300):
        slot = slot_with(int(rng.integers(0, 101)), rng)
        messages_alike(builder, slot, i)
        if builder._kernel is not None and slot.det_count:
            # the kernel wrote these, not the fallback
            assert builder.detections_bytes(slot) == builder.format_detections(slot).encode()


def test_messages_of_recorded_frames_are_byte_identical(compiled):
    builder = MessageBuilder("dev", tuple(f"class {i}" for i in range(CLASSES)), 50.0, tracks=True)
    rng = np.random.default_rng(0)
    for frame in FRAMES:
        kernels.install(compiled)
        found = YoloV8().decode((recorded(frame),), P)
        slot = empty_slot(100, rng)
        slot.geo.src_w, slot.geo.src_h = 640, 640
        slot.fill(found)
        assert slot.det_count >= 80
        messages_alike(builder, slot)


#: Values whose last kept digit is a tie or close to one, signs and zeros, the extremes the
#: kernel formats and those past them (left to ``%``).
AWKWARD = [
    0.0, -0.0, 0.25, 0.75, -0.25, 1.25, 2.5, 0.05, 0.15, 0.35, 0.03125, 0.09375, 0.00005, -0.00001,
    -0.04, 0.99995, 0.99994999, 1.0, 9.95, 19.95, 1e-30, 123456.75, 9.0e14, 2e15, -3e15, 1e16, 3.4e38,
]  # fmt: skip


@pytest.mark.parametrize("tracks", [False, True], ids=["plain", "tracked"])
def test_awkward_numbers_format_as_percent_does(tracks):
    builder = MessageBuilder("dev", LABELS, 50.0, tracks=tracks)
    rng = np.random.default_rng(2)
    values = np.array(AWKWARD, np.float32)
    for i in range(len(values)):
        slot = slot_with(4, rng)
        slot.det_score[:4] = values[i]
        slot.det_xyxy[:4] = np.roll(values, i)[:16].reshape(4, 4)
        messages_alike(builder, slot)


def test_random_float32_values_format_as_percent_does():
    builder = MessageBuilder("dev", LABELS, 50.0)
    rng = np.random.default_rng(5)
    for scale in (1.0, 100.0, 1e4, 1e7):
        slot = slot_with(100, rng)
        bits = rng.integers(0, 1 << 32, (100, 5), dtype=np.uint64).astype(np.uint32).view(np.float32)
        finite = np.where(np.isfinite(bits), bits, 1.0).astype(np.float32)
        slot.det_score[:100] = np.float32(scale) * (finite[:, 0] % np.float32(1))
        slot.det_xyxy[:100] = np.clip(finite[:, 1:], -scale, scale)
        messages_alike(builder, slot)


@pytest.mark.parametrize(
    ("classes", "tracks"),
    [
        pytest.param([0, 5, -1, 2], [0, 1, 2, 3], id="class-beyond-the-labels"),
        pytest.param([0, 1, 2, 3], [0, -5, 2**63 - 1, -(2**63)], id="extreme-track-ids"),
    ],
)
def test_what_the_kernel_leaves_comes_out_alike(classes, tracks):
    builder = MessageBuilder("dev", LABELS, 50.0, tracks=True)
    slot = slot_with(4, np.random.default_rng(1))
    slot.det_class[:4] = classes
    slot.det_track[:4] = tracks
    messages_alike(builder, slot)


def test_no_labels_and_no_detections():
    builder = MessageBuilder("dev", (), 50.0)
    rng = np.random.default_rng(8)
    messages_alike(builder, slot_with(0, rng, labels=1))
    messages_alike(builder, slot_with(3, rng, labels=1))  # every class beyond the (no) labels


def test_msgpack_messages_are_unchanged():
    msgpack = pytest.importorskip("msgpack")
    builder = MessageBuilder("dev", LABELS, 50.0, encoding="msgpack")
    slot = slot_with(5, np.random.default_rng(3))
    message = builder.build(slot, 1, "m")
    body = msgpack.unpackb(builder.encode(message, slot))
    assert body["detections"] == builder.detections(slot) and builder._kernel is None
