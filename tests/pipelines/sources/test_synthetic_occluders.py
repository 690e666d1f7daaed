"""Static occluders in the synthetic scene (SceneSpec.occluders): in front of every object,
out of its visible fraction, and nothing else changed."""

from __future__ import annotations

import tracemalloc

import numpy as np

from edge_agent.pipelines.sources.synthetic import SceneSpec, SyntheticScene

MARGINS = {"margin_x": 128, "margin_y": 96}


def render(scene: SyntheticScene, index: int):
    spec = scene.spec
    img = np.empty((spec.height, spec.width, 3), np.uint8)
    gt = np.zeros((spec.num_objects, 6), np.float32)
    scene.render(index, img, gt)
    return img, gt


def alone_in_view(scene: SyntheticScene) -> tuple[int, int]:
    """(frame, object): an object wholly seen, well inside the view."""
    spec = scene.spec
    for t in range(0, 600, 10):
        _, gt = render(scene, t)
        for i in range(spec.num_objects):
            x1, y1, x2, y2 = gt[i, 1:5]
            if gt[i, 5] > 0.99 and x1 >= 20 and y1 >= 50 and x2 <= spec.width - 20 and y2 <= spec.height - 50:
                return t, i
    raise AssertionError("no object alone inside the view")


def test_without_occluders_the_scene_is_the_one_it_was():
    """A spec without the field, and one with an empty tuple, render the same frames."""
    old = SyntheticScene(SceneSpec(seed=4, num_objects=12, **MARGINS))
    new = SyntheticScene(SceneSpec(seed=4, num_objects=12, occluders=(), **MARGINS))
    for t in (0, 7, 123):
        a_img, a_gt = render(old, t)
        b_img, b_gt = render(new, t)
        assert np.array_equal(a_img, b_img) and np.array_equal(a_gt, b_gt)


def test_occluders_change_only_their_own_pixels_and_visibility():
    """Adding occluders leaves every pixel outside them, every box and class as it was (they
    draw from their own random stream); visibility can only drop."""
    spec = SceneSpec(seed=4, num_objects=12, **MARGINS)
    occ = ((300, 150, 90, 380), (420, 520, 300, 70))
    plain, hidden = SyntheticScene(spec), SyntheticScene(SceneSpec(**{**spec.__dict__, "occluders": occ}))
    outside = np.ones((spec.height, spec.width), bool)
    for x, y, w, h in occ:
        x1, y1 = x - spec.margin_x, y - spec.margin_y
        outside[max(y1, 0) : max(y1 + h, 0), max(x1, 0) : max(x1 + w, 0)] = False
    dropped = 0
    for t in range(0, 300, 15):
        a_img, a_gt = render(plain, t)
        b_img, b_gt = render(hidden, t)
        assert np.array_equal(a_img[outside], b_img[outside])
        assert not np.array_equal(a_img[~outside], b_img[~outside])
        assert np.array_equal(a_gt[:, :5], b_gt[:, :5])
        assert np.all(b_gt[:, 5] <= a_gt[:, 5])
        dropped += int(np.sum(b_gt[:, 5] < a_gt[:, 5]))
    assert dropped, "over 300 frames some object passes behind an occluder"


def test_an_object_behind_an_occluder_is_invisible_and_the_occluder_shows():
    base = SceneSpec(seed=9, num_objects=8, noise_sigma=0.0, **MARGINS)
    t, i = alone_in_view(SyntheticScene(base))
    x, y = (int(v) for v in SyntheticScene(base).boxes(t)[i])
    s = int(SyntheticScene(base).sizes[i])
    # elongated, well past the object on every side (world pixels)
    occ = (x - 6, y - 40, s + 12, s + 80)
    scene = SyntheticScene(SceneSpec(**{**base.__dict__, "occluders": (occ,)}))
    _, seen = render(SyntheticScene(base), t)
    assert seen[i, 5] > 0.5, "without the occluder the object is seen"
    img, gt = render(scene, t)
    assert gt[i, 5] == 0.0
    assert np.array_equal(gt[i, 1:5], seen[i, 1:5]), "the truth box is kept while hidden"
    # No noise: the occluder's pixels are the same in every frame, whatever moves behind it.
    x1, y1 = occ[0] - base.margin_x, occ[1] - base.margin_y
    region = (slice(y1, y1 + occ[3]), slice(x1, x1 + occ[2]))
    for other in (0, 200, 500):
        o_img, _ = render(scene, other)
        assert np.array_equal(img[region], o_img[region])
    # Half behind it: partly visible.
    half = (x + s // 2, y - 40, s, s + 80)
    _, part = render(SyntheticScene(SceneSpec(**{**base.__dict__, "occluders": (half,)})), t)
    assert 0.1 < part[i, 5] < 0.9


def test_rendering_with_occluders_allocates_no_frame():
    """The occluders are drawn once; a frame copies them (no image-sized allocation)."""
    spec = SceneSpec(seed=2, num_objects=10, occluders=((300, 100, 100, 400), (100, 500, 500, 80)), **MARGINS)
    scene = SyntheticScene(spec)
    img, gt = render(scene, 0)
    tracemalloc.start()
    try:
        for t in range(1, 6):
            scene.render(t, img, gt)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < img.nbytes // 8, peak
