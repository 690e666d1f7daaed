"""The TensorRT backend's device preprocessing (pipelines/backends/trt_preprocess.py): a
small engine on a DLA core (GPU fallback) that normalises uint8 frames into the model's own
input; every case where it is not possible, or fails, falls back to the CPU and says why."""

from __future__ import annotations

import numpy as np
import onnx
from fakes import trt_kit
from fakes.fake_tensorrt import FakeNetwork
from fakes.trt_kit import FLOAT_FMT_IMAGENET, FLOAT_FMT_SCALED, Fakes, float_detector

from edge_agent.models.manifest import InputFormat
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.backends.base import TensorSpec

cache = trt_kit.cache
float_model = trt_kit.float_model  # a float NCHW detector (an Ultralytics-like export)


def test_device_preprocessing_on_the_dla(float_model, cache):
    f = Fakes(num_dla=2)
    be = f.backend(cache, preprocess="dla")
    be.load(str(float_model), FLOAT_FMT_IMAGENET)
    assert f.trt.builds == 2, "the model and the preprocessing engine"
    assert len(list(cache.glob("preprocess-preprocess-*.engine"))) == 1
    assert f.trt.args_of("IBuilderConfig.DLA_core=") == [(0,)]
    runtime_cores = [a[1] for a in f.trt.args_of("Runtime.deserialize_cuda_engine")]
    assert runtime_cores == [-1, 0], "the runtime selects DLA core 0 for the preprocessing engine"
    host = be.host_format(FLOAT_FMT_IMAGENET)
    assert (host.layout, host.dtype, host.color, host.height, host.width) == (
        "NHWC",
        "uint8",
        "bgr",
        320,
        320,
    )
    assert be.inputs == [TensorSpec("frame", (1, 320, 320, 3), np.dtype(np.uint8))]
    assert be.describe()["preprocess"] == "device"
    assert any("DLA0" in n for n in be.notes), be.notes

    io = be.allocate()
    assert list(io.inputs) == ["frame"] and io.inputs["frame"].dtype == np.uint8
    mark = len(f.calls)
    be.infer(io)
    calls = f.since(mark)
    execs = [a for n, a in calls if n == "IExecutionContext.execute_async_v3"]
    assert [label for label, _ in execs] == ["network", "model.onnx"], "preprocessing first"
    assert execs[0][1] == execs[1][1] == io.handle.stream.handle, "on the slot's stream"
    addr = {(a[0], a[1]): a[2] for n, a in calls if n == "IExecutionContext.set_tensor_address"}
    assert addr[("network", "input")] == addr[("model.onnx", "images")] == io.handle.device["images"]
    assert addr[("network", "frame")] == io.inputs["frame"].base.address
    assert be.timings(io) == {"device_preprocess_ms": 0.25, "device_compute_ms": 1.5}
    assert f.cuda.pending_streams() == []


def test_device_preprocessing_falls_back_to_the_gpu_without_a_dla(float_model, cache):
    f = Fakes(num_dla=0)
    be = f.backend(cache, preprocess="dla")
    be.load(str(float_model), FLOAT_FMT_IMAGENET)
    assert be.pre_engine is not None
    assert any("preprocessing: DLA core 0" in n for n in be.notes), be.notes
    assert any("on GPU" in n for n in be.notes), be.notes


def test_cpu_preprocessing_builds_no_second_engine(float_model, cache):
    f = Fakes(num_dla=2)
    be = f.backend(cache, preprocess="cpu")
    be.load(str(float_model), FLOAT_FMT_IMAGENET)
    assert f.trt.builds == 1
    assert be.pre_engine is None and be.host_format(FLOAT_FMT_IMAGENET) == FLOAT_FMT_IMAGENET
    assert be.inputs == [TensorSpec("images", (1, 3, 320, 320), np.dtype(np.float32))]


def test_failed_preprocessing_build_falls_back_to_the_cpu(float_model, cache):
    f = Fakes(num_dla=2)
    be = f.backend(cache, preprocess="dla", gpu_fallback=False)  # the uint8 cast needs the GPU
    be.load(str(float_model), FLOAT_FMT_IMAGENET)
    assert be.pre_engine is None and be.host_format(FLOAT_FMT_IMAGENET) == FLOAT_FMT_IMAGENET
    assert any("preprocessing on the CPU" in n for n in be.notes), be.notes


def test_nhwc_float_model_gets_its_own_layout_from_device_preprocessing(tmp_path, cache):
    out = yolov8_output([(160, 160, 40, 40)], [0], [0.9], 4, 2100)
    model = constant_detector(str(tmp_path / "nhwc.onnx"), out, layout="NHWC", dtype=onnx.TensorProto.FLOAT)
    fmt = InputFormat(height=320, width=320, layout="NHWC", dtype="float32", color="rgb")
    f = Fakes(num_dla=2)
    be = f.backend(cache, preprocess="dla")
    be.load(model, fmt)
    # The device network writes NCHW, so an NHWC float model keeps the CPU path (and says so).
    assert be.pre_engine is None, "a device engine would feed NCHW data into an NHWC input"
    assert be.host_format(fmt) == fmt
    assert any("NHWC" in n for n in be.notes), be.notes


# -- the engine's output is the model's own input, type and shape ------------------------------


def test_preprocessing_writes_the_model_inputs_own_dtype(tmp_path, cache):
    """The manifest says float32, the model takes float16: fp32 written into an fp16 buffer."""
    f = Fakes()
    be = f.backend(cache, preprocess="gpu")
    be.load(float_detector(tmp_path, "half", onnx.TensorProto.FLOAT16), FLOAT_FMT_SCALED)
    io = be.allocate()
    be.infer(io)  # the strict fake checks the model-input buffer against what is written
    assert f.cuda.pending_streams() == []
    assert be.describe()["preprocess"] == "device"
    assert be.pre_engine.get_tensor_dtype("input") == f.trt.DataType.HALF


def test_preprocessing_refused_when_the_model_input_shape_differs(tmp_path, cache):
    f = Fakes()
    be = f.backend(cache, preprocess="gpu")
    be.load(float_detector(tmp_path, "small", height=256), FLOAT_FMT_SCALED)
    be.infer(be.allocate())
    assert be.describe()["preprocess"] == "cpu"
    assert any("(1, 3, 256, 256)" in n for n in be.notes), be.notes


# -- falling back to the CPU --------------------------------------------------------------------


def test_dla_preprocessing_without_gpu_fallback_is_not_attempted(tmp_path, cache):
    model = float_detector(tmp_path, "f")
    for _start in (1, 2):
        f = Fakes(num_dla=2)
        be = f.backend(cache, preprocess="dla", gpu_fallback=False, dla_core=-1)
        be.load(model, FLOAT_FMT_SCALED)
        assert f.trt.build_failures == [], "a preprocessing build that cannot succeed was tried"
        assert be.describe()["preprocess"] == "cpu"
        assert [n for n in be.notes if "cannot run on the DLA" in n], be.notes


def test_a_failing_optional_preprocessing_build_falls_back(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(FakeNetwork, "add_scale", lambda self, *a, **k: None)  # add_* returned None
    be = Fakes().backend(cache, preprocess="gpu")
    be.load(float_detector(tmp_path, "f"), FLOAT_FMT_SCALED)
    assert be.describe()["preprocess"] == "cpu"
    assert any("AttributeError" in n for n in be.notes), be.notes


def test_no_preprocessing_context_falls_back_to_the_cpu(tmp_path, cache):
    f = Fakes()
    f.trt.context_fails = {"network"}  # the preprocessing network's engine
    be = f.backend(cache, preprocess="gpu")
    be.load(float_detector(tmp_path, "f"), FLOAT_FMT_SCALED)
    assert be.describe()["preprocess"] == "cpu"
    assert be.host_format(FLOAT_FMT_SCALED) == FLOAT_FMT_SCALED
    assert any("execution context" in n for n in be.notes), be.notes
    io = be.allocate()
    assert list(io.inputs) == ["images"] and io.inputs["images"].dtype == np.float32
    be.infer(io)
    assert f.cuda.pending_streams() == []
