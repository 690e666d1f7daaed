"""INT8 calibration on the TensorRT backend (fakes): the calibrator fed from the images,
its cache and the engine key (what decides the scales), the dtype it writes, and every way a
calibration can fail: the builder's reason first, the calibrator's error carried, "no frames"
only when frames were asked for."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakeCudaDriver
from fakes.fake_tensorrt import FakeTensorRT
from fakes.trt_kit import FLOAT_FMT_SCALED, SHAPE, UINT8_FMT, Fakes, float_detector, loaded

from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_build
from edge_agent.pipelines.backends.base import BackendError

settings = partial(trt_kit.settings, precision="int8")
cache = trt_kit.cache
cuda = trt_kit.cuda


@pytest.fixture
def calibration_images(tmp_path) -> Path:
    d = tmp_path / "calib"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(str(d / f"{i}.png"), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
    return d


def images(folder: Path, n: int = 3, seed: int = 0) -> Path:
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):  # BMP: the file size depends on the dimensions only
        cv2.imwrite(str(folder / f"{i}.bmp"), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
    return folder


def calibrator(trt, cuda, tmp_path, frames=4):
    batch = [np.zeros(SHAPE, np.uint8)] * frames
    nbytes = int(np.prod(SHAPE))
    return trt_build.make_calibrator(trt, cuda, lambda: iter(batch), tmp_path / "c.cache", nbytes)


# -- the backend calibrates once, with the images --------------------------------------------


def test_int8_load_calibrates_with_the_images(const_model, cache, calibration_images):
    _be, f = loaded(const_model, cache, precision="int8", calibration_images=str(calibration_images))
    assert f.trt.builds == 1
    assert f.names().count("memcpy_htod") == 3, "one calibration batch per image"
    assert len(list(cache.glob("*-calib-*.cache"))) == 1


def test_int8_engine_is_reused_on_the_next_start(const_model, cache, calibration_images):
    cfg = dict(precision="int8", calibration_images=str(calibration_images))
    loaded(const_model, cache, **cfg)
    _, f = loaded(const_model, cache, **cfg)
    assert f.trt.builds == 0, "the int8 engine was rebuilt on the second start"


def test_calibration_on_a_builder_thread_feeds_every_image(const_model, cache, tmp_path):
    f = Fakes()
    f.trt.calibrate_on_thread = True  # no context is current there
    be = f.backend(cache, precision="int8", calibration_images=str(images(tmp_path / "c")))
    be.load(str(const_model), UINT8_FMT)
    assert f.names().count("memcpy_htod") == 3
    assert f.names().count("mem_alloc") == 1, "allocated once, under the context"
    assert f.cuda.context_depth() == 0


def test_edited_images_or_normalisation_recalibrate(const_model, cache, tmp_path):
    calib = images(tmp_path / "c")
    cfg = dict(precision="int8", calibration_images=str(calib))
    Fakes().backend(cache, **cfg).load(str(const_model), UINT8_FMT)
    images(calib, seed=1)  # same names, same sizes, other pixels
    f = Fakes()
    f.backend(cache, **cfg).load(str(const_model), UINT8_FMT)
    assert f.trt.builds == 1, "new images, same names and sizes: the old scales were reused"
    f = Fakes()
    f.backend(cache, **cfg).load(str(const_model), InputFormat(**{**UINT8_FMT.__dict__, "color": "rgb"}))
    assert f.trt.builds == 1, "another colour order: the old scales were reused"
    assert len(list(cache.glob("*-calib-*.cache"))) == 3


def test_calibration_feeds_an_fp16_model_fp16_bytes(tmp_path, cache):
    images = tmp_path / "calib"
    images.mkdir()
    for i in range(2):
        cv2.imwrite(str(images / f"{i}.png"), np.full((240, 320, 3), 40 * i, np.uint8))
    f = Fakes()
    be = f.backend(cache, precision="int8", preprocess="cpu", calibration_images=str(images))
    be.load(float_detector(tmp_path, "half", onnx.TensorProto.FLOAT16), FLOAT_FMT_SCALED)  # manifest: float32
    copied = [a[1] for n, a in f.calls if n == "memcpy_htod"]
    assert copied == [1 * 3 * 320 * 320 * 2] * 2, "fp32 bytes for an fp16 input"


# -- failures: the builder's reason first, the calibrator's error carried -----------------------


def test_a_build_refused_before_calibrating_gives_the_builders_reason(const_model, tmp_path, cuda):
    """An int8 DLA build with layers the DLA cannot run and no GPU fallback."""
    trt = FakeTensorRT(num_dla_cores=1)
    calib = calibrator(trt, cuda, tmp_path)
    s = settings(dla_core=0, gpu_fallback=False)
    with pytest.raises(BackendError, match="could not build the engine") as e:
        trt_build.build_engine(trt, None, str(const_model), s, tmp_path / "t", calib, progress=False)
    assert "no frames" not in str(e.value)
    assert "GPU_FALLBACK" in trt.build_failures[-1] and calib.asked == 0


def test_a_refused_build_carries_the_calibration_error_too(const_model, tmp_path, cuda):
    trt = FakeTensorRT()
    trt.build_fails = True
    calib = calibrator(trt, cuda, tmp_path)
    calib.error = RuntimeError("frame 3 is corrupt")
    with pytest.raises(BackendError, match=r"could not build.*frame 3 is corrupt") as e:
        trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t", calib, progress=False)
    assert e.value.__cause__ is calib.error


def test_an_explicitly_quantised_onnx_builds_at_int8_without_calibrating(const_model, tmp_path, cuda):
    """TensorRT ignores the calibrator for a network with Q/DQ: nothing asked is not "no frames"."""
    proto = onnx.load(str(const_model))
    proto.graph.node.append(onnx.helper.make_node("QuantizeLinear", ["xf", "scale"], ["q"], name="q"))
    qdq = tmp_path / "qdq.onnx"
    onnx.save(proto, str(qdq))
    trt = FakeTensorRT()
    calib = calibrator(trt, cuda, tmp_path)
    plan, _ = trt_build.build_engine(trt, None, str(qdq), settings(), tmp_path / "t", calib, progress=False)
    assert plan and calib.asked == 0 and calib.count == 0


def test_asked_and_fed_nothing_is_no_frames(const_model, tmp_path, cuda):
    trt = FakeTensorRT()
    calib = calibrator(trt, cuda, tmp_path, frames=0)
    with pytest.raises(BackendError, match="fed no frames"):
        trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t", calib, progress=False)
    assert calib.asked == 1


def test_ctrl_c_in_get_batch_goes_through_as_it_is(tmp_path, cuda):
    def frames():
        raise KeyboardInterrupt
        yield

    calib = trt_build.make_calibrator(FakeTensorRT(), cuda, frames, tmp_path / "c.cache", 4)
    with pytest.raises(KeyboardInterrupt):
        calib.get_batch(["images"])
    assert calib.error is None
    calib.close()


def test_a_calibration_error_fails_the_build_instead_of_ending_it(const_model, tmp_path):
    cuda = FakeCudaDriver()
    cuda.init()
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()

    def frames():
        yield np.zeros((1, 320, 320, 3), np.uint8)
        raise RuntimeError("frame 2 is corrupt")

    trt = FakeTensorRT()
    calib = trt_build.make_calibrator(trt, cuda, frames, tmp_path / "c.cache", 320 * 320 * 3, ctx)
    s = trt_build.BuildSettings("int8", -1, True, 1 << 20, 3, "images", (1, 320, 320, 3))
    with pytest.raises(BackendError, match="frame 2 is corrupt"):
        trt_build.build_engine(trt, None, str(const_model), s, tmp_path / "t", calib, progress=False)
    calib.close()
    ctx.pop()


def test_calibration_with_no_readable_image_fails(const_model, cache, tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "a.png").write_bytes(b"not a png")
    be = Fakes().backend(cache, precision="int8", calibration_images=str(folder))
    with pytest.raises(BackendError, match="fed no frames"):
        be.load(str(const_model), UINT8_FMT)
