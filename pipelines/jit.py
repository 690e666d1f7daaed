"""Compiled per-frame kernels: numba where it loads, the numpy reference path where not.

The per-frame numeric work around a model (tracker, zones and lines, decode and NMS) is a
few hundred small numpy calls a frame; on a Jetson, where inference leaves the CPU, their
Python overhead is what bounds the cameras one device serves (docs/figures.md, "Cameras
per device"). Each of those parts keeps its numpy code as the tested reference and may
also have kernels: plain Python functions in numba's subset, compiled here with
``nogil`` (they run beside the capture threads) and checked against the reference by the
tests.

``load(name, functions, warm)`` compiles a part's kernels once per process and runs
``warm`` on them (numba compiles on the first call; nothing may compile on a live frame),
or returns None with the reason logged once: numba is off (``EDGE_AGENT_KERNELS=numpy``)
or absent, or a kernel fails to compile or to warm. The part then runs its numpy path.

The machine code is cached on disk, so a restart loads it in milliseconds instead of
compiling it again (seconds): under ``~/.cache/edge-agent/kernels`` (the service's
``HOME`` is /var/lib/edge-agent), or ``EDGE_AGENT_KERNEL_CACHE``. The folder is opened
as ``core.files.open_dir`` opens a private one (created 0700; a symlink, a folder others
can write to, or one above it that others could swap, is refused); refused or unwritable,
the kernels still compile, in memory only, and the log says why.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from edge_agent.core.files import open_dir

log = logging.getLogger(__name__)

MODES = ("auto", "numpy")
DEFAULT_CACHE = "~/.cache/edge-agent/kernels"

_lock = threading.Lock()
_loaded: dict[str, dict[str, Callable[..., Any]] | None] = {}
_state: dict[str, Any] = {}


def mode() -> str:
    """``auto`` (numba where it loads) or ``numpy`` (the reference path), from
    ``EDGE_AGENT_KERNELS``; anything else is an error naming the variable."""
    m = os.environ.get("EDGE_AGENT_KERNELS", "auto").strip().lower() or "auto"
    if m not in MODES:
        raise ValueError(f"EDGE_AGENT_KERNELS={m!r}: expected one of {', '.join(MODES)}")
    return m


def cache_dir() -> str:
    return os.path.expanduser(os.environ.get("EDGE_AGENT_KERNEL_CACHE", "") or DEFAULT_CACHE)


def _numba() -> tuple[Any, str]:
    """numba, set up (its disk cache checked), or (None, why not)."""
    if "numba" in _state:
        return _state["numba"], _state.get("why", "")
    numba, why = None, ""
    if mode() == "numpy":
        why = "EDGE_AGENT_KERNELS=numpy"
    else:
        try:
            import numba  # here only: half a second, and not every run needs it
        except Exception as e:  # ImportError, or numba refusing this numpy version
            numba, why = None, f"numba does not import ({type(e).__name__}: {e})"
    _state["numba"], _state["why"] = numba, why
    if numba is not None:
        _state["cache"] = _set_cache(numba)
        _state["version"] = numba.__version__
    return numba, why


def _set_cache(numba: Any) -> str:
    """Point numba's disk cache at the checked folder; "" (and a logged reason): none."""
    path = cache_dir()
    try:
        with open_dir(path, 0o700, create=True, private=True) as d:
            real = d.path
        if not os.access(real, os.W_OK | os.X_OK):
            raise PermissionError(f"{real}: not writable by this user")
    except (OSError, ValueError) as e:
        log.warning("kernels: no disk cache, they compile at every start (%s)", e)
        _state["cache_why"] = str(e)
        numba.config.CACHE_DIR = ""
        return ""
    numba.config.CACHE_DIR = real
    return real


def load(
    name: str, functions: Sequence[Callable[..., Any]], warm: Callable[[dict[str, Callable[..., Any]]], None]
) -> dict[str, Callable[..., Any]] | None:
    """``functions`` compiled (by name), warmed by ``warm``, once per process and ``name``;
    None: run the numpy path (the reason is logged once, and in ``state``)."""
    with _lock:
        if name in _loaded:
            return _loaded[name]
        numba, why = _numba()
        kernels = None
        if numba is not None:
            t0 = time.perf_counter()
            cache = bool(_state.get("cache"))
            if not _state.get("load_ms"):  # said once: the first part pays numba's own set-up too
                log.info(
                    "kernels: loading (a first start compiles them: tens of seconds; later starts read %s)",
                    _state.get("cache") or "nothing: no disk cache",
                )
            try:
                kernels = {f.__name__: numba.njit(cache=cache, nogil=True)(f) for f in functions}
                warm(kernels)
                for k in kernels.values():
                    # What warm compiled is all there is: a call with other types raises
                    # TypeError (the caller's numpy path) instead of compiling on a live frame.
                    if k.signatures:
                        k.disable_compile()
            except Exception as e:  # a typing error, a failed compile, a cache that broke
                kernels, why = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            else:
                ms = (time.perf_counter() - t0) * 1e3
                _state.setdefault("load_ms", {})[name] = round(ms, 1)
                log.info("kernels %s: numba %s, ready in %.0f ms", name, numba.__version__, ms)
        if kernels is None:
            _state.setdefault("fallback", {})[name] = why
            log.warning("kernels %s: the numpy path runs (%s)", name, why)
        _loaded[name] = kernels
        return kernels


def state() -> dict[str, Any]:
    """What ran: per part ``numba`` or ``numpy`` (with why), the version and the cache."""
    with _lock:
        parts = {n: ("numba" if k is not None else "numpy") for n, k in _loaded.items()}
        out: dict[str, Any] = {"mode": mode(), "parts": parts}
        for key in ("version", "cache", "cache_why", "fallback", "load_ms", "why"):
            if _state.get(key):
                out[key] = _state[key]
        return out


def reset() -> None:
    """Forget what was loaded (tests: another mode or cache folder for the next ``load``)."""
    with _lock:
        _loaded.clear()
        _state.clear()
