"""TensorRTBackend on FakeTensorRT + FakeCudaDriver with real ONNX models: caching, buffers,
the per-frame protocol, device preprocessing, and backend selection."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakePagelockedHostAllocation
from fakes.trt_kit import FLOAT_FMT_IMAGENET, UINT8_FMT, Fakes, loaded

from edge_agent.core.config import AutoBackendConfig, TensorRTConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.backends import engine_cache, registry
from edge_agent.pipelines.backends import tensorrt as trt_backend
from edge_agent.pipelines.backends.base import TensorSpec
from edge_agent.pipelines.backends.onnxruntime import OnnxRuntimeBackend
from edge_agent.pipelines.backends.tensorrt import TensorRTBackend

cache = trt_kit.cache
float_model = trt_kit.float_model  # a float NCHW detector (an Ultralytics-like export)


# -- loading and the engine cache -------------------------------------------------------------


def test_load_builds_once_and_stores_the_engine(const_model, cache):
    _be, f = loaded(const_model, cache)
    assert f.trt.builds == 1
    engines = sorted(p.name for p in cache.glob("*.engine"))
    assert len(engines) == 1 and engines[0].startswith(f"{const_model.parent.name}-model-")
    assert Path(cache / engines[0]).with_suffix(".json").exists(), "the sidecar"
    assert f.cuda.context_depth() == 0, "push/pop balance after load"


def test_second_backend_loads_from_the_cache_without_building(const_model, cache):
    loaded(const_model, cache)
    be, f = loaded(const_model, cache)
    assert "Builder.build_serialized_network" not in f.names(), "a cached engine was rebuilt"
    assert "Runtime.deserialize_cuda_engine" in f.names()
    assert [s.name for s in be.outputs] == ["output0"]


def test_corrupt_cached_engine_is_rebuilt_with_a_reason(const_model, cache, caplog):
    loaded(const_model, cache)
    (engine,) = cache.glob("*.engine")
    data = bytearray(engine.read_bytes())
    data[-5] ^= 0xFF
    engine.write_bytes(bytes(data))
    with caplog.at_level(logging.INFO):
        be, f = loaded(const_model, cache)
    assert f.trt.builds == 1
    assert "checksum mismatch" in caplog.text
    assert be.engine is not None


def test_engine_that_does_not_deserialize_is_discarded_and_rebuilt(const_model, cache, caplog):
    be, _ = loaded(const_model, cache)
    stem = const_model.parent.name
    engine_cache.EngineCache(cache).store(stem, be._key, b"intact on disk, refused by TensorRT")
    with caplog.at_level(logging.WARNING):
        _be2, f = loaded(const_model, cache)
    assert f.trt.builds == 1
    assert "could not deserialize" in caplog.text
    assert f.names().count("Runtime.deserialize_cuda_engine") == 2


@pytest.mark.parametrize(
    "change",
    [dict(cfg=dict(precision="fp32")), dict(version="10.7.0"), dict(cfg=dict(workspace_mib=256))],
    ids=["precision", "tensorrt-version", "workspace"],
)
def test_a_key_change_rebuilds(const_model, cache, change):
    loaded(const_model, cache)
    f = Fakes(version=change.get("version", "10.3.0"))
    _be, f = loaded(const_model, cache, f, **change.get("cfg", {}))
    assert f.trt.builds == 1, "the changed key must miss the cache"
    assert len(list(cache.glob("*.engine"))) == 2


def test_io_specs_match_the_onnx(const_model, cache):
    be, f = loaded(const_model, cache)
    assert be.inputs == [TensorSpec("images", (1, 320, 320, 3), np.dtype(np.uint8))]
    assert be.outputs == [TensorSpec("output0", (1, 8, 2100), np.dtype(np.float32))]
    assert f.trt.args_of("IExecutionContext.set_input_shape") == [
        ("model.onnx", "images", (1, 320, 320, 3))
    ], "the dynamic batch is set before output shapes are read"
    assert be.host_format(UINT8_FMT) == UINT8_FMT


# -- buffers and the per-frame protocol ------------------------------------------------------


def test_zero_copy_slots_are_mapped_and_need_no_copies(const_model, cache):
    be, f = loaded(const_model, cache)
    a, b = be.allocate(), be.allocate()
    assert a.handle.stream.handle != b.handle.stream.handle, "one stream per slot"
    for io in (a, b):
        arrays = [io.inputs["images"], *io.outputs]
        assert [x.shape for x in arrays] == [(1, 320, 320, 3), (1, 8, 2100)]
        for x in arrays:
            assert isinstance(x.base, FakePagelockedHostAllocation)
            assert x.base.get_flags() & f.cuda.host_alloc_flags.DEVICEMAP, "mapped memory"
    assert not np.shares_memory(a.outputs[0], b.outputs[0])
    mark = len(f.calls)
    be.upload(a)
    be.infer(a)
    names = [n for n, _ in f.since(mark)]
    assert not [n for n in names if n.startswith("memcpy")], names
    addresses = dict(args[1:] for args in f.trt.args_of("IExecutionContext.set_tensor_address")[-2:])
    # Unified addressing: the mapped buffers' device pointers are their host addresses.
    assert addresses == {"images": a.inputs["images"].base.address, "output0": a.outputs[0].base.address}


def test_copy_mode_uploads_on_the_slot_stream_then_copies_back_before_sync(const_model, cache):
    be, f = loaded(const_model, cache, zero_copy=False)
    a, b = be.allocate(), be.allocate()
    sa = a.handle.stream.handle
    mark = len(f.calls)
    be.upload(a)
    assert [(n, args[1]) for n, args in f.since(mark) if n.startswith("memcpy")] == [
        ("memcpy_htod_async", sa)
    ]
    mark = len(f.calls)
    be.infer(a)
    protocol = [
        n
        for n, _ in f.since(mark)
        if n in ("memcpy_htod_async", "IExecutionContext.execute_async_v3", "memcpy_dtoh_async")
        or n == "Event.synchronize"
    ]
    assert protocol == ["IExecutionContext.execute_async_v3", "memcpy_dtoh_async", "Event.synchronize"]
    assert all(
        args[-1] == sa for n, args in f.since(mark) if n.startswith(("memcpy", "IExecutionContext.exe"))
    )
    # Without an upload first, infer copies the input itself.
    mark = len(f.calls)
    be.infer(b)
    names = [n for n, _ in f.since(mark)]
    assert names.index("memcpy_htod_async") < names.index("IExecutionContext.execute_async_v3")


def test_infer_sets_every_address_and_waits_for_the_stream(const_model, cache):
    be, f = loaded(const_model, cache)
    io = be.allocate()
    mark = len(f.calls)
    be.infer(io)
    names = [n for n, _ in f.since(mark)]
    execute = names.index("IExecutionContext.execute_async_v3")
    assert names[:execute].count("IExecutionContext.set_tensor_address") == 2
    assert names.index("Event.synchronize") > execute
    assert f.cuda.pending_streams() == [], "work left in flight when the host reads outputs"
    assert f.cuda.context_depth() == 0


def test_infer_from_another_thread_makes_the_context_current(const_model, cache):
    be, f = loaded(const_model, cache)
    io = be.allocate()
    errors: list[BaseException] = []

    def run():
        try:
            be.infer(io)
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert errors == []
    assert f.cuda.pending_streams() == []


def test_the_fakes_catch_a_missing_address(const_model, cache):
    """The enforcement the other tests rely on: an unset output address fails the enqueue."""
    be, _f = loaded(const_model, cache)
    io = be.allocate()
    be._outputs = []  # the backend forgets to bind the output
    with pytest.raises(AssertionError, match="no address set for \\['output0'\\]"):
        be.infer(io)


def test_timings_are_the_two_event_figures(const_model, cache):
    be, _ = loaded(const_model, cache)
    io = be.allocate()
    assert be.timings(io) == {}
    be.infer(io)
    assert be.timings(io) == {"device_preprocess_ms": 0.0, "device_compute_ms": 1.5}


def test_describe_and_notes_report_the_gpu_fallback(const_model, cache):
    be, _ = loaded(const_model, cache, dla_core=0)
    assert any("no DLA" in n and "GPU" in n for n in be.notes), be.notes
    d = be.describe()
    assert d["backend"] == "tensorrt" and d["tensorrt"] == "10.3.0"
    assert d["notes"] == be.notes and d["preprocess"] == "cpu" and d["zero_copy"] is True
    assert " GPU " in d["engine"] and "fp16" in d["engine"]
    assert d["device"].startswith("Orin (fake) sm_87")


@pytest.mark.parametrize("zero_copy", [True, False])
def test_close_frees_buffers_and_detaches_the_context(const_model, cache, zero_copy):
    be, f = loaded(const_model, cache, zero_copy=zero_copy)
    be.allocate()
    be.close()
    names = f.names()
    assert names[-1] == "Context.detach"
    assert names.count("PagelockedHostAllocation.free") == 2
    assert names.count("DeviceAllocation.free") == (0 if zero_copy else 2)
    assert be.engine is None and be.context is None
    assert f.cuda.context_depth() == 0
    be.close()  # twice: nothing more
    assert f.names().count("Context.detach") == 1


# -- device preprocessing ----------------------------------------------------------------------


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


# -- int8 calibration ---------------------------------------------------------------------------


@pytest.fixture
def calibration_images(tmp_path) -> Path:
    d = tmp_path / "calib"
    d.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(str(d / f"{i}.png"), rng.integers(0, 256, (240, 320, 3), dtype=np.uint8))
    return d


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


# -- backend selection --------------------------------------------------------------------------


def test_select_auto_picks_tensorrt_when_the_probe_says_so(caplog):
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        be = registry.select_auto(AutoBackendConfig(), probe=lambda: "")
    assert isinstance(be, TensorRTBackend)
    assert "TensorRT" in caplog.text


def test_select_auto_falls_back_to_onnxruntime_with_the_reason(caplog):
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        be = registry.select_auto(AutoBackendConfig(), probe=lambda: "CUDA reports no GPU")
    assert isinstance(be, OnnxRuntimeBackend)
    assert "ONNX Runtime, because CUDA reports no GPU" in caplog.text


def test_select_auto_tensorrt_backend_runs_on_injected_fakes(const_model, cache, monkeypatch):
    f = Fakes()
    monkeypatch.setitem(
        registry._REGISTRY, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=(f.trt, f.cuda))
    )
    cfg = AutoBackendConfig(tensorrt=TensorRTConfig(cache_dir=str(cache)))
    be = registry.select_auto(cfg, probe=lambda: "")
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    be.infer(io)
    assert f.trt.builds == 1 and be.timings(io)["device_compute_ms"] == 1.5


def test_tensorrt_unavailable_here():
    reason = registry.tensorrt_unavailable()
    assert "tensorrt module is not installed" in reason


def test_import_tensorrt_says_where_to_get_it():
    with pytest.raises(trt_backend.BackendError, match="JetPack"):
        trt_backend.import_tensorrt()
