"""CUDA graphs for the TensorRT backend: a slot's work captured once, replayed per frame.

A YOLOv8n engine is a few hundred kernels; ``execute_async_v3`` launches each from the CPU on
every frame, on the ARM cores that also capture, decode and publish. A graph replays them
with one launch.

**Which binding.** pycuda has no stream capture or graph API in any release (none at
v2026.1; a "CUDA Graphs" commit exists only off-branch). The capture calls come from NVIDIA's
cuda-python runtime bindings, as TensorRT's own samples use them (``cuda.bindings.runtime``
from cuda-python 12.6.1; ``cuda.cudart`` before, removed in 13.0). Everything else (streams,
buffers, events) stays pycuda's: both drive the device's primary context, which the backend
makes current, and a pycuda ``Stream.handle`` is the ``cudaStream_t`` as an int, which the
bindings take as is. The calls, as cuda-python 12.x/13.x exposes them (each returns a tuple
whose first item is a ``cudaError_t``):

- ``cudaStreamBeginCapture(stream, mode) -> (err,)``
- ``cudaStreamEndCapture(stream) -> (err, cudaGraph_t)``
- ``cudaGraphInstantiate(graph, flags) -> (err, cudaGraphExec_t)`` (CUDA 12's signature)
- ``cudaGraphLaunch(graphExec, stream) -> (err,)``
- ``cudaGraphExecDestroy(graphExec) -> (err,)``, ``cudaGraphDestroy(graph) -> (err,)``
- ``cudaGetLastError() -> (err,)``, ``cudaGetErrorName(err) -> (err, bytes)``

**How**, as trtexec does it (TensorRT v10.3.0 ``samples/common/sampleInference.cpp``
``createEnqueueFunction``, ``samples/common/sampleDevice.h`` ``TrtCudaGraph``): one plain
enqueue first ("avoid capturing initialization calls"), then capture in THREAD_LOCAL mode
(a reload may allocate another slot's buffers on another thread meanwhile: GLOBAL mode would
fail that allocation and break this capture); an enqueue that returns False during capture,
or an error ending it, means the engine holds work that cannot be captured: plain enqueue
goes on, and the runtime's error state is cleared with ``cudaGetLastError``. A graph holds
the addresses and shapes it was captured with, and the state of its execution context, so
each slot has an execution context of its own, set once (TensorRT's guide: one execution
context per captured graph).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from edge_agent.pipelines.backends.base import BackendError

log = logging.getLogger(__name__)

MODES = ("auto", "on", "off")


class GraphRefused(Exception):
    """Why a model (or a slot's capture) runs without CUDA graphs."""


def import_cudart() -> Any:
    """cuda-python's runtime bindings, or GraphRefused saying how to get them."""
    try:
        from cuda.bindings import runtime as cudart  # cuda-python >= 12.6.1
    except ImportError:
        try:
            from cuda import cudart  # cuda-python < 12.6.1 (removed in 13.0)
        except ImportError as e:
            raise GraphRefused(
                f"cuda-python is not installed ({e}); it comes with pip install 'edge-agent[jetson]'"
            ) from None
    return cudart


def refusal(dla_core: int) -> str:
    """Why an engine is not captured at all, known before trying ("" when it may be): DLA
    work is left out because whether a capture can hold it is not documented. (An output
    whose row count depends on the frame, whose allocator allocates in the enqueue, is
    refused once the engine's outputs are read: ``TensorRTBackend._read_io``.)"""
    if dla_core >= 0:
        return f"the model engine runs on DLA core {dla_core} (capturing DLA work is not confirmed)"
    return ""


def _error_name(cudart: Any, err: Any) -> str:
    try:
        name = cudart.cudaGetErrorName(err)[1]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # a name is only for the message
        return str(err)


def _ok(cudart: Any, err: Any) -> bool:
    return err == cudart.cudaError_t.cudaSuccess


class CudaGraph:
    """One instantiated graph, replayed on the stream it was captured on."""

    def __init__(self, cudart: Any, graph_exec: Any, stream: int) -> None:
        self._cudart, self._exec, self.stream = cudart, graph_exec, stream

    def launch(self) -> None:
        (err,) = self._cudart.cudaGraphLaunch(self._exec, self.stream)
        if not _ok(self._cudart, err):
            raise BackendError(f"cudaGraphLaunch failed: {_error_name(self._cudart, err)}")

    def close(self) -> None:
        if self._exec is not None:
            self._cudart.cudaGraphExecDestroy(self._exec)
            self._exec = None


def capture(cudart: Any, stream: int, work: Callable[[], bool]) -> CudaGraph:
    """Record what ``work`` enqueues on ``stream`` (it returns False when an enqueue fails)
    into a graph and instantiate it. Raises GraphRefused with the reason when the capture
    fails; the stream leaves capture mode either way."""
    mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    (err,) = cudart.cudaStreamBeginCapture(stream, mode)
    if not _ok(cudart, err):
        cudart.cudaGetLastError()
        raise GraphRefused(f"cudaStreamBeginCapture failed: {_error_name(cudart, err)}")
    why, done = "", False
    try:
        if not work():
            why = "an enqueue failed during the capture (the engine holds work a graph cannot hold)"
        done = True
    except Exception as e:  # pycuda raises for a call the capture forbids
        why, done = f"{type(e).__name__} during the capture: {e}", True
    finally:
        err, graph = cudart.cudaStreamEndCapture(stream)  # always: the stream must leave capture
        if not done and graph is not None and _ok(cudart, err):
            cudart.cudaGraphDestroy(graph)  # an interrupt passing through
    if not _ok(cudart, err):
        why = why or f"cudaStreamEndCapture failed: {_error_name(cudart, err)}"
    if why:
        if graph is not None and _ok(cudart, err):
            cudart.cudaGraphDestroy(graph)
        cudart.cudaGetLastError()  # clear the error the failed capture left, as trtexec does
        raise GraphRefused(why)
    err, graph_exec = cudart.cudaGraphInstantiate(graph, 0)
    cudart.cudaGraphDestroy(graph)  # the executable graph keeps what it needs (trtexec's order)
    if not _ok(cudart, err):
        cudart.cudaGetLastError()
        raise GraphRefused(f"cudaGraphInstantiate failed: {_error_name(cudart, err)}")
    return CudaGraph(cudart, graph_exec, stream)


def other_frame(frame: np.ndarray) -> None:
    """Make ``frame`` another input than it holds, in place (the check replays the graphs on
    it): a fixed ramp of finite values (a buffer never written may hold NaN, which would hide
    an unwritten output), inverted where it happens to equal the frame."""
    ramp = np.arange(frame.size, dtype=np.int64) % 251
    kept = frame.copy()
    if frame.dtype.kind == "f":
        frame.reshape(-1)[:] = ramp / 251.0
    else:
        frame.reshape(-1)[:] = ramp
    if not np.array_equal(frame, kept):
        return
    if frame.dtype.kind == "f":
        np.subtract(1, frame, out=frame)
    else:
        np.invert(frame, out=frame)


def same_outputs(expected: list[np.ndarray], got: list[np.ndarray]) -> str:
    """ "" when a replay wrote what plain execution wrote; else which output differs.

    The replay runs the kernels plain execution ran, on the same input; a few ULPs are
    allowed for kernels whose reductions are not deterministic. The outputs were filled with
    0xFF (NaN in a float, -1 in an int) before the replay: a value it did not write shows.
    """
    for i, (a, b) in enumerate(zip(expected, got)):
        if a.dtype.kind == "f":
            fa, fb = a.astype(np.float32), b.astype(np.float32)
            unwritten = np.isnan(fb) & ~np.isnan(fa)
            if unwritten.any() or not np.allclose(fb, fa, rtol=1e-3, atol=1e-3, equal_nan=True):
                return f"output {i} differs from plain execution (unwritten values: {int(unwritten.sum())})"
        elif not np.array_equal(a, b):
            return f"output {i} differs from plain execution"
    return ""


def check_replay(
    frame: np.ndarray, outputs: list[np.ndarray], replay: Callable[[], None], plain: Callable[[], None]
) -> None:
    """Check a slot's graphs once, before they serve frames: ``replay`` them on another
    input than the captured frame's (``other_frame``) into outputs filled with 0xFF (the
    host's here; ``replay`` fills device buffers too), then ``plain`` runs the same input
    without graphs, and the two must agree (``same_outputs``): a value the graphs do not
    write, or one baked in at the capture (a plugin doing host work in its enqueue), shows.
    Both wait for the slot's stream. The frame's input and the outputs are put back after
    (the plain run's of the captured frame). GraphRefused when they differ."""
    kept_in, kept_out = frame.copy(), [o.copy() for o in outputs]
    try:
        other_frame(frame)
        for o in outputs:
            o.reshape(-1).view(np.uint8)[:] = 0xFF
        replay()
        replayed = [o.copy() for o in outputs]
        plain()
        why = same_outputs(outputs, replayed)
        if why:
            raise GraphRefused(f"one replay against plain execution on the same input: {why}")
    finally:
        np.copyto(frame, kept_in)
        for o, kept in zip(outputs, kept_out):
            np.copyto(o, kept)


class Graphs:
    """A backend's CUDA graphs: the config's ``cuda_graphs`` mode and, once graphs are off
    for the model, why; cuda-python's runtime; the one block of activation memory that every
    execution context of the model engine shares; how many slots were captured."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise BackendError(f"cuda_graphs must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.off = "cuda_graphs: off" if mode == "off" else ""
        self.replay = True  # False: plain enqueue on the slots' own contexts (the bench's comparison)
        self.cudart: Any = None
        self.scratch: Any = None  # the shared activation memory (pycuda DeviceAllocation)
        self.scratch_size = 0
        self.captured = 0  # slots whose graphs were captured, over the backend's life

    @property
    def wanted(self) -> bool:
        return not self.off

    def refuse(self, reason: str) -> None:
        """Graphs off for this model, said once in the log; with ``on`` an error instead."""
        first = not self.off
        self.off = self.off or reason
        if self.mode == "on":
            raise BackendError(f"cuda_graphs is on, but this model cannot run from a CUDA graph: {reason}")
        if first:
            log.warning("tensorrt: CUDA graphs off for this model (plain execute_async_v3): %s", reason)

    def setup(self, cuda: Any, engine: Any, dla_core: int, runtime: Callable[[], Any]) -> str:
        """Whether this model may run from graphs ("" if it may, else why not) and, if so, the
        shared block of activation memory: the load's context and every slot's use it, and
        their enqueues never overlap (one inference at a time, each waited for), which is
        what sharing needs. ``runtime``: cuda-python's bindings, or GraphRefused."""
        if not self.wanted:
            return self.off
        why = refusal(dla_core)
        if not why:
            try:
                self.cudart = runtime()
            except GraphRefused as e:
                why = str(e)
        if why:
            return why
        # TensorRT 10.1+ (and 11): device_memory_size_v2; 10.0: device_memory_size.
        size = getattr(engine, "device_memory_size_v2", None)
        if size is None:
            size = engine.device_memory_size
        self.scratch_size = max(int(size), 256)
        self.scratch = cuda.mem_alloc(self.scratch_size)
        return ""

    def new_context(self, trt: Any, engine: Any) -> Any:
        """An execution context of ``engine``: with its own memory, or with the shared block
        (None when TensorRT could not make one).

        TensorRT v10.3.0 ``python/src/infer/pyCore.cpp``:
        ``ICudaEngine.create_execution_context(strategy=ExecutionContextAllocationStrategy.STATIC)``,
        ``device_memory_size_v2`` and ``IExecutionContext.set_device_memory(memory, size)``
        (10.1+), the write-only ``device_memory`` property and ``device_memory_size`` on 10.0
        (the latter gone in 11). ``include/NvInferRuntime.h``, setDeviceMemoryV2: "in use from
        the invocation of enqueueV3() until network execution is complete"; using it "in
        another execution context running in parallel" is undefined: the slots never run in
        parallel (one inference at a time, each waited for)."""
        if self.scratch is None:
            return engine.create_execution_context()
        ctx = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if ctx is None:
            return None
        if hasattr(ctx, "set_device_memory"):  # 10.1+: set_device_memory(memory, size)
            ctx.set_device_memory(int(self.scratch), self.scratch_size)
        else:  # 10.0: the write-only property
            ctx.device_memory = int(self.scratch)
        return ctx

    def state(self) -> dict[str, Any]:
        """The config's mode, whether slots replay graphs, how many were captured (over the
        backend's life: still said after the memory is freed), and why not."""
        return {
            "mode": self.mode,
            "replaying": bool(self.captured) and self.wanted and self.replay,
            "captured_slots": self.captured,
            "off": self.off,
        }

    def free(self) -> None:
        if self.scratch is not None:
            self.scratch.free()
            self.scratch = None
