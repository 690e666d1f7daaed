"""What the TensorRT backend's tests share: one fake GPU (FakeTensorRT and FakeCudaDriver on
one call log), the input formats, build settings, float detectors, and the fixtures ``cache``,
``cuda`` and ``float_model``.

A test module takes a fixture by binding it (``cache = trt_kit.cache``): a conftest.py in
tests/pipelines/backends would take the name ``conftest`` from tests/conftest.py, which the
tests there import helpers from.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from edge_agent.core.model_config import TensorRTConfig
from edge_agent.models.manifest import InputFormat
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.backends import trt_build
from edge_agent.pipelines.backends.tensorrt import TensorRTBackend
from fakes.fake_cudart import FakeCudart
from fakes.fake_pycuda import FakeCudaDriver
from fakes.fake_tensorrt import FakeTensorRT

#: The model input of the test detectors, batch of one, NHWC.
SHAPE = (1, 320, 320, 3)

UINT8_FMT = InputFormat(height=320, width=320, layout="NHWC", dtype="uint8", color="bgr")
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
#: Float input normalised with ImageNet's mean and standard deviation.
FLOAT_FMT_IMAGENET = InputFormat(
    height=320, width=320, layout="NCHW", dtype="float32", color="rgb", scale=1.0, mean=MEAN, std=STD
)
#: Float input scaled to [0, 1], no mean or standard deviation.
FLOAT_FMT_SCALED = InputFormat(
    height=320, width=320, layout="NCHW", dtype="float32", color="rgb", scale=1 / 255
)


class Fakes:
    """One fake GPU: a FakeTensorRT and a FakeCudaDriver sharing one call log, and with
    ``graphs`` cuda-python's runtime (FakeCudart) as well; without it the backend finds no
    cuda-python, as on a Jetson without the ``jetson`` extra."""

    def __init__(
        self, num_dla: int = 0, version: str = "10.3.0", sm_count: int = 8, graphs: bool = False
    ) -> None:
        self.calls: list[tuple[str, tuple]] = []
        self.cuda = FakeCudaDriver(self.calls, sm_count=sm_count)
        self.trt = FakeTensorRT(version=version, num_dla_cores=num_dla, calls=self.calls, cuda=self.cuda)
        self.cudart = FakeCudart(self.cuda) if graphs else None

    def backend(self, cache: Path, **cfg) -> TensorRTBackend:
        modules = (self.trt, self.cuda) if self.cudart is None else (self.trt, self.cuda, self.cudart)
        return TensorRTBackend(TensorRTConfig(cache_dir=str(cache), **cfg), modules=modules)

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]

    def since(self, mark: int) -> list[tuple[str, tuple]]:
        return self.calls[mark:]


def loaded(model: Path, cache: Path, fakes: Fakes | None = None, **cfg) -> tuple[TensorRTBackend, Fakes]:
    """A backend on ``fakes`` (new ones by default) with ``model`` loaded for UINT8_FMT."""
    fakes = fakes or Fakes()
    be = fakes.backend(cache, **cfg)
    be.load(str(model), UINT8_FMT)
    return be, fakes


def settings(precision: str = "fp16", workspace_bytes: int = 1 << 20, **kw) -> trt_build.BuildSettings:
    """BuildSettings for a GPU build of SHAPE at optimisation level 3; ``kw`` overrides any field."""
    base = dict(
        precision=precision,
        dla_core=-1,
        gpu_fallback=True,
        workspace_bytes=workspace_bytes,
        optimization_level=3,
        input_name="images",
        input_shape=SHAPE,
    )
    return trt_build.BuildSettings(**{**base, **kw})


# -- fixtures (bind in the test module: ``cache = trt_kit.cache``) ----------------------------


@pytest.fixture
def cache(tmp_path) -> Path:
    """The engine cache's folder (not created)."""
    return tmp_path / "cache"


@pytest.fixture
def cuda() -> Iterator[FakeCudaDriver]:
    """A FakeCudaDriver with device 0's primary context pushed (popped afterwards)."""
    drv = FakeCudaDriver()
    drv.init()
    ctx = drv.Device(0).retain_primary_context()
    ctx.push()
    yield drv
    drv.Context.pop()


def float_detector(
    tmp_path: Path, name: str, dtype: int = onnx.TensorProto.FLOAT, height: int = 320, **kw
) -> str:
    """A float NCHW detector (like an Ultralytics export) reporting one box, as
    ``tmp_path/name/model.onnx``; ``dtype`` its input's ONNX type, ``height`` its square side."""
    out = yolov8_output([(160, 160, 40, 40)], [0], [0.9], 4, 2100)
    d = tmp_path / name
    d.mkdir()
    return constant_detector(
        str(d / "model.onnx"), out, height=height, width=height, layout="NCHW", dtype=dtype, **kw
    )


@pytest.fixture
def float_model(tmp_path) -> Path:
    """A float NCHW detector (like an Ultralytics export) reporting one box."""
    return Path(float_detector(tmp_path, "floatdet"))


# -- CUDA graphs (test_trt_graphs.py, test_trt_graph_fallbacks.py) ------------------------------


def mean_kernel(label: str, ins: dict, outs: dict) -> None:
    value = float(next(iter(ins.values())).astype(np.float64).mean())
    for out in outs.values():
        out[...] = value


def graph_fakes(**kw) -> Fakes:
    """Fakes with cuda-python's runtime, whose engines write the mean of their input."""
    f = Fakes(graphs=True, **kw)
    f.trt.kernel = mean_kernel
    return f


def graph_backend(
    model: Any, cache: Path, fakes: Fakes | None = None, fmt: InputFormat = UINT8_FMT, **cfg
) -> tuple[TensorRTBackend, Fakes]:
    fakes = fakes or graph_fakes()
    be = fakes.backend(cache, **cfg)
    be.load(str(model), fmt)
    return be, fakes


def infer_value(be: TensorRTBackend, io: Any, value: int) -> float:
    """Fill the frame with ``value``, infer, and return what the outputs hold (one value)."""
    io.inputs[be.inputs[0].name][...] = value
    be.upload(io)
    be.infer(io)
    out = io.outputs[0]
    assert np.all(out == out.flat[0]), "the kernel writes one value everywhere"
    return float(out.flat[0])


def count(fakes: Fakes, name: str, since: int = 0) -> int:
    return sum(1 for n, _ in fakes.since(since) if n == name)


def swap_backend(monkeypatch: Any, name: str, factory: Any) -> None:
    """For one test, ``factory`` builds the backends of ``name`` (the registry's modules are
    collected first, so the test's factory is not overwritten by them)."""
    from edge_agent.pipelines.backends import registry

    registry.names()
    monkeypatch.setitem(registry._REGISTRY._items, name, factory)
