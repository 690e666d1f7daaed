"""TensorRTBackend on FakeTensorRT + FakeCudaDriver with real ONNX models: loading (the
engine cache, the device key, one logger), buffers and the per-frame protocol, close.

Device preprocessing, INT8 calibration, batches, CUDA graphs and row outputs have files of
their own (test_trt_*.py); the backend registry, test_backend_registry.py."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import numpy as np
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakePagelockedHostAllocation
from fakes.trt_kit import UINT8_FMT, Fakes, loaded

from edge_agent.pipelines.backends import engine_cache
from edge_agent.pipelines.backends.base import BackendError, TensorSpec
from edge_agent.pipelines.backends.trt_support import import_tensorrt

cache = trt_kit.cache


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


def test_import_tensorrt_says_where_to_get_it():
    with pytest.raises(BackendError, match="JetPack"):
        import_tensorrt()


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


# -- close ---------------------------------------------------------------------------------


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
