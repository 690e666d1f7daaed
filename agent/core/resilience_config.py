"""How the agent holds up, and how that is tested: ``resilience`` (where a run of
inference failures leads), ``service`` (what the systemd watchdog's pings vouch for) and
``faults`` (failures injected into the real pipeline, for tests only)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from edge_agent.core.configfields import check, path_field


@dataclass(frozen=True)
class ResilienceConfig:
    """What the agent does when inference keeps failing: reload the backend, then fall
    back to ONNX Runtime on the CPU (with ``fallback_model``, or the same model), then
    exit non-zero for systemd to restart it."""

    max_consecutive_errors: int = 10  # inference errors in a row that trip the breaker
    fallback_model: str = path_field("file")  # empty: the main model

    def __post_init__(self) -> None:
        check(1 <= self.max_consecutive_errors <= 10_000, "max_consecutive_errors", "must be within 1..10000")


@dataclass(frozen=True)
class ServiceConfig:
    """What the systemd watchdog means. Pings go out while the agent does its job: every
    stage thread alive and progressing, no stage failed. A camera that is down is retried
    on schedule and is the camera's fault, not the agent's, so it stops the pings only
    when ``stall_watchdog_s`` asks for it (the outage shows in STATUS=, heartbeats and
    metrics either way)."""

    # A stage thread without progress this long (or 3x the slowest inference so far, if
    # longer) is stuck: no pings.
    stage_timeout_s: float = 5.0
    stall_watchdog_s: float = 0.0  # no frame from any source this long: no pings (a restart); 0: off

    def __post_init__(self) -> None:
        check(self.stage_timeout_s > 0, "stage_timeout_s", "must be > 0")
        check(self.stall_watchdog_s >= 0, "stall_watchdog_s", "must be >= 0 (0: off)")


@dataclass(frozen=True)
class FaultsConfig:
    """Fault injection, for tests on the real pipeline only: refused unless the
    environment variable EDGE_AGENT_FAULTS=1 is set."""

    source_outage_after_frames: int = 0  # the camera disappears after this many frames ...
    source_outage_s: float = 0.0  # ... for this long, then comes back
    backend_error_rate: float = 0.0  # share of inferences that raise
    backend_fail_after_frames: int = 0  # every inference after this many raises (0: never)
    backend_delay_ms: float = 0.0  # added to every inference
    model_load_delay_s: float = 0.0  # added to loading the models (a first TensorRT engine build)
    seed: int = 0

    def __post_init__(self) -> None:
        check(0.0 <= self.backend_error_rate <= 1.0, "backend_error_rate", "must be within 0..1")
        check(self.source_outage_s >= 0 and self.backend_delay_ms >= 0, "source_outage_s", "must be >= 0")
        check(self.model_load_delay_s >= 0, "model_load_delay_s", "must be >= 0")
        check(
            not self.active() or os.environ.get("EDGE_AGENT_FAULTS") == "1",
            "backend_error_rate" if self.backend_error_rate else "source_outage_after_frames",
            "fault injection is for tests: set EDGE_AGENT_FAULTS=1 to allow it",
        )

    def active(self) -> bool:
        return bool(
            self.source_outage_after_frames
            or self.backend_error_rate
            or self.backend_fail_after_frames
            or self.backend_delay_ms
            or self.model_load_delay_s
        )
