"""Fuzz target: recordings of a model's outputs (``pipelines/backends/recording.py``), the
emulated accelerator's input file, as a bad copy or a hostile author would leave one.
Inputs: any bytes, with and without the magic; a small valid recording with bytes
overwritten, cut short or padded; any JSON as its header; its header with one field
(also inside ``host`` and ``outputs``) set to any JSON value. The property: a recording
whose arrays hold exactly what its header declares, or ``RecordingError`` naming the file,
within the time and memory bound: a header that declares more than the file holds is
refused before anything is allocated for it."""

from __future__ import annotations

import functools
import json
import math
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.models.manifest import InputFormat
from edge_agent.pipelines.backends import recording
from edge_agent.pipelines.backends.recording import MAGIC, RecordingError

FMT = InputFormat(height=16, width=16, layout="NHWC", dtype="uint8", color="bgr")
OUTPUTS = [
    recording.OutputRecord("boxes", (2, 3), np.dtype(np.float32)),
    recording.OutputRecord("ids", (2,), np.dtype(np.int64)),
    recording.OutputRecord("mask", (5,), np.dtype(np.uint8)),
]
FRAMES = 3


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    """One folder for a target's examples (a function-scoped tmp_path is not per example)."""
    folder = Path(tempfile.mkdtemp(prefix="fuzz-recording-"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@functools.cache
def valid() -> bytes:
    """A small valid recording's bytes: 3 frames of 3 outputs."""
    rows = [
        (
            1000 + i,
            [np.full((2, 3), i, np.float32), np.array([i, -i], np.int64), np.arange(5, dtype=np.uint8) + i],
        )
        for i in range(FRAMES)
    ]
    folder = Path(tempfile.mkdtemp(prefix="fuzz-recording-valid-"))
    try:
        path = folder / "valid.rec"
        recording.write(str(path), "ab" * 32, "model.onnx", FMT, OUTPUTS, rows, "clip")
        return path.read_bytes()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def split(data: bytes) -> tuple[dict, bytes]:
    (length,) = struct.unpack("<I", data[8:12])
    return json.loads(data[12 : 12 + length]), data[12 + length :]


def framed(header: bytes, body: bytes) -> bytes:
    return MAGIC + struct.pack("<I", len(header)) + header + body


def read_back(workdir: Path, data: bytes) -> None:
    """Write ``data`` as a file and hold ``recording.read`` on it to the property."""
    path = workdir / "fuzz.rec"
    path.write_bytes(data)
    rec = bounded(lambda: recording.read(str(path)), RecordingError)
    if rec is None:
        return
    # Read: it holds exactly what it declares, and nothing more.
    per_frame = 8 + sum(math.prod(o.shape) * o.dtype.itemsize for o in rec.outputs)
    (length,) = struct.unpack("<I", data[8:12])
    assert len(data) == 12 + length + rec.frames * per_frame
    assert 1 <= rec.frames <= recording.MAX_FRAMES and 1 <= len(rec.outputs) <= recording.MAX_OUTPUTS
    assert rec.fingerprints.shape == (rec.frames,)
    for o, a in zip(rec.outputs, rec.arrays, strict=True):
        assert a.shape == (rec.frames, *o.shape) and a.dtype == o.dtype and not a.flags.writeable
    assert set(rec.host) == set(recording.host_key(FMT))
    header = json.loads(data[12 : 12 + length])
    assert type(header["version"]) is int and header["version"] == recording.VERSION, header["version"]


def refused_with_its_name(workdir: Path, data: bytes) -> None:
    """A file that is refused is refused by a message that starts with its path."""
    path = workdir / "fuzz.rec"
    path.write_bytes(data)
    try:
        recording.read(str(path))
    except RecordingError as e:
        assert str(e).startswith(f"{path}: "), str(e)


# -- strategies ----------------------------------------------------------------------------------

JSON = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from([0, 1, -1, 6, 7, 2**31, 2**63, 10**5, 10**5 + 1, 8192]),
        st.text(max_size=20),
        st.sampled_from(["float32", "int64", "uint8", "float64", "letterbox", "area", "boxes"]),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=15,
)

#: Where in the header a field gets another value.
KEYS = [
    "version",
    "frames",
    "model_sha256",
    "model",
    "source",
    "host",
    "outputs",
    "host.height",
    "host.width",
    "host.pad_value",
    "host.resize",
    "host.interpolation",
    "outputs.0",
    "outputs.0.name",
    "outputs.0.shape",
    "outputs.0.shape.0",
    "outputs.0.dtype",
    "outputs.1.shape",
    "outputs.2.name",
]


def with_field(header: dict, key: str, value: object) -> dict:
    h = json.loads(json.dumps(header))
    *path, last = key.split(".")
    node = h
    for k in path:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = value
    return h


@st.composite
def damaged(draw: st.DrawFn) -> bytes:
    """The valid recording with bytes overwritten, then maybe cut short or padded."""
    data = bytearray(valid())
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    end = draw(st.one_of(st.none(), st.integers(0, len(data) + 8)))
    if end is not None:
        data = data[:end] + b"\0" * max(0, end - len(data))
    return bytes(data)


#: A field's new value: any JSON, or one of the type the field has (so some files read).
VALUES = st.one_of(
    JSON,
    st.integers(-2, 12),
    st.sampled_from(["float32", "float16", "int32", "int64", "uint8", "ids", "mask", "m" * 300]),
    st.lists(st.integers(-1, 9), max_size=7),
)


def declared(header: object) -> int | None:
    """The body size ``header`` declares, when its fields are plain enough to say (and
    small enough to write), else None."""
    if not isinstance(header, dict) or not isinstance(header.get("outputs"), list):
        return None
    frames, size = header.get("frames"), 8
    for o in header["outputs"]:
        shape = o.get("shape") if isinstance(o, dict) else None
        dtype = o.get("dtype") if isinstance(o, dict) else None
        if not isinstance(shape, list) or not all(type(d) is int and 0 <= d <= 64 for d in shape):
            return None
        if dtype not in recording.DTYPES:
            return None
        size += math.prod(shape) * np.dtype(dtype).itemsize
    if type(frames) is not int or not 0 <= frames <= 64:
        return None
    return frames * size


@st.composite
def reheaded(draw: st.DrawFn) -> bytes:
    """The valid recording's body under one of its header's fields set to another value,
    or under any JSON at all; the body kept, cut, lengthened or sized to what the new
    header declares."""
    header, body = split(valid())
    if draw(st.integers(0, 3)):
        new = with_field(header, draw(st.sampled_from(KEYS)), draw(VALUES))
    else:
        new = draw(JSON)
    text = json.dumps(new).encode()
    tail = draw(st.sampled_from(["keep", "declared", "declared", "cut", "pad"]))
    if tail == "cut":
        body = body[: draw(st.integers(0, len(body)))]
    elif tail == "pad":
        body += b"\0" * draw(st.integers(1, 64))
    elif tail == "declared":
        size = declared(new)
        if size is not None:
            body = draw(st.binary(min_size=size, max_size=size)) if size <= 256 else bytes(size)
    return framed(text, body)


# -- targets ----------------------------------------------------------------------------------------


def test_the_valid_one_reads(workdir):
    read_back(workdir, valid())
    rec = recording.read(str(workdir / "fuzz.rec"))
    assert rec.frames == FRAMES and rec.fingerprints.tolist() == [1000, 1001, 1002]


@settings(max_examples=examples(100))
@given(data=st.one_of(st.binary(max_size=512), st.binary(max_size=512).map(MAGIC.__add__)))
@example(data=b"")
@example(data=MAGIC)
@example(data=MAGIC + b"\xff\xff\xff\xff")
@example(data=MAGIC + b"\x00\x00\x01\x00" + b"{" * 20)
def test_any_bytes_read_or_are_refused(workdir, data):
    read_back(workdir, data)


@settings(max_examples=examples(150))
@given(data=damaged())
def test_a_damaged_recording_reads_or_is_refused(workdir, data):
    read_back(workdir, data)
    refused_with_its_name(workdir, data)


@settings(max_examples=examples(150))
@given(data=reheaded())
@example(data=framed(b"[" * 60_000, b""))
@example(data=framed(b'{"a":' * 5_000 + b"1" + b"}" * 5_000, b""))
@example(data=framed(json.dumps(with_field(split(valid())[0], "version", True)).encode(), split(valid())[1]))
@example(data=framed(json.dumps(with_field(split(valid())[0], "frames", 100_000)).encode(), b""))
@example(data=framed(json.dumps(with_field(split(valid())[0], "outputs.0.shape", [4096] * 6)).encode(), b""))
@example(data=framed(b'{"version": 1, "frames": ' + b"9" * 5_000 + b"}", b""))  # past int's digit limit
def test_any_header_reads_or_is_refused(workdir, data):
    read_back(workdir, data)
    refused_with_its_name(workdir, data)
