"""The kernels' loader (pipelines/jit.py): numba where it loads, the numpy path with a
logged reason where not, and a disk cache only in a folder that is safe to write."""

from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from edge_agent.pipelines import jit


def twice(a, out):  # a kernel: numba's subset, module level
    for i in range(a.shape[0]):
        out[i] = 2.0 * a[i]


def _warm(k):
    k["twice"](np.zeros(3), np.zeros(3))


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The loader forgotten before and after, its cache in ``tmp_path/kernels``."""
    monkeypatch.setenv("EDGE_AGENT_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.delenv("EDGE_AGENT_KERNELS", raising=False)
    jit.reset()
    yield tmp_path / "kernels"
    jit.reset()


def test_kernels_compile_run_and_are_cached_in_a_private_folder(fresh):
    k = jit.load("t", [twice], _warm)
    assert k is not None
    out = np.zeros(4)
    k["twice"](np.arange(4.0), out)
    assert out.tolist() == [0.0, 2.0, 4.0, 6.0]
    state = jit.state()
    assert state["parts"] == {"t": "numba"}
    assert state["cache"] == str(fresh)
    assert oct(os.stat(fresh).st_mode & 0o777) == "0o700"
    assert any(files for _, _, files in os.walk(fresh)), "numba wrote its cache there"
    assert jit.load("t", [twice], _warm) is k, "once per process and name"


def test_numpy_forced_by_the_environment(fresh, monkeypatch, caplog):
    monkeypatch.setenv("EDGE_AGENT_KERNELS", "numpy")
    with caplog.at_level(logging.WARNING, "edge_agent.pipelines.jit"):
        assert jit.load("t", [twice], _warm) is None
    assert jit.state()["parts"] == {"t": "numpy"}
    assert jit.state()["fallback"]["t"] == "EDGE_AGENT_KERNELS=numpy"
    assert "the numpy path runs (EDGE_AGENT_KERNELS=numpy)" in caplog.text


def test_a_mode_that_is_no_mode_is_an_error_naming_the_variable(fresh, monkeypatch):
    monkeypatch.setenv("EDGE_AGENT_KERNELS", "fast")
    with pytest.raises(ValueError, match="EDGE_AGENT_KERNELS='fast': expected one of auto, numpy"):
        jit.load("t", [twice], _warm)


def test_a_kernel_that_fails_to_compile_falls_back_with_the_reason(fresh, caplog):
    def bad(a):
        return a.no_such_attribute

    with caplog.at_level(logging.WARNING, "edge_agent.pipelines.jit"):
        assert jit.load("bad", [bad], lambda k: k["bad"](np.zeros(2))) is None
    assert "TypingError" in jit.state()["fallback"]["bad"]
    assert "kernels bad: the numpy path runs (TypingError" in caplog.text


def test_numba_that_does_not_import_falls_back(fresh, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_numba(name, *args, **kwargs):
        if name == "numba":
            raise ImportError("Numba needs NumPy 2.5 or less")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_numba)
    assert jit.load("t", [twice], _warm) is None
    assert (
        jit.state()["fallback"]["t"] == "numba does not import (ImportError: Numba needs NumPy 2.5 or less)"
    )


def _refused(caplog, fresh, reason: str) -> None:
    k = jit.load("t", [twice], _warm)
    assert k is not None, "refused cache: the kernels still compile, in memory"
    state = jit.state()
    assert "cache" not in state
    assert reason in state["cache_why"]
    assert "no disk cache, they compile at every start" in caplog.text


def test_a_cache_folder_planted_as_a_symlink_is_refused(fresh, tmp_path, caplog):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    fresh.symlink_to(elsewhere)
    with caplog.at_level(logging.WARNING, "edge_agent.pipelines.jit"):
        _refused(caplog, fresh, "symlink")
    assert os.listdir(elsewhere) == [], "nothing was written through the link"


def test_a_cache_folder_others_can_write_to_is_refused(fresh, caplog):
    fresh.mkdir()
    os.chmod(fresh, 0o777)
    with caplog.at_level(logging.WARNING, "edge_agent.pipelines.jit"):
        _refused(caplog, fresh, "others can write to it")
    assert os.listdir(fresh) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")
def test_a_cache_folder_of_another_user_is_refused(fresh, caplog):
    fresh.mkdir(mode=0o700)
    os.chown(fresh, 65534, 65534)
    with caplog.at_level(logging.WARNING, "edge_agent.pipelines.jit"):
        _refused(caplog, fresh, "owned by uid 65534")


def test_a_cache_folder_that_cannot_be_made_is_refused(fresh, monkeypatch, tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("EDGE_AGENT_KERNEL_CACHE", str(blocker / "kernels"))
    jit.reset()
    with caplog.at_level(logging.WARNING, "edge_agent.pipelines.jit"):
        _refused(caplog, fresh, str(blocker))


def test_nothing_compiles_after_the_warm_up(fresh):
    k = jit.load("t", [twice], _warm)
    assert k is not None
    with pytest.raises(TypeError):
        k["twice"](np.zeros(3, np.int32), np.zeros(3, np.int32))  # a type warm never gave it
