"""The engine cache: serialized TensorRT engines on disk, keyed by everything that makes
an engine invalid, written atomically, checked before use.

An engine only works with the TensorRT version and the device it was built for, and it
is only the right engine for one ONNX file, precision, DLA core, input shape and set of
builder options. All of these go into the key; a change of any of them is a cache miss
and a rebuild. Every engine has a sidecar (``.json``) with its key and the SHA-256 of its
bytes: an engine without a matching sidecar (a power cut mid-write, a truncated copy, a
stale file) is not loaded but rebuilt, and the reason is logged.

Writes go to a temporary file in the same directory, are flushed to disk and then
renamed over the final name, so a reader sees either the old file or the whole new one.
Nothing here imports TensorRT: it is plain file handling, tested as such.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from edge_agent.core.files import SafeDir, atomic_write, file_sha256, open_dir

log = logging.getLogger(__name__)

KEY_VERSION = 2  # bump when the key's fields or their meaning change (2: min_batch)


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine depends on. ``digest`` names it in the cache."""

    onnx_sha256: str
    tensorrt_version: str
    device: str  # GPU name and compute capability, plus the L4T release on a Jetson
    precision: str  # fp16 | int8 | fp32
    dla_core: int  # -1 for the GPU
    input_shape: tuple[int, ...]
    gpu_fallback: bool
    workspace_mib: int
    optimization_level: int
    calibration_sha256: str = ""  # int8: the calibration cache the engine was built with
    role: str = "model"  # model | preprocess
    min_batch: int = 0  # > 0: the batch axis runs min_batch..input_shape[0] (GPU); 0: fixed

    def digest(self) -> str:
        blob = json.dumps({"key_version": KEY_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def describe(self) -> str:
        where = f"DLA{self.dla_core}" if self.dla_core >= 0 else "GPU"
        shape = "x".join(str(d) for d in self.input_shape)
        if self.min_batch:
            shape = f"{self.min_batch}..{shape}"
        trt = f"TensorRT {self.tensorrt_version}"
        return f"{self.role} {self.precision} {where} {shape} {trt} on {self.device}"


class EngineCache:
    """Engines under one directory: ``<name>-<digest16>.engine`` with a ``.json`` sidecar."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.dir = Path(os.path.expanduser(str(directory)))

    def paths(self, name: str, key: EngineKey) -> tuple[Path, Path]:
        stem = f"{name}-{key.role}-{key.digest()[:16]}"
        return self.dir / f"{stem}.engine", self.dir / f"{stem}.json"

    def lookup(self, name: str, key: EngineKey) -> Path | None:
        """The engine file for ``key`` if it is there and intact, else None (reason logged).

        Raises UnsafePathError (an OSError) for a cache folder that another user owns or
        can write to, or with such a folder above it (``core.files.open_dir``, the rule
        ``store`` writes by): they could plant an engine and a sidecar that vouches for it.
        An engine or sidecar that is not a regular file of this user's (or root's) is not
        loaded but rebuilt: in a sticky folder of ours, anyone may add files."""
        engine, sidecar = self.paths(name, key)
        try:
            folder = open_dir(self.dir, create=False, private=False)
        except FileNotFoundError:
            folder = None
        if folder is None or not _exists(folder, engine.name):
            if folder is not None:
                folder.close()
            log.info("engine cache: no engine for %s", key.describe())
            return None
        with folder:
            reason = _not_ours(folder, engine.name) or _not_ours(folder, sidecar.name)
        reason = reason or self._invalid(engine, sidecar, key)
        if reason:
            log.warning("engine cache: rebuilding %s: %s", engine.name, reason)
            return None
        return engine

    def _invalid(self, engine: Path, sidecar: Path, key: EngineKey) -> str:
        # Read by path: the folder was checked, and only root or we may replace what is in it.
        try:
            meta = json.loads(sidecar.read_text())
        except FileNotFoundError:
            return "no sidecar (the write was interrupted)"
        except (OSError, ValueError) as e:
            return f"unreadable sidecar: {e}"
        if meta.get("key_digest") != key.digest():
            return "its key does not match (another TensorRT, device or build option)"
        size = engine.stat().st_size
        if size != meta.get("size"):
            return f"size {size} B, expected {meta.get('size')} B (truncated or replaced)"
        if file_sha256(engine) != meta.get("sha256"):
            return "checksum mismatch (corrupt)"
        return ""

    def store(self, name: str, key: EngineKey, data: bytes | memoryview) -> Path:
        """Write an engine and then its sidecar; returns the engine's path.

        The sidecar is written last, so an engine whose sidecar is missing was never
        completely stored and will be rebuilt.
        """
        engine, sidecar = self.paths(name, key)
        raw = bytes(data)
        with contextlib.suppress(OSError):
            sidecar.unlink()  # a stale sidecar must not vouch for the new bytes mid-write
        atomic_write(engine, raw)
        meta = {
            "key_digest": key.digest(),
            "key": {**asdict(key), "input_shape": list(key.input_shape)},
            "size": len(raw),
            "sha256": hashlib.sha256(raw).hexdigest(),
        }
        atomic_write(sidecar, json.dumps(meta, indent=2).encode())
        return engine

    def invalidate(self, name: str, key: EngineKey, reason: str) -> None:
        """Drop an engine that failed to deserialize, so the next lookup rebuilds it."""
        engine, sidecar = self.paths(name, key)
        log.warning("engine cache: discarding %s: %s", engine.name, reason)
        for p in (sidecar, engine):
            with contextlib.suppress(OSError):
                p.unlink()

    def timing_cache_path(self, key: EngineKey) -> Path:
        """One timing cache per TensorRT version and device: layer timings carry over
        between models and rebuilds, which cuts minutes off builds on a Nano."""
        tag = hashlib.sha256(f"{key.tensorrt_version}|{key.device}".encode()).hexdigest()[:16]
        return self.dir / f"timing-{tag}.cache"

    def calibration_cache_path(self, name: str, onnx_sha256: str, images_sha256: str) -> Path:
        return self.dir / f"{name}-calib-{onnx_sha256[:12]}-{images_sha256[:12]}.cache"


def _exists(folder: SafeDir, name: str) -> bool:
    try:
        os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _not_ours(folder: SafeDir, name: str) -> str:
    """Why ``name`` in ``folder`` is not a file to trust ("" when it is: a regular file of
    this user's or root's); a missing one is for ``_invalid`` to name."""
    try:
        st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
    except FileNotFoundError:
        return ""
    if not stat.S_ISREG(st.st_mode):
        return f"{name} is not a regular file"
    me = os.geteuid()
    if st.st_uid not in (me, 0):
        return f"{name} is owned by uid {st.st_uid}, not by this user (uid {me}): someone else put it there"
    return ""
