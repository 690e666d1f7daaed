"""The backend registry (pipelines/backends/registry.py): every backend declared by its own
module (``BACKENDS``) and collected on the first lookup, none of their platform packages
imported to collect them, ``auto``'s choice, and an unknown name naming the known ones."""

from __future__ import annotations

import logging
import subprocess
import sys
from dataclasses import dataclass

import pytest
from fakes import trt_kit
from fakes.trt_kit import UINT8_FMT, Fakes, swap_backend

from edge_agent.core.model_config import AutoBackendConfig, OnnxRuntimeConfig, TensorRTConfig
from edge_agent.pipelines.backends import registry
from edge_agent.pipelines.backends.base import BackendError
from edge_agent.pipelines.backends.onnxruntime import OnnxRuntimeBackend
from edge_agent.pipelines.backends.tensorrt import TensorRTBackend

cache = trt_kit.cache


def test_every_backend_is_declared_by_its_module_and_collected():
    assert registry.names() == ["auto", "emulated", "onnxruntime", "tensorrt"]
    assert isinstance(registry.create_backend(OnnxRuntimeConfig()), OnnxRuntimeBackend)
    assert isinstance(registry.create_backend(TensorRTConfig()), TensorRTBackend)


def test_collecting_the_backends_imports_none_of_their_platform_packages():
    """Collecting imports every module of the package: each imports its backend's packages
    (onnxruntime, tensorrt, pycuda, cuda-python) only in the functions that need them."""
    code = (
        "import sys\n"
        "from edge_agent.pipelines.backends import registry\n"
        "from edge_agent.core.model_config import TensorRTConfig\n"
        "registry.names(); registry.create_backend(TensorRTConfig())\n"
        "print(sorted(m for m in ('tensorrt', 'pycuda', 'cuda', 'onnxruntime') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_an_unknown_backend_names_the_known_ones():
    @dataclass(frozen=True)
    class Other:
        type: str = "openvino"

    with pytest.raises(
        BackendError,
        match=r"unknown backend 'openvino' \(one of 'auto', 'emulated', 'onnxruntime', 'tensorrt'\)",
    ):
        registry.create_backend(Other())


def test_a_name_is_registered_once():
    with pytest.raises(ValueError, match="backend 'tensorrt' is already registered"):
        registry.register("tensorrt", TensorRTBackend)


def test_a_test_can_put_a_backend_in_a_names_place(monkeypatch):
    made: list[object] = []
    swap_backend(monkeypatch, "onnxruntime", lambda cfg: made.append(cfg) or "fake")
    assert registry.create_backend(OnnxRuntimeConfig()) == "fake" and len(made) == 1
    monkeypatch.undo()
    assert isinstance(registry.create_backend(OnnxRuntimeConfig()), OnnxRuntimeBackend)
    assert "nothing" not in registry.names()


# -- auto -------------------------------------------------------------------------------------


def test_select_auto_picks_tensorrt_when_the_probe_says_so(caplog):
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        be = registry.select_auto(AutoBackendConfig(), probe=lambda: "")
    assert isinstance(be, TensorRTBackend)
    assert "TensorRT" in caplog.text


def test_select_auto_falls_back_to_onnxruntime_with_the_reason(caplog):
    with caplog.at_level(logging.INFO, logger=registry.__name__):
        be = registry.select_auto(AutoBackendConfig(), probe=lambda: "CUDA reports no GPU")
    assert isinstance(be, OnnxRuntimeBackend)
    assert "ONNX Runtime, because CUDA reports no GPU" in caplog.text


def test_select_auto_tensorrt_backend_runs_on_injected_fakes(const_model, cache, monkeypatch):
    f = Fakes()
    swap_backend(monkeypatch, "tensorrt", lambda cfg: TensorRTBackend(cfg, modules=(f.trt, f.cuda)))
    cfg = AutoBackendConfig(tensorrt=TensorRTConfig(cache_dir=str(cache)))
    be = registry.select_auto(cfg, probe=lambda: "")
    be.load(str(const_model), UINT8_FMT)
    io = be.allocate()
    be.infer(io)
    assert f.trt.builds == 1 and be.timings(io)["device_compute_ms"] == 1.5


def test_tensorrt_unavailable_here():
    reason = registry.tensorrt_unavailable()
    assert "tensorrt module is not installed" in reason
