"""Fault injection wrappers for tests on the real pipeline (enabled only from a test config:
FaultsConfig refuses itself unless EDGE_AGENT_FAULTS=1).

``FaultySource`` makes a live camera disappear for a while and come back; ``FaultyBackend``
raises on a share of inferences, on every inference after N, or adds a delay. Both wrap
the real component and forward everything else to it.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from edge_agent.core.resilience_config import FaultsConfig
from edge_agent.pipelines.backends.base import InferenceBackend, IOSet
from edge_agent.pipelines.sources.base import Source, SourceFrame

log = logging.getLogger(__name__)


class InjectedFault(RuntimeError):
    pass


class FaultySource(Source):
    def __init__(self, inner: Source, faults: FaultsConfig) -> None:
        super().__init__(inner.name)
        self.inner = inner
        self.policy = inner.policy
        self.faults = faults
        self.frames = 0
        self.failures = 0
        self.connected = True
        self._outage_until = 0.0

    def open(self) -> None:
        self.inner.open()

    def close(self) -> None:
        self.inner.close()

    def read(self, timeout_s: float) -> SourceFrame | None:
        f = self.faults
        now = time.monotonic()
        if (
            f.source_outage_after_frames
            and self.frames == f.source_outage_after_frames
            and not self._outage_until
        ):
            self._outage_until = now + f.source_outage_s
            self.failures += 1
            self.connected = False
            log.warning("source %s: camera lost (injected)", self.name)
        if now < self._outage_until:
            time.sleep(min(timeout_s, self._outage_until - now))
            return None
        if not self.connected:
            self.connected = True
            log.info("source %s: camera back (injected outage over)", self.name)
        frame = self.inner.read(timeout_s)
        if frame is not None:
            self.frames += 1
        self.skipped, self.stale = self.inner.skipped, self.inner.stale
        self.lost, self.damage = self.inner.lost, self.inner.damage
        return frame

    def describe(self) -> dict[str, Any]:
        return {
            **self.inner.describe(),
            "connected": self.connected,
            "failures": self.failures,
            "injected": True,
        }


class FaultyBackend(InferenceBackend):
    def __init__(self, inner: InferenceBackend, faults: FaultsConfig) -> None:
        self.inner = inner
        self.faults = faults
        self.name = inner.name
        self.calls = 0
        self._rng = random.Random(faults.seed)

    def load(self, model_path: str, input_format: Any = None) -> None:
        self.inner.load(model_path, input_format)

    @property
    def inputs(self):  # type: ignore[override]
        return self.inner.inputs

    @property
    def outputs(self):  # type: ignore[override]
        return self.inner.outputs

    def host_format(self, fmt: Any) -> Any:
        return self.inner.host_format(fmt)

    def allocate(self, batch: int = 1) -> IOSet:
        return self.inner.allocate(batch)

    def batch_axis(self) -> tuple[int, bool]:
        return self.inner.batch_axis()

    def warmup(self, io: IOSet, runs: int = 3) -> None:
        self.inner.warmup(io, runs)  # warm-up is not a frame: no faults

    def prepare(self, io: IOSet) -> None:
        self.inner.prepare(io)

    def infer(self, io: IOSet) -> None:
        f = self.faults
        self.calls += 1
        if f.backend_delay_ms:
            time.sleep(f.backend_delay_ms / 1e3)
        if f.backend_fail_after_frames and self.calls > f.backend_fail_after_frames:
            raise InjectedFault(f"injected failure (inference {self.calls})")
        if f.backend_error_rate and self._rng.random() < f.backend_error_rate:
            raise InjectedFault(f"injected error (inference {self.calls})")
        self.inner.infer(io)

    def describe(self) -> dict[str, Any]:
        return {**self.inner.describe(), "injected_faults": True}

    def close(self) -> None:
        self.inner.close()
