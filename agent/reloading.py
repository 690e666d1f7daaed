"""How a running agent takes a new config (SIGHUP, `systemctl reload`): everything that can
fail is prepared while the old config still runs, then the pipeline is swapped at a frame
boundary on the same result socket, so sequence numbers and counts go on. A mixin of
``runner.Agent``, which owns the parts it swaps."""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import Any

from edge_agent.core.config import AgentConfig, OnnxRuntimeConfig, PublishConfig, config_hash
from edge_agent.core.plan import capture_part, model_batches
from edge_agent.core.reloads import AT_START, ELSEWHERE, MODELS, REBIND, marked_fields, marked_values
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.pipeline import Pipeline
from edge_agent.pipelines.profile import Profile, prepare_buffers
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.power.manager import PowerManager

log = logging.getLogger("edge_agent.runner")


def make_publisher(pub: PublishConfig) -> ZmqPublisher:
    return ZmqPublisher(
        pub.endpoint,
        pub.send_hwm,
        pub.encoding,
        pub.curve_server_key,
        pub.curve_clients_dir,
        pub.topic,
        max_subscribers=pub.max_subscribers,
    )


class Reloading:
    """``Agent.reload`` and its steps."""

    config: AgentConfig
    pipeline: Pipeline | None
    publisher: Any
    health: Any
    power: Any
    sources: dict[str, Any]
    models: dict[str, LoadedModel]
    profiles: dict[str, Profile]

    def reload(self, new: AgentConfig, force: bool = False) -> list[str]:
        """Swap to ``new`` at a frame boundary, keeping the result stream and its seq.

        Everything that can fail (models, a new source) is prepared while the old
        pipeline still runs; if it fails, the old config keeps running and the error is
        raised. Returns what changed.
        """
        old = self.config
        assert self.pipeline is not None and self.publisher is not None and self.health is not None
        differ = [f for f in fields(AgentConfig) if getattr(old, f.name) != getattr(new, f.name)]
        later = [f.name for f in differ if AT_START in f.metadata.get("reload", ())]
        if later:
            log.warning("reload: %s take effect at the next start", ", ".join(later))
        skip = (ELSEWHERE, AT_START)
        changed = [f.name for f in differ if not set(skip) & set(f.metadata.get("reload", ()))]
        # CURVE: keys added to (or removed from) the allowed folder count from now on, even
        # when the config itself did not change. A rebind below reads the folder anyway.
        self.publisher.refresh_clients()
        if not changed and not force:
            self.config = new  # at most a section read elsewhere (the uplink's) or at start
            self.health.config_hash = config_hash(new)
            return []
        models_changed = self._models_changed(old, new, force)
        if not force:
            self._breaker_trips = 0  # a new config starts the breaker's escalation afresh
        profiles, models = self._load_profiles(new) if models_changed else (self.profiles, self.models)
        sources = self._prepare_sources(old, new, profiles, models, models_changed)
        # The swap: drain the old pipeline, then start the new one on the same socket.
        old_pipeline = self.pipeline
        drained = old_pipeline.stop()
        if not drained:  # its stuck thread still counts when the agent stops
            self._undrained.append(old_pipeline)
        try:
            self._swap_parts(old, new)
            pipeline = self._pipeline(new, sources, profiles, advise=not models_changed)
        except BaseException:
            self._resume_old(old, new, sources, models if models_changed else {}, old_pipeline)
            raise
        self._adopt_sources(sources, old_pipeline)
        self.config = new
        self._start_pipeline(pipeline, old_pipeline)
        if models_changed:
            if drained:
                for m in self.models.values():
                    m.close()
            else:  # a stage is stuck inside the old backend: never pull it from under it
                log.warning("reload: the old pipeline did not drain; its models stay open")
            self.models, self.profiles = models, profiles
        log.info("reload: applied (%s)", ", ".join(changed))
        return changed

    @staticmethod
    def _models_changed(old: AgentConfig, new: AgentConfig, force: bool) -> bool:
        """Whether a reload from ``old`` to ``new`` must load the models again."""
        return (
            force
            or marked_values(old, MODELS) != marked_values(new, MODELS)
            # A TensorRT engine is built for the batch its sources can form.
            or (not isinstance(new.backend, OnnxRuntimeConfig) and model_batches(old) != model_batches(new))
        )

    def _prepare_sources(
        self,
        old: AgentConfig,
        new: AgentConfig,
        profiles: dict[str, Profile],
        models: dict[str, LoadedModel],
        models_changed: bool,
    ) -> dict[str, Any]:
        """Open ``new``'s sources and prepare its buffers while the old pipeline runs; on
        failure close what was opened for it (``models`` too, if they were loaded for it)."""
        # A source whose capture settings did not change keeps running (its scheduling
        # settings live in its lane); new or changed ones open now.
        kept = {capture_part(s): s.name for s in old.source_list()}
        sources: dict[str, Any] = {}
        try:
            for src in new.source_list():
                if kept.get(capture_part(src)) == src.name:
                    sources[src.name] = self.sources[src.name]
                else:
                    sources[src.name] = self._source(new, src)
                    sources[src.name].open()
            # Buffers too, while the old pipeline runs; warming up a backend it is using
            # waits for the drain.
            prepare_buffers(self._lane_profiles(new, profiles), new.batching.max_batch, warm=models_changed)
        except BaseException:
            self._close_new(sources, models if models_changed else {})
            raise
        return sources

    def _resume_old(
        self,
        old: AgentConfig,
        new: AgentConfig,
        sources: dict[str, Any],
        models: dict[str, LoadedModel],
        old_pipeline: Pipeline,
    ) -> None:
        """The swap failed after the drain: close what the reload opened and run ``old`` again."""
        # Past the drain nothing may leave the agent without a pipeline: the old
        # config comes back (its models and sources are still open), then the error.
        log.exception("reload: failed after the swap began; resuming the old config")
        self._close_new(sources, models)
        try:
            self._swap_parts(new, old)
        except Exception:
            log.exception("reload: could not put the old power profile or socket back")
        self._start_pipeline(self._pipeline(old, self.sources, self.profiles, advise=False), old_pipeline)

    def _adopt_sources(self, sources: dict[str, Any], old_pipeline: Pipeline) -> None:
        """Close the sources the new config no longer runs and make ``sources`` the agent's."""
        for name, source in self.sources.items():
            if sources.get(name) is not source:
                source.close()
        # Sources start just before the pipeline, so they stop just after it.
        for source in self.sources.values():
            self._parts.remove(source)
        self._parts.insert_before(old_pipeline, sources.values())
        self.sources = sources

    def _close_new(self, sources: dict[str, Any], models: dict[str, LoadedModel]) -> None:
        """A reload failed: close what it opened (sources the old config does not run, and
        models loaded for it: their sessions hold memory, on a GPU too)."""
        for name, source in sources.items():
            if self.sources.get(name) is not source:
                source.close()
        for m in models.values():
            m.close()

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
            publisher = make_publisher(pub_new)
            publisher.open()
            self._parts.replace(self.publisher, publisher)
            self.publisher = publisher
