"""The tasks' registry (pipelines/tasks/registry.py): each task module declares its class
as ``TASK`` and the registry collects them by the ``Decoder.task`` they serve, as the
decoders and the sources are collected (``core.plugins.PackageRegistry``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from edge_agent.models.decoders import registry as decoders
from edge_agent.models.decoders.base import BoundDecoder, DecodeParams
from edge_agent.models.decoders.obb import YoloV8Obb
from edge_agent.models.decoders.yolov8 import YoloV8
from edge_agent.pipelines.tasks import registry
from edge_agent.pipelines.tasks.base import Task
from edge_agent.pipelines.tasks.obb import ObbTask
from edge_agent.pipelines.tasks.pose import PoseTask
from edge_agent.pipelines.tasks.segment import SegmentTask

P = DecodeParams(0.25, 0.45, 100, input_w=64, input_h=64)


def test_each_task_module_declares_its_task_by_the_name_decoders_use():
    found = {name: registry.get(name) for name in registry.names()}
    assert found == {"detect": Task, "obb": ObbTask, "pose": PoseTask, "segment": SegmentTask}
    assert {name: t.__module__.rsplit(".", 1)[1] for name, t in found.items()} == {
        "detect": "base",
        "obb": "obb",
        "pose": "pose",
        "segment": "segment",
    }, "a task lives in its own module (plain detection in base)"


@pytest.mark.parametrize("decoder", decoders.registered(), ids=lambda d: d.name)
def test_every_decoders_task_is_registered(decoder):
    assert registry.get(decoder.task).name == decoder.task, f"{decoder.name} reads a task no module declares"


@pytest.mark.parametrize(
    ("decoder", "outputs", "kind"),
    [
        (YoloV8().fit([(1, 84, 8400)], 80), (0,), Task),
        (YoloV8Obb().fit([(1, 6, 84)], 1), (0,), ObbTask),
    ],
)
def test_a_models_task_is_the_one_its_decoder_names(decoder, outputs, kind):
    task = registry.task_for(BoundDecoder(decoder, outputs), P)
    assert type(task) is kind and task.name == decoder.task


def test_a_name_registered_twice_is_refused_and_an_unknown_task_is_named():
    with pytest.raises(ValueError, match="task 'pose' is already registered"):
        registry.register(PoseTask)
    classify = SimpleNamespace(decoder=SimpleNamespace(task="classify"))
    with pytest.raises(
        LookupError, match=r"unknown task 'classify' \(one of 'detect', 'obb', 'pose', 'segment'\)"
    ):
        registry.task_for(classify, P)  # type: ignore[arg-type]
