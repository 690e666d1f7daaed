"""Every task by name: each task module of this package declares its ``Task`` class as
``TASK``, named by the ``Decoder.task`` it serves, and ``task_for`` builds a loaded model's
task from its decoder (``Task.build``).

The registry (``core.plugins.PackageRegistry``) imports the package's modules once, on
the first lookup, and takes each ``TASK`` explicitly into a plain dict that refuses a name
twice: importing a module registers nothing by itself, and a task's module is all it takes
to add one (the shared ``masks`` declares none).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from edge_agent.core.plugins import PackageRegistry
from edge_agent.models.decoders.base import BoundDecoder, DecodeParams
from edge_agent.pipelines.tasks.base import Task


def _declared(module: ModuleType) -> list[tuple[str, type[Task]]]:
    task = getattr(module, "TASK", None)
    return [(task.name, task)] if task is not None else []


_REGISTRY: PackageRegistry[type[Task]] = PackageRegistry(
    "task", __package__, str(Path(__file__).parent), _declared
)


def register(task: type[Task]) -> type[Task]:
    """Make ``task`` known by its name. Raises ValueError for a name already registered."""
    return _REGISTRY.register(task.name, task)


def names() -> list[str]:
    return _REGISTRY.names()


def get(name: str) -> type[Task]:
    """The task registered as ``name``. Raises LookupError naming the known ones."""
    return _REGISTRY.get(name)


def task_for(
    decoder: BoundDecoder, params: DecodeParams, masks: str = "polygon", mask_points: int = 64
) -> Task:
    """The task of a model whose outputs ``decoder`` reads: the one its decoder names
    (``Decoder.task``), built by its class. ``masks`` and ``mask_points`` (``model.masks``,
    ``model.mask_points``): how segmentation masks are published. Raises LookupError for a
    task no module declares."""
    return get(decoder.decoder.task).build(decoder, params, masks, mask_points)
