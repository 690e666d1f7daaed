"""The emulated accelerator (``backends/emulated.py``) and its recordings (``backends/recording.py``).

The key property: a recording of a model's outputs, replayed, decodes to exactly what
ONNX Runtime gave on each frame, in whatever order the frames come and however they are
batched. Real parts throughout: the bundled detector on ONNX Runtime records, frames of
the synthetic camera written as PNG files, the agent publishes on a real socket. A
recording is input from outside, so every way of breaking one is refused with a
message naming the file and what is wrong, and nothing hangs on a FIFO.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import struct
import threading
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import REPO, agent_command, free_endpoint, run_process, started, wait_until
from helpers import Subscriber, write_frames

from edge_agent.bench.record import record_outputs
from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError, load
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.files import UnsafePathError, file_sha256
from edge_agent.core.model_config import EmulatedConfig, ModelConfig, OnnxRuntimeConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import ImageFolderSourceConfig, SyntheticSourceConfig
from edge_agent.models.manifest import InputFormat, bundled_model_path
from edge_agent.models.testmodels import constant_detector, float_nchw_detector, yolov8_output
from edge_agent.pipelines.backends import recording
from edge_agent.pipelines.backends.base import BackendError
from edge_agent.pipelines.backends.emulated import DEVICE, EmulatedBackend
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.preprocess import Letterbox
from edge_agent.pipelines.profile import Profile

FRAMES = 10
SCHEMA = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())


class Clip:
    """A folder of frames and the bundled detector's recording over them."""

    def __init__(self, root: Path) -> None:
        self.folder = root / "frames"
        self.frames = write_frames(self.folder, FRAMES)
        self.recording = root / "bundled.rec"
        self.result = record_outputs(ModelConfig(), str(self.folder), str(self.recording), FRAMES)


@pytest.fixture(scope="module")
def clip(tmp_path_factory) -> Clip:
    return Clip(tmp_path_factory.mktemp("emulated"))


def decoded(model, image: np.ndarray, io) -> tuple[np.ndarray, ...]:
    """``model``'s detections of ``image`` as the frame path gets them (copied: a decoder
    may reuse its buffers)."""
    d = model.run_one(image, io, Letterbox())
    return tuple(None if a is None else np.array(a) for a in d)


def assert_same(got, want, what: str) -> None:
    for name, g, w in zip(("xyxy", "scores", "classes", "extra"), got, want):
        if w is None:
            assert g is None, f"{what}: {name} is {g}, ONNX Runtime gave none"
            continue
        assert g.dtype == w.dtype and np.array_equal(g, w), f"{what}: {name}\n{g}\n!= ONNX Runtime's\n{w}"


def replayed(model, frames: list[np.ndarray], seed: int) -> dict[int, tuple]:
    """Each frame's detections on ``model`` run as the pipeline runs it: a profile's frame
    slots (warmed up and prepared), the frames shuffled and batched in ones to fours
    (``Profile.infer``, so several frames go through ``infer_slots``: the batch sets are
    read-only, a copy into one would fail)."""
    profile = Profile("emulated", model)
    pool = profile.pool("cam0")
    profile.prepare_batches(4)
    profile.prepare_slots()
    order = list(range(len(frames)))
    random.Random(seed).shuffle(order)
    out: dict[int, tuple] = {}
    sizes = [1, 3, 2, 4]
    while order:
        batch, order = order[: sizes[0]], order[sizes[0] :]
        sizes = sizes[1:] + sizes[:1]
        slots = pool.slots[: len(batch)]
        for i, slot in zip(batch, slots):
            model.preprocessor(frames[i], slot.tensor, slot.geo)
        profile.infer(slots)
        for i, slot in zip(batch, slots):
            d = model.decode(slot.io.outputs, model.params)
            out[i] = tuple(None if a is None else np.array(a) for a in d)
    return out


# -- the replay decodes to ONNX Runtime's detections -------------------------------------------


def test_a_replay_decodes_exactly_what_onnx_runtime_gave_on_each_frame(clip):
    assert clip.result["frames"] == FRAMES and clip.result["distinct_frames"] == FRAMES
    assert clip.result["model"] == bundled_model_path()
    with load_model(ModelConfig(), OnnxRuntimeConfig()) as ort:
        io = ort.backend.allocate(1)
        want = [decoded(ort, image, io) for image in clip.frames]
    assert sum(len(w[0]) > 0 for w in want) >= FRAMES - 1, "the bundled detector finds the synthetic shapes"
    with load_model(ModelConfig(), EmulatedConfig(recording=str(clip.recording), device_ms=0)) as emu:
        got = replayed(emu, clip.frames, seed=3)
        info = emu.backend.describe()
    for i in range(FRAMES):
        assert_same(got[i], want[i], f"frame {i}")
    assert info["unmatched_frames"] == 0, info


def test_a_float_model_replays_through_the_device_format_too(tmp_path, clip):
    # An Ultralytics-style float32 NCHW model: the host writes uint8 NHWC frames (the
    # device's preprocessing is emulated), its fingerprint over those same bytes.
    model_cfg = ModelConfig(path=str(float_nchw_detector(str(tmp_path / "float"))), cache_dir=str(tmp_path))
    frames = clip.frames[:4]
    rec = tmp_path / "float.rec"
    record_outputs(model_cfg, str(clip.folder), str(rec), len(frames))
    with load_model(model_cfg, OnnxRuntimeConfig()) as ort:
        io = ort.backend.allocate(1)
        want = [decoded(ort, image, io) for image in frames]
    with load_model(model_cfg, EmulatedConfig(recording=str(rec), device_ms=0)) as emu:
        assert emu.input_name == "frame" and emu.preprocessor.fmt.dtype == "uint8"
        got = replayed(emu, frames, seed=5)
        assert emu.backend.describe()["unmatched_frames"] == 0
    assert any(len(w[0]) for w in want)
    for i in range(len(frames)):
        assert_same(got[i], want[i], f"frame {i}")


# -- the backend on its own: batches, device time, unmatched frames ------------------------------

SIZE = 32
FMT = InputFormat(height=SIZE, width=SIZE, layout="NHWC", dtype="uint8", color="bgr")
OUTS = [
    recording.OutputRecord("boxes", (2, 3), np.dtype(np.float32)),
    recording.OutputRecord("ids", (4,), np.dtype(np.int32)),
]


def own_outputs(i: int) -> list[np.ndarray]:
    """Recorded frame ``i``'s outputs: values no other frame has."""
    return [np.full((2, 3), 10.0 * i + 0.5, np.float32), np.arange(4, dtype=np.int32) + 100 * i]


class Small:
    """A small real model, a recording of ``count`` distinct frames for it, and the frames."""

    def __init__(self, root: Path, count: int = 6) -> None:
        out = yolov8_output([(16, 16, 8, 8)], [0], [0.9], 4, (SIZE // 8) ** 2 + (SIZE // 16) ** 2)
        self.model = constant_detector(str(root / "small.onnx"), out, height=SIZE, width=SIZE)
        rng = np.random.default_rng(7)
        self.frames = [rng.integers(0, 256, (SIZE, SIZE, 3), np.uint8) for _ in range(count)]
        finger = recording.Fingerprint(SIZE, SIZE)
        rows = [(finger(f), own_outputs(i)) for i, f in enumerate(self.frames)]
        self.recording = root / "small.rec"
        recording.write(str(self.recording), file_sha256(self.model), "small.onnx", FMT, OUTS, rows, "test")

    def backend(self, **kw) -> EmulatedBackend:
        kw.setdefault("device_ms", 0.0)
        b = EmulatedBackend(EmulatedConfig(recording=str(self.recording), **kw))
        b.load(self.model, FMT)
        return b


@pytest.fixture
def small(tmp_path) -> Small:
    return Small(tmp_path)


def slot_with(backend: EmulatedBackend, frame: np.ndarray):
    io = backend.allocate(1)
    io.inputs["images"][0] = frame
    return io


def assert_outputs_of(io, i: int, what: str = "") -> None:
    want = own_outputs(i)
    assert len(io.outputs) == len(want)
    for got, w in zip(io.outputs, want):
        assert got.shape == (1, *w.shape) and got.dtype == w.dtype
        assert np.array_equal(got[0], w), f"{what} got the outputs of another frame: {got[0]} for frame {i}"
        assert not got.flags.writeable, "the replayed outputs are the recording's: read-only"


def test_a_batch_of_slots_gets_each_frames_own_outputs_and_one_device_wait(small):
    backend = small.backend(device_ms=2.0, device_ms_per_frame=0.5, max_batch=8)
    assert backend.inputs[0].name == "images", "a uint8 model's own input takes the host's frames"
    backend.prepare(backend.allocate(1))
    order = [4, 0, 5, 2]
    ios = [slot_with(backend, small.frames[i]) for i in order]
    assert backend.infer_slots(ios) is True
    for i, io in zip(order, ios):
        assert_outputs_of(io, i, f"slot of frame {i}")
        assert backend.timings(io) == {"device_compute_ms": pytest.approx(2.0 + 0.5 * 3)}
    # A single frame: the device's time for one.
    one = slot_with(backend, small.frames[3])
    backend.infer(one)
    assert_outputs_of(one, 3)
    assert backend.timings(one) == {"device_compute_ms": pytest.approx(2.0)}
    assert backend.describe()["unmatched_frames"] == 0


def test_a_batch_set_is_read_only_zeros_that_no_frame_goes_through(small):
    # Batches run from the frames' own slots (infer_slots): the set a profile allocates per
    # batch size only times the warm-up, so a copy into it would fail (``replayed`` relies
    # on that: its batches cannot have gone through one).
    backend = small.backend(max_batch=4)
    assert backend.batch_axis() == (4, False)
    batch = backend.allocate(3)
    assert batch.inputs["images"].shape == (3, SIZE, SIZE, 3)
    assert not batch.inputs["images"].flags.writeable, "a batch set takes no frames"
    assert [o.shape for o in batch.outputs] == [(3, 2, 3), (3, 4)]


def test_an_unmatched_frame_is_counted_after_prepare_and_gets_recorded_outputs_in_turn(small, caplog):
    backend = small.backend()
    blank = backend.allocate(1)
    # Warm-ups (blank frames, before prepare) are no frames of the clip: not counted.
    for _ in range(3):
        backend.infer(blank)
    assert backend.describe()["unmatched_frames"] == 0
    assert_outputs_of(blank, 0, "a warm-up")
    backend.prepare(blank)
    strange = [np.full((SIZE, SIZE, 3), v, np.uint8) for v in (1, 2, 3)]
    with caplog.at_level(logging.WARNING, logger="edge_agent.pipelines.backends.emulated"):
        for k, frame in enumerate(strange):
            io = slot_with(backend, frame)
            backend.infer(io)
            assert_outputs_of(io, k, f"unmatched frame {k}")
        # A recorded frame between them is still itself, and not counted.
        known = slot_with(backend, small.frames[5])
        backend.infer(known)
        assert_outputs_of(known, 5)
        ios = [slot_with(backend, f) for f in (strange[0], small.frames[1])]
        backend.infer_slots(ios)
        assert_outputs_of(ios[0], 3, "the fourth unmatched frame")
        assert_outputs_of(ios[1], 1)
    assert backend.describe()["unmatched_frames"] == 4
    warned = [r for r in caplog.records if "unmatched_frames" in r.getMessage()]
    assert len(warned) == 1, "the first unmatched frame is warned about, once"
    assert str(small.recording) in warned[0].getMessage()


def test_describe_names_the_emulated_accelerator(small):
    backend = small.backend(device_ms=3.0, device_ms_per_frame=0.25)
    d = backend.describe()
    assert d["emulated"] is True and d["backend"] == "emulated"
    assert d["device"] == DEVICE and "emulated" in d["device"] and "not a device" in d["device"]
    assert d["recording"] == str(small.recording)
    assert (d["recorded_frames"], d["recorded_model"]) == (6, "small.onnx")
    assert (d["device_ms"], d["device_ms_per_frame"]) == (3.0, 0.25)


def test_loading_warns_that_results_are_the_recordings(small, caplog):
    with caplog.at_level(logging.WARNING, logger="edge_agent.pipelines.backends.emulated"):
        small.backend()
    [record] = [r for r in caplog.records if "EMULATED" in r.getMessage()]
    assert str(small.recording) in record.getMessage() and "measurement only" in record.getMessage()


def test_a_fingerprint_is_of_one_frame_size():
    finger = recording.Fingerprint(SIZE, SIZE)
    with pytest.raises(
        recording.RecordingError, match=rf"a frame of 12 bytes; the recording's input has {SIZE * SIZE * 3}"
    ):
        finger(np.zeros((2, 2, 3), np.uint8))
    frame = np.random.default_rng(1).integers(0, 256, (SIZE, SIZE, 3), np.uint8)
    assert finger(frame) == recording.Fingerprint(SIZE, SIZE)(frame.copy()), "recorder and replay agree"


# -- an agent on it ----------------------------------------------------------------------------


def test_an_agent_on_it_says_so_in_every_heartbeat_and_its_messages_validate(clip, tmp_path):
    endpoint = free_endpoint()
    backend = EmulatedConfig(
        recording=str(clip.recording), device_ms=1.0, device_ms_per_frame=0.5, max_batch=2
    )
    cfg = AgentConfig(
        device_id="emulated",
        source=ImageFolderSourceConfig(path=str(clip.folder), name="cam0"),
        model=ModelConfig(),
        backend=backend,
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1),
        metrics=MetricsConfig(enabled=False),
    )
    sub = Subscriber(endpoint, keep_all=True)
    with started(cfg, sub, clean=True) as agent:
        wait_until(
            lambda: (
                sum(t == "health" for t in sub.topics) >= 2 and sum(t == "det.cam0" for t in sub.topics) >= 3
            ),
            60,
            message="two heartbeats and three results",
        )
        described = agent.describe()
    assert described["emulated"] is True and described["device"] == DEVICE
    assert described["unmatched_frames"] == 0, "every frame of the folder is in the recording"
    validator = jsonschema.Draft202012Validator(SCHEMA)
    beats = [m for t, m in zip(sub.topics, sub.messages) if t == "health"]
    for topic, msg in zip(sub.topics, sub.messages):
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(msg)]
        assert not errors, f"{topic}: {errors}"
    want = {
        "recording": str(clip.recording),
        "recorded_model": "model.onnx",
        "device_ms": 1.0,
        "device_ms_per_frame": 0.5,
    }
    assert beats and all(m["emulated"] == want for m in beats), [m.get("emulated") for m in beats]
    # The schema holds the field to its shape.
    bad = {**beats[0], "emulated": {**want, "device_ms": -1}}
    assert not validator.is_valid(bad)


def test_an_agent_on_a_real_backend_has_no_emulated_field(const_model, endpoint):
    sub = Subscriber(endpoint, "health")
    cfg = AgentConfig(
        device_id="real",
        source=SyntheticSourceConfig(fps=50, seed=1, name="cam0"),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1),
        metrics=MetricsConfig(enabled=False),
    )
    with started(cfg, sub, clean=True) as agent:
        sub.wait_for(1)
        assert "emulated" not in agent.describe()
    assert all("emulated" not in m for m in sub.messages)


# -- configuration -----------------------------------------------------------------------------


def test_config_emulated_without_a_recording_names_backend_recording():
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, "backend:\n  type: emulated\n  device_ms: 4\n", "agent.yaml")
    [p] = info.value.problems
    assert (p.file, p.path, p.line) == ("agent.yaml", "backend.recording", 2), str(p)
    assert "recording" in p.message


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ("device_ms: -1", "backend.device_ms"),
        ("device_ms_per_frame: 10001", "backend.device_ms_per_frame"),
        ("max_batch: 65", "backend.max_batch"),
        ("recorded: x.rec", "backend.recorded"),
    ],
)
def test_config_emulated_bounds_name_their_key(line, path):
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, f"backend:\n  type: emulated\n  recording: a.rec\n  {line}\n", "agent.yaml")
    assert [p.path for p in info.value.problems] == [path], [str(p) for p in info.value.problems]


def test_config_emulated_loads():
    cfg = load(
        AgentConfig,
        "backend:\n  type: emulated\n  recording: /r/a.rec\n  device_ms: 7.5\n  max_batch: 4\n",
        "agent.yaml",
    )
    assert cfg.backend == EmulatedConfig(recording="/r/a.rec", device_ms=7.5, max_batch=4)


# -- hostile recordings --------------------------------------------------------------------------


@pytest.fixture
def valid(small) -> bytes:
    return small.recording.read_bytes()


def parts(data: bytes) -> tuple[dict, bytes]:
    """A recording's header (parsed) and what follows it."""
    (length,) = struct.unpack("<I", data[8:12])
    return json.loads(data[12 : 12 + length]), data[12 + length :]


def forge(path: Path, header: dict | bytes, body: bytes = b"", magic: bytes = recording.MAGIC) -> Path:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(magic + struct.pack("<I", len(text)) + text + body)
    return path


def refused(path: Path, pattern: str, **kw) -> str:
    """``recording.read(path)`` raises RecordingError, its message the path then ``pattern``."""
    with pytest.raises(recording.RecordingError) as info:
        recording.read(str(path), **kw)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    assert re.search(pattern, message), f"{message!r} does not say {pattern!r}"
    return message


def test_a_valid_recording_reads_back_as_written(small):
    rec = recording.read(str(small.recording), file_sha256(small.model), FMT)
    assert rec.frames == 6 and rec.model == "small.onnx" and rec.source == "test"
    assert rec.outputs == OUTS
    for i in range(6):
        for a, w in zip(rec.arrays, own_outputs(i)):
            assert np.array_equal(a[i], w)
    finger = recording.Fingerprint(SIZE, SIZE)
    assert rec.index() == {finger(f): i for i, f in enumerate(small.frames)}


def test_truncated_anywhere_is_refused(tmp_path, valid):
    (length,) = struct.unpack("<I", valid[8:12])
    fingerprints = 12 + length
    outputs = fingerprints + 6 * 8
    cuts = {
        "empty": 0,
        "in the magic": 5,
        "in the header length": 10,
        "in the header": 12 + length // 2,
        "at the header's end": fingerprints,
        "in the fingerprints": fingerprints + 13,
        "in the outputs": outputs + 7,
        "between outputs": outputs + 6 * 24,
        "the last byte": len(valid) - 1,
    }
    for where, at in cuts.items():
        path = tmp_path / f"cut-{at}.rec"
        path.write_bytes(valid[:at])
        pattern = "no EDGEREC1 magic" if at < 12 else "header of|not JSON|truncated"
        message = refused(path, pattern)
        if at >= fingerprints:
            assert f"truncated ({at:,} bytes; the header declares {len(valid):,})" in message, (
                where,
                message,
            )


def forge_raw(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_padded_is_refused(tmp_path, valid):
    refused(forge_raw(tmp_path / "padded.rec", valid + b"\0"), r"longer than its header says")


def test_wrong_magic_is_refused(tmp_path, valid):
    refused(forge_raw(tmp_path / "magic.rec", b"EDGEREC2" + valid[8:]), r"no EDGEREC1 magic")
    refused(forge_raw(tmp_path / "png.rec", b"\x89PNG\r\n\x1a\n" + valid[8:]), r"no EDGEREC1 magic")


def test_header_length_past_the_file_or_the_bound_is_refused(tmp_path, valid):
    header, body = parts(valid)
    text = json.dumps(header).encode()
    past = recording.MAGIC + struct.pack("<I", len(text) + len(body) + 1) + text + body
    refused(forge_raw(tmp_path / "past.rec", past), r"header of \d+ bytes \(at most 65536, within the file\)")
    big = recording.MAGIC + struct.pack("<I", 2**32 - 1) + text + body
    refused(forge_raw(tmp_path / "huge.rec", big), r"header of 4294967295 bytes")
    # A header over 64 KiB, though the file holds it.
    long = dict(header, source="x" * 70_000)
    refused(forge(tmp_path / "long.rec", long, body), r"header of \d+ bytes \(at most 65536")


@pytest.mark.parametrize(
    ("text", "pattern"),
    [
        pytest.param(b"{not json", r"header is not JSON \(JSONDecodeError\)", id="not-json"),
        pytest.param(b"\xff\xfe{}", r"header is not JSON \(UnicodeDecodeError\)", id="not-utf8"),
        pytest.param(b"[" * 60_000, r"header is not JSON \(RecursionError\)", id="deep-list"),
        pytest.param(
            b'{"a":' * 8_000 + b"1" + b"}" * 8_000, r"header is not JSON \(RecursionError\)", id="deep"
        ),
        pytest.param(b"", r"header is not JSON", id="empty"),
        pytest.param(b"[1, 2]", r"header is not a JSON object", id="list"),
        pytest.param(b'"text"', r"header is not a JSON object", id="string"),
        pytest.param(b"NaN", r"header is not a JSON object", id="nan"),
    ],
)
def test_a_header_that_is_no_json_object_is_refused(tmp_path, text, pattern):
    refused(forge(tmp_path / "h.rec", text, b"\0" * 64), pattern)


def _set(header: dict, key: str, value) -> dict:
    """``header`` with ``key`` (dotted: ``outputs.0.shape``) set, or removed for ``...``."""
    h = json.loads(json.dumps(header))
    *path, last = key.split(".")
    node = h
    for k in path:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last_key = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[last_key]
    else:
        node[last_key] = value
    return h


OUTPUT = {"name": "boxes", "shape": [2, 3], "dtype": "float32"}

BAD_HEADERS = [
    ("version", 2, r"version 2; this agent reads 1"),
    ("version", ..., r"version None; this agent reads 1"),
    ("version", "1", r"version '1'"),
    ("version", True, r"version True"),
    ("version", 1.0, r"version 1\.0"),
    ("frames", 0, r"header frames: 0 is not an integer within 1\.\.100000"),
    ("frames", -3, r"header frames: -3 is not"),
    ("frames", 100_001, r"header frames: 100001 is not"),
    ("frames", 10**40, r"header frames: 1{1}0{40} is not"),
    ("frames", True, r"header frames: True is not"),
    ("frames", 6.0, r"header frames: 6\.0 is not"),
    ("frames", "6", r"header frames: '6' is not"),
    ("frames", ..., r"header frames: None is not"),
    ("outputs", [], r"header outputs: a list of 1\.\.16 outputs"),
    ("outputs", [OUTPUT] * 17, r"header outputs: a list of 1\.\.16 outputs"),
    ("outputs", {"boxes": OUTPUT}, r"header outputs: a list"),
    ("outputs", ..., r"header outputs: a list"),
    ("outputs.0", [1, 2], r"header outputs\[0\]: not an object"),
    ("outputs.1", "ids", r"header outputs\[1\]: not an object"),
    ("outputs.0.dtype", "float64", r"header outputs\[0\]\.dtype: 'float64' is not one of float32"),
    ("outputs.0.dtype", "object", r"outputs\[0\]\.dtype: 'object'"),
    ("outputs.0.dtype", "<f4", r"outputs\[0\]\.dtype: '<f4'"),
    ("outputs.0.dtype", ["float32"], r"outputs\[0\]\.dtype"),
    ("outputs.0.dtype", ..., r"outputs\[0\]\.dtype: None"),
    ("outputs.0.shape", [], r"outputs\[0\]\.shape: not a list of 1\.\.6 sizes"),
    ("outputs.0.shape", [1] * 7, r"outputs\[0\]\.shape: not a list of 1\.\.6 sizes"),
    ("outputs.0.shape", "2x3", r"outputs\[0\]\.shape: not a list"),
    ("outputs.0.shape", [2, 0], r"outputs\[0\]\.shape: 0 is not an integer within 1\.\."),
    ("outputs.0.shape", [-2, 3], r"outputs\[0\]\.shape: -2 is not an integer"),
    ("outputs.0.shape", [2**62, 3], r"outputs\[0\]\.shape: \d+ is not an integer"),
    ("outputs.0.shape", [True, 3], r"outputs\[0\]\.shape: True is not"),
    ("outputs.0.shape", [2.0, 3], r"outputs\[0\]\.shape: 2\.0 is not"),
    ("outputs.0.shape", [None, 3], r"outputs\[0\]\.shape: None is not"),
    ("outputs.0.shape", [100_000, 100_000], r"outputs\[0\]\.shape: \(100000, 100000\): more than"),
    ("outputs.0.name", "", r"outputs\[0\]\.name: not a name of 1\.\.256"),
    ("outputs.0.name", "n" * 257, r"outputs\[0\]\.name: not a name"),
    ("outputs.0.name", 5, r"outputs\[0\]\.name: not a name"),
    ("outputs.1.name", "boxes", r"header outputs: a name twice"),
    ("host", ..., r"header host: needs exactly height, width"),
    ("host.extra", 1, r"header host: needs exactly"),
    ("host.resize", ..., r"header host: needs exactly"),
    ("host", [32, 32], r"header host: needs exactly"),
    ("host.height", 0, r"header host\.height: 0 is not an integer within 1\.\.8192"),
    ("host.width", 9000, r"header host\.width: 9000 is not"),
    ("host.width", "32", r"header host\.width: '32' is not"),
    ("host.pad_value", 256, r"header host\.pad_value: 256 is not an integer within 0\.\.255"),
    ("host.resize", 1, r"header host\.resize: not a short string"),
    ("host.interpolation", "x" * 33, r"header host\.interpolation: not a short string"),
    ("model_sha256", 12, r"header model_sha256: not a string of at most 64"),
    ("model_sha256", "a" * 65, r"header model_sha256: not a string"),
    ("model", ["m"], r"header model: not a string of at most 256"),
    ("source", "s" * 4097, r"header source: not a string of at most 4096"),
]


@pytest.mark.parametrize(
    ("key", "value", "pattern"), BAD_HEADERS, ids=[f"{k}={v!r}"[:40] for k, v, _ in BAD_HEADERS]
)
def test_a_bad_header_field_is_refused_by_its_key(tmp_path, valid, key, value, pattern):
    header, body = parts(valid)
    refused(forge(tmp_path / "bad.rec", _set(header, key, value), body), pattern)


def test_declared_sizes_are_bounded_before_anything_is_allocated(tmp_path, valid):
    header, _ = parts(valid)
    # Within every per-field bound, but 100,000 frames of 4 MB each: refused by the total,
    # before the file's size is even compared (the body here is empty).
    huge = _set(
        _set(header, "frames", 100_000), "outputs", [{"name": "a", "shape": [1_000_000], "dtype": "float32"}]
    )
    refused(
        forge(tmp_path / "huge.rec", huge),
        r"declares 400,000,800,000 bytes of outputs, more than the 8,589,934,592",
    )
    # Within the total but not what the file holds.
    many = _set(header, "frames", 1000)
    refused(
        forge(tmp_path / "many.rec", many, parts(valid)[1]),
        r"truncated \([\d,]+ bytes; the header declares [\d,]+\)",
    )


def test_a_recording_for_another_host_format_is_refused(small):
    other = InputFormat(height=SIZE, width=SIZE, layout="NHWC", dtype="uint8", color="bgr", pad_value=0)
    refused(
        small.recording,
        r"recorded with host input .*'pad_value': 114.* this model takes .*'pad_value': 0",
        fmt=other,
    )
    # Through the backend, a model taking another size: its message names the config key.
    backend = EmulatedBackend(EmulatedConfig(recording=str(small.recording)))
    with pytest.raises(
        BackendError, match=rf"^backend\.recording: {re.escape(str(small.recording))}: recorded with host"
    ):
        backend.load(small.model, InputFormat(height=64, width=64, layout="NHWC", dtype="uint8", color="bgr"))


def test_a_recording_of_another_model_is_refused(clip, const_model):
    refused(
        clip.recording,
        r"recorded from another model \(model\.onnx, sha256 [0-9a-f]{12}…; this one is",
        model_sha256="0" * 64,
    )
    with pytest.raises(BackendError) as info:
        load_model(ModelConfig(path=str(const_model)), EmulatedConfig(recording=str(clip.recording)))
    message = str(info.value)
    assert message.startswith(f"backend.recording: {clip.recording}: recorded from another model"), message
    assert "edge-agent record-outputs" in message


def test_a_missing_model_file_is_a_backend_error(small, tmp_path):
    backend = EmulatedBackend(EmulatedConfig(recording=str(small.recording)))
    with pytest.raises(BackendError, match=r"cannot read the model"):
        backend.load(str(tmp_path / "gone.onnx"), FMT)


def read_in_thread(path: str, timeout_s: float = 10.0, unblock=None):
    """``recording.read(path)`` on another thread: its result or exception, and an
    AssertionError when it has not returned within ``timeout_s`` (``unblock`` is called
    first, so that a hung reader can end)."""
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = recording.read(path)
        except BaseException as e:
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        if unblock:
            unblock()
        t.join(timeout_s)
        raise AssertionError(f"recording.read({path}) did not return within {timeout_s} s")
    return box


def test_a_folder_a_fifo_or_a_device_is_refused_without_hanging(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    fifo = tmp_path / "fifo.rec"
    os.mkfifo(fifo)

    def open_writer() -> None:  # a writer lets a reader blocked in open() go on
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)

    for path in (folder, fifo, Path("/dev/zero")):
        box = read_in_thread(str(path), unblock=open_writer if path == fifo else None)
        error = box.get("error")
        assert isinstance(error, recording.RecordingError), box
        assert str(error) == f"{path}: not a regular file"


def test_a_missing_recording_is_refused(tmp_path):
    refused(tmp_path / "none.rec", r"cannot open \(No such file or directory\)")


def test_a_recording_read_through_a_symlink_is_the_file_it_names(small, tmp_path):
    # A recording is an input file (as a model is): a link to one reads as that file.
    link = tmp_path / "link.rec"
    link.symlink_to(small.recording)
    rec = recording.read(str(link), file_sha256(small.model), FMT)
    assert rec.path == str(link) and rec.frames == 6
    assert np.array_equal(rec.fingerprints, recording.read(str(small.recording)).fingerprints)
    # A dangling one: cannot open.
    dangling = tmp_path / "dangling.rec"
    dangling.symlink_to(tmp_path / "gone.rec")
    refused(dangling, r"cannot open \(No such file or directory\)")


def test_writing_replaces_a_symlink_and_never_writes_through_one(small, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    link = tmp_path / "out.rec"
    link.symlink_to(target)
    recording.write(str(link), "0" * 64, "m", FMT, OUTS, [(1, own_outputs(0))])
    assert target.read_bytes() == b"keep" and not link.is_symlink()
    assert recording.read(str(link)).frames == 1
    # Nor into a symlinked folder.
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePathError):
        recording.write(str(tmp_path / "linked" / "a.rec"), "0" * 64, "m", FMT, OUTS, [(1, own_outputs(0))])
    assert not list((tmp_path / "real").iterdir())


def test_a_recording_holds_exactly_its_declared_bytes(small):
    data = small.recording.read_bytes()
    header, body = parts(data)
    per_frame = 8 + sum(math.prod(o["shape"]) * np.dtype(o["dtype"]).itemsize for o in header["outputs"])
    assert len(body) == header["frames"] * per_frame
    assert header["version"] == 1 and header["host"] == recording.host_key(FMT)


# -- the command -------------------------------------------------------------------------------


def test_record_outputs_command_records_a_folder(clip, tmp_path):
    out = tmp_path / "cli.rec"
    r = run_process(
        agent_command("record-outputs", "--source", str(clip.folder), "--frames", "3", "--out", str(out)), 120
    )
    assert r.returncode == 0, r.stderr
    model = bundled_model_path()
    into = re.escape(str(out))
    line = rf"recorded 3 frames \(3 distinct\) of {re.escape(model)} into {into} \(\d+\.\d MiB\)\n"
    assert re.fullmatch(line, r.stdout), r.stdout
    rec = recording.read(str(out), file_sha256(model))
    assert rec.frames == 3 and rec.source == str(clip.folder)
    whole = recording.read(str(clip.recording))
    assert np.array_equal(rec.fingerprints, whole.fingerprints[:3])
    for a, b in zip(rec.arrays, whole.arrays):
        assert np.array_equal(a, b[:3]), "the same frames give the same outputs"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(
            ("--source", "{tmp}/none"),
            r"record-outputs: {tmp}/none: no such video file or image folder",
            id="no-source",
        ),
        pytest.param(
            ("--source", "{tmp}", "--frames", "0"),
            r"record-outputs: --frames must be within 1\.\.100000",
            id="frames-0",
        ),
    ],
)
def test_record_outputs_command_refuses_a_bad_source_with_exit_2(tmp_path, args, message):
    out = tmp_path / "x.rec"
    argv = [a.format(tmp=tmp_path) for a in args]
    r = run_process(agent_command("record-outputs", *argv, "--out", str(out)), 120)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert re.search(message.format(tmp=re.escape(str(tmp_path))), r.stderr), r.stderr
    assert not out.exists()


def test_on_an_accelerator_two_post_threads_keep_each_sources_frames_in_order(clip):
    """Four sources on the emulated accelerator: two post threads, each with its own lanes;
    every source's results come in order, none twice, none lost."""
    endpoint = free_endpoint()
    sources = tuple(ImageFolderSourceConfig(path=str(clip.folder), name=f"cam{i}") for i in range(4))
    cfg = AgentConfig(
        device_id="posts",
        sources=sources,
        model=ModelConfig(),
        backend=EmulatedConfig(recording=str(clip.recording), device_ms=0.5),
        publish=PublishConfig(endpoint=endpoint, wait_for_subscribers=1),
        metrics=MetricsConfig(enabled=False),
    )
    sub = Subscriber(endpoint, "det.", keep_all=True)
    with started(cfg, sub, clean=True) as agent:
        assert agent.pipeline is not None
        names = sorted(t.name for t in agent.pipeline.threads())
        assert [n for n in names if n.startswith("post")] == ["post", "post-1"]
        wait_until(agent.pipeline.finished.is_set, 60, message="every frame of every source published")
        counts = {lane.name: lane.counts for lane in agent.pipeline.figures().lanes}
        wait_until(lambda: len(sub.messages) >= 4 * FRAMES, 30, message="every result received")
    for name in (s.name for s in sources):
        mine = [m for t, m in zip(sub.topics, sub.messages) if t == f"det.{name}"]
        assert [m["seq"] for m in mine] == list(range(FRAMES)), name
        assert [m["frame_id"] for m in mine] == sorted(m["frame_id"] for m in mine), name
        assert counts[name].published == FRAMES and counts[name].dropped == 0


def test_a_model_on_the_cpu_keeps_one_post_thread(tmp_path):
    from edge_agent.pipelines.pipeline import post_threads

    class Lane:
        def __init__(self, off_cpu: bool) -> None:
            backend = type("B", (), {"off_cpu": off_cpu})()
            self.profiles = (type("P", (), {"model": type("M", (), {"backend": backend})()})(),)

    assert post_threads([Lane(False), Lane(False)]) == 1
    assert post_threads([Lane(True)]) == 1, "one source: one post thread"
    assert post_threads([Lane(True), Lane(False)]) == (2 if (os.cpu_count() or 1) > 1 else 1)
