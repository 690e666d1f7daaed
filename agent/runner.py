"""Builds the agent from its config and owns the lifetime of every component.

Components start in order (publisher, source, pipeline) and stop in reverse; every
failure to build names the file, device or key at fault before anything is started.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from edge_agent.core.config import (
    AgentConfig,
    LadderStep,
    OnnxRuntimeConfig,
    config_hash,
)
from edge_agent.core.lifecycle import Parts
from edge_agent.core.plan import model_at, model_batches, source_models, with_batch
from edge_agent.core.source_config import SourceConfig
from edge_agent.models.manifest import (
    ModelError,
)
from edge_agent.pipelines.deadline import DeadlineMonitor
from edge_agent.pipelines.health import HealthReporter
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.model import LoadedModel, load_model
from edge_agent.pipelines.pipeline import Pipeline
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.publish import MessageBuilder, ZmqPublisher
from edge_agent.pipelines.sources import create_source
from edge_agent.power.manager import PowerManager
from edge_agent.reloading import Reloading, make_publisher

log = logging.getLogger(__name__)


class _FinalBeat:
    """The last heartbeat, as a part of the agent's lifecycle (see ``Agent.start``)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def start(self) -> None:
        pass

    def stop(self, timeout_s: float) -> bool:
        if self.agent.health is not None:
            self.agent.health.beat(final=True)
        return True


class Agent(Reloading):
    """One configured agent: source → pipeline → result stream, with its heartbeat."""

    #: Warn, at start and at each reload, of a source whose model cannot fit its budget
    #: (``core.budget_fit``). The bench and tune measure that themselves and say it once.
    says_budget_advice = True

    def __init__(self, config: AgentConfig, max_frames: int = 0) -> None:
        self.config = config
        self.max_frames = max_frames
        self.models: dict[str, LoadedModel] = {}  # by path, the main model under ""
        self.profiles: dict[str, Profile] = {}  # the same keys
        self.sources: dict[str, Any] = {}  # by source name
        self.pipeline: Pipeline | None = None
        self.publisher: ZmqPublisher | None = None
        self.health: HealthReporter | None = None
        self.power: PowerManager | None = None
        self.metrics: Any = None
        self.view: Any = None  # the live view's server, when enabled
        self._parts = Parts()  # what start() started, stopped in reverse
        self._undrained: list[Pipeline] = []  # replaced by a reload with a stage stuck
        self._breaker_trips = 0  # Agent.recover's escalation since the last config change

    def heartbeats(self) -> dict[str, Any]:
        """The latest heartbeat of each source (for the live view)."""
        return dict(self.health.latest_by_source) if self.health is not None else {}

    @property
    def model(self) -> LoadedModel | None:
        return next(iter(self.models.values()), None)

    def _load_profiles(self, cfg: AgentConfig) -> tuple[dict[str, Profile], dict[str, LoadedModel]]:
        """Load every model the config names (the ladder's and the sources' own too) and
        key them by path (the main model under "").

        Ladder models are loaded now, not when the ladder reaches them: a switch under
        overload must be instant, and a broken fallback must fail at start, not then.
        """
        batches = model_batches(cfg)
        if cfg.faults.model_load_delay_s:
            time.sleep(cfg.faults.model_load_delay_s)
        main = self._faulty(load_model(cfg.model, with_batch(cfg.backend, batches[""])), cfg)
        profiles = {"": Profile(main.manifest.name, main)}
        models = {"": main}
        wanted = [("ladder step", s.name, s.model, s.manifest, True) for s in cfg.deadline.ladder]
        wanted += [("source", s.name, s.model, s.manifest, False) for s in cfg.source_list()]
        try:
            for what, tag, path, manifest, same_labels in wanted:
                if not path or path in profiles:
                    continue
                alt_cfg = model_at(cfg, path, manifest)
                backend = with_batch(cfg.backend, batches[path])
                alt = models[path] = self._faulty(load_model(alt_cfg, backend), cfg)
                if same_labels and alt.manifest.labels != main.manifest.labels:
                    raise ModelError(f"{what} {tag!r}: {path} has other labels than the main model")
                # Profile names key the per-model estimates and latencies: keep them unique.
                name = alt.manifest.name
                if name in {p.name for p in profiles.values()}:
                    name = f"{name}@{tag}"
                profiles[path] = Profile(name, alt)
        except BaseException:
            for m in models.values():  # loaded for nothing: give the sessions back
                m.close()
            raise
        return profiles, models

    @staticmethod
    def _faulty(model: LoadedModel, cfg: AgentConfig) -> LoadedModel:
        f = cfg.faults
        if f.backend_error_rate or f.backend_fail_after_frames or f.backend_delay_ms:
            from edge_agent.pipelines.faults import FaultyBackend

            model.backend = FaultyBackend(model.backend, f)
        return model

    @staticmethod
    def _source(cfg: AgentConfig, src: SourceConfig) -> Any:
        source = create_source(src)
        if cfg.faults.source_outage_after_frames:
            from edge_agent.pipelines.faults import FaultySource

            source = FaultySource(source, cfg.faults)
        return source

    @staticmethod
    def _lane_profiles(
        cfg: AgentConfig, profiles: dict[str, Profile]
    ) -> list[tuple[str, dict[str, Profile]]]:
        """Per source, the profiles it may use, its own under "" (the ladder's model steps
        then have nothing to switch a source with its own model to; its strides and
        alert-only steps still apply)."""
        return [
            (src.name, {"": profiles[paths[0]], **{p: profiles[p] for p in paths[1:]}})
            for src, paths in source_models(cfg)
        ]

    def _pipeline(
        self, cfg: AgentConfig, sources: dict[str, Any], profiles: dict[str, Profile], advise: bool = True
    ) -> Pipeline:
        """The lanes of ``cfg`` on ``profiles``, warmed up. ``advise``: warn of a source
        whose model cannot fit its budget (off where the warm-up times are not the model's
        alone: a reload's new model warmed up beside the running pipeline)."""
        assert self.publisher is not None
        lanes = []
        for i, (src, (_, lane_profiles)) in enumerate(
            zip(cfg.source_list(), self._lane_profiles(cfg, profiles))
        ):
            budget_ms = src.budget_ms or cfg.deadline.budget_ms
            labels = lane_profiles[""].model.manifest.labels
            lanes.append(
                Lane(
                    i,
                    sources[src.name],
                    lane_profiles,
                    DeadlineMonitor(replace(cfg.deadline, budget_ms=budget_ms)),
                    MessageBuilder(cfg.device_id, labels, budget_ms, self.power, cfg.publish.encoding),
                    cfg.publish.topic,
                    src.priority,
                    src.max_fps,
                )
            )
        if self.view is not None:
            for lane in lanes:
                lane.view_tap = self.view.tap(lane.name, cfg.model.max_detections)
            self.view.keep({lane.name for lane in lanes})
        b = cfg.batching
        pipeline = Pipeline(
            lanes,
            self.publisher,
            self.max_frames,
            cfg.resilience.max_consecutive_errors,
            b.max_batch,
            b.max_wait_ms,
            b.margin_ms,
        )
        pipeline.warm_up()
        if advise and self.says_budget_advice:
            for line in pipeline.budget_advice(budget_settings(cfg)):
                log.warning("%s", line)
        return pipeline

    def build(self) -> None:
        cfg = self.config
        self.profiles, self.models = self._load_profiles(cfg)
        try:
            self.sources = {src.name: self._source(cfg, src) for src in cfg.source_list()}
            self.power = PowerManager(cfg.power)
            self.publisher = make_publisher(cfg.publish)
            if cfg.view.enabled:
                from edge_agent.view.server import ViewServer

                self.view = ViewServer(cfg.view, self.heartbeats, cfg.device_id)
            self.pipeline = self._pipeline(cfg, self.sources, self.profiles)
            self.health = HealthReporter(
                self.pipeline, self.publisher, cfg.device_id, cfg.publish.health_interval_s, self.power
            )
            self.health.config_hash = config_hash(cfg)
        except BaseException:
            self.close_models()  # nothing started: the sessions go back
            raise

    def recover(self) -> str:
        """The inference breaker opened: reload the backend, then fall back to ONNX Runtime
        on the CPU, then give up (the pipeline's error makes `run` exit non-zero, and
        systemd restarts the agent). Returns what was done."""
        self._breaker_trips += 1
        cfg = self.config
        if self._breaker_trips == 1:
            log.error("breaker: reloading the backend")
            try:
                self.reload(cfg, force=True)
                return "reloaded the backend"
            except Exception as e:  # a backend that no longer loads: on to the fallback
                log.error("breaker: the reload failed (%s)", e)
                self._breaker_trips = 2
        fb_model = cfg.resilience.fallback_model
        fallback = replace(
            cfg,
            backend=OnnxRuntimeConfig(),
            # A manifest written for the main model does not describe another one.
            model=replace(
                cfg.model, path=fb_model or cfg.model.path, manifest="" if fb_model else cfg.model.manifest
            ),
            deadline=replace(cfg.deadline, ladder=(LadderStep(),)),
        )
        if self._breaker_trips == 2 and fallback != cfg:
            log.error(
                "breaker: falling back to ONNX Runtime on the CPU (%s)", fallback.model.path or "bundled"
            )
            try:
                self.reload(fallback, force=True)
                return "fell back to ONNX Runtime on the CPU"
            except Exception as e:
                log.error("breaker: the fallback failed (%s)", e)
        assert self.pipeline is not None
        self.pipeline.error = "inference keeps failing after a backend reload and the fallback: giving up"
        log.error("breaker: %s", self.pipeline.error)
        return "gave up"

    def _restart_metrics(self, cfg: AgentConfig) -> None:
        """Close the metrics server, if any, and start one as ``cfg`` says (if enabled)."""
        if self.metrics is not None:
            self.metrics.close()
            self._parts.remove(self.metrics)
            self.metrics = None
        if cfg.metrics.enabled:
            from edge_agent.metrics import AgentCollector, MetricsServer

            self.metrics = MetricsServer(AgentCollector(self), cfg.metrics.host, cfg.metrics.port)
            self._parts.start(self.metrics)

    def _start_pipeline(self, pipeline: Pipeline, old_pipeline: Pipeline) -> None:
        assert self.health is not None
        pipeline.adopt(old_pipeline)
        self._parts.replace(self.pipeline, pipeline)
        self.pipeline = pipeline
        self.health.pipeline, self.health.power, self.health.publisher = pipeline, self.power, self.publisher
        self.health.interval_s = self.config.publish.health_interval_s
        self.health.config_hash = config_hash(self.config)
        pipeline.start()

    def start(self, interrupt: threading.Event | None = None) -> None:
        """Open the stream and the sources, wait for the subscribers a file needs, start
        the stages and the heartbeat. ``interrupt`` (a stop signal) ends that wait early.

        On failure, whatever already started is stopped again.
        """
        assert self.pipeline is not None and self.publisher is not None, "build() first"
        assert self.power is not None and self.health is not None
        try:
            # Power first: the device is in its profile before the first frame, and it is
            # the last thing put back.
            self._parts.start(self.power)
            self._parts.start(self.publisher)
            # Stops after the pipeline drained and before the socket closes: the final
            # heartbeat holds the final counts.
            self._parts.start(_FinalBeat(self))
            for source in self.sources.values():
                self._parts.start(source)
            self._wait_for_subscribers(interrupt)
            self._parts.start(self.pipeline)
            self._parts.start(self.health)
            self._restart_metrics(self.config)
            if self.view is not None:
                self._parts.start(self.view)
        except BaseException:
            self.stop()
            raise

    def _wait_for_subscribers(self, interrupt: threading.Event | None) -> None:
        """Before the first frame of a file: results published before a waiting subscriber's
        subscription arrived would be lost to it (ZeroMQ drops them)."""
        assert self.publisher is not None
        wanted = self.config.subscribers_to_wait_for()
        if not wanted:
            return
        timeout_s = self.config.publish.subscriber_timeout_s
        log.info("waiting up to %.1f s for %d subscriber(s) to the results", timeout_s, wanted)
        got = self.publisher.wait_for_subscribers(wanted, timeout_s, interrupt)
        if got < wanted and not (interrupt is not None and interrupt.is_set()):
            log.info(
                "%d of %d subscribers to the results after %.1f s (publish.wait_for_subscribers; "
                "a client refused by CURVE never subscribes): publishing anyway",
                got,
                wanted,
                timeout_s,
            )

    def stop(self, timeout_s: float = 1.0) -> bool:
        """Stop everything that started, in reverse order; True if every thread ended.

        The heartbeat stops at once, the pipeline drains within ``timeout_s`` (then gives
        up on a stuck stage), and a camera reader stuck in its driver is not waited for,
        so the whole stop stays under two seconds.
        """
        clean = self._parts.stop(timeout_s)
        stuck = [name for p in self._undrained for name in p.alive()]
        if stuck:
            log.error("a pipeline replaced by a reload still has a stuck stage: %s", stuck)
            clean = False
        if clean:
            self.close_models()
        return clean

    def close_models(self) -> bool:
        """Give every model's session back (an agent built and never started, or stopped);
        False, and nothing closed, while a stage thread is still running: a session is
        never pulled from under a stage that may be inside it."""
        running = [
            *(self.pipeline.alive() if self.pipeline is not None else ()),
            *(name for p in self._undrained for name in p.alive()),
        ]
        if running:
            log.warning("models left open: stage thread(s) %s still running", running)
            return False
        for model in self.models.values():
            model.close()
        return True

    def __enter__(self) -> Agent:
        """Built (models loaded) for the block; on leaving it, whatever was started is
        stopped and the models are closed once no stage thread runs (``stop``)."""
        if self.pipeline is None:
            self.build()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> dict[str, Any]:
        assert self.model is not None and self.pipeline is not None
        return {
            "model": self.model.resolved.path,
            "manifest": self.model.resolved.manifest_path or "(read from the ONNX)",
            "input_adapter": "adapted copy" if self.model.adapted_from else "off",
            **self.model.backend.describe(),
            "sources": [source.describe() for source in self.sources.values()],
            "endpoint": self.config.publish.endpoint,
            "ladder": [step.name for step in self.config.deadline.ladder],
        }


def budget_settings(cfg: AgentConfig) -> dict[str, str]:
    """By source name, the key that sets its budget: its own ``budget_ms``, else the deadline's."""
    keys = {f"sources[{i}].budget_ms": s for i, s in enumerate(cfg.sources)}
    keys = keys or {"source.budget_ms": cfg.source}
    return {s.name: key if s.budget_ms else "deadline.budget_ms" for key, s in keys.items()}
