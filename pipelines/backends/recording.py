"""A model's raw outputs recorded over a clip, for the emulated accelerator
(``backends/emulated.py``): one file, written by ``edge-agent record-outputs``.

The file::

    b"EDGEREC1"  uint32 LE header length  header (UTF-8 JSON)
    fingerprints: frames x uint64 LE
    each output in turn: frames x its per-frame shape, C order, little-endian

The header names the model (its SHA-256), the host input the frames were written in
(height, width, pad value, resize, interpolation: the fingerprint is over those bytes), the
outputs (name, per-frame shape, dtype) and the frame count. A frame's *fingerprint* is a
64-bit mix of ``SAMPLES`` bytes of its letterboxed uint8 input at fixed positions: the
emulated backend finds which recorded frame it was given by it, so decoding the replay
gives what the model gave on that very frame, whatever order the sources play them in.

A recording is input from outside: ``read`` checks the magic, bounds the header (64 KiB,
its JSON depth) and every count before it allocates, requires the file's size to be
exactly what the header declares (a truncated or padded file is refused), and checks the
model's hash and the host format against the caller's (a recording of another model is
refused). Errors are ``RecordingError`` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.core.files import FileRefused, atomic_write, open_regular
from edge_agent.models.decoders.base import MAX_OUTPUT_ELEMENTS
from edge_agent.models.manifest import InputFormat

MAGIC = b"EDGEREC1"
VERSION = 1
MAX_HEADER = 64 * 1024
MAX_FRAMES = 100_000
MAX_OUTPUTS = 16
MAX_DIMS = 6
#: Bytes of a recording held in memory at most (the replay reads it whole).
MAX_BYTES = 8 * 2**30
SAMPLES = 4096
DTYPES = ("float32", "float16", "int32", "int64", "uint8")
_PREFIX = struct.Struct("<8sI")


class RecordingError(ValueError):
    """A recording that cannot be used; the message names the file and why."""


@dataclass(frozen=True)
class OutputRecord:
    name: str
    shape: tuple[int, ...]  # per frame (no batch axis)
    dtype: np.dtype

    @property
    def frame_bytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def host_key(fmt: InputFormat) -> dict[str, Any]:
    """What of the host's format decides the bytes a fingerprint samples."""
    return {
        "height": fmt.height,
        "width": fmt.width,
        "pad_value": fmt.pad_value,
        "resize": fmt.resize,
        "interpolation": fmt.interpolation,
    }


class Fingerprint:
    """A frame's fingerprint from its letterboxed uint8 input (H, W, 3), with a scratch
    of its own: nothing is allocated per frame but the integer."""

    def __init__(self, height: int, width: int) -> None:
        size = height * width * 3
        rng = np.random.default_rng(20261206)  # fixed: the recorder and the replay agree
        self._at = np.sort(rng.choice(size, min(SAMPLES, size), replace=False)).astype(np.intp)
        self._bytes = np.zeros(SAMPLES, np.uint8)
        words = SAMPLES // 8
        self._words = self._bytes.view(np.uint64)[:words]
        # odd multipliers, one a word: a weighted sum mod 2**64 of the sampled words
        self._weights = (rng.integers(0, 2**63, words, dtype=np.uint64) << np.uint64(1)) | np.uint64(1)
        self._size = size

    def __call__(self, image: np.ndarray) -> int:
        flat = image.reshape(-1)
        if flat.size != self._size:
            raise RecordingError(f"a frame of {flat.size} bytes; the recording's input has {self._size}")
        np.take(flat, self._at, out=self._bytes[: len(self._at)])
        return int(np.dot(self._words, self._weights))


@dataclass
class Recording:
    """A recording read whole: per output an array (frames, *shape), read-only, and the
    frame index of each fingerprint."""

    path: str
    model_sha256: str
    model: str
    host: dict[str, Any]
    outputs: list[OutputRecord]
    arrays: list[np.ndarray]
    fingerprints: np.ndarray
    source: str

    @property
    def frames(self) -> int:
        return len(self.fingerprints)

    def index(self) -> dict[int, int]:
        """Fingerprint → the first recorded frame that has it (equal inputs, equal outputs)."""
        out: dict[int, int] = {}
        for i, f in enumerate(self.fingerprints.tolist()):
            out.setdefault(int(f), i)
        return out


def write(
    path: str,
    model_sha256: str,
    model: str,
    fmt: InputFormat,
    outputs: list[OutputRecord],
    frames: list[tuple[int, list[np.ndarray]]],
    source: str = "",
) -> int:
    """Write a recording of ``frames`` ((fingerprint, outputs of that frame)) to ``path``,
    created exclusively and never through a symlink (``core.files.atomic_write``); returns
    its size in bytes."""
    header = {
        "version": VERSION,
        "model_sha256": model_sha256,
        "model": model,
        "host": host_key(fmt),
        "frames": len(frames),
        "outputs": [{"name": o.name, "shape": list(o.shape), "dtype": o.dtype.name} for o in outputs],
        "source": source,
    }
    text = json.dumps(header).encode()
    parts = [_PREFIX.pack(MAGIC, len(text)), text]
    parts.append(np.array([f for f, _ in frames], "<u8").tobytes())
    for k, o in enumerate(outputs):
        for _, outs in frames:
            a = np.ascontiguousarray(outs[k], o.dtype.newbyteorder("<")).reshape(o.shape)
            parts.append(a.tobytes())
    data = b"".join(parts)
    atomic_write(path, data, mode=0o644)
    return len(data)


def read(path: str, model_sha256: str | None = None, fmt: InputFormat | None = None) -> Recording:
    """The recording at ``path``, checked (see the module's docstring); with
    ``model_sha256`` and ``fmt``, also that it was made of that model in that format."""
    f, size = _open(path)
    with f:
        rec = _read(f, path, size)
    if model_sha256 is not None and rec.model_sha256 != model_sha256:
        raise RecordingError(
            f"{path}: recorded from another model ({rec.model or '?'}, sha256 {rec.model_sha256[:12]}…;"
            f" this one is {model_sha256[:12]}…): record this model's outputs (edge-agent record-outputs)"
        )
    if fmt is not None and rec.host != host_key(fmt):
        raise RecordingError(
            f"{path}: recorded with host input {rec.host}, but this model takes {host_key(fmt)}"
        )
    return rec


def host_size(path: str) -> tuple[int, int]:
    """The host input (height, width) the recording at ``path`` was made in: its header
    alone is read, checked as ``read`` checks it."""
    f, size = _open(path)
    with f:
        host = _header(f, path, size)[0].host()
    return host["height"], host["width"]


def _open(path: str) -> tuple[Any, int]:
    """``path`` opened for reading, and its size; a regular file only (``core.files``)."""
    try:
        return open_regular(path)
    except FileRefused:
        raise RecordingError(f"{path}: not a regular file") from None
    except OSError as e:
        raise RecordingError(f"{path}: cannot open ({e.strerror})") from None


def _header(f: Any, path: str, size: int) -> tuple[_Header, int]:
    """The header, parsed within its bounds, and its length in bytes."""
    prefix = f.read(_PREFIX.size)
    if len(prefix) < _PREFIX.size or prefix[:8] != MAGIC:
        raise RecordingError(f"{path}: not a recording of model outputs (no {MAGIC.decode()} magic)")
    _, length = _PREFIX.unpack(prefix)
    if length > MAX_HEADER or length > size - _PREFIX.size:
        raise RecordingError(f"{path}: header of {length} bytes (at most {MAX_HEADER}, within the file)")
    try:
        header = json.loads(f.read(length).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise RecordingError(f"{path}: header is not JSON ({type(e).__name__})") from None
    return _Header(path, header), length


def _read(f: Any, path: str, size: int) -> Recording:
    h, length = _header(f, path, size)
    frames = h.int_field("frames", 1, MAX_FRAMES)
    outputs = h.outputs()
    per_frame = 8 + sum(o.frame_bytes for o in outputs)
    body = frames * per_frame
    if body > MAX_BYTES:
        raise RecordingError(
            f"{path}: declares {body:,} bytes of outputs, more than the {MAX_BYTES:,} it may hold"
        )
    expected = _PREFIX.size + length + body
    if size != expected:
        what = "truncated" if size < expected else "longer than its header says"
        raise RecordingError(f"{path}: {what} ({size:,} bytes; the header declares {expected:,})")
    fingerprints = _array(f, path, np.dtype("<u8"), (frames,))
    arrays = [_array(f, path, o.dtype.newbyteorder("<"), (frames, *o.shape)) for o in outputs]
    return Recording(
        path=path,
        model_sha256=h.text("model_sha256", 64),
        model=h.text("model", 256),
        host=h.host(),
        outputs=outputs,
        arrays=arrays,
        fingerprints=fingerprints,
        source=h.text("source", 4096),
    )


def _array(f: Any, path: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    n = math.prod(shape) * dtype.itemsize
    a = np.empty(shape, dtype.newbyteorder("="))
    view = memoryview(a.reshape(-1).view(np.uint8))
    got = f.readinto(view)
    if got != n:
        raise RecordingError(f"{path}: truncated while reading (changed while it was read?)")
    if not np.little_endian:  # the file is little-endian
        a.byteswap(inplace=True)
    a.flags.writeable = False  # replayed as the device's outputs: nothing writes them
    return a


class _Header:
    """The header's fields, each checked by type and bound before use."""

    def __init__(self, path: str, header: Any) -> None:
        if not isinstance(header, dict):
            raise RecordingError(f"{path}: header is not a JSON object")
        self.path, self.h = path, header
        v = header.get("version")
        if type(v) is not int or v != VERSION:  # not true, nor 1.0
            raise RecordingError(f"{path}: version {header.get('version')!r}; this agent reads {VERSION}")

    def _bad(self, key: str, why: str) -> RecordingError:
        return RecordingError(f"{self.path}: header {key}: {why}")

    def int_field(self, key: str, lo: int, hi: int, v: Any = None) -> int:
        v = self.h.get(key) if v is None else v
        if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
            raise self._bad(key, f"{v!r} is not an integer within {lo}..{hi}")
        return v

    def text(self, key: str, most: int) -> str:
        v = self.h.get(key, "")
        if not isinstance(v, str) or len(v) > most:
            raise self._bad(key, f"not a string of at most {most} characters")
        return v

    def host(self) -> dict[str, Any]:
        v = self.h.get("host")
        if not isinstance(v, dict) or set(v) != {"height", "width", "pad_value", "resize", "interpolation"}:
            raise self._bad("host", "needs exactly height, width, pad_value, resize, interpolation")
        for k in ("height", "width"):
            self.int_field(f"host.{k}", 1, 8192, v[k])
        self.int_field("host.pad_value", 0, 255, v["pad_value"])
        for k in ("resize", "interpolation"):
            if not isinstance(v[k], str) or len(v[k]) > 32:
                raise self._bad(f"host.{k}", "not a short string")
        return v

    def outputs(self) -> list[OutputRecord]:
        v = self.h.get("outputs")
        if not isinstance(v, list) or not 1 <= len(v) <= MAX_OUTPUTS:
            raise self._bad("outputs", f"a list of 1..{MAX_OUTPUTS} outputs is needed")
        out = []
        for i, o in enumerate(v):
            key = f"outputs[{i}]"
            if not isinstance(o, dict):
                raise self._bad(key, "not an object")
            name, shape, dtype = o.get("name"), o.get("shape"), o.get("dtype")
            if not isinstance(name, str) or not 0 < len(name) <= 256:
                raise self._bad(f"{key}.name", "not a name of 1..256 characters")
            if not isinstance(shape, list) or not 1 <= len(shape) <= MAX_DIMS:
                raise self._bad(f"{key}.shape", f"not a list of 1..{MAX_DIMS} sizes")
            dims = tuple(self.int_field(f"{key}.shape", 1, MAX_OUTPUT_ELEMENTS, d) for d in shape)
            if math.prod(dims) > MAX_OUTPUT_ELEMENTS:
                raise self._bad(f"{key}.shape", f"{dims}: more than {MAX_OUTPUT_ELEMENTS:,} values a frame")
            if dtype not in DTYPES:
                raise self._bad(f"{key}.dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
            out.append(OutputRecord(name, dims, np.dtype(dtype)))
        if len({o.name for o in out}) != len(out):
            raise self._bad("outputs", "a name twice")
        return out
