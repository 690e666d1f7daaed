"""The per-frame deadline (``deadline``: the budget, per-stage budgets, admission, and the
degradation ladder stepped down and back up by the miss rate), and the scheduler's
``batching`` of several sources' frames within it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core.configfields import check, path_field
from edge_agent.core.names import NAME_RULE, name_ok
from edge_agent.core.reloads import MODELS
from edge_agent.core.stamps import STAGES


@dataclass(frozen=True)
class LadderStep:
    """One rung of the degradation ladder; the first rung is normal operation."""

    name: str = "full"
    frame_stride: int = 1  # process every Nth frame; the others are dropped as "ladder"
    # another ONNX (e.g. the same network at a smaller input); empty: main
    model: str = path_field("file", reload=(MODELS,))
    manifest: str = path_field("file", reload=(MODELS,))  # its manifest; empty: beside it
    infer: bool = True  # false: alert only (frames are counted and dropped, health goes on)

    def __post_init__(self) -> None:
        check(name_ok(self.name), "name", NAME_RULE)
        check(self.frame_stride >= 1, "frame_stride", "must be >= 1")


@dataclass(frozen=True)
class DeadlineConfig:
    budget_ms: float = 50.0  # capture to publish
    # Under overload `throughput` (newest frame wins) starts inference on the newest frame
    # even if it waited up to a frame interval; `latency` starts only on a frame fresh
    # enough to finish within pre + infer + post, waiting for the next capture otherwise:
    # a lower p99 at lower throughput.
    mode: Literal["throughput", "latency"] = "throughput"
    # Per-stage budgets (stage names as in the message's latency_ms); a stage over its
    # budget is counted per stage, so the health stream shows which stage broke the total.
    stage_budgets_ms: dict[str, float] = field(default_factory=dict)
    admission: bool = True  # drop, before inference, frames too old to finish in time
    miss_window_s: float = 2.0  # sliding window for the miss rate
    step_down_miss_rate: float = 0.2  # above this, step down the ladder
    step_up_miss_rate: float = 0.02  # at or below this for step_up_after_s, step back up
    step_up_after_s: float = 5.0
    ladder: tuple[LadderStep, ...] = (LadderStep(),)

    def __post_init__(self) -> None:
        check(0 < self.budget_ms <= 60_000, "budget_ms", "must be within (0, 60000]")
        for name, ms in self.stage_budgets_ms.items():
            check(name in STAGES, "stage_budgets_ms", f"unknown stage {name!r} (stages: {', '.join(STAGES)})")
            check(ms > 0, "stage_budgets_ms", f"budget of {name!r} must be > 0")
        check(0.5 <= self.miss_window_s <= 600, "miss_window_s", "must be within 0.5..600")
        check(0 < self.step_down_miss_rate <= 1, "step_down_miss_rate", "must be within (0, 1]")
        check(
            0 <= self.step_up_miss_rate < self.step_down_miss_rate,
            "step_up_miss_rate",
            "must be >= 0 and below step_down_miss_rate (the gap is the hysteresis)",
        )
        check(0 < self.step_up_after_s <= 3600, "step_up_after_s", "must be within (0, 3600]")
        check(len(self.ladder) >= 1, "ladder", "at least one step (normal operation)")
        names = [s.name for s in self.ladder]
        check(len(set(names)) == len(names), "ladder", "step names must be unique")
        first = self.ladder[0] if self.ladder else LadderStep()
        check(
            first.frame_stride == 1 and first.infer and not first.model,
            "ladder",
            "the first step is normal operation: frame_stride 1, infer true, the main model",
        )


@dataclass(frozen=True)
class BatchingConfig:
    """How the scheduler in front of inference batches frames of several sources.

    A batch holds at most one frame per source. The scheduler waits for more frames only
    while the most urgent frame in hand keeps its slack (and at most ``max_wait_ms``), and
    a batch never grows past what keeps its frames, and the next frame of any
    higher-priority source, within their budgets.
    """

    max_batch: int = 0  # 0: up to one frame per source (or the model's fixed batch); 1: no batching
    max_wait_ms: float = 4.0  # longest wait for more frames once one is ready
    margin_ms: float = 2.0  # kept free of each budget, for the error of the time estimates

    def __post_init__(self) -> None:
        check(0 <= self.max_batch <= 64, "max_batch", "must be within 0..64 (0: as many as sources)")
        check(0 <= self.max_wait_ms <= 1000, "max_wait_ms", "must be within 0..1000")
        check(0 <= self.margin_ms <= 1000, "margin_ms", "must be within 0..1000")
