"""FakeCudaDriver: a fake of ``pycuda.driver`` for tests without a GPU.

Mirrors the parts of pycuda's driver API the TensorRT backend uses, as documented in
pycuda's ``doc/driver.rst`` (summarised in /work/shared/reference/jetson-apis.md, section 3):
``init``, ``Device`` (``name``, ``compute_capability``, ``retain_primary_context``,
``count``), ``Context.push``/``Context.pop`` (a per-thread stack) and ``detach``,
``Stream`` (``handle``, ``synchronize``), ``Event`` (``record``, ``time_since``),
``pagelocked_empty`` (an ndarray whose ``.base`` has ``get_device_pointer()``),
``host_alloc_flags``, ``mem_alloc`` and the ``memcpy_*`` calls.

It records every call in ``calls`` (a list of ``(name, args)``, shareable with a
FakeTensorRT so one list shows the whole protocol in order) and enforces pycuda's rules:

- after ``init()``, every call that needs a context raises ``FakeLogicError`` (pycuda's
  ``LogicError``) unless a context is current in the calling thread;
- the host side of ``memcpy_*_async`` must come from ``pagelocked_empty`` (the array, or a
  contiguous view into it);
- a second ``free()`` of an allocation raises (pycuda ``src/cpp/cuda.hpp``:
  ``device_allocation::free`` / ``pagelocked_host_allocation::free`` throw
  CUDA_ERROR_INVALID_HANDLE once ``m_valid`` is false);
- ``get_device_pointer()`` needs a current context (``host_pointer::get_device_pointer``
  calls ``cuMemHostGetDevicePointer``) and, stricter than a UVA device needs, the
  DEVICEMAP flag (the documented way to map);
- ``detach()`` from a thread other than the one that retained the context raises: the
  real ``context::detach`` then silently skips the release (a leaked primary-context
  reference), which a test could not see otherwise; a second ``detach()`` raises
  ("cannot detach from invalid context");
- ``Event.synchronize()`` waits for the stream up to that event (an event created with
  ``event_flags.BLOCKING_SYNC`` blocks instead of spinning; ``synced_events`` records the flags);
- device work (copies, kernels enqueued by TensorRT, events) marks its stream pending
  until ``stream.synchronize()``; ``pending_streams()`` lets a test check that nothing is
  left in flight when the host goes on to read outputs, and ``Event.time_since`` refuses
  events that have not been reached ("invalid value") or that were made with
  ``event_flags.DISABLE_TIMING`` ("invalid handle"), as the real call does.

Device time is a fake clock: each enqueued piece of work advances it by its cost in ms,
so event timings are exact numbers a test can assert.

Device memory holds bytes: ``mem_alloc`` gives zeroed memory, a mapped page-locked buffer is
the host array itself, and the async copies move bytes when their work runs (an enqueue runs
at once; the host only reads after a wait). ``view(address, n)`` reads or writes it.

Stream capture (CUDA graphs; the runtime calls are FakeCudart's, fake_cudart.py) follows the
CUDA Programming Guide's rules ("Prohibited and unhandled operations", "Invalidation") and
cuStreamBeginCapture's mode semantics:

- work enqueued on a capturing stream does not run: it is recorded, with the device
  addresses it touches, into the capture, and runs each time the graph is launched;
- work on another stream is not captured (nothing joins it to the capture): it runs at
  once, and the graph replays without it, as on a device;
- synchronising or querying a capturing stream, waiting on or timing an event recorded in
  a capture, any use of the legacy (NULL) stream, from any thread, while a blocking stream
  (``Stream()`` without flag 1, NON_BLOCKING) captures (a synchronous ``memcpy_htod``, an
  enqueue on handle 0), and an allocation (``mem_alloc``, ``pagelocked_empty``) from the
  capturing thread (THREAD_LOCAL) or any thread (GLOBAL) raise ``FakeLogicError`` and
  invalidate the capture; ``cudaStreamEndCapture`` then fails
  with cudaErrorStreamCaptureInvalidated and no graph (which call gets 900 and which 901 is
  not documented; the fake gives the offending call the error and the end 901);
- a launched graph whose work touches memory freed since the capture sets a sticky
  "illegal memory access" error: every later call that needs the context raises
  ``FakeLaunchError``, as after a real fault (the context is unusable).
"""

from __future__ import annotations

import itertools
import threading
from types import SimpleNamespace
from typing import Any

import numpy as np


class FakeLogicError(RuntimeError):
    """pycuda.driver.LogicError."""


class FakeLaunchError(RuntimeError):
    """pycuda.driver.LaunchError: a kernel faulted (sticky: the context is unusable)."""


class _Op:
    """A piece of device work: what it is, what it does to memory, what it costs, and the
    device addresses it touches (checked when a graph replays it)."""

    def __init__(self, what: str, run: Any, ms: float, addresses: tuple[int, ...]) -> None:
        self.what, self.run, self.ms, self.addresses = what, run, ms, addresses


class FakeCapture:
    """A stream capture sequence in progress (cudaStreamBeginCapture .. cudaStreamEndCapture)."""

    def __init__(self, stream: Any, mode: int, thread: int) -> None:
        self.stream, self.mode, self.thread = stream, mode, thread
        self.ops: list[_Op] = []
        self.invalidated = ""  # why, once an invalid operation broke it


class FakeDeviceAllocation:
    """pycuda's DeviceAllocation: ``int()`` gives the device address."""

    def __init__(self, drv: FakeCudaDriver, address: int, nbytes: int) -> None:
        self._drv, self.address, self.nbytes = drv, address, nbytes

    def __int__(self) -> int:
        return self.address

    def __index__(self) -> int:
        return self.address

    def free(self) -> None:
        if self.address not in self._drv._device_ranges:
            raise FakeLogicError("device_allocation::free failed: invalid handle (freed twice)")
        self._drv._record("DeviceAllocation.free", self.address)
        del self._drv._device_ranges[self.address]
        self._drv._backing.pop(self.address, None)


class FakePagelockedHostAllocation:
    """pycuda's PagelockedHostAllocation: the ``.base`` of a ``pagelocked_empty`` array."""

    def __init__(self, drv: FakeCudaDriver, shape: tuple[int, ...], dtype: np.dtype, flags: int) -> None:
        self._drv = drv
        self.flags = flags
        self.freed = False
        self._mem = np.zeros(max(int(np.prod(shape)) * dtype.itemsize, 1), np.uint8)
        self.__array_interface__ = {
            "shape": tuple(shape),
            "typestr": dtype.str,
            "data": (self._mem.ctypes.data, False),
            "version": 3,
        }

    @property
    def address(self) -> int:
        return int(self._mem.ctypes.data)

    @property
    def nbytes(self) -> int:
        return int(self._mem.nbytes)

    def get_flags(self) -> int:
        return self.flags

    def get_device_pointer(self) -> int:
        self._drv._needs_context("get_device_pointer")
        if not self.flags & self._drv.host_alloc_flags.DEVICEMAP:
            raise FakeLogicError("cuMemHostGetDevicePointer failed: invalid value (not DEVICEMAP)")
        if self.freed:
            raise FakeLogicError("cuMemHostGetDevicePointer failed: invalid value (freed)")
        # Unified addressing: the device sees page-locked host memory at the same address.
        self._drv._record("PagelockedHostAllocation.get_device_pointer", self.address)
        self._drv._device_ranges[self.address] = self.nbytes
        self._drv._backing[self.address] = self._mem  # the same bytes: nothing is copied
        return self.address

    def free(self) -> None:
        if self.freed:
            raise FakeLogicError("pagelocked_host_allocation::free failed: invalid handle (freed twice)")
        self._drv._record("PagelockedHostAllocation.free", self.address)
        self.freed = True
        self._drv._device_ranges.pop(self.address, None)
        self._drv._backing.pop(self.address, None)


class _DeviceBase:
    _drv: FakeCudaDriver

    def __init__(self, ordinal: int) -> None:
        self._drv._needs_init(f"Device({ordinal})")
        if not 0 <= ordinal < self._drv.device_count:
            raise FakeLogicError(f"cuDeviceGet failed: invalid device ordinal {ordinal}")
        self.ordinal = ordinal
        self._drv._record("Device", ordinal)

    @classmethod
    def count(cls) -> int:
        cls._drv._needs_init("Device.count")
        cls._drv._record("Device.count")
        return cls._drv.device_count

    def name(self) -> str:
        self._drv._record("Device.name", self.ordinal)
        return self._drv.device_name

    def compute_capability(self) -> tuple[int, int]:
        self._drv._record("Device.compute_capability", self.ordinal)
        return self._drv.cc

    def get_attribute(self, attr: Any) -> int:
        self._drv._record("Device.get_attribute", self.ordinal, attr)
        if attr != self._drv.device_attribute.MULTIPROCESSOR_COUNT:
            raise AssertionError(f"the fake knows only MULTIPROCESSOR_COUNT, not {attr}")
        return self._drv.sm_count

    def retain_primary_context(self) -> Any:
        self._drv._record("Device.retain_primary_context", self.ordinal)
        ctx = self._drv.Context(self)
        self._drv.contexts.append(ctx)
        return ctx  # not made current, as documented


class _ContextBase:
    _drv: FakeCudaDriver

    def __init__(self, device: Any) -> None:
        self.device = device
        self.detached = False
        self.owner = threading.get_ident()

    def push(self) -> None:
        if self.detached:
            raise FakeLogicError("context.push failed: the context was detached")
        self._drv._record("Context.push")
        self._drv._stack().append(self)

    @classmethod
    def pop(cls) -> None:
        stack = cls._drv._stack()
        if not stack:
            raise FakeLogicError("context::pop failed: cannot pop non-current context")
        cls._drv._record("Context.pop")
        stack.pop()

    def detach(self) -> None:
        if self.detached:
            raise FakeLogicError("context::detach failed: cannot detach from invalid context")
        if threading.get_ident() != self.owner:
            raise FakeLogicError("context::detach: the context belongs to another thread (a leak in pycuda)")
        self._drv._record("Context.detach")
        self.detached = True
        stack = self._drv._stack()
        if stack and stack[-1] is self:
            stack.pop()


class _StreamBase:
    _drv: FakeCudaDriver

    def __init__(self, flags: int = 0) -> None:
        self._drv._needs_context("Stream")
        self.flags = flags  # 1: CU_STREAM_NON_BLOCKING (no implicit sync with the legacy stream)
        self.handle = next(self._drv._handles)
        self.pending = False
        self.seq = 0  # pieces of work enqueued so far
        self.clock = 0.0  # device time when the last enqueued work on it finishes
        self._drv.streams[self.handle] = self
        self._drv._record("Stream", self.handle)

    def synchronize(self) -> None:
        self._drv._needs_context("Stream.synchronize")
        self._drv._not_capturing(self.handle, "cuStreamSynchronize")
        self._drv._record("Stream.synchronize", self.handle)
        self.pending = False
        for ev in self._drv.events:
            if ev.stream is self:
                ev.reached = True

    def is_done(self) -> bool:
        self._drv._not_capturing(self.handle, "cuStreamQuery")
        return not self.pending


class _EventBase:
    _drv: FakeCudaDriver

    def __init__(self, flags: int = 0) -> None:
        self._drv._needs_context("Event")
        self.flags = flags
        self.seq = -1
        self.stream: Any = None
        self.time: float | None = None
        self.reached = False
        self.captured = False  # last recorded into a capture: no node, unusable outside it
        self._drv.events.append(self)
        self._drv._record("Event")

    def record(self, stream: Any = None) -> Any:
        self._drv._needs_context("Event.record")
        if stream is None:
            raise AssertionError("Event.record() on the default stream: pass the slot's stream")
        self._drv._record("Event.record", stream.handle)
        if self._drv.capture_of(stream.handle) is not None:
            # A plain record in a capture adds no node: it only marks a point of the capture.
            self.stream, self.captured, self.reached = stream, True, False
            return self
        self.captured = False
        stream.seq += 1
        self.stream, self.time, self.reached, self.seq = stream, stream.clock, False, stream.seq
        stream.pending = True
        return self

    def synchronize(self) -> Any:
        """Wait until the stream reaches this event: the work before it is done."""
        self._drv._needs_context("Event.synchronize")
        if self.stream is None:
            raise AssertionError("Event.synchronize() on an event that was never recorded")
        self._drv._captured_event(self, "cuEventSynchronize")
        self._drv._record("Event.synchronize", self.stream.handle, self.flags)
        for ev in self._drv.events:
            if ev.stream is self.stream and 0 <= ev.seq <= self.seq:
                ev.reached = True
        if self.seq == self.stream.seq:
            self.stream.pending = False
        return self

    def time_since(self, start: Any) -> float:
        self._drv._needs_context("Event.time_since")
        self._drv._record("Event.time_since")
        for ev in (self, start):
            self._drv._captured_event(ev, "cuEventElapsedTime")
        no_timing = self._drv.event_flags.DISABLE_TIMING
        if (self.flags | start.flags) & no_timing:
            raise FakeLogicError(
                "cuEventElapsedTime failed: invalid handle (an event made with DISABLE_TIMING)"
            )
        if not (self.reached and start.reached) or self.time is None or start.time is None:
            raise FakeLogicError("cuEventElapsedTime failed: invalid value (event not reached yet)")
        return self.time - start.time


class FakeCudaDriver:
    """A fake ``pycuda.driver`` module; one instance is one process's view of one GPU."""

    LogicError = FakeLogicError
    LaunchError = FakeLaunchError
    # cudaStreamCaptureMode (CUDA runtime/driver values)
    CAPTURE_GLOBAL, CAPTURE_THREAD_LOCAL, CAPTURE_RELAXED = 0, 1, 2

    def __init__(
        self,
        calls: list[tuple[str, tuple]] | None = None,
        device_name: str = "Orin (fake)",
        compute_capability: tuple[int, int] = (8, 7),
        device_count: int = 1,
        sm_count: int = 8,
    ) -> None:
        self.calls = calls if calls is not None else []
        self.device_name = device_name
        self.cc = compute_capability
        self.device_count = device_count
        self.sm_count = sm_count
        self.initialized = False
        self.contexts: list[Any] = []
        self.streams: dict[int, Any] = {}
        self.events: list[Any] = []
        self._tls = threading.local()
        self._handles = itertools.count(0x1000, 0x10)
        self._addresses = itertools.count(0x7F00_0000_0000, 1 << 24)
        self._device_ranges: dict[int, int] = {}  # device address -> size in bytes
        self._backing: dict[int, np.ndarray] = {}  # device address -> its bytes (uint8)
        self.captures: dict[int, FakeCapture] = {}  # stream handle -> the capture in progress
        self.sticky = ""  # a fault that made the context unusable
        self.host_alloc_flags = SimpleNamespace(PORTABLE=1, DEVICEMAP=2, WRITECOMBINED=4)
        self.event_flags = SimpleNamespace(DEFAULT=0, BLOCKING_SYNC=1, DISABLE_TIMING=2, INTERPROCESS=4)
        self.device_attribute = SimpleNamespace(MULTIPROCESSOR_COUNT="MULTIPROCESSOR_COUNT")
        # Classes bound to this driver instance, so several fakes never share state.
        self.Device = type("FakeDevice", (_DeviceBase,), {"_drv": self})
        self.Context = type("FakeContext", (_ContextBase,), {"_drv": self})
        self.Stream = type("FakeStream", (_StreamBase,), {"_drv": self})
        self.Event = type("FakeEvent", (_EventBase,), {"_drv": self})

    # -- bookkeeping ------------------------------------------------------------------

    def _record(self, name: str, *args: Any) -> None:
        self.calls.append((name, args))

    def _stack(self) -> list[Any]:
        if not hasattr(self._tls, "stack"):
            self._tls.stack = []
        return self._tls.stack

    def _needs_init(self, what: str) -> None:
        if not self.initialized:
            raise FakeLogicError(f"{what} failed: cuInit has not been called (call init() first)")

    def _needs_context(self, what: str) -> None:
        self._needs_init(what)
        if self.sticky:
            raise FakeLaunchError(f"{what} failed: {self.sticky}")
        if not self._stack():
            raise FakeLogicError(
                f"{what}: explicit_context_dependent failed: invalid device context - "
                "no currently active context?"
            )

    def current_context(self) -> Any:
        stack = self._stack()
        return stack[-1] if stack else None

    def context_depth(self) -> int:
        """How many contexts the calling thread has pushed and not popped."""
        return len(self._stack())

    def pending_streams(self) -> list[int]:
        """Handles of streams with work that no ``synchronize()`` has waited for."""
        return [h for h, s in self.streams.items() if s.pending]

    def is_device_address(self, address: int) -> bool:
        return any(base <= address < base + max(n, 1) for base, n in self._device_ranges.items())

    def device_bytes_at(self, address: int) -> int:
        """Bytes of device-visible memory from ``address`` to the end of its allocation (0: none)."""
        for base, n in self._device_ranges.items():
            if base <= address < base + max(n, 1):
                return base + n - address
        return 0

    def view(self, address: int, nbytes: int) -> np.ndarray:
        """The ``nbytes`` bytes of device-visible memory at ``address`` (writable, uint8)."""
        for base, mem in self._backing.items():
            if base <= address and address + nbytes <= base + mem.nbytes:
                return mem[address - base : address - base + nbytes]
        raise AssertionError(f"{nbytes} B at {address:#x} is not inside one live device allocation")

    def is_live(self, address: int) -> bool:
        return self.device_bytes_at(address) > 0

    # -- stream capture ---------------------------------------------------------------

    def capture_of(self, handle: int) -> FakeCapture | None:
        return self.captures.get(handle)

    def _invalidate(self, capture: FakeCapture, why: str) -> None:
        if not capture.invalidated:
            capture.invalidated = why

    def _not_capturing(self, handle: int, what: str) -> None:
        """Synchronising or querying a capturing stream is invalid and invalidates the capture."""
        capture = self.captures.get(handle)
        if capture is not None:
            self._invalidate(capture, f"{what} on the capturing stream")
            raise FakeLogicError(f"{what} failed: operation not permitted when stream is capturing")

    def _captured_event(self, ev: Any, what: str) -> None:
        if ev.captured:
            capture = self.captures.get(ev.stream.handle)
            if capture is not None:
                self._invalidate(capture, f"{what} on an event recorded in the capture")
            raise FakeLogicError(
                f"{what} failed: operation not permitted on an event last recorded in a capturing stream"
            )

    def unsafe(self, what: str) -> None:
        """A potentially unsafe call (an allocation): prohibited in the capturing thread of a
        THREAD_LOCAL or GLOBAL capture, and in every thread during a GLOBAL one."""
        me = threading.get_ident()
        hit = [
            c
            for c in self.captures.values()
            if c.mode == self.CAPTURE_GLOBAL or (c.mode == self.CAPTURE_THREAD_LOCAL and c.thread == me)
        ]
        for c in hit:
            self._invalidate(c, f"{what} during the capture")
        if hit:
            raise FakeLogicError(f"{what} failed: operation not permitted when stream is capturing")

    def _legacy_stream(self, what: str) -> None:
        """The legacy stream synchronises with every blocking stream: using it, from any
        thread, while one captures would make it depend on captured work
        (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). A NON_BLOCKING stream has no such tie."""
        blocking = [c for c in self.captures.values() if not c.stream.flags & 1]
        for c in blocking:
            self._invalidate(c, f"{what} on the legacy stream during the capture")
        if blocking:
            raise FakeLogicError(
                f"{what} failed: operation would make the legacy stream depend on a capturing blocking stream"
            )

    def enqueue(
        self, handle: Any, what: str, ms: float, run: Any = None, addresses: tuple[int, ...] = ()
    ) -> Any:
        """Device work on the stream ``handle`` (TensorRT's kernels call this): ``run`` does
        what it does to memory; on a capturing stream it is recorded instead."""
        self._needs_context(what)
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise AssertionError(f"{what}: the stream handle must be an int, got {type(handle).__name__}")
        if handle == 0:
            self._legacy_stream(what)
        stream = self.streams.get(handle)
        if stream is None:
            raise AssertionError(f"{what}: {handle:#x} is not a stream created with Stream()")
        op = _Op(what, run, ms, tuple(addresses))
        capture = self.captures.get(handle)
        if capture is not None:
            capture.ops.append(op)
            return stream
        self._run(stream, op)
        return stream

    def _run(self, stream: Any, op: _Op) -> None:
        if op.run is not None:
            op.run()
        stream.pending = True
        stream.seq += 1
        stream.clock += op.ms

    def replay(self, handle: int, ops: list[_Op]) -> None:
        """A graph's work, launched on the stream ``handle``: each piece runs as captured, on
        the addresses captured; one that touches freed memory faults (sticky)."""
        stream = self.streams[handle]
        for op in ops:
            dead = [a for a in op.addresses if not self.is_live(a)]
            if dead:
                self.sticky = "an illegal memory access was encountered"
                stream.pending = True
                return
            self._run(stream, op)

    # -- the driver API ---------------------------------------------------------------

    def init(self, flags: int = 0) -> None:
        self._record("init")
        self.initialized = True

    def pagelocked_empty(self, shape: Any, dtype: Any, order: str = "C", mem_flags: int = 0) -> np.ndarray:
        self._needs_context("pagelocked_empty")
        self.unsafe("cuMemHostAlloc")
        shape = (shape,) if isinstance(shape, int) else tuple(int(d) for d in shape)
        dtype = np.dtype(dtype)
        self._record("pagelocked_empty", shape, dtype, mem_flags)
        return np.asarray(FakePagelockedHostAllocation(self, shape, dtype, mem_flags))

    def mem_alloc(self, nbytes: int) -> FakeDeviceAllocation:
        self._needs_context("mem_alloc")
        self.unsafe("cuMemAlloc")
        if int(nbytes) <= 0:
            raise FakeLogicError("cuMemAlloc failed: invalid value (size 0)")
        address = self.reserve(int(nbytes))
        self._record("mem_alloc", int(nbytes), address)
        return FakeDeviceAllocation(self, address, int(nbytes))

    def reserve(self, nbytes: int) -> int:
        """Device memory (zeroed) at a new address; what ``mem_alloc`` and TensorRT's own
        allocations take."""
        address = next(self._addresses)
        self._device_ranges[address] = nbytes
        self._backing[address] = np.zeros(nbytes, np.uint8)
        return address

    def _device(self, what: str, dev: Any, nbytes: int) -> int:
        address = int(dev)
        size = self._device_ranges.get(address)
        if size is None:
            raise AssertionError(f"{what}: {address:#x} is not device memory from mem_alloc")
        if nbytes > size:
            raise AssertionError(f"{what}: copies {nbytes} B into a {size} B allocation")
        return address

    @staticmethod
    def _pagelocked(what: str, host: Any) -> np.ndarray:
        # Page-locked is the memory's property: a contiguous view into it (the first rows of
        # a buffer) is page-locked too, which numpy shows as a base chain ending there.
        base = host.base if isinstance(host, np.ndarray) else None
        while isinstance(base, np.ndarray):
            base = base.base
        if not isinstance(base, FakePagelockedHostAllocation) or not host.flags.c_contiguous:
            raise AssertionError(
                f"{what}: the host buffer must be page-locked (from pagelocked_empty), "
                f"got {type(host).__name__} with base {type(getattr(host, 'base', None)).__name__}"
            )
        return host

    def memcpy_htod_async(self, dest: Any, src: np.ndarray, stream: Any = None) -> None:
        self._needs_context("memcpy_htod_async")
        src = self._pagelocked("memcpy_htod_async", src)
        address = self._device("memcpy_htod_async", dest, src.nbytes)
        if stream is None:
            raise AssertionError("memcpy_htod_async on the default stream: pass the slot's stream")
        self._record("memcpy_htod_async", address, stream.handle)

        def run() -> None:
            self.view(address, src.nbytes)[:] = _bytes(src)

        self.enqueue(stream.handle, "memcpy_htod_async", 0.0, run, (address,))

    def memcpy_dtoh_async(self, dest: np.ndarray, src: Any, stream: Any = None) -> None:
        self._needs_context("memcpy_dtoh_async")
        dest = self._pagelocked("memcpy_dtoh_async", dest)
        address = self._device("memcpy_dtoh_async", src, dest.nbytes)
        if stream is None:
            raise AssertionError("memcpy_dtoh_async on the default stream: pass the slot's stream")
        self._record("memcpy_dtoh_async", address, stream.handle)

        def run() -> None:
            _bytes(dest)[:] = self.view(address, dest.nbytes)

        self.enqueue(stream.handle, "memcpy_dtoh_async", 0.0, run, (address,))

    def memset_d8_async(self, dest: Any, data: int, size: int, stream: Any = None) -> None:
        """pycuda's memset_d8_async(dest, data, size, stream): cuMemsetD8Async."""
        self._needs_context("memset_d8_async")
        address = self._device("memset_d8_async", dest, int(size))
        if stream is None:
            raise AssertionError("memset_d8_async on the default stream: pass the slot's stream")
        self._record("memset_d8_async", address, stream.handle)

        def run() -> None:
            self.view(address, int(size))[:] = data

        self.enqueue(stream.handle, "memset_d8_async", 0.0, run, (address,))

    def memcpy_htod(self, dest: Any, src: Any) -> None:
        self._needs_context("memcpy_htod")
        self._legacy_stream("cuMemcpyHtoD")  # synchronous: on the legacy stream
        src = np.ascontiguousarray(src)
        address = self._device("memcpy_htod", dest, src.nbytes)
        self._record("memcpy_htod", address, src.nbytes)
        self.view(address, src.nbytes)[:] = _bytes(src)


def _bytes(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array, as a writable view."""
    return arr.reshape(-1).view(np.uint8)
