"""Segmentation masks (pipelines/tasks/masks.py) against an independent, slow reference of
what Ultralytics' predict does (``process_mask(upsample=True)`` then ``scale_masks``):

1. logits = coefficients @ prototypes, upsampled over the WHOLE input bilinearly as
   ``F.interpolate(mode="bilinear", align_corners=False)`` does, kept where > 0, cut to the
   box (columns c with x1 <= c < x2, rows likewise); an empty one drops the detection;
2. the letterboxed content of that input-sized mask resized bilinearly (same rule) to the
   WHOLE frame, kept where > 0.5.

The reference is per pixel, in float64, over whole images: nothing of the module's
box-restricted separable weights. Sizes are chosen so every weight is dyadic, where float32
and float64 give the same bits and the two must agree exactly; the prototypes are either
quantised (exact arithmetic throughout, ties at 0 included) or continuous (step 1 compared
away from the 0 tie, step 2 fed the module's own step 1).

Also COCO RLE (round trip, canonical counts) and polygons (budget, source pixels, order).
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from edge_agent.pipelines.preprocess import Letterbox, letterbox_geometry
from edge_agent.pipelines.tasks.masks import Mask, Taps, input_mask, polygons, rle, source_mask

# -- the reference ------------------------------------------------------------------------------


def ref_resize(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """PyTorch's bilinear resize, align_corners=False (``upsample_bilinear2d``): each output
    pixel from its four input pixels (the gather done for all pixels at once)."""
    in_h, in_w = img.shape
    img = img.astype(np.float64)

    def index(size_out: int, size_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scale = size_in / size_out
        i0, i1, lam = [], [], []
        for d in range(size_out):
            src = max(scale * (d + 0.5) - 0.5, 0.0)
            a = int(src)
            i0.append(a)
            i1.append(a + 1 if a < size_in - 1 else a)
            lam.append(src - a)
        return np.array(i0), np.array(i1), np.array(lam)

    y0, y1, ly = (v[:, None] for v in index(out_h, in_h))
    x0, x1, lx = (v[None, :] for v in index(out_w, in_w))
    return (1 - ly) * ((1 - lx) * img[y0, x0] + lx * img[y0, x1]) + ly * (
        (1 - lx) * img[y1, x0] + lx * img[y1, x1]
    )


def ref_input_logits(coeffs: np.ndarray, protos: np.ndarray, ih: int, iw: int) -> np.ndarray:
    m, mh, mw = protos.shape
    logits = (coeffs.astype(np.float64) @ protos.reshape(m, -1).astype(np.float64)).reshape(mh, mw)
    return ref_resize(logits, ih, iw)


def ref_crop(mask: np.ndarray, box: np.ndarray) -> np.ndarray:
    """Ultralytics' ``crop_mask``: keep columns c with x1 <= c < x2 and rows r with y1 <= r < y2."""
    h, w = mask.shape
    x1, y1, x2, y2 = (float(v) for v in box)
    c = np.arange(w)[None, :]
    r = np.arange(h)[:, None]
    return mask & (c >= x1) & (c < x2) & (r >= y1) & (r < y2)


def ref_frame_mask(input_bitmap: np.ndarray, geo: Letterbox) -> np.ndarray:
    """``scale_masks``: the content region (padding removed) resized to the frame, > 0.5."""
    content = input_bitmap[geo.pad_y : geo.pad_y + geo.new_h, geo.pad_x : geo.pad_x + geo.new_w]
    return ref_resize(content.astype(np.float64), geo.src_h, geo.src_w) > 0.5


def place(mask: Mask, h: int, w: int) -> np.ndarray:
    """A Mask placed in a frame of ``h`` x ``w``; it must lie inside it."""
    bh, bw = mask.bitmap.shape
    assert mask.bitmap.dtype == bool
    assert mask.x0 >= 0 and mask.y0 >= 0 and mask.x0 + bw <= w and mask.y0 + bh <= h, (
        mask.x0,
        mask.y0,
        bh,
        bw,
    )
    out = np.zeros((h, w), bool)
    out[mask.y0 : mask.y0 + bh, mask.x0 : mask.x0 + bw] = mask.bitmap
    return out


def placed_input(found: tuple[int, int, np.ndarray], ih: int, iw: int) -> np.ndarray:
    r0, c0, bitmap = found
    return place(Mask(c0, r0, bitmap), ih, iw)


def differ(got: np.ndarray, want: np.ndarray, what: str, values: np.ndarray | None = None) -> str:
    ys, xs = np.nonzero(got != want)
    shown = [
        f"(row {y}, col {x}) got {bool(got[y, x])} want {bool(want[y, x])}"
        + ("" if values is None else f" ref value {values[y, x]!r}")
        for y, x in zip(ys[:12], xs[:12])
    ]
    return f"{what}: {len(ys)} pixels differ: " + "; ".join(shown)


# -- the cases ----------------------------------------------------------------------------------

# (input h, input w, proto h, proto w)
INPUTS = [(64, 64, 16, 16), (32, 64, 8, 16)]
# source frames (w, h) per input: identity content (letterbox pads) and resized content
FRAMES = {
    (64, 64): [(64, 48), (48, 64), (32, 24), (128, 96), (64, 64)],
    (32, 64): [(64, 32), (64, 24), (128, 64), (32, 16)],
}
BOXES = [
    (0.0, 0.0, 64.0, 64.0),  # the whole input
    (-5.3, -2.0, 20.7, 30.2),  # past the top-left
    (50.5, 40.25, 70.0, 80.0),  # past the bottom-right
    (10.5, 12.0, 40.0001, 33.9999),  # fractional edges
    (16.0, 16.0, 48.0, 48.0),  # whole-pixel edges
    (3.25, 0.5, 61.75, 7.5),  # in the letterbox padding of a landscape frame
    (10.0, 10.0, 10.5, 40.0),  # one column (10 <= c < 10.5)
    (10.2, 5.0, 10.8, 40.0),  # no column at all: empty
    (70.0, 10.0, 90.0, 20.0),  # outside the input: empty
    (0.9, 0.9, 63.1, 31.1),
]


def geometry(src_w: int, src_h: int, iw: int, ih: int) -> Letterbox:
    return letterbox_geometry(src_w, src_h, iw, ih, Letterbox())


def cases():
    for ih, iw, mh, mw in INPUTS:
        for src_w, src_h in FRAMES[(ih, iw)]:
            yield pytest.param(
                ih, iw, mh, mw, src_w, src_h, id=f"in{iw}x{ih}-p{mw}x{mh}-frame{src_w}x{src_h}"
            )


def quantised(rng: np.random.Generator, m: int, mh: int, mw: int) -> tuple[np.ndarray, np.ndarray]:
    """Prototypes in eighths and coefficients in quarters: every sum and bilinear weight
    (dyadic sizes) exact in float32, so the two must agree to the bit, ties at 0 included."""
    protos = (rng.integers(-8, 9, (m, mh, mw)) / 8).astype(np.float32)
    coeffs = (rng.integers(-4, 5, (8, m)) / 4).astype(np.float32)
    return coeffs, protos


@pytest.mark.parametrize(("ih", "iw", "mh", "mw", "src_w", "src_h"), list(cases()))
def test_masks_match_the_reference_exactly_on_quantised_prototypes(ih, iw, mh, mw, src_w, src_h):
    rng = np.random.default_rng(ih * 1000 + src_w * 10 + src_h)
    coeffs, protos = quantised(rng, 4, mh, mw)
    geo = geometry(src_w, src_h, iw, ih)
    made = dropped = 0
    for k, co in enumerate(coeffs):
        logits = ref_input_logits(co, protos, ih, iw)
        ties = int((logits == 0).sum())
        for box in BOXES:
            box = np.array(box, np.float32)
            want_in = ref_crop(logits > 0, box)
            found = input_mask(co, protos, box, (ih, iw))
            if not want_in.any():
                assert found is None, f"coeffs {k} box {box}: the reference's input mask is empty"
                dropped += 1
                continue
            assert found is not None, (
                f"coeffs {k} box {box}: the reference's input mask has {want_in.sum()} pixels"
            )
            got_in = placed_input(found, ih, iw)
            assert np.array_equal(got_in, want_in), differ(
                got_in, want_in, f"input mask, coeffs {k}, box {box}, {ties} ties", logits
            )
            got = place(source_mask(found, geo), src_h, src_w)
            want = ref_frame_mask(want_in, geo)
            assert np.array_equal(got, want), differ(got, want, f"frame mask, coeffs {k}, box {box}")
            made += 1
    assert made > 20 and dropped > 0  # the cases exercise both


@pytest.mark.parametrize(("ih", "iw", "mh", "mw", "src_w", "src_h"), list(cases()))
def test_masks_match_the_reference_on_continuous_prototypes(ih, iw, mh, mw, src_w, src_h):
    rng = np.random.default_rng(7 + ih + src_w + src_h)
    protos = rng.standard_normal((4, mh, mw)).astype(np.float32)
    coeffs = rng.standard_normal((6, 4)).astype(np.float32)
    geo = geometry(src_w, src_h, iw, ih)
    for k, co in enumerate(coeffs):
        logits = ref_input_logits(co, protos, ih, iw)
        clear = np.abs(logits) > 1e-4  # away from the tie at 0, where float32 rounding may fall either way
        for box in BOXES:
            box = np.array(box, np.float32)
            want_in = ref_crop(logits > 0, box)
            found = input_mask(co, protos, box, (ih, iw))
            if found is None:
                assert not (want_in & clear).any(), f"coeffs {k} box {box}: dropped, the reference has a mask"
                continue
            got_in = placed_input(found, ih, iw)
            assert np.array_equal(got_in & clear, want_in & clear), differ(
                got_in & clear, want_in & clear, f"input mask, coeffs {k}, box {box}", logits
            )
            # Step 2 from the module's own step 1: exact.
            got = place(source_mask(found, geo), src_h, src_w)
            want = ref_frame_mask(got_in, geo)
            assert np.array_equal(got, want), differ(got, want, f"frame mask, coeffs {k}, box {box}")


def test_frame_masks_of_a_non_dyadic_letterbox_differ_only_at_the_threshold():
    """100x75 into 64x64: content 64x48, weights not dyadic; a pixel may differ only where
    the reference's resized value is within rounding of 0.5."""
    rng = np.random.default_rng(5)
    coeffs, protos = quantised(rng, 4, 16, 16)
    geo = geometry(100, 75, 64, 64)
    assert (geo.new_w, geo.new_h, geo.pad_y) == (64, 48, 8)
    compared = 0
    for co in coeffs:
        logits = ref_input_logits(co, protos, 64, 64)
        for box in BOXES:
            box = np.array(box, np.float32)
            found = input_mask(co, protos, box, (64, 64))
            if found is None:
                continue
            want_in = placed_input(found, 64, 64)
            assert np.array_equal(want_in, ref_crop(logits > 0, box))
            content = want_in[8:56].astype(np.float64)
            values = ref_resize(content, 75, 100)
            got = place(source_mask(found, geo), 75, 100)
            bad = (got != (values > 0.5)) & (np.abs(values - 0.5) > 1e-5)
            assert not bad.any(), differ(got & bad, (values > 0.5) & bad, f"box {box}", values)
            compared += 1
    assert compared > 10


def test_an_empty_mask_in_the_box_is_none():
    protos = np.ones((2, 16, 16), np.float32)
    assert input_mask(np.array([-1.0, -1.0], np.float32), protos, np.array([0, 0, 64, 64]), (64, 64)) is None
    assert input_mask(np.array([0.0, 0.0], np.float32), protos, np.array([0, 0, 64, 64]), (64, 64)) is None, (
        "0 is not > 0"
    )
    r0, c0, bitmap = input_mask(
        np.array([1.0, 0.0], np.float32), protos, np.array([2.5, 3.5, 10, 12]), (64, 64)
    )
    assert (r0, c0, bitmap.shape) == (4, 3, (8, 7)) and bitmap.all()


@pytest.mark.parametrize(
    ("start", "stop", "scale", "size"),
    [
        (0, 64, 0.25, 16),
        (5, 17, 0.25, 16),
        (60, 64, 0.25, 16),
        (0, 100, 0.64, 64),
        (31, 32, 2.0, 64),
        (0, 24, 2.0, 48),
    ],
)
def test_taps_are_pytorchs_bilinear(start, stop, scale, size):
    """Each output's two taps and their weights, spread over the whole input axis, are the
    per-pixel rule's."""
    taps = Taps.of(start, stop, scale, size)
    assert taps.l1.dtype == np.float32 and len(taps.i0) == stop - start
    for k, d in enumerate(range(start, stop)):
        src = max(scale * (d + 0.5) - 0.5, 0.0)
        i0 = int(src)
        i1 = i0 + 1 if i0 < size - 1 else i0
        want = np.zeros(size)
        want[i0] += 1 - (src - i0)
        want[i1] += src - i0
        got = np.zeros(size)
        got[taps.i0[k]] += 1 - taps.l1[k]
        got[taps.i1[k]] += taps.l1[k]
        np.testing.assert_allclose(got, want, atol=1e-6)


# -- COCO RLE -----------------------------------------------------------------------------------


def rle_decode(counts: np.ndarray, h: int, w: int) -> np.ndarray:
    flat = np.zeros(h * w, bool)
    pos, value = 0, False
    for c in counts.tolist():
        flat[pos : pos + c] = value
        pos += c
        value = not value
    assert pos == h * w
    return flat.reshape(w, h).T  # column-major


def rle_masks():
    h, w = 7, 9
    rng = np.random.default_rng(1)
    yield "empty frame crop", Mask(2, 3, np.zeros((3, 4), bool)), h, w
    yield "no pixels at all", Mask(2, 1, np.zeros((0, 3), bool)), h, w
    yield "no columns", Mask(2, 1, np.zeros((3, 0), bool)), h, w
    yield "top-left pixel", Mask(0, 0, np.ones((1, 1), bool)), h, w
    yield "inner block", Mask(3, 2, np.ones((3, 2), bool)), h, w
    yield "top rows", Mask(1, 0, rng.random((2, 5)) > 0.4), h, w
    yield "bottom rows", Mask(2, 5, rng.random((2, 6)) > 0.4), h, w
    yield "left columns", Mask(0, 1, rng.random((5, 2)) > 0.4), h, w
    yield "right columns", Mask(7, 1, rng.random((5, 2)) > 0.4), h, w
    yield "full-height columns", Mask(2, 0, np.ones((7, 3), bool)), h, w  # runs that cross columns
    yield (
        "full-height, interior end",
        Mask(2, 0, np.array(np.ones((7, 3)), bool) & (np.arange(7)[:, None] != 3)),
        h,
        w,
    )
    yield from (case for case in random_rle_masks() if not place(case[1], h, w)[-1, -1])


def random_rle_masks():
    h, w = 7, 9
    rng = np.random.default_rng(1)
    for k in range(60):
        bh, bw = rng.integers(1, h + 1), rng.integers(1, w + 1)
        y0, x0 = rng.integers(0, h - bh + 1), rng.integers(0, w - bw + 1)
        yield f"random {k}", Mask(int(x0), int(y0), rng.random((bh, bw)) > rng.uniform(0.1, 0.9)), h, w


def rle_masks_at_the_last_pixel():
    """Masks that cover the frame's last pixel (bottom row, right column)."""
    h, w = 7, 9
    yield "bottom-right pixel", Mask(8, 6, np.ones((1, 1), bool)), h, w
    yield "whole frame", Mask(0, 0, np.ones((h, w), bool)), h, w
    yield "bottom-right block", Mask(6, 4, np.ones((3, 3), bool)), h, w
    yield from (case for case in random_rle_masks() if place(case[1], h, w)[-1, -1])


@pytest.mark.parametrize(
    ("what", "mask", "h", "w"),
    [*rle_masks(), *rle_masks_at_the_last_pixel()],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_rle_round_trip(what, mask, h, w):
    counts = rle(mask, h, w)
    assert counts.dtype == np.int64
    assert counts.sum() == h * w and counts[0] >= 0 and (counts >= 0).all()
    np.testing.assert_array_equal(rle_decode(counts, h, w), place(mask, h, w))


@pytest.mark.parametrize(
    ("what", "mask", "h", "w"), list(rle_masks()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_rle_counts_are_canonical(what, mask, h, w):
    """As pycocotools encodes: a first run of zeros (0 when the first pixel is set), then
    runs that are never empty."""
    counts = rle(mask, h, w)
    assert (counts[1:] > 0).all(), counts.tolist()
    frame = place(mask, h, w)
    assert (counts[0] == 0) == bool(frame[0, 0])


@pytest.mark.parametrize(
    ("what", "mask", "h", "w"),
    list(rle_masks_at_the_last_pixel()),
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_rle_counts_are_canonical_when_the_mask_reaches_the_last_pixel(what, mask, h, w):
    counts = rle(mask, h, w)
    assert (counts[1:] > 0).all(), counts.tolist()


def test_rle_known_counts():
    assert rle(Mask(0, 0, np.ones((1, 1), bool)), 3, 4).tolist() == [0, 1, 11]
    assert rle(Mask(1, 0, np.ones((3, 1), bool)), 3, 4).tolist() == [3, 3, 6]
    assert rle(Mask(1, 0, np.ones((3, 2), bool)), 3, 4).tolist() == [3, 6, 3], "two full columns are one run"
    assert rle(Mask(1, 1, np.ones((2, 2), bool)), 3, 4).tolist() == [4, 2, 1, 2, 3]
    assert rle(Mask(0, 0, np.zeros((3, 4), bool)), 3, 4).tolist() == [12]


# -- polygons -----------------------------------------------------------------------------------


def blob(h: int, w: int, seed: int) -> np.ndarray:
    """A ragged shape with many outline points and several pieces."""
    rng = np.random.default_rng(seed)
    noise = cv2.GaussianBlur(rng.standard_normal((h, w)).astype(np.float32), (0, 0), 2.0)
    return noise > 0.1


@pytest.mark.parametrize("budget", [3, 4, 8, 16, 64, 200])
def test_polygons_respect_the_point_budget(budget):
    for seed in range(5):
        mask = Mask(0, 0, blob(60, 80, seed))
        found = polygons(mask, budget)
        assert found, "a mask with pixels has an outline"
        assert sum(len(p) for p in found) <= budget, [len(p) for p in found]
        assert all(p.ndim == 2 and p.shape[1] == 2 for p in found)


def test_a_large_budget_keeps_every_piece():
    bits = blob(60, 80, 0)
    n_pieces = len(cv2.findContours(bits.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)[0])
    found = polygons(Mask(0, 0, bits), 100_000)
    assert 1 < len(found) <= n_pieces


def test_polygons_are_in_source_pixels():
    bits = np.zeros((10, 15), bool)
    bits[2:6, 3:10] = True  # rows 2..5, columns 3..9 of the crop
    (poly,) = polygons(Mask(100, 50, bits), 64)
    assert sorted(map(tuple, poly.tolist())) == sorted([(103, 52), (109, 52), (109, 55), (103, 55)])


def test_polygons_put_the_largest_piece_first_and_two_blobs_give_two():
    bits = np.zeros((30, 40), bool)
    bits[2:5, 2:5] = True  # small, first in scan order
    bits[10:25, 20:38] = True  # large
    found = polygons(Mask(7, 9, bits), 64)
    assert len(found) == 2
    big, small = found
    assert (big[:, 0].min(), big[:, 1].min(), big[:, 0].max(), big[:, 1].max()) == (27, 19, 44, 33)
    assert (small[:, 0].min(), small[:, 1].min(), small[:, 0].max(), small[:, 1].max()) == (9, 11, 11, 13)
    (only,) = polygons(Mask(7, 9, bits), 4)
    np.testing.assert_array_equal(only, big, err_msg="over the budget: the largest piece")


def test_polygons_leave_out_pieces_under_three_points_and_an_empty_mask():
    bits = np.zeros((20, 20), bool)
    bits[5:15, 5:15] = True
    bits[1, 1] = True  # a one-pixel speck
    found = polygons(Mask(0, 0, bits), 64)
    assert len(found) == 1 and len(found[0]) == 4
    assert polygons(Mask(0, 0, np.zeros((5, 5), bool)), 64) == []


def test_polygon_points_stay_on_the_mask():
    bits = np.zeros((40, 40), bool)
    cv2.circle(bits.view(np.uint8), (20, 20), 15, 1, -1)
    found = polygons(Mask(3, 4, bits), 12)
    assert sum(len(p) for p in found) <= 12 and len(found[0]) >= 3
    for x, y in found[0].tolist():
        assert bits[y - 4, x - 3], "outline points are mask pixels"
    area = cv2.contourArea(found[0].astype(np.float32))
    assert area > 0.8 * math.pi * 15 * 15
