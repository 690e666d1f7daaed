"""The fakes are as strict as TensorRT 10.3's bindings and pycuda: each rule the backend's
tests rely on, shown to fire (#22)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fakes import trt_kit
from fakes.fake_pycuda import FakeLogicError
from fakes.fake_tensorrt import FakeTensorRT
from fakes.trt_kit import SHAPE, settings

from edge_agent.pipelines.backends import trt_build

cuda = trt_kit.cuda


# -- pycuda ---------------------------------------------------------------------------------------


def test_a_second_free_raises(cuda):
    mem = cuda.mem_alloc(16)
    mem.free()
    with pytest.raises(FakeLogicError, match="freed twice"):
        mem.free()
    host = cuda.pagelocked_empty((4,), np.float32)
    host.base.free()
    with pytest.raises(FakeLogicError, match="freed twice"):
        host.base.free()


def test_get_device_pointer_needs_devicemap_and_a_context(cuda):
    plain = cuda.pagelocked_empty((4,), np.float32)
    with pytest.raises(FakeLogicError, match="DEVICEMAP"):
        plain.base.get_device_pointer()
    mapped = cuda.pagelocked_empty((4,), np.float32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
    assert mapped.base.get_device_pointer() == mapped.base.address
    cuda.Context.pop()
    try:
        with pytest.raises(FakeLogicError, match="no currently active context"):
            mapped.base.get_device_pointer()
    finally:
        cuda.contexts[0].push()


def test_detach_belongs_to_the_creating_thread(cuda):
    ctx = cuda.contexts[0]
    errors: list[BaseException] = []

    def detach():
        try:
            ctx.detach()
        except BaseException as e:  # checked below
            errors.append(e)

    t = threading.Thread(target=detach)
    t.start()
    t.join(timeout=10)
    assert len(errors) == 1 and isinstance(errors[0], FakeLogicError)


def test_a_blocking_event_waits_for_the_work_before_it(cuda):
    stream = cuda.Stream()
    done = cuda.Event(cuda.event_flags.BLOCKING_SYNC)
    cuda.enqueue(stream.handle, "kernel", 1.0)
    done.record(stream)
    assert cuda.pending_streams() == [stream.handle]
    done.synchronize()
    assert cuda.pending_streams() == []
    cuda.enqueue(stream.handle, "later kernel", 1.0)
    done.synchronize()
    assert cuda.pending_streams() == [stream.handle], "work after the event is not waited for"


# -- TensorRT -------------------------------------------------------------------------------------


def engine_and_context(trt, const_model, tmp_path, **kw):
    plan, _ = trt_build.build_engine(
        trt, None, str(const_model), settings(**kw), tmp_path / "t", progress=False
    )
    engine = trt.Runtime(None).deserialize_cuda_engine(plan)
    return engine, engine.create_execution_context()


def int8_build(trt, const_model, tmp_path, calibrator):
    """An INT8 build of the test detector on the fakes, fed by ``calibrator``."""
    return trt_build.build_engine(
        trt, None, str(const_model), settings(precision="int8"), tmp_path / "t", calibrator, progress=False
    )


def test_set_input_shape_returns_false_for_a_refused_shape(const_model, tmp_path):
    _, ctx = engine_and_context(FakeTensorRT(), const_model, tmp_path)
    assert ctx.set_input_shape("images", (2, 320, 320, 3)) is False, "outside the profile"
    assert ctx.set_input_shape("images", (1, 3, 320, 320)) is False, "not the engine's shape"
    assert ctx.set_input_shape("images", SHAPE) is True


def test_execute_checks_every_buffer_size(const_model, tmp_path, cuda):
    trt = FakeTensorRT(cuda=cuda)
    _, ctx = engine_and_context(trt, const_model, tmp_path)
    ctx.set_input_shape("images", SHAPE)
    stream = cuda.Stream()
    ctx.set_tensor_address("images", int(cuda.mem_alloc(320 * 320 * 3)))
    ctx.set_tensor_address("output0", int(cuda.mem_alloc(8 * 2100 * 4 - 4)))  # one float short
    with pytest.raises(AssertionError, match=r"'output0' .* needs 67200 B .* holds 67196 B"):
        ctx.execute_async_v3(stream.handle)
    ctx.set_tensor_address("output0", int(cuda.mem_alloc(8 * 2100 * 4)))
    assert ctx.execute_async_v3(stream.handle)


def test_a_calibrator_exception_is_swallowed_as_no_more_data(const_model, tmp_path):
    trt = FakeTensorRT()

    class Calibrator(trt.IInt8EntropyCalibrator2):
        calls = 0

        def __init__(self):
            trt.IInt8EntropyCalibrator2.__init__(self)

        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, data):
            pass

        def get_batch(self, names):
            Calibrator.calls += 1
            raise RuntimeError("lost")

    int8_build(trt, const_model, tmp_path, Calibrator())
    assert Calibrator.calls == 1 and trt.builds == 1, "built on no data, as the binding does"


def test_a_progress_monitor_exception_cancels_the_build(const_model, tmp_path, monkeypatch):
    trt = FakeTensorRT()

    class Broken(trt.IProgressMonitor):
        def phase_start(self, *a):
            raise ValueError("bug in the monitor")

    monkeypatch.setattr(trt_build, "make_progress_monitor", lambda trt: Broken())
    with pytest.raises(trt_build.BackendError, match="could not build"):
        trt_build.build_engine(trt, None, str(const_model), settings(), tmp_path / "t")
    assert trt.build_failures == ["cancelled by the progress monitor"]


def test_the_builder_refuses_what_tensorrt_refuses(const_model, tmp_path):
    trt = FakeTensorRT(num_dla_cores=1)
    builder = trt.Builder(None)

    def build(net_fn, **kw):
        network = builder.create_network(0)
        net_fn(network)
        config = builder.create_builder_config()
        trt_build.apply_settings(trt, builder, network, config, settings(**kw))
        return builder.build_serialized_network(network, config)

    def uint8_shuffle(n):
        n.mark_output(n.add_shuffle(n.add_input("images", trt.DataType.UINT8, SHAPE)).get_output(0))

    def scale_3d(n):
        x = n.add_input("images", trt.DataType.HALF, (3, 320, 320))
        n.mark_output(n.add_scale(x, trt.ScaleMode.CHANNEL, np.zeros(3), np.ones(3)).get_output(0))

    def dynamic(n):
        n.mark_output(
            n.add_cast(
                n.add_input("images", trt.DataType.UINT8, (-1, 320, 320, 3)), trt.DataType.HALF
            ).get_output(0)
        )

    assert build(uint8_shuffle) is None and "uint8" in trt.build_failures[-1]
    assert build(scale_3d, input_shape=(3, 320, 320)) is None and "4 dimensions" in trt.build_failures[-1]
    ranged = dict(dla_core=0, input_shape=(4, 320, 320, 3), min_batch=1)
    assert build(dynamic, **ranged) is None and "min != max" in trt.build_failures[-1]
    assert build(dynamic, dla_core=0, input_shape=(4, 320, 320, 3)) is not None


# -- review of #22: rules the fakes lacked ------------------------------------------------------------


def test_time_since_refuses_an_event_made_without_timing(cuda):
    stream = cuda.Stream()
    timed, untimed = (
        cuda.Event(),
        cuda.Event(cuda.event_flags.BLOCKING_SYNC | cuda.event_flags.DISABLE_TIMING),
    )
    timed.record(stream)
    untimed.record(stream)
    untimed.synchronize()
    for end, start in ((untimed, timed), (timed, untimed)):
        with pytest.raises(FakeLogicError, match="invalid handle"):
            end.time_since(start)


def test_set_input_shape_on_an_output_returns_false(const_model, tmp_path):
    _, ctx = engine_and_context(FakeTensorRT(), const_model, tmp_path)
    assert ctx.set_input_shape("output0", (1, 8, 2100)) is False
    assert ctx.set_input_shape("nothing", SHAPE) is False


@pytest.mark.parametrize("bad", [[], None, [1, 2], [np.int64(4096)], (4096,), 4096])
def test_the_calibrator_loop_takes_none_or_one_int_per_input(const_model, tmp_path, bad):
    trt = FakeTensorRT()

    class Calibrator(trt.IInt8EntropyCalibrator2):
        def read_calibration_cache(self):
            return None

        def write_calibration_cache(self, data):
            pass

        def get_batch(self, names):
            return bad

    def build():
        int8_build(trt, const_model, tmp_path, Calibrator())

    if bad in ([], None):
        build()  # the end of the data
    else:
        with pytest.raises(AssertionError, match="get_batch"):
            build()


def test_an_error_on_the_calibration_thread_reaches_the_build(const_model, tmp_path):
    trt = FakeTensorRT()
    trt.calibrate_on_thread = True

    class Uninitialised(trt.IInt8EntropyCalibrator2):
        def __init__(self):  # forgets the base class's __init__
            pass

    with pytest.raises(AssertionError, match=r"did not call IInt8EntropyCalibrator2\.__init__"):
        int8_build(trt, const_model, tmp_path, Uninitialised())
    assert trt.builds == 0


# -- TensorRT's output allocator (data-dependent output shapes) ---------------------------------------


def rows_engine(trt, cuda):
    """An engine whose output ``y`` is [-1, 3] (NonMaxSuppression's [num_selected, 3]), and a
    context with its input set: what the data-dependent rules need."""
    from fakes.fake_trt_runtime import FakeEngine

    io = [
        {"name": "x", "mode": "INPUT", "shape": [1, 4], "dtype": "FLOAT", "dims": ["", ""]},
        {"name": "y", "mode": "OUTPUT", "shape": [-1, 3], "dtype": "INT32", "dims": ["num_selected", ""]},
    ]
    plan = {"version": trt.__version__, "label": "nms", "io": io, "profile": {}, "exec_ms": 1.0}
    ctx = FakeEngine(trt, plan).create_execution_context()
    ctx.set_tensor_address("x", int(cuda.mem_alloc(16)))
    return ctx


class Recording:
    """An IOutputAllocator that allocates exactly what is asked and keeps the calls."""

    def __init__(self, trt, cuda, give=None):
        base = trt.IOutputAllocator

        class Allocator(base):
            def __init__(self):
                base.__init__(self)
                self.calls = []

            def reallocate_output_async(self, name, memory, size, alignment, stream):
                self.calls.append(("reallocate", name, memory, size, alignment, stream))
                return give(size) if give else int(cuda.mem_alloc(size))

            def notify_shape(self, name, shape):
                self.calls.append(("notify", name, tuple(shape)))

        self.allocator = Allocator()


def test_a_data_dependent_output_needs_an_allocator(cuda):
    trt = FakeTensorRT(cuda=cuda)
    ctx = rows_engine(trt, cuda)
    assert ctx.get_tensor_shape("y") == (-1, 3)
    ctx.set_tensor_address("y", int(cuda.mem_alloc(1 << 12)))  # an address alone is not enough
    with pytest.raises(AssertionError, match=r"\['y'\] have a data-dependent shape and no output allocator"):
        ctx.execute_async_v3(cuda.Stream().handle)


def test_reallocate_comes_before_notify_shape_and_the_kernel_writes_there(cuda):
    trt = FakeTensorRT(cuda=cuda)
    trt.output_rows = {"y": 5}
    ctx = rows_engine(trt, cuda)
    alloc = Recording(trt, cuda).allocator
    assert ctx.set_output_allocator("y", alloc) is True and ctx.get_output_allocator("y") is alloc
    assert ctx.set_output_allocator("x", alloc) is False, "not an output"
    stream = cuda.Stream()
    assert ctx.execute_async_v3(stream.handle)
    (realloc, notify) = alloc.calls
    assert realloc == ("reallocate", "y", 0, 5 * 3 * 4, 256, stream.handle)
    assert notify == ("notify", "y", (5, 3))
    address, shape = ctx.placed["y"]
    assert shape == (5, 3) and cuda.device_bytes_at(address) >= 60
    trt.output_rows = {"y": 0}
    alloc.calls.clear()
    assert ctx.execute_async_v3(stream.handle)
    assert alloc.calls[0][3] == 1, "the size is positive even for an empty tensor"
    assert alloc.calls[1] == ("notify", "y", (0, 3))


@pytest.mark.parametrize(
    "give",
    [lambda size: None, lambda size: 0, lambda size: 1 / 0, lambda size: "0x7f00"],
    ids=["None", "nullptr", "raises", "not-an-int"],
)
def test_no_memory_fails_the_enqueue_before_notify_shape(cuda, give):
    trt = FakeTensorRT(cuda=cuda)
    trt.output_rows = {"y": 2}
    ctx = rows_engine(trt, cuda)
    alloc = Recording(trt, cuda, give).allocator
    ctx.set_output_allocator("y", alloc)
    stream = cuda.Stream()
    assert ctx.execute_async_v3(stream.handle) is False
    assert [c[0] for c in alloc.calls] == ["reallocate"] and not stream.pending, "nothing ran"


def test_memory_smaller_than_asked_or_misaligned_is_refused(cuda):
    trt = FakeTensorRT(cuda=cuda)
    trt.output_rows = {"y": 4}
    ctx = rows_engine(trt, cuda)
    ctx.set_output_allocator("y", Recording(trt, cuda, lambda size: int(cuda.mem_alloc(size - 4))).allocator)
    with pytest.raises(AssertionError, match="TensorRT would write past it"):
        ctx.execute_async_v3(cuda.Stream().handle)
    ctx.set_output_allocator("y", Recording(trt, cuda, lambda size: int(cuda.mem_alloc(size)) + 4).allocator)
    with pytest.raises(AssertionError, match="not 256-byte aligned"):
        ctx.execute_async_v3(cuda.Stream().handle)


def test_an_allocator_must_init_its_base_and_the_legacy_name_still_serves(cuda):
    trt = FakeTensorRT(cuda=cuda)
    trt.output_rows = {"y": 1}
    ctx = rows_engine(trt, cuda)

    class NoInit(trt.IOutputAllocator):
        def __init__(self):
            pass

    with pytest.raises(TypeError, match=r"IOutputAllocator\.__init__"):
        ctx.set_output_allocator("y", NoInit())

    class Legacy(trt.IOutputAllocator):  # TensorRT 9's name: the binding falls back to it
        def reallocate_output(self, name, memory, size, alignment):
            return int(cuda.mem_alloc(size))

        def notify_shape(self, name, shape):
            self.shape = tuple(shape)

    legacy = Legacy()
    ctx.set_output_allocator("y", legacy)
    assert ctx.execute_async_v3(cuda.Stream().handle) and legacy.shape == (1, 3)
