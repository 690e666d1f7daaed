"""FakeCudart: a fake of cuda-python's runtime bindings (``cuda.bindings.runtime``, formerly
``cuda.cudart``) for the calls the TensorRT backend's CUDA graphs make, on a FakeCudaDriver.

The calls and their return tuples are the bindings' (cuda-python 12.x/13.x; TensorRT 10.3's
``demo/Diffusion/utilities.py`` calls them this way). Stream handles are ints here, as pycuda's
``Stream.handle`` gives them: the generated bindings convert any int to a stream handle
(``cuda_bindings/cuda/bindings/driver.pyx``; the runtime module is generated alike).

- ``cudaStreamBeginCapture(stream, mode)`` → ``(err,)``
- ``cudaStreamEndCapture(stream)`` → ``(err, graph)``; an invalidated capture gives
  cudaErrorStreamCaptureInvalidated and no graph, and the stream leaves capture mode
- ``cudaGraphInstantiate(graph, flags)`` → ``(err, graphExec)`` (CUDA 12's form)
- ``cudaGraphLaunch(graphExec, stream)`` → ``(err,)``
- ``cudaGraphExecDestroy(graphExec)``, ``cudaGraphDestroy(graph)`` → ``(err,)``
- ``cudaStreamIsCapturing(stream)`` → ``(err, status)``
- ``cudaGetLastError()`` → ``(err,)``: the calling thread's last error, which it resets (as
  trtexec uses it); a fault (700) is not reset
- ``cudaGetErrorName(err)`` → ``(err, bytes)``

Rules it enforces, from cudaStreamBeginCapture's documentation: capture cannot start on the
legacy stream (handle 0) or on a stream already capturing; outside RELAXED mode the capture
must end in the thread that began it (cudaErrorStreamCaptureWrongThread); a destroyed graph
or exec is an invalid resource handle. Stricter than the real runtime, on purpose (the backend
never does these, and a test doing them by mistake should fail loudly): every call needs a
context current in the calling thread (the real runtime would make the device's primary
context current by itself; the backend pushes pycuda's, the same one), and a launch on the
legacy stream or into a capturing stream raises (legal on a device). The capture rules of
the work itself (what invalidates it, what replays) are FakeCudaDriver's.
"""

from __future__ import annotations

import enum
import itertools
import threading
from typing import Any

from fakes.fake_pycuda import FakeCapture, FakeCudaDriver, _Op


class FakeCudaError(enum.IntEnum):
    """cudaError_t: the values of the CUDA runtime."""

    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorInvalidResourceHandle = 400
    cudaErrorIllegalState = 401
    cudaErrorIllegalAddress = 700
    cudaErrorStreamCaptureUnsupported = 900
    cudaErrorStreamCaptureInvalidated = 901
    cudaErrorStreamCaptureWrongThread = 908


class FakeCaptureMode(enum.IntEnum):
    cudaStreamCaptureModeGlobal = 0
    cudaStreamCaptureModeThreadLocal = 1
    cudaStreamCaptureModeRelaxed = 2


class FakeCaptureStatus(enum.IntEnum):
    cudaStreamCaptureStatusNone = 0
    cudaStreamCaptureStatusActive = 1
    cudaStreamCaptureStatusInvalidated = 2


class FakeGraph:
    """cudaGraph_t: the work a capture recorded."""

    def __init__(self, handle: int, ops: list[_Op]) -> None:
        self.handle, self.ops, self.destroyed = handle, ops, False

    def __int__(self) -> int:
        return self.handle


class FakeGraphExec:
    """cudaGraphExec_t: an instantiated graph; keeps its own copy of the work."""

    def __init__(self, handle: int, ops: list[_Op]) -> None:
        self.handle, self.ops, self.destroyed, self.launches = handle, list(ops), False, 0

    def __int__(self) -> int:
        return self.handle


class FakeCudart:
    """A fake ``cuda.bindings.runtime`` module on one FakeCudaDriver."""

    cudaError_t = FakeCudaError
    cudaStreamCaptureMode = FakeCaptureMode
    cudaStreamCaptureStatus = FakeCaptureStatus

    def __init__(self, drv: FakeCudaDriver) -> None:
        self._drv = drv
        self._tls = threading.local()  # the runtime's last error is per thread
        self.graphs: list[FakeGraph] = []
        self.execs: list[FakeGraphExec] = []
        self._handles = itertools.count(0xA000, 0x10)

    # -- bookkeeping ------------------------------------------------------------------

    @property
    def last_error(self) -> FakeCudaError:
        return getattr(self._tls, "error", FakeCudaError.cudaSuccess)

    @last_error.setter
    def last_error(self, err: FakeCudaError) -> None:
        self._tls.error = err

    def _fail(self, err: FakeCudaError, *outputs: Any) -> tuple:
        self.last_error = err
        return (err, *outputs)

    def _enter(self, what: str, stream: Any = None) -> bool:
        """Checks and records a call; False: the context is faulted (the call returns 700)."""
        if self._drv.sticky:
            self.last_error = FakeCudaError.cudaErrorIllegalAddress
            return False
        self._drv._needs_context(what)
        self._drv._record(what, stream)
        if stream is not None and (not isinstance(stream, int) or isinstance(stream, bool)):
            raise AssertionError(f"{what}: pass the stream's int handle, got {type(stream).__name__}")
        return True

    def live_execs(self) -> list[FakeGraphExec]:
        return [e for e in self.execs if not e.destroyed]

    def live_graphs(self) -> list[FakeGraph]:
        return [g for g in self.graphs if not g.destroyed]

    # -- the bindings -------------------------------------------------------------------

    def cudaStreamBeginCapture(self, stream: int, mode: FakeCaptureMode) -> tuple:
        if not self._enter("cudaStreamBeginCapture", stream):
            return (FakeCudaError.cudaErrorIllegalAddress,)
        s = self._drv.streams.get(stream)
        if stream == 0 or s is None:
            return self._fail(FakeCudaError.cudaErrorStreamCaptureUnsupported)
        if stream in self._drv.captures:
            return self._fail(FakeCudaError.cudaErrorIllegalState)
        self._drv.captures[stream] = FakeCapture(s, int(mode), threading.get_ident())
        return (FakeCudaError.cudaSuccess,)

    def cudaStreamEndCapture(self, stream: int) -> tuple:
        if not self._enter("cudaStreamEndCapture", stream):
            return (FakeCudaError.cudaErrorIllegalAddress, None)
        capture = self._drv.captures.get(stream)
        if capture is None:
            return self._fail(FakeCudaError.cudaErrorIllegalState, None)
        relaxed = capture.mode == FakeCaptureMode.cudaStreamCaptureModeRelaxed
        if not relaxed and capture.thread != threading.get_ident():
            return self._fail(FakeCudaError.cudaErrorStreamCaptureWrongThread, None)
        del self._drv.captures[stream]
        if capture.invalidated:
            return self._fail(FakeCudaError.cudaErrorStreamCaptureInvalidated, None)
        graph = FakeGraph(next(self._handles), capture.ops)
        self.graphs.append(graph)
        return (FakeCudaError.cudaSuccess, graph)

    def cudaStreamIsCapturing(self, stream: int) -> tuple:
        if not self._enter("cudaStreamIsCapturing", stream):
            return (FakeCudaError.cudaErrorIllegalAddress, None)
        capture = self._drv.captures.get(stream)
        if capture is None:
            return (FakeCudaError.cudaSuccess, FakeCaptureStatus.cudaStreamCaptureStatusNone)
        if capture.invalidated:
            return (FakeCudaError.cudaSuccess, FakeCaptureStatus.cudaStreamCaptureStatusInvalidated)
        return (FakeCudaError.cudaSuccess, FakeCaptureStatus.cudaStreamCaptureStatusActive)

    def cudaGraphInstantiate(self, graph: FakeGraph, flags: int) -> tuple:
        if not self._enter("cudaGraphInstantiate"):
            return (FakeCudaError.cudaErrorIllegalAddress, None)
        if not isinstance(graph, FakeGraph) or graph.destroyed:
            return self._fail(FakeCudaError.cudaErrorInvalidResourceHandle, None)
        self._drv.unsafe("cudaGraphInstantiate")  # allocates the executable graph
        exe = FakeGraphExec(next(self._handles), graph.ops)
        self.execs.append(exe)
        return (FakeCudaError.cudaSuccess, exe)

    def cudaGraphLaunch(self, graph_exec: FakeGraphExec, stream: int) -> tuple:
        if not self._enter("cudaGraphLaunch", stream):
            return (FakeCudaError.cudaErrorIllegalAddress,)
        if not isinstance(graph_exec, FakeGraphExec) or graph_exec.destroyed:
            return self._fail(FakeCudaError.cudaErrorInvalidResourceHandle)
        if stream == 0 or stream not in self._drv.streams:
            raise AssertionError(f"cudaGraphLaunch on {stream!r}: launch on the slot's own stream")
        if stream in self._drv.captures:
            raise AssertionError("cudaGraphLaunch into a capturing stream: not what the backend does")
        graph_exec.launches += 1
        self._drv.replay(stream, graph_exec.ops)
        return (FakeCudaError.cudaSuccess,)

    def cudaGraphExecDestroy(self, graph_exec: FakeGraphExec) -> tuple:
        return self._destroy("cudaGraphExecDestroy", graph_exec, FakeGraphExec)

    def cudaGraphDestroy(self, graph: FakeGraph) -> tuple:
        return self._destroy("cudaGraphDestroy", graph, FakeGraph)

    def _destroy(self, what: str, handle: Any, kind: type) -> tuple:
        if not self._enter(what):
            return (FakeCudaError.cudaErrorIllegalAddress,)
        if not isinstance(handle, kind) or handle.destroyed:
            return self._fail(FakeCudaError.cudaErrorInvalidResourceHandle)
        handle.destroyed = True
        return (FakeCudaError.cudaSuccess,)

    def cudaGetLastError(self) -> tuple:
        if self._drv.sticky:  # a fault is not reset
            return (FakeCudaError.cudaErrorIllegalAddress,)
        err, self.last_error = self.last_error, FakeCudaError.cudaSuccess
        return (err,)

    def cudaGetErrorName(self, error: FakeCudaError) -> tuple:
        return (FakeCudaError.cudaSuccess, FakeCudaError(error).name.encode())
