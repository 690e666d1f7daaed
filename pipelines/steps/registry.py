"""The per-frame steps by name, collected from the modules of this package: each declares
``STEP``, its ``StepPlugin`` (``core.plugins.PackageRegistry``)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from edge_agent.core.plugins import PackageRegistry
from edge_agent.pipelines.steps.base import LaneStep, StepContext, StepPlugin


def _declared(module: ModuleType):
    step = getattr(module, "STEP", None)
    return [(step.name, step)] if step is not None else []


STEPS: PackageRegistry[StepPlugin] = PackageRegistry(
    "per-frame step", __package__, str(Path(__file__).parent), _declared
)


def build_steps(ctx: StepContext, plugins: Sequence[StepPlugin] | None = None) -> tuple[LaneStep, ...]:
    """The source's step states, in the plug-ins' order (``plugins``: these instead of
    the registered ones)."""
    ordered = sorted(STEPS.items() if plugins is None else plugins, key=lambda p: (p.order, p.name))
    return tuple(state for p in ordered if (state := p.build(ctx)) is not None)
