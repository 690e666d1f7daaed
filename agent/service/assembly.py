"""What an agent is built from, made from a config: its models (loaded, with their buffers),
its sources, and the pipeline over them. The agent builds with it at start and its reload
for each new config (``runner.Agent``, ``reloading.Reloader``); the bench builds agents on
played frames with a variant of it (``bench.configs.BenchAssembly``).

Nothing here starts anything: a source is made but not opened, a pipeline built and
warmed up but not started.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, NamedTuple

from edge_agent.core.config import AgentConfig
from edge_agent.core.plan import model_at, model_batches, source_models, with_batch
from edge_agent.core.source_config import SourceConfig
from edge_agent.models.manifest import ModelError
from edge_agent.pipelines.deadline import DeadlineMonitor
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.messages import MessageBuilder
from edge_agent.pipelines.model import LoadedModel, load_model
from edge_agent.pipelines.pipeline import Pipeline
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.publish import ZmqPublisher
from edge_agent.pipelines.sources.base import Source
from edge_agent.pipelines.sources.registry import create_source
from edge_agent.pipelines.steps.base import StepContext, StepPlugin
from edge_agent.pipelines.steps.registry import build_steps

log = logging.getLogger("edge_agent.service.runner")


class LaneProfiles(NamedTuple):
    """The profiles one source may use."""

    name: str  # the source's
    primary: Profile  # its own model's (or the main one's)
    ladder: dict[str, Profile]  # by path, the ladder's models it may switch to

    @property
    def profiles(self) -> list[Profile]:
        return [self.primary, *self.ladder.values()]


class Assembly:
    """Makes the parts of an agent from a config. ``max_frames``: each source ends after
    that many frames (0: runs on)."""

    #: Warn, at start and at each reload, of a source whose model cannot fit its budget
    #: (``core.budget_fit``). The bench and tune measure that themselves and say it once.
    says_budget_advice = True

    def __init__(self, max_frames: int = 0, step_plugins: Sequence[StepPlugin] | None = None) -> None:
        """``step_plugins``: the per-frame steps each source may get (None: every
        registered one, ``pipelines/steps``)."""
        self.max_frames = max_frames
        self.step_plugins = step_plugins
        # This run of the agent (its heartbeats' and events'): track ids and event numbers
        # are unique within a run and source, so a new run_id tells a consumer they start
        # again (a restart; a reload keeps it).
        self.run_id = uuid.uuid4().hex[:16]

    def load_profiles(self, cfg: AgentConfig) -> tuple[dict[str, Profile], dict[str, LoadedModel]]:
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

    def source(self, cfg: AgentConfig, src: SourceConfig) -> Source:
        """The source ``src`` of ``cfg``, made (not opened)."""
        source = create_source(src)
        if cfg.faults.source_outage_after_frames:
            from edge_agent.pipelines.faults import FaultySource

            source = FaultySource(source, cfg.faults)
        return source

    @staticmethod
    def lane_profiles(cfg: AgentConfig, profiles: dict[str, Profile]) -> list[LaneProfiles]:
        """Per source, the profiles it may use (``profiles``: by model path, the main
        model's under ""): its own, and by path the ladder's models it may switch to (none
        for a source with a model of its own: the ladder's model steps then have nothing
        to switch it to; its strides and alert-only steps still apply)."""
        return [
            LaneProfiles(src.name, profiles[paths[0]], {p: profiles[p] for p in paths[1:]})
            for src, paths in source_models(cfg)
        ]

    def pipeline(
        self,
        cfg: AgentConfig,
        sources: dict[str, Source],
        profiles: dict[str, Profile],
        publisher: ZmqPublisher,
        power: Any = None,
        view: Any = None,
        advise: bool = True,
        snapshots: Any = None,
    ) -> Pipeline:
        """The lanes of ``cfg`` on ``sources`` and ``profiles``, results on ``publisher``
        (``power``: for the messages' throttled flag; ``view``: the live view's server,
        given a tap on each lane), warmed up. ``advise``: warn of a source whose model
        cannot fit its budget (off where the warm-up times are not the model's alone: a
        reload's new model warmed up beside the running pipeline)."""
        lanes = []
        per_source = zip(cfg.source_list(), self.lane_profiles(cfg, profiles))
        for i, (src, own) in enumerate(per_source):
            budget_ms = src.budget_ms or cfg.deadline.budget_ms
            labels = own.primary.model.manifest.labels
            lanes.append(
                Lane(
                    i,
                    sources[src.name],
                    own.primary,
                    own.ladder,
                    DeadlineMonitor(replace(cfg.deadline, budget_ms=budget_ms)),
                    MessageBuilder(
                        cfg.device_id, labels, budget_ms, power, cfg.publish.encoding, src.tracker.enabled
                    ),
                    cfg.publish.topic,
                    src.priority,
                    src.max_fps,
                    self.max_frames,
                )
            )
        for key, (src, lane) in zip(source_keys(cfg), zip(cfg.source_list(), lanes)):
            primary = lane.primary.model
            ctx = StepContext(
                src,
                key,
                primary.resolved.path,
                primary.manifest.labels,
                cfg.device_id,
                self.run_id,
                publisher.send,
                publisher.encode,
                snapshots,
            )
            lane.set_steps(build_steps(ctx, self.step_plugins))
        if view is not None:
            for lane in lanes:
                lane.view_tap = view.tap(lane.name, cfg.model.max_detections)
            view.keep({lane.name for lane in lanes})
        pipeline = Pipeline(lanes, publisher, cfg.batching, cfg.resilience)
        pipeline.warm_up()
        if advise and self.says_budget_advice:
            for line in pipeline.budget_advice(budget_settings(cfg)):
                log.warning("%s", line)
        return pipeline


def source_keys(cfg: AgentConfig) -> list[str]:
    """Each source's key path in the config (``sources[i]``, or ``source``)."""
    return [f"sources[{i}]" for i in range(len(cfg.sources))] or ["source"]


def budget_settings(cfg: AgentConfig) -> dict[str, str]:
    """By source name, the key that sets its budget: its own ``budget_ms``, else the deadline's."""
    return {
        s.name: f"{key}.budget_ms" if s.budget_ms else "deadline.budget_ms"
        for key, s in zip(source_keys(cfg), cfg.source_list())
    }
