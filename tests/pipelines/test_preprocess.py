"""Letterbox geometry, box mapping and model-input preprocessing (pipelines/preprocess.py)."""

from __future__ import annotations

import itertools
import tracemalloc

import cv2
import numpy as np
import pytest

from edge_agent.pipelines.preprocess import (
    InputFormat,
    Letterbox,
    Preprocessor,
    boxes_to_input,
    boxes_to_source,
    letterbox_geometry,
    letterbox_into,
)

# (width, height) of source frames and of model inputs.
SOURCES = [
    (640, 480),
    (1920, 1080),
    (480, 640),
    (320, 320),
    (100, 700),
    (700, 100),
    (1, 1),
    (3, 2),
    (1, 500),
    (4096, 1),
    (321, 257),
    (33, 17),
]
INPUTS = [(320, 320), (640, 640), (320, 256)]
GRID = list(itertools.product(SOURCES, INPUTS))
GRID_IDS = [f"{sw}x{sh}->{dw}x{dh}" for (sw, sh), (dw, dh) in GRID]


def geometry(src: tuple[int, int], dst: tuple[int, int]) -> Letterbox:
    return letterbox_geometry(src[0], src[1], dst[0], dst[1], Letterbox())


def random_boxes(rng: np.random.Generator, w: int, h: int, n: int = 64) -> np.ndarray:
    """Boxes (float64 xyxy) inside a w x h frame, including the full frame and degenerate ones."""
    xs = np.sort(rng.uniform(0, w, (n, 2)), axis=1)
    ys = np.sort(rng.uniform(0, h, (n, 2)), axis=1)
    boxes = np.stack([xs[:, 0], ys[:, 0], xs[:, 1], ys[:, 1]], axis=1)
    extra = np.array([[0, 0, w, h], [0, 0, 0, 0], [w, h, w, h], [w / 2, h / 2, w / 2, h / 2]], float)
    return np.concatenate([boxes, extra])


# -- geometry -------------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), GRID, ids=GRID_IDS)
def test_geometry_fits_centres_and_keeps_aspect(src, dst):
    (sw, sh), (dw, dh) = src, dst
    g = geometry(src, dst)
    assert (g.src_w, g.src_h) == (sw, sh)
    assert 1 <= g.new_w <= dw and 1 <= g.new_h <= dh, g
    # The limiting side fills the input exactly.
    assert g.new_w == dw or g.new_h == dh, f"neither side fills the input: {g}"
    # Centred: left/top padding is the floor of half the slack, so right/bottom >= left/top.
    assert g.pad_x == (dw - g.new_w) // 2 and g.pad_y == (dh - g.new_h) // 2, g
    assert g.pad_x + g.new_w <= dw and g.pad_y + g.new_h <= dh
    # Scales are the exact ratios of the resized size to the source size.
    assert g.scale_x == g.new_w / sw and g.scale_y == g.new_h / sh
    # One common scale r, each side rounded to the nearest pixel (but never below 1 px).
    r = min(dw / sw, dh / sh)
    for new, size in ((g.new_w, sw), (g.new_h, sh)):
        assert abs(new - size * r) <= 0.5 or new == 1, f"side {size} -> {new}, expected ~{size * r:.2f}"


def test_geometry_reuses_the_given_letterbox():
    g = Letterbox()
    assert letterbox_geometry(640, 480, 320, 320, g) is g
    assert letterbox_geometry(480, 640, 320, 320, g) is g
    assert (g.src_w, g.src_h, g.new_w, g.new_h, g.pad_x, g.pad_y) == (480, 640, 240, 320, 40, 0)


@pytest.mark.parametrize(("w", "h"), [(0, 480), (640, 0), (-1, 10), (0, 0)])
def test_geometry_rejects_empty_frames(w, h):
    with pytest.raises(ValueError, match="empty frame"):
        letterbox_geometry(w, h, 320, 320, Letterbox())


@pytest.mark.parametrize(
    ("src", "dst", "expected"),
    [
        # (new_w, new_h, pad_x, pad_y)
        ((640, 480), (320, 320), (320, 240, 0, 40)),
        ((1920, 1080), (640, 640), (640, 360, 0, 140)),
        ((480, 640), (320, 256), (192, 256, 64, 0)),
        ((100, 700), (320, 256), (37, 256, 141, 0)),
        ((1, 1), (320, 256), (256, 256, 32, 0)),
        ((4096, 1), (320, 320), (320, 1, 0, 159)),
    ],
)
def test_geometry_known_values(src, dst, expected):
    g = geometry(src, dst)
    assert (g.new_w, g.new_h, g.pad_x, g.pad_y) == expected


# -- box mapping ----------------------------------------------------------------------------


@pytest.mark.parametrize(("src", "dst"), GRID, ids=GRID_IDS)
def test_boxes_round_trip_source_input_source(src, dst):
    (sw, sh), _ = src, dst
    g = geometry(src, dst)
    rng = np.random.default_rng(sw * 10007 + sh)
    for dtype in (np.float64, np.float32):
        boxes = random_boxes(rng, sw, sh).astype(dtype)
        work = boxes.copy()
        assert boxes_to_input(work, g) is work, "boxes_to_input must work in place"
        assert boxes_to_source(work, g) is work, "boxes_to_source must work in place"
        err = np.abs(work.astype(np.float64) - boxes.astype(np.float64)).max()
        assert err < 1.0, f"round trip error {err:.4f} px ({dtype.__name__})"
        assert err < 1e-3 * max(sw, sh, 1), f"round trip error {err:.6f} px is more than rounding"


@pytest.mark.parametrize(("src", "dst"), GRID, ids=GRID_IDS)
def test_full_frame_maps_onto_the_letterboxed_content(src, dst):
    (sw, sh), _ = src, dst
    g = geometry(src, dst)
    box = boxes_to_input(np.array([[0.0, 0.0, sw, sh]]), g)[0]
    expected = [g.pad_x, g.pad_y, g.pad_x + g.new_w, g.pad_y + g.new_h]
    np.testing.assert_allclose(box, expected, atol=1e-9)


def test_boxes_to_source_clips_boxes_in_the_padding():
    g = geometry((640, 480), (320, 320))  # content rows 40..280 of the input
    boxes = np.array([[-10.0, 0.0, 400.0, 30.0], [10.0, 290.0, 20.0, 320.0], [0.0, 40.0, 320.0, 280.0]])
    boxes_to_source(boxes, g)
    np.testing.assert_allclose(boxes, [[0, 0, 640, 0], [20, 480, 40, 480], [0, 0, 640, 480]])


def test_boxes_to_source_handles_no_boxes():
    g = geometry((640, 480), (320, 320))
    empty = np.zeros((0, 4), np.float32)
    assert boxes_to_source(empty, g).shape == (0, 4)
    assert boxes_to_input(empty, g).shape == (0, 4)


RECT_CASES = [
    ((640, 480), (320, 320)),
    ((1920, 1080), (640, 640)),
    ((480, 640), (320, 256)),
    ((320, 320), (640, 640)),
    ((100, 700), (320, 256)),
    ((700, 100), (320, 320)),
    ((33, 17), (640, 640)),
]


@pytest.mark.parametrize(
    ("src", "dst"), RECT_CASES, ids=[f"{s[0]}x{s[1]}->{d[0]}x{d[1]}" for s, d in RECT_CASES]
)
def test_mapped_box_matches_where_the_pixels_land(src, dst):
    """A bright rectangle in the frame lands where boxes_to_input says (within 1 px)."""
    (sw, sh), (dw, dh) = src, dst
    x0, x1 = round(sw * 0.3), round(sw * 0.8)
    y0, y1 = round(sh * 0.2), round(sh * 0.6)
    frame = np.zeros((sh, sw, 3), np.uint8)
    frame[y0:y1, x0:x1] = 255
    canvas = np.empty((dh, dw, 3), np.uint8)
    g = letterbox_into(frame, canvas, 0, Letterbox())
    bright = canvas[..., 0] >= 128
    ys, xs = np.nonzero(bright)
    seen = np.array([xs.min(), ys.min(), xs.max() + 1, ys.max() + 1], float)
    mapped = boxes_to_input(np.array([[x0, y0, x1, y1]], float), g)[0]
    assert np.abs(seen - mapped).max() <= 1.0, f"pixels at {seen}, boxes_to_input says {mapped}"


# -- letterbox_into ---------------------------------------------------------------------------


def content_slices(g: Letterbox) -> tuple[slice, slice]:
    return slice(g.pad_y, g.pad_y + g.new_h), slice(g.pad_x, g.pad_x + g.new_w)


def resized_references(src: np.ndarray, g: Letterbox) -> list[np.ndarray]:
    size = (g.new_w, g.new_h)
    return [cv2.resize(src, size, interpolation=i) for i in (cv2.INTER_AREA, cv2.INTER_LINEAR)]


@pytest.mark.parametrize(("src", "dst"), GRID, ids=GRID_IDS)
def test_letterbox_into_pads_border_and_resizes_content(src, dst):
    (sw, sh), (dw, dh) = src, dst
    rng = np.random.default_rng(sw + 31 * sh)
    frame = rng.integers(0, 256, (sh, sw, 3), np.uint8)
    pad = 114
    canvas = np.full((dh, dw, 3), 7, np.uint8)  # sentinel: any pixel left unwritten shows up
    g = letterbox_into(frame, canvas, pad, Letterbox())
    assert (g.src_w, g.src_h) == (sw, sh)
    assert g == geometry(src, dst)
    rows, cols = content_slices(g)
    border = np.ones((dh, dw), bool)
    border[rows, cols] = False
    assert np.all(canvas[border] == pad), "border must hold the pad value everywhere"
    content = canvas[rows, cols]
    assert any(np.array_equal(content, ref) for ref in resized_references(frame, g)), (
        "content is not the resized frame at (pad_x, pad_y)"
    )


def test_letterbox_into_one_pixel_frame_fills_the_content():
    frame = np.array([[[10, 20, 30]]], np.uint8)
    canvas = np.zeros((256, 320, 3), np.uint8)
    g = letterbox_into(frame, canvas, 114, Letterbox())
    rows, cols = content_slices(g)
    assert np.all(canvas[rows, cols] == [10, 20, 30])
    assert np.all(canvas[:, : g.pad_x] == 114) and np.all(canvas[:, g.pad_x + g.new_w :] == 114)


@pytest.mark.parametrize("pad", [0, 114, 255])
def test_letterbox_into_writes_in_place_without_allocating(pad):
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), np.uint8)
    tensor = np.full((1, 320, 320, 3), 7, np.uint8)
    dst = tensor[0]
    address = dst.__array_interface__["data"][0]
    g = Letterbox()
    letterbox_into(frame, dst, pad, g)  # warm-up
    tensor.fill(7)
    tracemalloc.start()
    try:
        letterbox_into(frame, dst, pad, g)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert dst.__array_interface__["data"][0] == address
    assert peak < 16 * 1024, f"letterbox_into allocated {peak} B (the resized frame is 230 kB)"
    # The caller's tensor (whose view was passed) holds the result: nothing went to a copy.
    rows, cols = content_slices(g)
    assert np.all(tensor[0, : g.pad_y] == pad)
    assert any(np.array_equal(tensor[0][rows, cols], ref) for ref in resized_references(frame, g))


def test_letterbox_into_strided_destination_is_written_in_place():
    """A row-padded destination (a view with a larger row stride) is written through the view."""
    frame = np.random.default_rng(1).integers(0, 256, (100, 200, 3), np.uint8)
    backing = np.full((128, 160 + 16, 3), 7, np.uint8)
    dst = backing[:, 8 : 8 + 160]
    assert not dst.flags.c_contiguous
    g = letterbox_into(frame, dst, 114, Letterbox())
    rows, cols = content_slices(g)
    assert np.all(backing[:, :8] == 7) and np.all(backing[:, 168:] == 7), "wrote outside the view"
    assert np.all(backing[: g.pad_y, 8:168] == 114)
    assert any(np.array_equal(backing[:, 8:168][rows, cols], ref) for ref in resized_references(frame, g))


# -- Preprocessor -----------------------------------------------------------------------------

IMAGENET = {"mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225)}
FORMATS = {
    "uint8-NHWC-bgr-direct": InputFormat(256, 320, "NHWC", "uint8", "bgr"),
    "uint8-NHWC-rgb": InputFormat(256, 320, "NHWC", "uint8", "rgb"),
    "f32-NCHW-rgb": InputFormat(256, 320),
    "f32-NCHW-bgr": InputFormat(256, 320, color="bgr"),
    "f32-NHWC-rgb": InputFormat(256, 320, "NHWC"),
    "f16-NCHW-rgb": InputFormat(256, 320, dtype="float16"),
    "f16-NHWC-bgr": InputFormat(256, 320, "NHWC", "float16", "bgr"),
    "f32-NCHW-rgb-meanstd": InputFormat(256, 320, **IMAGENET),
    "f16-NCHW-rgb-meanstd": InputFormat(256, 320, dtype="float16", **IMAGENET),
    "f32-NHWC-bgr-meanstd": InputFormat(
        256, 320, "NHWC", color="bgr", mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.25)
    ),
    "f32-NCHW-rgb-scale1-pad0": InputFormat(256, 320, scale=1.0, pad_value=0),
    "f32-NCHW-rgb-uniform-std": InputFormat(256, 320, std=(0.5, 0.5, 0.5)),
}


def reference_input(frame: np.ndarray, fmt: InputFormat) -> tuple[np.ndarray, Letterbox]:
    """The model input computed the plain way from the same letterboxed canvas."""
    canvas = np.empty((fmt.height, fmt.width, 3), np.uint8)
    g = letterbox_into(frame, canvas, fmt.pad_value, Letterbox())
    img = canvas[..., ::-1] if fmt.color == "rgb" else canvas
    if fmt.dtype == "uint8":
        x = img.copy()
    else:
        x = (img.astype(np.float64) * fmt.scale - np.asarray(fmt.mean)) / np.asarray(fmt.std)
        x = x.astype(fmt.dtype)
    if fmt.layout == "NCHW":
        x = x.transpose(2, 0, 1)
    return x[None], g


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS.keys())
@pytest.mark.parametrize("src", [(640, 480), (200, 300), (1, 1)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_preprocessor_matches_reference(fmt, src):
    rng = np.random.default_rng(src[0] * 7 + src[1])
    frame = rng.integers(0, 256, (src[1], src[0], 3), np.uint8)
    # Distinct channels make a BGR/RGB mix-up visible.
    frame[..., 0] //= 4
    pre = Preprocessor(fmt)
    tensor = np.full(pre.input_shape(), 3, fmt.dtype)
    g = Letterbox()
    assert pre(frame, tensor, g) is g
    expected, g_ref = reference_input(frame, fmt)
    assert g == g_ref
    assert tensor.shape == expected.shape == pre.input_shape()
    if fmt.dtype == "uint8":
        np.testing.assert_array_equal(tensor, expected)
    elif fmt.dtype == "float16":
        np.testing.assert_allclose(
            tensor.astype(np.float32), expected.astype(np.float32), rtol=1e-3, atol=1e-3
        )
    else:
        np.testing.assert_allclose(tensor, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("fmt", "shape"),
    [
        (InputFormat(256, 320, "NHWC", "uint8", "bgr"), (1, 256, 320, 3)),
        (InputFormat(256, 320), (1, 3, 256, 320)),
        (InputFormat(640, 640, "NHWC", "float16"), (1, 640, 640, 3)),
    ],
)
def test_preprocessor_input_shape(fmt, shape):
    assert Preprocessor(fmt).input_shape() == shape


@pytest.mark.parametrize(
    ("fmt", "direct"),
    [
        (InputFormat(256, 320, "NHWC", "uint8", "bgr"), True),
        (InputFormat(256, 320, "NHWC", "uint8", "rgb"), False),
        (InputFormat(256, 320, "NCHW", "float32", "bgr"), False),
    ],
)
def test_preprocessor_direct_path_only_for_uint8_nhwc_bgr(fmt, direct):
    assert Preprocessor(fmt).direct is direct


def test_preprocessor_pad_value_reaches_the_tensor():
    fmt = InputFormat(320, 320, pad_value=114)
    pre = Preprocessor(fmt)
    tensor = np.zeros(pre.input_shape(), np.float32)
    g = pre(np.zeros((480, 640, 3), np.uint8), tensor, Letterbox())
    assert g.pad_y == 40
    np.testing.assert_allclose(tensor[0, :, : g.pad_y], 114 / 255, rtol=1e-6)
    np.testing.assert_allclose(tensor[0, :, g.pad_y : g.pad_y + g.new_h], 0.0)


@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_preprocessor_uint8_nchw(color):
    fmt = InputFormat(256, 320, "NCHW", "uint8", color)
    frame = np.random.default_rng(5).integers(0, 256, (480, 640, 3), np.uint8)
    pre = Preprocessor(fmt)
    tensor = np.zeros(pre.input_shape(), np.uint8)
    pre(frame, tensor, Letterbox())
    expected, _ = reference_input(frame, fmt)
    np.testing.assert_array_equal(tensor, expected)


MEMORY_FORMATS = {
    k: FORMATS[k] for k in ("uint8-NHWC-bgr-direct", "f32-NCHW-rgb", "f16-NCHW-rgb", "f32-NCHW-rgb-meanstd")
}


@pytest.mark.parametrize("fmt", MEMORY_FORMATS.values(), ids=MEMORY_FORMATS.keys())
def test_preprocessor_repeated_calls_do_not_allocate(fmt):
    # A 640x480 frame is 900 kB; the 320x256 canvas 240 kB and its float copy ~1 MB. The bound
    # leaves room only for NumPy's fixed ufunc casting buffers (8192 elements, ~66 kB).
    bound = 128 * 1024
    frame = np.random.default_rng(2).integers(0, 256, (480, 640, 3), np.uint8)
    pre = Preprocessor(fmt)
    tensor = np.zeros(pre.input_shape(), fmt.dtype)
    g = Letterbox()
    for _ in range(3):
        pre(frame, tensor, g)
    tracemalloc.start()
    try:
        for _ in range(200):
            pre(frame, tensor, g)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < bound, f"peak {peak} B traced during 200 calls (bound {bound} B)"
    assert current < 16 * 1024, f"{current} B still allocated after 200 calls: a leak"


@pytest.mark.parametrize(("interpolation", "flag"), [("linear", cv2.INTER_LINEAR), ("area", cv2.INTER_AREA)])
@pytest.mark.parametrize("resize", ["letterbox", "stretch"])
def test_resize_and_interpolation_follow_the_manifest(resize, interpolation, flag):
    """Ultralytics' predict resizes bilinearly (its exports expect that: RT-DETR's top-k
    turns on small input differences); stretch fills the input, as for RT-DETR."""
    rng = np.random.default_rng(3)
    frame = rng.integers(0, 256, (480, 640, 3), np.uint8)
    fmt = InputFormat(
        height=320,
        width=320,
        layout="NHWC",
        dtype="uint8",
        color="bgr",
        resize=resize,
        interpolation=interpolation,
    )
    tensor = np.zeros((1, 320, 320, 3), np.uint8)
    geo = Preprocessor(fmt)(frame, tensor, Letterbox())
    if resize == "stretch":
        want = cv2.resize(frame, (320, 320), interpolation=flag)
        assert (geo.pad_x, geo.pad_y, geo.scale_x, geo.scale_y) == (0, 0, 0.5, 320 / 480)
    else:
        want = np.full((320, 320, 3), 114, np.uint8)
        want[40:280] = cv2.resize(frame, (320, 240), interpolation=flag)
    np.testing.assert_array_equal(tensor[0], want)
