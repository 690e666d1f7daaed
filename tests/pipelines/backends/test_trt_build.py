"""Engine building against FakeTensorRT: settings, version checks, the recorded builder protocol."""

from __future__ import annotations

import io
import logging
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakeCudaDriver
from fakes.fake_tensorrt import MAGIC, FakeTensorRT
from fakes.trt_kit import SHAPE

from edge_agent.core.model_config import TensorRTConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import trt_build
from edge_agent.pipelines.backends.base import BackendError
from edge_agent.pipelines.backends.trt_build import settings_for
from edge_agent.pipelines.preprocess import Letterbox, Preprocessor

settings = partial(trt_kit.settings, workspace_bytes=256 << 20)


# -- settings_for ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg, num_dla, override, want, note",
    [
        (dict(), 0, None, dict(dla_core=-1, precision="fp16"), None),
        (dict(dla_core=0), 0, None, dict(dla_core=-1, precision="fp16"), "no DLA"),
        (dict(dla_core=1), 1, None, dict(dla_core=-1), "1 DLA cores"),
        (dict(dla_core=1), 2, None, dict(dla_core=1, precision="fp16"), None),
        (dict(dla_core=0, precision="fp32"), 2, None, dict(dla_core=0, precision="fp16"), "FP16 or INT8"),
        (dict(dla_core=0, precision="fp32"), 0, None, dict(dla_core=-1, precision="fp32"), "no DLA"),
        (dict(precision="fp32"), 2, None, dict(dla_core=-1, precision="fp32"), None),
        (dict(workspace_mib=256), 0, None, dict(workspace_bytes=256 * 1024 * 1024), None),
        (dict(dla_core=-1), 2, 1, dict(dla_core=1), None),
        (dict(dla_core=1), 2, -1, dict(dla_core=-1), None),
        (dict(optimization_level=5, gpu_fallback=False), 0, None, dict(optimization_level=5), None),
    ],
)
def test_settings_for(cfg, num_dla, override, want, note):
    s, notes = settings_for(TensorRTConfig(**cfg), "images", SHAPE, num_dla, dla_core=override)
    for k, v in want.items():
        assert getattr(s, k) == v, (k, s)
    assert (s.input_name, s.input_shape) == ("images", SHAPE)
    if note is None:
        assert notes == []
    else:
        assert any(note in n for n in notes), notes


def test_settings_for_no_dla_note_says_it_builds_for_the_gpu():
    _, notes = settings_for(TensorRTConfig(dla_core=0), "images", SHAPE, 0)
    assert len(notes) == 1 and "GPU" in notes[0] and "DLA core 0" in notes[0]


# -- check_version -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "version, precision, error",
    [
        ("9.2.0", "fp16", "too old"),
        ("8.6.1", "fp32", "too old"),
        ("10.0.1", "fp16", None),
        ("10.3.0.30", "int8", None),
        ("10.7.0", "fp32", None),
        ("11.0.0", "fp16", "TensorRT 11"),
        ("11.1", "int8", "TensorRT 11"),
        ("11.0.0", "fp32", None),
    ],
)
def test_check_version(version, precision, error):
    trt = FakeTensorRT(version=version)
    if error is None:
        trt_build.check_version(trt, precision)
    else:
        with pytest.raises(BackendError, match=error):
            trt_build.check_version(trt, precision)


def test_check_version_names_the_precision_for_tensorrt_11():
    with pytest.raises(BackendError, match="'int8'"):
        trt_build.check_version(FakeTensorRT(version="11.0.0"), "int8")


# -- apply_settings --------------------------------------------------------------------------


def parsed(trt: FakeTensorRT, onnx_path: Path):
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)
    assert trt.OnnxParser(network, None).parse_from_file(str(onnx_path))
    return builder, network, builder.create_builder_config()


def config_calls(trt: FakeTensorRT) -> list[tuple]:
    return [(n, a) for n, a in trt.calls if n.startswith(("IBuilderConfig", "IOptimizationProfile"))]


def test_apply_settings_fp16_gpu(const_model):
    trt = FakeTensorRT()
    builder, network, config = parsed(trt, const_model)
    off = trt_build.apply_settings(trt, builder, network, config, settings(workspace_bytes=64 << 20))
    calls = config_calls(trt)
    assert ("IBuilderConfig.set_memory_pool_limit", (trt.MemoryPoolType.WORKSPACE, 64 << 20)) in calls
    assert ("IBuilderConfig.builder_optimization_level=", (3,)) in calls
    assert ("IBuilderConfig.profiling_verbosity=", (trt.ProfilingVerbosity.DETAILED,)) in calls
    assert trt.args_of("IBuilderConfig.set_flag") == [(trt.BuilderFlag.FP16,)]
    assert not trt.args_of("IBuilderConfig.default_device_type=")
    assert not trt.args_of("IBuilderConfig.can_run_on_DLA"), "GPU builds do not ask about the DLA"
    assert off == []


@pytest.mark.parametrize(
    "precision, flags",
    [("fp32", []), ("fp16", ["FP16"]), ("int8", ["FP16", "INT8"])],
)
def test_apply_settings_precision_flags(const_model, precision, flags):
    trt = FakeTensorRT()
    builder, network, config = parsed(trt, const_model)
    trt_build.apply_settings(trt, builder, network, config, settings(precision=precision))
    assert [a[0].name for a in trt.args_of("IBuilderConfig.set_flag")] == flags


@pytest.mark.parametrize("fallback", [True, False])
def test_apply_settings_dla(const_model, fallback):
    trt = FakeTensorRT(num_dla_cores=2)
    builder, network, config = parsed(trt, const_model)
    s = settings(dla_core=1, gpu_fallback=fallback)
    off = trt_build.apply_settings(trt, builder, network, config, s)
    assert trt.args_of("IBuilderConfig.default_device_type=") == [(trt.DeviceType.DLA,)]
    assert trt.args_of("IBuilderConfig.DLA_core=") == [(1,)]
    flags = [a[0] for a in trt.args_of("IBuilderConfig.set_flag")]
    assert (trt.BuilderFlag.GPU_FALLBACK in flags) == fallback
    assert len(trt.args_of("IBuilderConfig.can_run_on_DLA")) == network.num_layers
    assert off == ["Cast_0", "Shape_5"], "the layers the DLA cannot run, by name"


def test_apply_settings_profile_for_a_dynamic_batch(const_model):
    trt = FakeTensorRT()
    builder, network, config = parsed(trt, const_model)
    assert tuple(network.get_input(0).shape) == (-1, 320, 320, 3), "the fake parser keeps -1"
    trt_build.apply_settings(trt, builder, network, config, settings())
    assert trt.args_of("IOptimizationProfile.set_shape") == [("images", SHAPE, SHAPE, SHAPE)]
    assert trt.args_of("IBuilderConfig.add_optimization_profile") == [({"images": (SHAPE, SHAPE, SHAPE)},)]
    order = [n for n, _ in config_calls(trt)]
    set_shape = order.index("IOptimizationProfile.set_shape")
    assert set_shape < order.index("IBuilderConfig.add_optimization_profile")


def test_apply_settings_no_profile_for_static_inputs(tmp_path):
    trt = FakeTensorRT()
    builder = trt.Builder(None)
    network = builder.create_network(0)
    network.mark_output(network.add_input("x", trt.DataType.FLOAT, (1, 3, 8, 8)))
    trt_build.apply_settings(trt, builder, network, builder.create_builder_config(), settings())
    assert not trt.args_of("IBuilderConfig.add_optimization_profile")


# -- build_engine ----------------------------------------------------------------------------


def test_build_engine(const_model, tmp_path):
    trt = FakeTensorRT()
    model = str(const_model)
    plan, off = trt_build.build_engine(trt, None, model, settings(), tmp_path / "t.cache", progress=False)
    assert plan.startswith(MAGIC) and isinstance(plan, bytes)
    assert off == []
    assert trt.args_of("Builder.create_network") == [(0,)], "explicit batch: flags 0 in TensorRT 10"
    assert trt.args_of("OnnxParser.parse_from_file") == [(str(const_model),)]
    names = trt.names()
    assert names.index("OnnxParser.parse_from_file") < names.index("Builder.build_serialized_network")
    assert names.index("IBuilderConfig.set_timing_cache") < names.index("Builder.build_serialized_network")
    engine = trt.Runtime(None).deserialize_cuda_engine(plan)
    assert [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)] == ["images", "output0"]


def test_build_engine_parse_failure_names_the_file(const_model, tmp_path):
    trt = FakeTensorRT()
    trt.parse_error = "Unsupported ONNX op: NonMaxSuppression"
    with pytest.raises(BackendError) as e:
        trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t.cache", progress=False)
    assert str(const_model) in str(e.value) and "NonMaxSuppression" in str(e.value)
    assert "Builder.build_serialized_network" not in trt.names()


def test_build_engine_of_a_file_that_is_not_onnx(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"not a model")
    with pytest.raises(BackendError, match="cannot parse"):
        trt_build.build_engine(FakeTensorRT(), None, str(bad), settings(), tmp_path / "t", progress=False)


def test_build_engine_builder_failure(const_model, tmp_path):
    trt = FakeTensorRT()
    trt.build_fails = True
    with pytest.raises(BackendError, match="could not build"):
        trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t.cache", progress=False)
    assert not (tmp_path / "t.cache").exists(), "no timing cache from a failed build"


def test_build_engine_refuses_tensorrt_11_fp16_before_building(const_model, tmp_path):
    trt = FakeTensorRT(version="11.0.0")
    with pytest.raises(BackendError, match="TensorRT 11"):
        trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t.cache", progress=False)
    assert trt.calls == []


def test_build_engine_int8_without_calibrator(const_model, tmp_path):
    with pytest.raises(BackendError, match="calibration"):
        trt_build.build_engine(
            FakeTensorRT(), None, str(const_model), settings(precision="int8"), tmp_path / "t", progress=False
        )


def test_timing_cache_is_written_atomically_and_read_back(const_model, tmp_path, monkeypatch):
    trt = FakeTensorRT()
    cache = tmp_path / "timing.cache"
    written: list[Path] = []
    real = trt_build.atomic_write
    monkeypatch.setattr(trt_build, "atomic_write", lambda p, d: (written.append(Path(p)), real(p, d)))
    trt_build.build_engine(trt, None, str(const_model), settings(), cache, progress=False)
    assert written == [cache]
    first = cache.read_bytes()
    assert first == b"FAKE-TIMING-CACHE+"
    trt_build.build_engine(trt, None, str(const_model), settings(), cache, progress=False)
    assert trt.args_of("IBuilderConfig.create_timing_cache") == [(b"",), (first,)]
    assert trt.args_of("IBuilderConfig.set_timing_cache")[1] == (first, False)
    assert cache.read_bytes() == first + b"+", "the second build's timings are saved"


def test_dla_build_logs_the_layers_left_on_the_gpu(const_model, tmp_path, caplog):
    trt = FakeTensorRT(num_dla_cores=1)
    with caplog.at_level(logging.WARNING, logger=trt_build.__name__):
        _, off = trt_build.build_engine(
            trt, None, str(const_model), settings(dla_core=0), tmp_path / "t", progress=False
        )
    assert off == ["Cast_0", "Shape_5"]
    assert "cannot run on DLA0" in caplog.text and "Cast_0" in caplog.text


def test_build_engine_with_progress_monitor(const_model, tmp_path, monkeypatch):
    trt = FakeTensorRT()
    out = io.StringIO()
    # The default stream is bound when the module is imported, so swap the default itself.
    monkeypatch.setattr(trt_build.make_progress_monitor, "__defaults__", (out,))
    trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t")
    (monitor,) = trt.args_of("IBuilderConfig.progress_monitor=")
    assert isinstance(monitor[0], trt.IProgressMonitor)
    assert "Building engine (10 steps)" in out.getvalue()
    assert "Building engine: 10/10" in out.getvalue()


# -- the preprocessing engine -----------------------------------------------------------------

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)


def fmt_for(color: str, dtype: str = "float32") -> InputFormat:
    return InputFormat(height=16, width=24, layout="NCHW", dtype=dtype, color=color, mean=MEAN, std=STD)


def run_recorded_network(trt: FakeTensorRT, frame: np.ndarray) -> np.ndarray:
    """Apply the recorded preprocessing layers to ``frame`` (H, W, 3) with numpy."""
    x = frame[None]
    for name, args in trt.calls:
        if name == "INetworkDefinition.add_cast":
            x = x.astype(np.float32)
        elif name == "IShuffleLayer.first_transpose=":
            x = x.transpose(args[0])
        elif name == "INetworkDefinition.add_constant":
            indices = args[1]
        elif name == "INetworkDefinition.add_gather":
            x = np.take(x, indices, axis=args[2])
        elif name == "INetworkDefinition.add_scale":
            _, mode, shift, scale, power = args
            assert mode == trt.ScaleMode.CHANNEL and power is None
            x = x * scale[None, :, None, None] + shift[None, :, None, None]  # CHANNEL: axis -3
    return x


@pytest.mark.parametrize("color, gather", [("rgb", True), ("bgr", False)])
def test_preprocess_engine_layers(tmp_path, color, gather):
    trt = FakeTensorRT()
    fmt = fmt_for(color)
    s = settings(input_name="frame", input_shape=(1, 16, 24, 3))
    plan, _ = trt_build.build_preprocess_engine(trt, None, fmt, s, tmp_path / "t")
    layers = [n.split(".")[1] for n in trt.names() if n.startswith("INetworkDefinition.add_")]
    want = ["add_input", "add_cast", "add_shuffle"]
    want += ["add_constant", "add_gather"] if gather else []
    assert layers == [*want, "add_scale"]
    assert trt.args_of("INetworkDefinition.add_input") == [("frame", trt.DataType.UINT8, (1, 16, 24, 3))]
    assert trt.args_of("INetworkDefinition.add_cast")[0][1] == trt.DataType.HALF
    if gather:
        ((shape, indices),) = trt.args_of("INetworkDefinition.add_constant")
        assert shape == (3,) and indices.tolist() == [2, 1, 0]
        assert trt.args_of("INetworkDefinition.add_gather")[0][2] == 1, "gather on the channel axis"
    _, mode, shift, scale, power = trt.args_of("INetworkDefinition.add_scale")[0]
    assert mode == trt.ScaleMode.CHANNEL and power is None
    np.testing.assert_allclose(scale, (1 / 255) / np.array(STD), rtol=1e-6)
    np.testing.assert_allclose(shift, -np.array(MEAN) / np.array(STD), rtol=1e-6)
    engine = trt.Runtime(None).deserialize_cuda_engine(plan)
    assert engine.get_tensor_shape("input") == (1, 3, 16, 24)
    assert engine.get_tensor_dtype("input") == trt.DataType.FLOAT
    assert engine.get_tensor_mode("frame") == trt.TensorIOMode.INPUT


@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_preprocess_engine_protocol_order(tmp_path, color):
    trt = FakeTensorRT()
    s = settings(input_name="frame", input_shape=(1, 16, 24, 3))
    trt_build.build_preprocess_engine(trt, None, fmt_for(color), s, tmp_path / "t")
    steps = [
        n
        for n in trt.names()
        if n.startswith(("INetworkDefinition.add_", "IShuffleLayer", "INetworkDefinition.mark_output"))
    ]
    gather = ["INetworkDefinition.add_constant", "INetworkDefinition.add_gather"] if color == "rgb" else []
    assert steps == [
        "INetworkDefinition.add_input",
        "INetworkDefinition.add_cast",  # uint8 cannot be shuffled: cast first
        "INetworkDefinition.add_shuffle",
        "IShuffleLayer.first_transpose=",
        *gather,
        "INetworkDefinition.add_scale",
        "INetworkDefinition.mark_output",
    ]
    assert trt.args_of("IShuffleLayer.first_transpose=") == [((0, 3, 1, 2),)]
    assert trt.args_of("INetworkDefinition.mark_output") == [("input",)]
    assert trt.args_of("IBuilderConfig.set_flag") == [(trt.BuilderFlag.FP16,)]


@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_preprocess_engine_matches_the_cpu_preprocessor(tmp_path, color):
    trt = FakeTensorRT()
    fmt = fmt_for(color)
    trt_build.build_preprocess_engine(
        trt, None, fmt, settings(input_name="frame", input_shape=(1, 16, 24, 3)), tmp_path / "t"
    )
    frame = np.random.default_rng(1).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    want = np.zeros((1, 3, 16, 24), np.float32)
    Preprocessor(fmt)(frame, want, Letterbox())
    np.testing.assert_allclose(run_recorded_network(trt, frame), want, rtol=1e-5, atol=1e-5)


def test_preprocess_engine_fp16_output(tmp_path):
    trt = FakeTensorRT()
    s = settings(input_name="frame", input_shape=(1, 16, 24, 3))
    plan, _ = trt_build.build_preprocess_engine(trt, None, fmt_for("rgb", "float16"), s, tmp_path / "t")
    assert trt.Runtime(None).deserialize_cuda_engine(plan).get_tensor_dtype("input") == trt.DataType.HALF


# -- progress monitor and calibrator -----------------------------------------------------------


def test_progress_monitor_prints_phases():
    trt = FakeTensorRT()
    out = io.StringIO()
    mon = trt_build.make_progress_monitor(trt, out)
    assert isinstance(mon, trt.IProgressMonitor) and mon._fake_initialised
    mon.phase_start("Building engine", None, 20)
    mon.phase_start("Tactics", "Building engine", 3)
    assert all(mon.step_complete("Building engine", i) is True for i in range(20))
    assert mon.step_complete("Tactics", 0) is True
    mon.phase_finish("Tactics")
    mon.phase_finish("Building engine")
    text = out.getvalue()
    assert "Building engine (20 steps)" in text
    assert "  Tactics (3 steps)" in text, "a sub-phase is indented"
    assert "Building engine: 20/20" in text and "Building engine: 2/20" in text
    assert "Tactics: 1/3" not in text, "phases under 10 steps print no steps"


def test_calibrator_feeds_batches_and_keeps_its_cache(tmp_path):
    trt = FakeTensorRT()
    cuda = FakeCudaDriver()
    cuda.init()
    ctx = cuda.Device(0).retain_primary_context()
    ctx.push()
    batches = [np.full((1, 3, 4, 4), i, np.float32) for i in range(3)]
    cache = tmp_path / "calib.cache"
    calib = trt_build.make_calibrator(trt, cuda, lambda: iter(batches), cache, batches[0].nbytes)
    assert isinstance(calib, trt.IInt8EntropyCalibrator2) and calib._fake_initialised
    assert calib.get_batch_size() == 1
    assert calib.read_calibration_cache() is None
    ptrs = [calib.get_batch(["input"]) for _ in range(3)]
    assert calib.get_batch(["input"]) is None, "None at the end of the batches"
    assert all(len(p) == 1 and isinstance(p[0], int) and cuda.is_device_address(p[0]) for p in ptrs)
    assert len(cuda.calls and [c for c in cuda.calls if c[0] == "mem_alloc"]) == 1, "one device buffer"
    assert [c[1][1] for c in cuda.calls if c[0] == "memcpy_htod"] == [batches[0].nbytes] * 3
    assert calib.count == 3
    calib.write_calibration_cache(memoryview(b"calibration table"))
    assert cache.read_bytes() == b"calibration table"
    assert trt_build.make_calibrator(trt, cuda, lambda: iter(()), cache, 4).read_calibration_cache() == (
        b"calibration table"
    )
    ctx.pop()


def test_int8_build_runs_the_calibrator(const_model, tmp_path):
    trt = FakeTensorRT()
    cuda = FakeCudaDriver()
    cuda.init()
    cuda.Device(0).retain_primary_context().push()
    cache = tmp_path / "calib.cache"
    frames = [np.zeros(SHAPE, np.uint8)] * 4
    calib = trt_build.make_calibrator(trt, cuda, lambda: iter(frames), cache, frames[0].nbytes)
    trt_build.build_engine(
        trt, None, str(const_model), settings(precision="int8"), tmp_path / "t", calib, progress=False
    )
    assert trt.args_of("IBuilderConfig.int8_calibrator=") == [(calib,)]
    assert calib.count == 4 and cache.read_bytes() == b"FAKE-CALIBRATION-CACHE"


@pytest.mark.parametrize("stale", [b"garbage, not a timing cache", b"FAKE-TIMING-CACHE OTHER-DEVICE"])
def test_an_unusable_timing_cache_is_replaced(const_model, tmp_path, caplog, stale):
    trt = FakeTensorRT()
    cache = tmp_path / "timing.cache"
    cache.write_bytes(stale)
    with caplog.at_level(logging.WARNING, logger=trt_build.__name__):
        trt_build.build_engine(trt, None, str(const_model), settings(), cache, progress=False)
    assert "not usable here" in caplog.text
    assert trt.args_of("IBuilderConfig.create_timing_cache") == [(stale,), (b"",)]
    assert [a[1] for a in trt.args_of("IBuilderConfig.set_timing_cache")][-1] is False
    assert cache.read_bytes() == b"FAKE-TIMING-CACHE+", "a fresh cache replaces the stale one"


@pytest.mark.parametrize("precision, calibration", [("int8", True), ("fp16", False)])
def test_int8_dynamic_input_gets_a_calibration_profile(const_model, precision, calibration):
    trt = FakeTensorRT()
    builder, network, config = parsed(trt, const_model)
    trt_build.apply_settings(trt, builder, network, config, settings(precision=precision))
    want = [({"images": (SHAPE, SHAPE, SHAPE)},)] if calibration else []
    assert trt.args_of("IBuilderConfig.set_calibration_profile") == want
