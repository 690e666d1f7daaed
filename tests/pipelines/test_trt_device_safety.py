"""#22: what would crash, corrupt memory or mislead on a Jetson, each against the strict fakes.

Every test here failed before the fix it names (the strict fakes catch what the real
TensorRT and pycuda would do); docs/jetson.md lists the source each relies on.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakeCudaDriver
from fakes.fake_tensorrt import FakeNetwork, FakeTensorRT
from fakes.trt_kit import FLOAT_FMT_SCALED, UINT8_FMT, Fakes

from edge_agent.models.manifest import InputFormat
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.backends import trt_build
from edge_agent.pipelines.backends.base import BackendError

cache = trt_kit.cache


def float_model(tmp_path: Path, name: str, dtype=onnx.TensorProto.FLOAT, height: int = 320, **kw) -> str:
    out = yolov8_output([(160, 160, 40, 40)], [0], [0.9], 4, 2100)
    d = tmp_path / name
    d.mkdir()
    return constant_detector(
        str(d / "model.onnx"), out, height=height, width=height, layout="NCHW", dtype=dtype, **kw
    )


# -- item 2: the preprocessing engine's output is the model's input, type and shape --------------


def test_preprocessing_writes_the_model_inputs_own_dtype(tmp_path, cache):
    """The manifest says float32, the model takes float16: fp32 written into an fp16 buffer."""
    f = Fakes()
    be = f.backend(cache, preprocess="gpu")
    be.load(float_model(tmp_path, "half", onnx.TensorProto.FLOAT16), FLOAT_FMT_SCALED)
    io = be.allocate()
    be.infer(io)  # the strict fake checks the model-input buffer against what is written
    assert f.cuda.pending_streams() == []
    assert be.describe()["preprocess"] == "device"
    assert be.pre_engine.get_tensor_dtype("input") == f.trt.DataType.HALF


def test_preprocessing_refused_when_the_model_input_shape_differs(tmp_path, cache):
    f = Fakes()
    be = f.backend(cache, preprocess="gpu")
    be.load(float_model(tmp_path, "small", height=256), FLOAT_FMT_SCALED)
    be.infer(be.allocate())
    assert be.describe()["preprocess"] == "cpu"
    assert any("(1, 3, 256, 256)" in n for n in be.notes), be.notes


# -- item 3: data-dependent output shapes -------------------------------------------------------


def test_a_data_dependent_output_is_refused_by_name(tmp_path, cache):
    path = float_model(tmp_path, "nms")
    proto = onnx.load(path)
    proto.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "num_dets"  # NMS inside
    onnx.save(proto, path)
    be = Fakes().backend(cache, preprocess="cpu")
    with pytest.raises(BackendError, match="output 'output0' has a data-dependent shape"):
        be.load(path, FLOAT_FMT_SCALED)


# -- item 4: INT8 calibration that stops early ----------------------------------------------------


def images(folder: Path, n: int = 3, seed: int = 0) -> Path:
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(n):  # BMP: the file size depends on the dimensions only
        cv2.imwrite(str(folder / f"{i}.bmp"), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
    return folder


def test_calibration_on_a_builder_thread_feeds_every_image(const_model, cache, tmp_path):
    f = Fakes()
    f.trt.calibrate_on_thread = True  # no context is current there
    be = f.backend(cache, precision="int8", calibration_images=str(images(tmp_path / "c")))
    be.load(str(const_model), UINT8_FMT)
    assert f.names().count("memcpy_htod") == 3
    assert f.names().count("mem_alloc") == 1, "allocated once, under the context"
    assert f.cuda.context_depth() == 0


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


# -- item 5: stale INT8 scales -----------------------------------------------------------------------


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


# -- item 6: a blocking wait, not a spinning one ----------------------------------------------------


def test_infer_waits_on_a_blocking_sync_event(const_model, cache):
    f = Fakes()
    be = f.backend(cache)
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    mark = len(f.calls)
    be.infer(io)
    names = [n for n, _ in f.calls[mark:]]
    assert "Stream.synchronize" not in names
    (sync,) = [a for n, a in f.calls[mark:] if n == "Event.synchronize"]
    assert sync[0] == io.handle.stream.handle and sync[1] & f.cuda.event_flags.BLOCKING_SYNC
    assert f.cuda.pending_streams() == [] and be.timings(io)["device_compute_ms"] == 1.5


# -- item 7: DLA preprocessing without GPU fallback ---------------------------------------------------


def test_dla_preprocessing_without_gpu_fallback_is_not_attempted(tmp_path, cache):
    model = float_model(tmp_path, "f")
    for _start in (1, 2):
        f = Fakes(num_dla=2)
        be = f.backend(cache, preprocess="dla", gpu_fallback=False, dla_core=-1)
        be.load(model, FLOAT_FMT_SCALED)
        assert f.trt.build_failures == [], "a preprocessing build that cannot succeed was tried"
        assert be.describe()["preprocess"] == "cpu"
        assert [n for n in be.notes if "cannot run on the DLA" in n], be.notes


# -- item 9 ------------------------------------------------------------------------------------------


def test_one_logger_for_every_load(const_model, cache):
    f = Fakes()
    made: list[object] = []
    real = f.trt.Logger

    class Counting(real):
        def __init__(self, *a):
            made.append(self)
            super().__init__(*a)

    f.trt.Logger = Counting
    f.backend(cache).load(str(const_model), UINT8_FMT)
    f.backend(cache).load(str(const_model), UINT8_FMT)
    assert len(made) == 1


def test_a_refused_tensor_address_fails_the_frame(const_model, cache):
    f = Fakes()
    be = f.backend(cache)
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    be.context.set_tensor_address = lambda name, address: False
    with pytest.raises(BackendError, match="refused the address"):
        be.infer(io)


def test_a_refused_batch_shape_fails_the_frame(const_model, cache):
    f = Fakes()
    be = f.backend(cache, max_batch=4)
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate(3)
    io.handle.batch = 5  # outside the profile: the binding returns False
    with pytest.raises(BackendError, match="refused input shape"):
        be.infer(io)


def test_a_failing_optional_preprocessing_build_falls_back(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(FakeNetwork, "add_scale", lambda self, *a, **k: None)  # add_* returned None
    be = Fakes().backend(cache, preprocess="gpu")
    be.load(float_model(tmp_path, "f"), FLOAT_FMT_SCALED)
    assert be.describe()["preprocess"] == "cpu"
    assert any("AttributeError" in n for n in be.notes), be.notes


def test_the_device_key_has_the_board_and_the_sm_count(const_model, cache, tmp_path, monkeypatch):
    model = tmp_path / "dt-model"
    model.write_bytes(b"NVIDIA Jetson Orin Nano Developer Kit\x00")
    monkeypatch.setattr("edge_agent.pipelines.backends.trt_support.DEVICE_TREE_MODEL", str(model))
    nano = Fakes(sm_count=8).backend(cache)
    nano.load(str(const_model), UINT8_FMT)
    agx = Fakes(sm_count=16).backend(cache)
    agx.load(str(const_model), UINT8_FMT)
    assert "8 SMs NVIDIA Jetson Orin Nano Developer Kit" in nano._key.device
    assert nano._key.digest() != agx._key.digest()
