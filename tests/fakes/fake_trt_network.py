"""FakeTensorRT's network definition and ONNX parser (see fake_tensorrt.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fakes.fake_trt_types import _FROM_ONNX, PLUGINS, FakeDataType, FakeScaleMode

if TYPE_CHECKING:
    from fakes.fake_tensorrt import FakeTensorRT


class FakeTensor:
    """ITensor: ``name`` and ``dtype`` are settable; ``shape`` comes from its producer."""

    def __init__(self, name: str, dtype: FakeDataType, shape: tuple[int, ...] = (), producer: Any = None):
        self.name = name
        self.dtype = dtype
        self._shape = tuple(shape)
        self._producer = producer
        # ONNX's symbolic name of each dynamic axis ("" for a fixed one or none known): what
        # tells an output axis that follows the input's batch from a data-dependent one.
        self.dim_names: tuple[str, ...] = ("",) * len(self._shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return self._producer.output_shape() if self._producer is not None else self._shape


class FakeLayer:
    """ILayer: ``name``, ``type`` and ``get_output(0)``."""

    def __init__(self, kind: str, name: str, inputs: list[FakeTensor], dtype: FakeDataType | None = None):
        self.type = kind
        self.name = name
        self.inputs = inputs
        dtype = dtype or (inputs[0].dtype if inputs else FakeDataType.FLOAT)
        self._output = FakeTensor(f"({name} output)", dtype, producer=self)

    def output_shape(self) -> tuple[int, ...]:
        return self.inputs[0].shape

    def get_output(self, index: int) -> FakeTensor:
        if index != 0:
            raise IndexError(f"{self.name} has one output")
        return self._output


class FakeShuffleLayer(FakeLayer):
    def __init__(self, trt: FakeTensorRT, name: str, inputs: list[FakeTensor]) -> None:
        super().__init__("Shuffle", name, inputs)
        self._trt = trt
        self._first_transpose: tuple[int, ...] | None = None

    @property
    def first_transpose(self) -> tuple[int, ...] | None:
        return self._first_transpose

    @first_transpose.setter
    def first_transpose(self, perm: Any) -> None:
        perm = tuple(int(p) for p in perm)
        self._trt._record("IShuffleLayer.first_transpose=", perm)
        self._first_transpose = perm

    def output_shape(self) -> tuple[int, ...]:
        shape = self.inputs[0].shape
        if self.first_transpose is None:
            return shape
        perm = tuple(self.first_transpose)
        if sorted(perm) != list(range(len(shape))):
            raise AssertionError(f"first_transpose {perm} is not a permutation of {len(shape)} axes")
        return tuple(shape[p] for p in perm)


class FakeConstantLayer(FakeLayer):
    def __init__(self, name: str, shape: tuple[int, ...], weights: np.ndarray) -> None:
        dtype = FakeDataType.INT32 if weights.dtype == np.int32 else FakeDataType.FLOAT
        super().__init__("Constant", name, [], dtype)
        self.shape, self.weights = tuple(shape), weights

    def output_shape(self) -> tuple[int, ...]:
        return self.shape


class FakeNetwork:
    """INetworkDefinition."""

    def __init__(self, trt: FakeTensorRT, flags: int) -> None:
        self._trt = trt
        self.flags = flags
        self.label = "network"
        self.layers: list[FakeLayer] = []
        self.inputs: list[FakeTensor] = []
        self.outputs: list[FakeTensor] = []

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def get_layer(self, index: int) -> FakeLayer:
        return self.layers[index]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int) -> FakeTensor:
        return self.inputs[index]

    @property
    def num_outputs(self) -> int:
        return len(self.outputs)

    def get_output(self, index: int) -> FakeTensor:
        return self.outputs[index]

    def _layer(self, layer: FakeLayer) -> FakeLayer:
        self.layers.append(layer)
        return layer

    def _name(self, kind: str) -> str:
        return f"{kind}_{len(self.layers)}"

    def add_input(self, name: str, dtype: FakeDataType, shape: Any) -> FakeTensor:
        self._trt._record("INetworkDefinition.add_input", name, dtype, tuple(shape))
        t = FakeTensor(name, dtype, tuple(shape))
        self.inputs.append(t)
        return t

    def add_cast(self, input: FakeTensor, to_type: FakeDataType) -> FakeLayer:
        self._trt._record("INetworkDefinition.add_cast", input.name, to_type)
        return self._layer(FakeLayer("Cast", self._name("Cast"), [input], to_type))

    def add_shuffle(self, input: FakeTensor) -> FakeShuffleLayer:
        self._trt._record("INetworkDefinition.add_shuffle", input.name)
        return self._layer(FakeShuffleLayer(self._trt, self._name("Shuffle"), [input]))

    def add_constant(self, shape: Any, weights: Any) -> FakeConstantLayer:
        weights = np.asarray(weights)
        self._trt._record("INetworkDefinition.add_constant", tuple(shape), weights.copy())
        return self._layer(FakeConstantLayer(self._name("Constant"), tuple(shape), weights))

    def add_gather(self, input: FakeTensor, indices: FakeTensor, axis: int) -> FakeLayer:
        self._trt._record("INetworkDefinition.add_gather", input.name, indices.name, axis)
        return self._layer(FakeLayer("Gather", self._name("Gather"), [input, indices]))

    def add_scale(
        self, input: FakeTensor, mode: FakeScaleMode, shift: Any = None, scale: Any = None, power: Any = None
    ) -> FakeLayer:
        arrays = [None if a is None else np.asarray(a).copy() for a in (shift, scale, power)]
        self._trt._record("INetworkDefinition.add_scale", input.name, mode, *arrays)
        return self._layer(FakeLayer("Scale", self._name("Scale"), [input]))

    def mark_output(self, tensor: FakeTensor) -> None:
        self._trt._record("INetworkDefinition.mark_output", tensor.name)
        self.outputs.append(tensor)


class FakeParserError:
    def __init__(self, desc: str) -> None:
        self._desc = desc

    def desc(self) -> str:
        return self._desc

    def __str__(self) -> str:
        return self._desc


class FakeOnnxParser:
    """trt.OnnxParser(network, logger): fills the network from the real ONNX file."""

    def __init__(self, trt: FakeTensorRT, network: FakeNetwork, logger: Any) -> None:
        self._trt, self._network = trt, network
        self._errors: list[FakeParserError] = []
        trt._record("OnnxParser", type(logger).__name__)

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> FakeParserError:
        return self._errors[index]

    def clear_errors(self) -> None:
        self._errors.clear()

    def parse_from_file(self, model: str) -> bool:
        self._trt._record("OnnxParser.parse_from_file", model)
        if self._trt.parse_error:
            self._errors.append(FakeParserError(self._trt.parse_error))
            return False
        import onnx

        try:
            proto = onnx.load(model)
        except Exception as e:  # the real parser reports unreadable files as errors too
            self._errors.append(FakeParserError(f"failed to load {model}: {type(e).__name__}: {e}"))
            return False
        net = self._network
        net.label = Path(model).name
        inits = {i.name for i in proto.graph.initializer}

        def tensor(vi: Any) -> FakeTensor:
            tt = vi.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
            t = FakeTensor(vi.name, _FROM_ONNX[tt.elem_type], dims)
            t.dim_names = tuple("" if d.HasField("dim_value") else d.dim_param for d in tt.shape.dim)
            return t

        plugins = sorted({n.op_type for n in proto.graph.node if n.op_type in PLUGINS})
        if plugins and not self._trt.plugins_registered:
            # What the real parser says for a plugin op it finds no creator for.
            self._errors.append(FakeParserError(f"No importer registered for op: {plugins[0]}"))
            return False
        net.inputs = [tensor(vi) for vi in proto.graph.input if vi.name not in inits]
        for i, node in enumerate(proto.graph.node):
            net.layers.append(FakeLayer(node.op_type, node.name or f"{node.op_type}_{i}", net.inputs[:1]))
        net.outputs = [tensor(vi) for vi in proto.graph.output]
        return True
