"""How a running agent takes a new config (SIGHUP, `systemctl reload`): everything that can
fail is prepared while the old config still runs (``Reloader.prepare``: models, sources,
buffers), then the agent swaps its pipeline at a frame boundary on the same result socket,
so sequence numbers and counts go on (``runner.Agent.reload``, which owns the parts it
swaps). A reload that fails before the swap leaves the old config running, with what it
opened closed again (``Reloader.discard``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields

from edge_agent.core.config import AgentConfig
from edge_agent.core.model_config import OnnxRuntimeConfig
from edge_agent.core.plan import capture_part, model_batches
from edge_agent.core.reloads import AT_START, ELSEWHERE, MODELS, marked_values
from edge_agent.pipelines.model import LoadedModel
from edge_agent.pipelines.profile import Profile, prepare_profiles
from edge_agent.pipelines.sources.base import Source
from edge_agent.service.assembly import Assembly

log = logging.getLogger("edge_agent.service.runner")


@dataclass
class Prepared:
    """What a reload made ready for its new config while the old one still runs."""

    config: AgentConfig
    models_changed: bool  # ``profiles`` and ``models`` were loaded for it (else: the running ones)
    profiles: dict[str, Profile]
    models: dict[str, LoadedModel]
    sources: dict[str, Source]  # by name: kept running ones and newly opened ones


class Reloader:
    """The half of a reload that runs beside the old pipeline: which config sections
    changed, and the models, sources and buffers of the new config, made with the agent's
    ``assembly``."""

    def __init__(self, assembly: Assembly) -> None:
        self.assembly = assembly

    @staticmethod
    def changes(old: AgentConfig, new: AgentConfig) -> list[str]:
        """The sections of ``new`` that differ from ``old`` and take effect at a reload
        (those that wait for the next start are logged)."""
        differ = [f for f in fields(AgentConfig) if getattr(old, f.name) != getattr(new, f.name)]
        later = [f.name for f in differ if AT_START in f.metadata.get("reload", ())]
        if later:
            log.warning("reload: %s take effect at the next start", ", ".join(later))
        skip = (ELSEWHERE, AT_START)
        return [f.name for f in differ if not set(skip) & set(f.metadata.get("reload", ()))]

    @staticmethod
    def models_changed(old: AgentConfig, new: AgentConfig, force: bool) -> bool:
        """Whether a reload from ``old`` to ``new`` must load the models again."""
        return (
            force
            or marked_values(old, MODELS) != marked_values(new, MODELS)
            # A TensorRT engine is built for the batch its sources can form.
            or (not isinstance(new.backend, OnnxRuntimeConfig) and model_batches(old) != model_batches(new))
        )

    def prepare(
        self,
        old: AgentConfig,
        new: AgentConfig,
        force: bool,
        sources: dict[str, Source],
        profiles: dict[str, Profile],
        models: dict[str, LoadedModel],
    ) -> Prepared:
        """Load ``new``'s models (when they changed: else the running ``profiles`` and
        ``models`` serve), open its sources (those whose capture settings did not change
        keep running: from ``sources``) and prepare its buffers. On failure, what was
        loaded or opened for it is closed again and the error raised."""
        models_changed = self.models_changed(old, new, force)
        if models_changed:
            profiles, models = self.assembly.load_profiles(new)
        prepared = Prepared(new, models_changed, profiles, models, {})
        # A source whose capture settings did not change keeps running (its scheduling
        # settings live in its lane); new or changed ones open now.
        kept = {capture_part(s): s.name for s in old.source_list()}
        try:
            for src in new.source_list():
                if kept.get(capture_part(src)) == src.name:
                    prepared.sources[src.name] = sources[src.name]
                else:
                    prepared.sources[src.name] = self.assembly.source(new, src)
                    prepared.sources[src.name].open()
            # Buffers too, while the old pipeline runs; warming up a backend it is using
            # waits for the drain.
            lanes = [(own.name, own.profiles) for own in self.assembly.lane_profiles(new, profiles)]
            prepare_profiles(lanes, new.batching.max_batch, warm=models_changed)
        except BaseException:
            self.discard(prepared, sources)
            raise
        return prepared

    @staticmethod
    def discard(prepared: Prepared, running: dict[str, Source]) -> None:
        """A reload failed: close what ``prepare`` opened (sources the ``running`` config
        does not run, and models loaded for it: their sessions hold memory, on a GPU too)."""
        for name, source in prepared.sources.items():
            if running.get(name) is not source:
                source.close()
        if prepared.models_changed:
            for m in prepared.models.values():
                m.close()
