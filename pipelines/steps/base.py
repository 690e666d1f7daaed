"""The per-frame step plug-in interface, and the registry that collects the steps.

A step is a module of this package that declares ``STEP``, its ``StepPlugin``
(``registry.py`` collects them). At every
pipeline the agent builds (its start, each reload), each plug-in looks at a source's
config (``StepContext``) and builds the source's state (a ``LaneStep``) or nothing; the
lane holds its states in the plug-ins' ``order``. The stages, the pipeline, the heartbeat
and the live view only iterate that list: a new step is one new module here, nothing else
changes.

A ``LaneStep`` runs on the thread that publishes its source's frames (the post stage's,
or the inference thread's, never both at once); ``figures`` and ``take_figures`` are
called by others (the heartbeat, metrics) and read what ``run`` writes without a lock: a
figure, not an account.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, Protocol

from edge_agent.core.latency import LatencyHistogram
from edge_agent.core.source_config import SourceConfig


@dataclass(frozen=True)
class StepContext:
    """What a step's state for one source is built from."""

    source: SourceConfig
    key: str  # the source's key path in the config (``sources[i]``), for errors
    model: str  # the path of the source's model (another one restarts a tracker)
    labels: tuple[str, ...]  # its model's labels
    device_id: str
    run_id: str
    send: Callable[[bytes, bytes], None]  # the result stream's (topic, body)
    encode: Callable[[dict], bytes]  # a message in the stream's encoding
    snapshots: Any = None  # the agent's event snapshot writer (``offer``), if any


class StepFigures(Protocol):
    """A step's figures, frozen: the heartbeat carries ``as_dict()`` under the step's name."""

    cost: LatencyHistogram

    def as_dict(self) -> dict[str, Any]: ...


class LaneStep(Protocol):
    """One source's state of a step."""

    name: str  # its key in the heartbeat, and in the result message when it adds a block
    keeps_pixels: bool  # it needs each frame's image after the source's next read

    def run(self, slot: Any) -> None:
        """The frame ``slot`` (decoded, in source pixels). May read and extend its
        detections; must not allocate per frame in steady state. Raising drops the frame
        (``error``)."""

    def adopt(self, last: LaneStep, continuous: bool, same_source: bool) -> LaneStep:
        """The state to run with after a reload, given ``last``, this source's state of
        the same step earlier in the run (``continuous``: it ran until this reload;
        ``same_source``: the source was not reopened): itself, ``last``, or a mix."""

    #: What the frame's result message carries under ``name`` (called after ``run``; it
    #: returns None for a frame it adds nothing to); None for a step that never adds
    #: anything (its lane then makes no call).
    message_block: Callable[[], dict[str, Any] | None] | None

    def to_view(self, frame: Any, slot: Any) -> None:
        """Give the live view's frame (``view_tap.ViewFrame``) what it draws of this step."""

    def figures(self) -> StepFigures: ...

    def take_figures(self) -> StepFigures:
        """``figures`` with the cost since the last take (the heartbeat's)."""


class StepPlugin(Protocol):
    name: str
    order: int  # steps run in ascending order (the tracker's ids before analytics reads them)

    def build(self, ctx: StepContext) -> LaneStep | None:
        """The source's state, or None when its config does not turn the step on. Raises
        ``ConfigError`` naming the key for a setting the model cannot honour."""


class StepTiming:
    """A step's time per frame, since it started and since the heartbeat last took it."""

    def __init__(self) -> None:
        self.cost = LatencyHistogram()
        self.window = LatencyHistogram()

    def record(self, ns: int) -> None:
        self.cost.record(ns)
        self.window.record(ns)

    def frozen(self, take: bool) -> tuple[LatencyHistogram, LatencyHistogram | None]:
        """A copy of the cost, and (``take``) the window since the last take."""
        cost = self.cost.copy()
        if not take:
            return cost, None
        return cost, self.window.take()


@dataclass(frozen=True)
class StepCost:
    """A step's figures when its time per frame is all it reports."""

    cost: LatencyHistogram
    window: LatencyHistogram | None = None

    def as_dict(self) -> dict[str, Any]:
        return figures_dict(self)


class Step:
    """What most ``LaneStep``s share: its time per frame (``timing``, recorded by its
    ``run``), and the defaults: no pixels kept, nothing added to the message or drawn on
    the view, a reload keeps this new state (``adopt``), its figures its cost (``figures_of``)."""

    name: str
    keeps_pixels = False
    message_block: Callable[[], dict[str, Any] | None] | None = None

    def __init__(self) -> None:
        self.timing = StepTiming()

    def run(self, slot: Any) -> None:
        raise NotImplementedError

    def adopt(self, last: LaneStep, continuous: bool, same_source: bool) -> LaneStep:
        return self

    def to_view(self, frame: Any, slot: Any) -> None:
        pass

    def figures(self) -> StepFigures:
        return self.figures_of(*self.timing.frozen(False))

    def take_figures(self) -> StepFigures:
        return self.figures_of(*self.timing.frozen(True))

    def figures_of(self, cost: LatencyHistogram, window: LatencyHistogram | None) -> StepFigures:
        """Its figures, given its cost since it started and (taken) since the last take."""
        return StepCost(cost, window)


def figures_dict(figures: Any) -> dict[str, Any]:
    """A step's figures (a dataclass with ``cost`` and ``window``) as the heartbeat carries
    them: its other fields as they are, in order, then ``cost_ms``, its time per frame
    since start and, when it took a window, since the previous heartbeat."""
    out = {f.name: getattr(figures, f.name) for f in fields(figures) if f.name not in ("cost", "window")}
    out["cost_ms"] = cost = {"cumulative": figures.cost.summary_ms()}
    if figures.window is not None:
        cost["window"] = figures.window.summary_ms()
    return out
