"""Review of #22 (fa119f9): calibration against a refused build, the preprocessing context,
the calibration dtype, what close() leaves behind, data-dependent first axes.

Each test failed before the fix it names, against the strict fakes.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from fakes import trt_kit
from fakes.fake_tensorrt import FakeTensorRT
from fakes.trt_kit import FLOAT_FMT_SCALED, SHAPE, UINT8_FMT, Fakes

from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.backends import trt_build
from edge_agent.pipelines.backends.base import BackendError

settings = partial(trt_kit.settings, precision="int8")
cache = trt_kit.cache
cuda = trt_kit.cuda


def float_model(tmp_path: Path, name: str, dtype=onnx.TensorProto.FLOAT) -> str:
    out = yolov8_output([(160, 160, 40, 40)], [0], [0.9], 4, 2100)
    d = tmp_path / name
    d.mkdir()
    return constant_detector(str(d / "model.onnx"), out, layout="NCHW", dtype=dtype)


def calibrator(trt, cuda, tmp_path, frames=4):
    batch = [np.zeros(SHAPE, np.uint8)] * frames
    nbytes = int(np.prod(SHAPE))
    return trt_build.make_calibrator(trt, cuda, lambda: iter(batch), tmp_path / "c.cache", nbytes)


# -- item 1: the builder's reason first; "no frames" only when frames were asked for ---------------


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


# -- item 2: a preprocessing context TensorRT could not create ------------------------------------


def test_no_preprocessing_context_falls_back_to_the_cpu(tmp_path, cache):
    f = Fakes()
    f.trt.context_fails = {"network"}  # the preprocessing network's engine
    be = f.backend(cache, preprocess="gpu")
    be.load(float_model(tmp_path, "f"), FLOAT_FMT_SCALED)
    assert be.describe()["preprocess"] == "cpu"
    assert be.host_format(FLOAT_FMT_SCALED) == FLOAT_FMT_SCALED
    assert any("execution context" in n for n in be.notes), be.notes
    io = be.allocate()
    assert list(io.inputs) == ["images"] and io.inputs["images"].dtype == np.float32
    be.infer(io)
    assert f.cuda.pending_streams() == []


# -- item 3: calibration writes the model input's own dtype -----------------------------------------


def test_calibration_feeds_an_fp16_model_fp16_bytes(tmp_path, cache):
    images = tmp_path / "calib"
    images.mkdir()
    for i in range(2):
        cv2.imwrite(str(images / f"{i}.png"), np.full((240, 320, 3), 40 * i, np.uint8))
    f = Fakes()
    be = f.backend(cache, precision="int8", preprocess="cpu", calibration_images=str(images))
    be.load(float_model(tmp_path, "half", onnx.TensorProto.FLOAT16), FLOAT_FMT_SCALED)  # manifest: float32
    copied = [a[1] for n, a in f.calls if n == "memcpy_htod"]
    assert copied == [1 * 3 * 320 * 320 * 2] * 2, "fp32 bytes for an fp16 input"


# -- item 4: close() leaves no stream or event behind in an IOSet --------------------------------------


@pytest.mark.parametrize("zero_copy", [True, False])
def test_close_drops_the_slots_stream_and_events(const_model, cache, zero_copy):
    f = Fakes()
    be = f.backend(cache, zero_copy=zero_copy)
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    be.infer(io)
    be.close()
    slot = io.handle
    assert slot.stream is None and slot.events == []
    assert slot.host == {} and slot.allocations == {} and slot.device == {}


# -- item 6: a data-dependent first axis ---------------------------------------------------------------


def test_a_data_dependent_first_output_axis_is_refused_by_name(tmp_path, cache):
    """NonMaxSuppression's [num_selected, 3]: axis 0 is not the input's batch."""
    path = float_model(tmp_path, "nms")
    proto = onnx.load(path)
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "num_selected"
    onnx.save(proto, path)
    be = Fakes().backend(cache, preprocess="cpu")
    with pytest.raises(BackendError, match=r"output 'output0' has a data-dependent shape \(-1, 8, 2100\)"):
        be.load(path, FLOAT_FMT_SCALED)
