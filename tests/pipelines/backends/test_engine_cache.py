"""The engine cache: keys, atomic writes, and every way a cached engine can be unusable."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import spawn

from edge_agent.core.files import UnsafePathError, atomic_write
from edge_agent.pipelines.backends import engine_cache
from edge_agent.pipelines.backends.engine_cache import EngineCache, EngineKey

KEY = EngineKey(
    onnx_sha256="a" * 64,
    tensorrt_version="10.3.0",
    device="Orin sm_87 R36 (release)",
    precision="fp16",
    dla_core=-1,
    input_shape=(1, 320, 320, 3),
    gpu_fallback=True,
    workspace_mib=1024,
    optimization_level=3,
    calibration_sha256="",
    role="model",
)

# One changed value per field: every field must be part of the key.
CHANGED = {
    "onnx_sha256": "b" * 64,
    "tensorrt_version": "10.7.0",
    "device": "Xavier sm_72 R35",
    "precision": "int8",
    "dla_core": 0,
    "input_shape": (1, 640, 640, 3),
    "gpu_fallback": False,
    "workspace_mib": 512,
    "optimization_level": 5,
    "calibration_sha256": "c" * 64,
    "role": "preprocess",
    "min_batch": 1,
}

PLAN = b"engine bytes " * 1000


def test_changed_covers_every_field():
    assert set(CHANGED) == {f.name for f in dataclasses.fields(EngineKey)}, "update CHANGED"


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_digest_changes_with_every_field(field):
    other = dataclasses.replace(KEY, **{field: CHANGED[field]})
    assert other.digest() != KEY.digest(), f"{field} is not part of the key"


def test_digest_is_stable():
    same = EngineKey(**dataclasses.asdict(KEY) | {"input_shape": (1, 320, 320, 3)})
    assert KEY.digest() == KEY.digest() == same.digest()
    assert len(KEY.digest()) == 64


def test_store_then_lookup(tmp_path):
    cache = EngineCache(tmp_path / "c")
    path = cache.store("det", KEY, PLAN)
    assert path.read_bytes() == PLAN
    assert cache.lookup("det", KEY) == path
    engine, sidecar = cache.paths("det", KEY)
    assert (engine, sidecar) == (path, path.with_suffix(".json"))
    assert sidecar.exists()


def test_lookup_of_another_key_misses(tmp_path):
    cache = EngineCache(tmp_path)
    cache.store("det", KEY, PLAN)
    assert cache.lookup("det", dataclasses.replace(KEY, precision="int8")) is None


def _missing_engine(cache: EngineCache) -> None:
    cache.paths("det", KEY)[0].unlink()


def _missing_sidecar(cache: EngineCache) -> None:
    cache.paths("det", KEY)[1].unlink()  # a power cut between the engine and the sidecar


def _truncated(cache: EngineCache) -> None:
    engine = cache.paths("det", KEY)[0]
    engine.write_bytes(engine.read_bytes()[:-100])


def _flipped_byte(cache: EngineCache) -> None:
    engine = cache.paths("det", KEY)[0]
    data = bytearray(engine.read_bytes())
    data[len(data) // 2] ^= 0x01
    engine.write_bytes(bytes(data))


def _sidecar_of_another_key(cache: EngineCache) -> None:
    other = dataclasses.replace(KEY, tensorrt_version="10.7.0")
    cache.store("other", other, PLAN)
    cache.paths("other", other)[1].replace(cache.paths("det", KEY)[1])


def _unreadable_sidecar(cache: EngineCache) -> None:
    cache.paths("det", KEY)[1].write_text("{not json")


@pytest.mark.parametrize(
    "damage, reason",
    [
        (_missing_engine, "no engine"),
        (_missing_sidecar, "no sidecar"),
        (_truncated, "truncated"),
        (_flipped_byte, "checksum"),
        (_sidecar_of_another_key, "key does not match"),
        (_unreadable_sidecar, "unreadable sidecar"),
    ],
)
def test_lookup_refuses_a_damaged_entry_with_a_reason(tmp_path, caplog, damage, reason):
    cache = EngineCache(tmp_path)
    cache.store("det", KEY, PLAN)
    damage(cache)
    with caplog.at_level(logging.INFO, logger=engine_cache.__name__):
        assert cache.lookup("det", KEY) is None
    assert reason in caplog.text, caplog.text


def test_store_replaces_a_damaged_entry(tmp_path):
    cache = EngineCache(tmp_path)
    cache.store("det", KEY, PLAN)
    _flipped_byte(cache)
    path = cache.store("det", KEY, PLAN + b"new")
    assert cache.lookup("det", KEY) == path
    assert path.read_bytes() == PLAN + b"new"


def test_atomic_write_leaves_no_temporary_files(tmp_path):
    target = tmp_path / "sub" / "f.bin"
    atomic_write(target, b"one")
    atomic_write(target, memoryview(b"two"))
    assert target.read_bytes() == b"two"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.bin"]


def test_a_failed_rename_keeps_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "f.bin"
    atomic_write(target, b"old contents")

    def crash(src, dst, **dir_fds):
        raise OSError("power cut")

    monkeypatch.setattr(engine_cache.os, "replace", crash)
    with pytest.raises(OSError, match="power cut"):
        atomic_write(target, b"new contents that never land")
    assert target.read_bytes() == b"old contents"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"], "the temporary file was left behind"


def test_a_store_never_writes_through_a_symlink_planted_in_the_cache(tmp_path):
    """Whoever can write to the cache folder plants links at the engine's and the
    sidecar's names (and at temporaries' names as the old writer drew them): the store
    replaces the links, and the files they point to stay as they were."""
    cache = EngineCache(tmp_path / "engines")
    engine, sidecar = cache.paths("det", KEY)
    outside = tmp_path / "outside"
    outside.mkdir()
    engine.parent.mkdir(mode=0o700)
    planted = {}
    for name in (engine.name, sidecar.name, f".{engine.name}.tmp", f".{sidecar.name}.abcd1234.tmp"):
        target = outside / f"target-{len(planted)}"
        target.write_bytes(b"mine")
        (engine.parent / name).symlink_to(target)
        planted[name] = target
    assert cache.store("det", KEY, PLAN) == engine
    assert all(t.read_bytes() == b"mine" for t in planted.values()), "a file outside was overwritten"
    assert sorted(os.listdir(outside)) == sorted(t.name for t in planted.values())
    assert not engine.is_symlink() and not sidecar.is_symlink()
    assert cache.lookup("det", KEY) == engine
    assert oct(engine.stat().st_mode & 0o777) == oct(0o600)


def test_a_cache_folder_that_is_a_symlink_is_refused_naming_it(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "engines").symlink_to(tmp_path / "real")
    with pytest.raises(UnsafePathError, match=f"{tmp_path / 'engines'}: is a symlink"):
        EngineCache(tmp_path / "engines").store("det", KEY, PLAN)
    assert os.listdir(tmp_path / "real") == []


def test_a_store_interrupted_before_the_sidecar_is_a_miss(tmp_path, monkeypatch, caplog):
    cache = EngineCache(tmp_path)
    cache.store("det", KEY, PLAN)
    real = engine_cache.atomic_write
    writes: list[Path] = []

    def dies_on_sidecar(path, data):
        writes.append(Path(path))
        if Path(path).suffix == ".json":
            raise KeyboardInterrupt  # the process dies between the two writes
        real(path, data)

    monkeypatch.setattr(engine_cache, "atomic_write", dies_on_sidecar)
    with pytest.raises(KeyboardInterrupt):
        cache.store("det", KEY, PLAN + b"v2")
    assert [p.suffix for p in writes] == [".engine", ".json"], "engine first, sidecar last"
    with caplog.at_level(logging.INFO, logger=engine_cache.__name__):
        assert cache.lookup("det", KEY) is None, "the old sidecar must not vouch for new bytes"
    assert "no sidecar" in caplog.text


WRITER = textwrap.dedent(
    """
    import sys
    from edge_agent.core.files import UnsafePathError, atomic_write
    target, size = sys.argv[1], int(sys.argv[2])
    i = 0
    while True:
        atomic_write(target, bytes([i % 251]) * size)
        print(i, flush=True)
        i += 1
    """
)


def test_sigkill_mid_write_never_leaves_a_partial_file(tmp_path):
    target = tmp_path / "big.engine"
    size = 16 << 20
    with spawn(
        [sys.executable, "-c", WRITER, str(target), str(size)], stdout=subprocess.PIPE, text=True
    ) as proc:
        for _ in range(2):  # two whole writes done; the third is under way
            assert proc.stdout.readline(), "the writer died"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    data = target.read_bytes()
    assert len(data) == size, f"partial file at the final path: {len(data)} of {size} B"
    assert data == bytes([data[0]]) * size, "the final file mixes two writes"


def test_invalidate_removes_engine_and_sidecar(tmp_path, caplog):
    cache = EngineCache(tmp_path)
    cache.store("det", KEY, PLAN)
    with caplog.at_level(logging.WARNING, logger=engine_cache.__name__):
        cache.invalidate("det", KEY, "TensorRT could not deserialize it")
    assert not any(p.exists() for p in cache.paths("det", KEY))
    assert "could not deserialize" in caplog.text
    cache.invalidate("det", KEY, "again")  # nothing there: no error


@pytest.mark.parametrize("field", sorted(CHANGED))
def test_timing_cache_depends_on_tensorrt_version_and_device_only(tmp_path, field):
    cache = EngineCache(tmp_path)
    other = dataclasses.replace(KEY, **{field: CHANGED[field]})
    same = cache.timing_cache_path(other) == cache.timing_cache_path(KEY)
    assert same == (field not in ("tensorrt_version", "device")), field
    assert cache.timing_cache_path(KEY).parent == tmp_path


def test_cache_dir_expands_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert EngineCache("~/engines").dir == tmp_path / "engines"
