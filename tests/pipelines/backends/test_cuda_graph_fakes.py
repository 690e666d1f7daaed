"""The capture rules of the fakes (FakeCudaDriver, FakeCudart, FakeTensorRT's execution
context): each mistake fails here as it does on a device, so the backend's tests on them mean
something. The rules and their sources are in the fakes' docstrings."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from fakes.fake_cudart import FakeCudart
from fakes.fake_pycuda import FakeCudaDriver, FakeLaunchError, FakeLogicError
from fakes.fake_tensorrt import FakeTensorRT
from fakes.fake_trt_runtime import FakeEngine
from fakes.fake_trt_types import FakeExecutionContextAllocationStrategy as Strategy

THREAD_LOCAL = FakeCudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
GLOBAL = FakeCudart.cudaStreamCaptureMode.cudaStreamCaptureModeGlobal
OK = FakeCudart.cudaError_t.cudaSuccess
ERR = FakeCudart.cudaError_t


@pytest.fixture
def gpu():
    """A driver with a context current here, its runtime, two streams and a copy's buffers."""
    drv = FakeCudaDriver()
    drv.init()
    ctx = drv.Device(0).retain_primary_context()
    ctx.push()
    rt = FakeCudart(drv)
    host = drv.pagelocked_empty((4,), np.float32)
    dev = drv.mem_alloc(host.nbytes)
    yield drv, rt, drv.Stream(), drv.Stream(), host, dev
    drv.Context.pop()


def captured_copy(rt, stream, host, dev, drv, mode=THREAD_LOCAL):
    """A graph of one host-to-device copy of ``host`` into ``dev``."""
    assert rt.cudaStreamBeginCapture(stream.handle, mode) == (OK,)
    drv.memcpy_htod_async(dev, host, stream)
    err, graph = rt.cudaStreamEndCapture(stream.handle)
    assert err == OK
    err, exe = rt.cudaGraphInstantiate(graph, 0)
    assert err == OK
    return exe


def device_values(drv, dev) -> np.ndarray:
    return drv.view(int(dev), 16).view(np.float32).copy()


def test_captured_work_does_not_run_until_the_graph_is_launched_then_runs_every_time(gpu):
    drv, rt, s, _, host, dev = gpu
    host[:] = 1
    exe = captured_copy(rt, s, host, dev, drv)
    assert device_values(drv, dev).tolist() == [0, 0, 0, 0], "nothing ran during the capture"
    for value in (2, 3):
        host[:] = value
        assert rt.cudaGraphLaunch(exe, s.handle) == (OK,)
        assert device_values(drv, dev).tolist() == [value] * 4, "the replay copies what the host holds now"


def test_work_on_another_stream_during_a_capture_runs_at_once_and_is_not_in_the_graph(gpu):
    drv, rt, s, other, host, dev = gpu
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    host[:] = 5
    drv.memcpy_htod_async(dev, host, other)  # not the capturing stream
    err, graph = rt.cudaStreamEndCapture(s.handle)
    assert err == OK and graph.ops == [], "the graph holds nothing"
    assert device_values(drv, dev).tolist() == [5] * 4, "it ran eagerly"
    host[:] = 6
    _, exe = rt.cudaGraphInstantiate(graph, 0)
    rt.cudaGraphLaunch(exe, s.handle)
    assert device_values(drv, dev).tolist() == [5] * 4, "the replay does not repeat it"


@pytest.mark.parametrize("call", ["stream", "query", "event"])
def test_a_synchronize_during_a_capture_fails_and_invalidates_it(gpu, call):
    drv, rt, s, _, host, dev = gpu
    ev = drv.Event()
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    drv.memcpy_htod_async(dev, host, s)
    ev.record(s)
    with pytest.raises(FakeLogicError, match="not permitted"):
        if call == "stream":
            s.synchronize()
        elif call == "query":
            s.is_done()
        else:
            ev.synchronize()
    assert rt.cudaStreamEndCapture(s.handle) == (ERR.cudaErrorStreamCaptureInvalidated, None)
    assert rt.cudaGetLastError() == (ERR.cudaErrorStreamCaptureInvalidated,)
    assert rt.cudaGetLastError() == (OK,), "read once, then reset"
    with pytest.raises(FakeLogicError, match="event last recorded in a capturing stream"):
        ev.time_since(ev)  # an event recorded in a capture stays unusable outside it


def test_an_allocation_fails_in_the_capturing_thread_and_in_any_thread_of_a_global_capture(gpu):
    drv, rt, s, *_ = gpu
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    other: list = []
    t = threading.Thread(target=lambda: (drv.Context.push(drv.contexts[0]), other.append(drv.mem_alloc(64))))
    t.start()
    t.join(10)
    assert other, "THREAD_LOCAL: another thread may allocate"
    with pytest.raises(FakeLogicError, match="cuMemAlloc failed"):
        drv.mem_alloc(64)
    assert rt.cudaStreamEndCapture(s.handle)[0] == ERR.cudaErrorStreamCaptureInvalidated

    assert rt.cudaStreamBeginCapture(s.handle, GLOBAL) == (OK,)
    failed: list = []

    def alloc() -> None:
        drv.Context.push(drv.contexts[0])
        try:
            drv.pagelocked_empty((4,), np.float32)
        except FakeLogicError as e:
            failed.append(str(e))

    t = threading.Thread(target=alloc)
    t.start()
    t.join(10)
    assert failed and "cuMemHostAlloc" in failed[0], "GLOBAL: every thread is held to the rules"
    assert rt.cudaStreamEndCapture(s.handle)[0] == ERR.cudaErrorStreamCaptureInvalidated


def test_the_legacy_stream_during_a_blocking_streams_capture_fails_and_invalidates_it(gpu):
    drv, rt, s, _, host, dev = gpu
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    with pytest.raises(FakeLogicError, match="legacy stream"):
        drv.memcpy_htod(dev, host)  # synchronous: the legacy stream
    assert rt.cudaStreamEndCapture(s.handle)[0] == ERR.cudaErrorStreamCaptureInvalidated
    drv.memcpy_htod(dev, host)  # outside a capture it is fine
    quiet = drv.Stream(1)  # NON_BLOCKING: not tied to the legacy stream
    assert rt.cudaStreamBeginCapture(quiet.handle, THREAD_LOCAL) == (OK,)
    drv.memcpy_htod(dev, host)
    assert rt.cudaStreamEndCapture(quiet.handle)[0] == OK


def test_replaying_a_graph_after_its_buffers_were_freed_faults_the_context(gpu):
    drv, rt, s, _, host, dev = gpu
    exe = captured_copy(rt, s, host, dev, drv)
    dev.free()  # the buffers moved (a reallocation, a reload) while the graph lives
    assert rt.cudaGraphLaunch(exe, s.handle) == (OK,), "the launch itself succeeds, as on a device"
    with pytest.raises(FakeLaunchError, match="illegal memory access"):
        s.synchronize()
    with pytest.raises(FakeLaunchError):
        drv.mem_alloc(16)  # sticky: the context is unusable
    assert rt.cudaGraphLaunch(exe, s.handle)[0] == ERR.cudaErrorIllegalAddress
    assert rt.cudaGetLastError() == (ERR.cudaErrorIllegalAddress,), "not reset"
    drv.sticky = ""  # let the fixture's teardown pop the context


def test_capture_begins_and_ends_by_the_rules(gpu):
    drv, rt, s, _, _, _ = gpu
    assert rt.cudaStreamBeginCapture(0, THREAD_LOCAL) == (ERR.cudaErrorStreamCaptureUnsupported,)
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (ERR.cudaErrorIllegalState,)
    ended: list = []

    def end_elsewhere() -> None:
        drv.Context.push(drv.contexts[0])
        ended.append(rt.cudaStreamEndCapture(s.handle))

    t = threading.Thread(target=end_elsewhere)
    t.start()
    t.join(10)
    assert ended == [(ERR.cudaErrorStreamCaptureWrongThread, None)]
    err, graph = rt.cudaStreamEndCapture(s.handle)
    assert err == OK
    assert rt.cudaGraphDestroy(graph) == (OK,)
    assert rt.cudaGraphDestroy(graph) == (ERR.cudaErrorInvalidResourceHandle,)
    assert rt.cudaGraphInstantiate(graph, 0) == (ERR.cudaErrorInvalidResourceHandle, None)


# -- TensorRT's execution context under capture ------------------------------------------------


def engine(trt: FakeTensorRT, out_shape, dims=("batch", "n", "k"), **plan) -> FakeEngine:
    io = [
        {"name": "x", "mode": "INPUT", "shape": [1, 4], "dtype": "FLOAT", "dims": ["", ""]},
        {"name": "y", "mode": "OUTPUT", "shape": list(out_shape), "dtype": "FLOAT", "dims": list(dims)},
    ]
    base = {"version": trt.__version__, "label": "net", "io": io, "profile": {}, "exec_ms": 1.0}
    return FakeEngine(trt, {**base, **plan})


def bound(drv, trt, eng, strategy=Strategy.STATIC):
    ctx = eng.create_execution_context(strategy)
    x, y = drv.mem_alloc(16), drv.mem_alloc(4 * 12)
    ctx.set_tensor_address("x", int(x))
    ctx.set_tensor_address("y", int(y))
    return ctx, x, y


def test_an_engine_with_a_data_dependent_output_fails_its_capture(gpu):
    drv, rt, s, _, _, _ = gpu
    trt = FakeTensorRT(cuda=drv)
    ctx, _, _ = bound(drv, trt, engine(trt, (-1, 3), dims=("num_selected", "")))

    class Allocator(trt.IOutputAllocator):
        def reallocate_output_async(self, name, memory, size, alignment, stream):
            raise AssertionError("asked for memory during a capture")

        def notify_shape(self, name, shape):
            pass

    assert ctx.set_output_allocator("y", Allocator())
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    assert ctx.execute_async_v3(s.handle) is False
    assert drv.captures[s.handle].invalidated.startswith("output 'y' is data-dependent")
    assert rt.cudaStreamEndCapture(s.handle)[0] == ERR.cudaErrorStreamCaptureInvalidated


@pytest.mark.parametrize("plan", [{"plugins": ["EfficientNMS_TRT"]}, {"dla_core": 0}])
def test_an_allocating_plugin_or_a_dla_engine_fails_its_capture(gpu, plan):
    drv, rt, s, _, _, _ = gpu
    trt = FakeTensorRT(cuda=drv)
    trt.plugin_allocates = {"EfficientNMS_TRT"}
    ctx, _, _ = bound(drv, trt, engine(trt, (1, 3, 4), **plan))
    assert rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL) == (OK,)
    assert ctx.execute_async_v3(s.handle) is False
    assert rt.cudaStreamEndCapture(s.handle)[0] == ERR.cudaErrorStreamCaptureInvalidated
    assert ctx.execute_async_v3(s.handle) is True, "outside a capture it runs"


def test_a_graph_replayed_after_its_context_changed_is_refused(gpu):
    drv, rt, s, _, _, _ = gpu
    trt = FakeTensorRT(cuda=drv)
    ctx, _, _ = bound(drv, trt, engine(trt, (1, 3, 4)))
    rt.cudaStreamBeginCapture(s.handle, THREAD_LOCAL)
    assert ctx.execute_async_v3(s.handle)
    _, graph = rt.cudaStreamEndCapture(s.handle)
    _, exe = rt.cudaGraphInstantiate(graph, 0)
    rt.cudaGraphLaunch(exe, s.handle)  # fine
    ctx.set_tensor_address("y", int(drv.mem_alloc(48)))  # another slot's buffer, say
    with pytest.raises(AssertionError, match="changed"):
        rt.cudaGraphLaunch(exe, s.handle)


def test_contexts_sharing_device_memory_must_not_run_at_once(gpu):
    drv, _, s, other, _, _ = gpu
    trt = FakeTensorRT(cuda=drv)
    eng = engine(trt, (1, 3, 4))
    scratch = drv.mem_alloc(1 << 20)
    a, _, _ = bound(drv, trt, eng, Strategy.USER_MANAGED)
    b, _, _ = bound(drv, trt, eng, Strategy.USER_MANAGED)
    with pytest.raises(AssertionError, match="without device memory"):
        a.execute_async_v3(s.handle)
    for ctx in (a, b):
        ctx.set_device_memory(int(scratch), eng.device_memory_size_v2)
    a.execute_async_v3(s.handle)
    with pytest.raises(AssertionError, match="same device memory at once"):
        b.execute_async_v3(other.handle)
    s.synchronize()
    assert b.execute_async_v3(other.handle), "after a's work is waited for, b may run"
