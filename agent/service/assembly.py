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
from dataclasses import replace
from typing import Any

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError, Problem
from edge_agent.core.plan import model_at, model_batches, source_models, with_batch
from edge_agent.core.source_config import SourceConfig
from edge_agent.models.manifest import ModelError
from edge_agent.pipelines.analytics.step import AnalyticsStep, SourceAnalytics
from edge_agent.pipelines.deadline import DeadlineMonitor
from edge_agent.pipelines.lane import Lane
from edge_agent.pipelines.model import LoadedModel, load_model
from edge_agent.pipelines.pipeline import Pipeline
from edge_agent.pipelines.publish import MessageBuilder, ZmqPublisher
from edge_agent.pipelines.slots import ModelBuffers
from edge_agent.pipelines.sources.base import Source
from edge_agent.pipelines.sources.registry import create_source
from edge_agent.pipelines.stages import PostStep
from edge_agent.pipelines.tracking.step import SourceTracker, TrackStep

log = logging.getLogger("edge_agent.service.runner")


class Assembly:
    """Makes the parts of an agent from a config. ``max_frames``: each source ends after
    that many frames (0: runs on)."""

    #: Warn, at start and at each reload, of a source whose model cannot fit its budget
    #: (``core.budget_fit``). The bench and tune measure that themselves and say it once.
    says_budget_advice = True

    def __init__(self, max_frames: int = 0) -> None:
        self.max_frames = max_frames
        # This run of the agent (its heartbeats' and events'): track ids and event numbers
        # are unique within a run and source, so a new run_id tells a consumer they start
        # again (a restart; a reload keeps it).
        self.run_id = uuid.uuid4().hex[:16]

    def load_profiles(self, cfg: AgentConfig) -> tuple[dict[str, ModelBuffers], dict[str, LoadedModel]]:
        """Load every model the config names (the ladder's and the sources' own too) and
        key them by path (the main model under "").

        Ladder models are loaded now, not when the ladder reaches them: a switch under
        overload must be instant, and a broken fallback must fail at start, not then.
        """
        batches = model_batches(cfg)
        if cfg.faults.model_load_delay_s:
            time.sleep(cfg.faults.model_load_delay_s)
        main = self._faulty(load_model(cfg.model, with_batch(cfg.backend, batches[""])), cfg)
        profiles = {"": ModelBuffers(main.manifest.name, main)}
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
                # ModelBuffers names key the per-model estimates and latencies: keep them unique.
                name = alt.manifest.name
                if name in {p.name for p in profiles.values()}:
                    name = f"{name}@{tag}"
                profiles[path] = ModelBuffers(name, alt)
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
    def lane_profiles(
        cfg: AgentConfig, profiles: dict[str, ModelBuffers]
    ) -> list[tuple[str, dict[str, ModelBuffers]]]:
        """Per source, the profiles it may use, its own under "" (the ladder's model steps
        then have nothing to switch a source with its own model to; its strides and
        alert-only steps still apply)."""
        return [
            (src.name, {"": profiles[paths[0]], **{p: profiles[p] for p in paths[1:]}})
            for src, paths in source_models(cfg)
        ]

    def post_steps(self, cfg: AgentConfig) -> list[PostStep]:
        """What runs on every decoded frame before its result is published, in order (a
        tracker per source, then analytics on its tracks), for each pipeline ``cfg``
        builds (at start and at every reload). Nothing when no source tracks."""
        steps: list[PostStep] = []
        if any(src.tracker.enabled for src in cfg.source_list()):
            steps.append(TrackStep())
        if any(src.analytics.enabled for src in cfg.source_list()):
            steps.append(AnalyticsStep())
        return steps

    def pipeline(
        self,
        cfg: AgentConfig,
        sources: dict[str, Source],
        profiles: dict[str, ModelBuffers],
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
        for i, (src, (_, lane_profiles)) in enumerate(per_source):
            budget_ms = src.budget_ms or cfg.deadline.budget_ms
            labels = lane_profiles[""].model.manifest.labels
            lanes.append(
                Lane(
                    i,
                    sources[src.name],
                    lane_profiles,
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
            if src.tracker.enabled:
                lane.tracker = SourceTracker(src.tracker, lane.primary.model.resolved.path)
            if src.analytics.enabled:
                labels = lane.primary.model.manifest.labels
                check_labels(src, labels, f"{key}.analytics")
                lane.analytics = SourceAnalytics(
                    src.analytics,
                    labels,
                    src.tracker.lost_frames,
                    2 * src.tracker.max_tracks,
                    src.name,
                    cfg.device_id,
                    self.run_id,
                    publisher.send,
                    publisher.encode,
                )
                if src.analytics.snapshots.enabled and snapshots is not None:
                    lane.analytics.snapshots = snapshots
                    lane.keeps_pixels = True
        if view is not None:
            for lane in lanes:
                lane.view_tap = view.tap(lane.name, cfg.model.max_detections)
            view.keep({lane.name for lane in lanes})
        pipeline = Pipeline(lanes, publisher, cfg.batching, cfg.resilience, self.post_steps(cfg))
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


def check_labels(src: SourceConfig, labels: tuple[str, ...], key: str) -> None:
    """A zone or line that counts a label the source's model does not have: a config error
    (raised at start, and by a reload, which then keeps the running config)."""
    problems = []
    for kind, items in (("zones", src.analytics.zones), ("lines", src.analytics.lines)):
        for i, item in enumerate(items):
            unknown = [name for name in item.labels if name not in labels]
            if unknown:
                known = ", ".join(map(repr, labels))  # repr: a model's label may hold control characters
                message = f"label {', '.join(map(repr, unknown))} is not one of the model's ({known})"
                problems.append(Problem("config", 0, 0, f"{key}.{kind}[{i}].labels", message))
    if problems:
        raise ConfigError(problems)
