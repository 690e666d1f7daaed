"""TensorRT backend: engines for batches of several sources (a GPU engine's batch profile,
a DLA engine's fixed batch, padding, the engine key of a batch range)."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import onnx
from fakes import trt_kit
from fakes.trt_kit import FLOAT_FMT_IMAGENET, Fakes, loaded

from edge_agent.core.model_config import AutoBackendConfig, TensorRTConfig
from edge_agent.models.testmodels import constant_detector, yolov8_output

cache = trt_kit.cache
float_model = trt_kit.float_model  # a float NCHW detector (an Ultralytics-like export)


# -- batches of several sources -------------------------------------------------------------


def test_gpu_engine_for_several_sources_runs_any_batch_up_to_its_largest(const_model, cache):
    be, f = loaded(const_model, cache, max_batch=4)
    (profile,) = f.trt.args_of("IBuilderConfig.add_optimization_profile")
    assert list(profile[0]["images"]) == [(1, 320, 320, 3), (4, 320, 320, 3), (4, 320, 320, 3)]
    assert be.batch_axis() == (4, False)
    assert be._key is not None and be._key.input_shape == (4, 320, 320, 3)
    one, three = be.allocate(), be.allocate(3)
    assert one.inputs["images"].shape == (1, 320, 320, 3) and one.outputs[0].shape == (1, 8, 2100)
    assert three.inputs["images"].shape == (3, 320, 320, 3) and three.outputs[0].shape == (3, 8, 2100)
    mark = len(f.calls)
    be.infer(three)
    be.infer(one)
    shapes = [a[2] for n, a in f.since(mark) if n == "IExecutionContext.set_input_shape"]
    assert shapes == [(3, 320, 320, 3), (1, 320, 320, 3)], "each enqueue sets its own batch size"
    assert f.cuda.context_depth() == 0


def test_dla_engine_for_several_sources_has_one_batch_and_pads(const_model, cache):
    f = Fakes(num_dla=2)
    be, f = loaded(const_model, cache, f, max_batch=4, dla_core=0)
    (profile,) = f.trt.args_of("IBuilderConfig.add_optimization_profile")
    assert list(profile[0]["images"]) == [(4, 320, 320, 3)] * 3, "the DLA takes fixed shapes"
    assert be.batch_axis() == (4, True)
    assert any("padded" in n for n in be.notes), be.notes
    assert be.allocate(2).inputs["images"].shape == (4, 320, 320, 3)
    mark = len(f.calls)
    be.infer(be.allocate())
    assert "IExecutionContext.set_input_shape" not in [n for n, _ in f.since(mark)]


def test_batch_stays_one_where_batching_is_not_supported(const_model, float_model, cache, tmp_path):
    calib = tmp_path / "calib"
    calib.mkdir()
    cv2.imwrite(str(calib / "a.png"), np.zeros((64, 64, 3), np.uint8))
    be, _ = loaded(const_model, cache, max_batch=4, precision="int8", calibration_images=str(calib))
    assert be.batch_axis() == (1, True) and any("int8" in n for n in be.notes), be.notes
    f = Fakes()
    be = f.backend(cache, max_batch=4, preprocess="gpu")
    be.load(str(float_model), FLOAT_FMT_IMAGENET)
    assert be.batch_axis() == (1, True) and any("preprocessing engine" in n for n in be.notes), be.notes


def test_agent_resolves_each_engine_batch_to_the_sources_that_run_it():
    from edge_agent.core.config import AgentConfig
    from edge_agent.core.deadline_config import BatchingConfig, DeadlineConfig, LadderStep
    from edge_agent.core.plan import model_batches, with_batch
    from edge_agent.core.source_config import SyntheticSourceConfig

    shared = tuple(SyntheticSourceConfig(name=f"c{i}") for i in range(3))
    own = SyntheticSourceConfig(name="dock", model="dock.onnx")
    ladder = DeadlineConfig(ladder=(LadderStep(), LadderStep(name="light", model="light.onnx")))
    cfg = AgentConfig(sources=(*shared, own), deadline=ladder)
    assert model_batches(cfg) == {"": 3, "light.onnx": 3, "dock.onnx": 1}
    assert model_batches(replace(cfg, batching=BatchingConfig(max_batch=2)))[""] == 2
    assert model_batches(AgentConfig()) == {"": 1}
    assert isinstance(cfg.backend, AutoBackendConfig)
    assert with_batch(cfg.backend, 3).tensorrt.max_batch == 3
    assert with_batch(TensorRTConfig(max_batch=2), 3).max_batch == 2, "an explicit size stays"


def test_a_fixed_batch_float_model_keeps_cpu_preprocessing_and_runs_its_batch(tmp_path, cache):
    """#22 item 1: the one-frame preprocessing engine in front of a fixed batch of 4 sized the
    outputs for one frame while the model wrote four (the strict fake's size check)."""
    out = yolov8_output([(160, 160, 40, 40)], [0], [0.9], 4, 2100)
    d = tmp_path / "fixed4"
    d.mkdir()
    model = constant_detector(
        str(d / "model.onnx"), out, layout="NCHW", dtype=onnx.TensorProto.FLOAT, batch=4
    )
    f = Fakes()
    be = f.backend(cache, preprocess="gpu")
    be.load(str(model), FLOAT_FMT_IMAGENET)
    assert be.describe()["preprocess"] == "cpu"
    assert any("fixed batch of 4" in n for n in be.notes), be.notes
    assert be.batch_axis() == (4, True)
    io = be.allocate(1)
    assert io.inputs["images"].shape == (4, 3, 320, 320) and io.outputs[0].shape == (4, 8, 2100)
    be.infer(io)  # every buffer holds what the engine writes
    assert f.cuda.pending_streams() == []


def test_an_engine_for_a_batch_range_has_its_own_cache_key(const_model, cache):
    one, _ = loaded(const_model, cache)
    gpu, _ = loaded(const_model, cache, max_batch=4)
    dla, _ = loaded(const_model, cache, Fakes(num_dla=2), max_batch=4, dla_core=0)
    keys = {be._key.digest() for be in (one, gpu, dla)}
    assert len(keys) == 3
    assert gpu._key.min_batch == 1 and dla._key.min_batch == 0
    assert "1..4x320x320x3" in gpu._key.describe()
