"""Builds the agent from its config and owns the lifetime of every component.

Components start in order (publisher, source, pipeline) and stop in reverse; every
failure to build names the file, device or key at fault before anything is started. The
parts are made by the agent's ``Assembly``; a reload prepares the new config's with its
``Reloader`` while the old pipeline runs, then the agent swaps them at a frame boundary.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace
from typing import Any

from edge_agent.core.config import AgentConfig, config_hash
from edge_agent.core.deadline_config import LadderStep
from edge_agent.core.lifecycle import Parts
from edge_agent.core.model_config import OnnxRuntimeConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.reloads import REBIND, marked_fields
from edge_agent.pipelines.heartbeat import HealthReporter
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.pipeline import Pipeline
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.sources.base import Source
from edge_agent.power.manager import PowerManager
from edge_agent.service.assembly import Assembly
from edge_agent.service.reloading import Prepared, Reloader
from edge_agent.service.snapshots import SnapshotService

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


class Agent:
    """One configured agent: source → pipeline → result stream, with its heartbeat."""

    def __init__(self, config: AgentConfig, max_frames: int = 0, assembly: Assembly | None = None) -> None:
        """``max_frames``: each source ends after that many frames (0: runs on);
        ``assembly``: what makes the parts (the bench's plays frames from memory), which
        then holds ``max_frames`` itself."""
        if assembly is not None and max_frames:
            raise ValueError("max_frames goes to the assembly given: Assembly(max_frames)")
        self.config = config
        self.assembly = assembly if assembly is not None else Assembly(max_frames)
        self._reloader = Reloader(self.assembly)
        self.models: dict[str, LoadedModel] = {}  # by path, the main model under ""
        self.profiles: dict[str, Profile] = {}  # the same keys
        self.sources: dict[str, Source] = {}  # by source name
        self.pipeline: Pipeline | None = None
        self.publisher: ZmqPublisher | None = None
        self.health: HealthReporter | None = None
        self.power: PowerManager | None = None
        self.metrics: Any = None
        self.view: Any = None  # the live view's server, when enabled
        self.snapshots = SnapshotService()  # event snapshots (a thread once the first is taken)
        self._parts = Parts()  # what start() started, stopped in reverse
        self._undrained: list[Pipeline] = []  # replaced by a reload with a stage stuck
        self._breaker_trips = 0  # Agent.recover's escalation since the last config change

    def heartbeats(self) -> dict[str, Any]:
        """The latest heartbeat of each source (for the live view)."""
        return dict(self.health.latest_by_source) if self.health is not None else {}

    @property
    def model(self) -> LoadedModel | None:
        return next(iter(self.models.values()), None)

    def primary_profile(self, source: int = 0) -> Profile:
        """The profile (the loaded model and its buffers) the ``source``-th source runs:
        its own model's, else the main one's."""
        return self.assembly.lane_profiles(self.config, self.profiles)[source].primary

    def _emulated(self) -> dict[str, Any] | None:
        """The emulated accelerator's settings when a model runs on it (the heartbeat's
        ``emulated``), else None."""
        for m in self.models.values():
            d = m.backend.describe()
            if d.get("emulated"):
                return {k: d[k] for k in ("recording", "recorded_model", "device_ms", "device_ms_per_frame")}
        return None

    def build(self) -> None:
        cfg, assembly = self.config, self.assembly
        self.profiles, self.models = assembly.load_profiles(cfg)
        try:
            self.sources = {src.name: assembly.source(cfg, src) for src in cfg.source_list()}
            self.power = PowerManager(cfg.power)
            self.publisher = ZmqPublisher.from_config(cfg.publish)
            if cfg.view.enabled:
                from edge_agent.service.view.server import ViewServer

                self.view = ViewServer(cfg.view, self.heartbeats, cfg.device_id)
            self.pipeline = self._pipeline(cfg, self.sources, self.profiles)
            self.health = HealthReporter(
                self.pipeline, self.publisher, cfg.device_id, cfg.publish.health_interval_s, self.power
            )
            self.health.config_hash = config_hash(cfg)
            self.health.run_id = self.assembly.run_id
            self.health.emulated = self._emulated()
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
            from edge_agent.service.metrics import AgentCollector, MetricsServer

            self.metrics = MetricsServer(AgentCollector(self), cfg.metrics.host, cfg.metrics.port)
            self._parts.start(self.metrics)

    def _pipeline(
        self,
        cfg: AgentConfig,
        sources: dict[str, Source],
        profiles: dict[str, Profile],
        advise: bool = True,
    ) -> Pipeline:
        """``cfg``'s pipeline on ``sources`` and ``profiles``, on this agent's stream, power
        and view (``Assembly.pipeline``)."""
        assert self.publisher is not None
        return self.assembly.pipeline(
            cfg, sources, profiles, self.publisher, self.power, self.view, advise, self.snapshots
        )

    # -- reload -------------------------------------------------------------------------

    def reload(self, new: AgentConfig, force: bool = False) -> list[str]:
        """Swap to ``new`` at a frame boundary, keeping the result stream and its seq.

        Everything that can fail (models, a new source) is prepared while the old
        pipeline still runs; if it fails, the old config keeps running and the error is
        raised. Returns what changed.
        """
        old = self.config
        assert self.pipeline is not None and self.publisher is not None and self.health is not None
        changed = self._reloader.changes(old, new)
        # CURVE: keys added to (or removed from) the allowed folder count from now on, even
        # when the config itself did not change. A rebind below reads the folder anyway.
        self.publisher.refresh_clients()
        if not changed and not force:
            self.config = new  # at most a section read elsewhere (the uplink's) or at start
            self.health.config_hash = config_hash(new)
            return []
        if not force:
            self._breaker_trips = 0  # a new config starts the breaker's escalation afresh
        ready = self._reloader.prepare(old, new, force, self.sources, self.profiles, self.models)
        # The swap: drain the old pipeline, then start the new one on the same socket.
        old_pipeline = self.pipeline
        drained = old_pipeline.stop()
        if not drained:  # its stuck thread still counts when the agent stops
            self._undrained.append(old_pipeline)
        try:
            self._swap_parts(old, new)
            pipeline = self._pipeline(new, ready.sources, ready.profiles, advise=not ready.models_changed)
        except BaseException:
            self._resume_old(old, ready, old_pipeline)
            raise
        self._adopt_sources(ready.sources, old_pipeline)
        self.config = new
        self._start_pipeline(pipeline, old_pipeline)
        if ready.models_changed:
            if drained:
                for m in self.models.values():
                    m.close()
            else:  # a stage is stuck inside the old backend: never pull it from under it
                log.warning("reload: the old pipeline did not drain; its models stay open")
            self.models, self.profiles = ready.models, ready.profiles
        log.info("reload: applied (%s)", ", ".join(changed))
        return changed

    def _resume_old(self, old: AgentConfig, ready: Prepared, old_pipeline: Pipeline) -> None:
        """The swap failed after the drain: close what the reload opened and run ``old`` again."""
        # Past the drain nothing may leave the agent without a pipeline: the old
        # config comes back (its models and sources are still open), then the error.
        log.exception("reload: failed after the swap began; resuming the old config")
        self._reloader.discard(ready, self.sources)
        try:
            self._swap_parts(ready.config, old)
        except Exception:
            log.exception("reload: could not put the old power profile or socket back")
        self._start_pipeline(self._pipeline(old, self.sources, self.profiles, advise=False), old_pipeline)

    def _adopt_sources(self, sources: dict[str, Source], old_pipeline: Pipeline) -> None:
        """Close the sources the new config no longer runs and make ``sources`` the agent's."""
        for name, source in self.sources.items():
            if sources.get(name) is not source:
                source.close()
        # Sources start just before the pipeline, so they stop just after it.
        for source in self.sources.values():
            self._parts.remove(source)
        self._parts.insert_before(old_pipeline, sources.values())
        self.sources = sources

    def _swap_parts(self, old: AgentConfig, new: AgentConfig) -> None:
        """The power profile and the result socket for ``new`` (the pipeline is stopped)."""
        if old.power != new.power:
            assert self.power is not None
            self.power.close()  # puts the old profile's state back first
            power = PowerManager(new.power)
            power.start()
            self._parts.replace(self.power, power)
            self.power = power
        if old.metrics != new.metrics:
            self._restart_metrics(new)
        pub_old, pub_new = old.publish, new.publish
        if any(getattr(pub_old, k) != getattr(pub_new, k) for k in marked_fields(PublishConfig, REBIND)):
            log.warning("reload: the result stream is rebound (%s); subscribers reconnect", pub_new.endpoint)
            assert self.publisher is not None
            self.publisher.close()
            publisher: ZmqPublisher = ZmqPublisher.from_config(pub_new)
            publisher.open()
            self._parts.replace(self.publisher, publisher)
            self.publisher = publisher

    def _start_pipeline(self, pipeline: Pipeline, old_pipeline: Pipeline) -> None:
        assert self.health is not None and self.publisher is not None
        pipeline.adopt(old_pipeline)
        self._parts.replace(self.pipeline, pipeline)
        self.pipeline = pipeline
        self.health.attach(pipeline, self.publisher, self.power)
        self.health.interval_s = self.config.publish.health_interval_s
        self.health.config_hash = config_hash(self.config)
        self.health.emulated = self._emulated()
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
            self._parts.start(self.snapshots)  # stops after the pipeline: the last ones written
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
