"""What the bench measures with: configs derived from the user's (private endpoint, synthetic
cameras, a file source played from memory), the agent that counts detections, and the
start/stop guard that fails a measurement whose pipeline failed."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from edge_agent.core.config import AgentConfig
from edge_agent.core.deadline_config import LadderStep
from edge_agent.core.source_config import (
    SCHEDULING_FIELDS,
    ImageFolderSourceConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.models.decoders.base import BoundDecoder
from edge_agent.pipelines.sources.base import Source, SourceError
from edge_agent.pipelines.sources.files import FileSourceConfig
from edge_agent.pipelines.sources.memory import MemorySource
from edge_agent.service.assembly import Assembly
from edge_agent.service.runner import Agent

BENCH_SCHEMA = 1


class BenchError(ValueError):
    """The bench cannot measure what it was asked to; the message says why."""


def lane_settings(src: SourceConfig) -> dict[str, Any]:
    """What a source keeps when it is played from other frames: its name and its lane's
    settings."""
    return {"name": src.name, **{k: getattr(src, k) for k in SCHEDULING_FIELDS}}


def _as_synthetic(src: Any, fps: float | None) -> SyntheticSourceConfig:
    """``src`` as a synthetic camera at ``fps`` (None: a synthetic source's own rate, else
    30), keeping its name and scheduling settings."""
    if isinstance(src, SyntheticSourceConfig):
        return replace(src, fps=src.fps if fps is None else fps)
    return SyntheticSourceConfig(fps=30.0 if fps is None else fps, **lane_settings(src))


PRIVATE_ENDPOINT = "tcp://127.0.0.1:*"  # a free loopback port, chosen at bind


def private_config(config: AgentConfig) -> AgentConfig:
    """``config`` for an agent that runs beside the real one (a service on the same config):
    no metrics endpoint, and results on a private loopback port (any free one), never the
    configured endpoint; it waits for no subscriber: nobody listens to a measurement."""
    metrics = replace(config.metrics, enabled=False)
    publish = replace(config.publish, endpoint=PRIVATE_ENDPOINT, wait_for_subscribers=0)
    return replace(config, metrics=metrics, publish=publish)


def synthetic_config(config: AgentConfig, fps: float | None, sources: int = 0) -> AgentConfig:
    """The config on synthetic cameras at ``fps``: its own sources, or ``sources`` copies
    of its first one."""
    template = config.source_list()
    if sources:
        first = _as_synthetic(template[0], fps)
        made = tuple(replace(first, name=f"cam{i}", seed=first.seed + i) for i in range(sources))
    else:
        made = tuple(_as_synthetic(src, fps) for src in template)
    if len(made) == 1:
        return private_config(replace(config, source=made[0], sources=()))
    return private_config(replace(config, source=SyntheticSourceConfig(), sources=made))


def with_model(config: AgentConfig, path: str, manifest: str = "") -> AgentConfig:
    """The config measuring the model at ``path`` in place of its own (its manifest:
    ``manifest``, else beside it, else read from the ONNX). Sources with a model of their
    own run it too: the model measured is the one every source runs."""
    model = replace(config.model, path=path, manifest=manifest)
    source = replace(config.source, model="", manifest="")
    sources = tuple(replace(s, model="", manifest="") for s in config.sources)
    return replace(config, model=model, source=source, sources=sources)


def bench_source(config: AgentConfig, path: str | None = None) -> FileSourceConfig | None:
    """The file the bench plays (see ``preload``): ``path`` (a video file or an image
    folder, with the name and lane settings of the config's first source), else the
    config's own source when it is a single video file or image folder; None: a synthetic
    camera (live cameras are never opened: the agent may hold them). Raises SourceError
    naming a ``path`` that is neither."""
    if path:
        kept = lane_settings(config.source_list()[0])
        if os.path.isdir(path):
            return ImageFolderSourceConfig(path=path, **kept)
        if os.path.isfile(path):
            return VideoSourceConfig(path=path, **kept)
        raise SourceError(f"--source {path}: no such video file or image folder")
    own = config.source_list()
    if len(own) != 1 or not isinstance(own[0], (VideoSourceConfig, ImageFolderSourceConfig)):
        return None
    return own[0]


def bench_config(
    config: AgentConfig, fps: float | None, sources: int = 0, file_source: FileSourceConfig | None = None
) -> AgentConfig:
    """The config the bench's agents run: on ``file_source`` (its frames preloaded and
    played by ``BenchAgent``, paced there), else on synthetic cameras at ``fps`` (see
    ``synthetic_config``)."""
    if file_source is None:
        return synthetic_config(config, fps, sources)
    return private_config(replace(config, source=file_source, sources=()))


def raw_config(
    config: AgentConfig, sources: int = 0, file_source: FileSourceConfig | None = None
) -> AgentConfig:
    """Unpaced, with neither admission nor ladder: the pipeline's own capability.

    The deadline machinery is for the live phase; here a model slower than the budget
    must still be measured, not dropped as stale.
    """
    deadline = replace(config.deadline, admission=False, ladder=(LadderStep(),))
    return replace(bench_config(config, 0.0, sources, file_source), deadline=deadline)


#: Preloaded frames by source name (``sources.preload``).
Played = dict[str, list[np.ndarray]]


class BenchAssembly(Assembly):
    """Plays the frames in ``played`` (a file's, preloaded) in place of the file source of
    that name, as a camera at ``pace_fps`` or unpaced (0)."""

    says_budget_advice = False  # the bench's "budget:" line says it, from its own figures

    def __init__(
        self,
        max_frames: int = 0,
        played: Played | None = None,
        pace_fps: float = 0.0,
        offsets: dict[str, tuple[int, float]] | None = None,
    ) -> None:
        """``offsets``: by source, the frame it plays first and its phase (``MemorySource``)."""
        super().__init__(max_frames)
        self.played = played or {}
        self.pace_fps = pace_fps
        self.offsets = offsets or {}

    def source(self, cfg: AgentConfig, src: SourceConfig) -> Source:
        images = self.played.get(src.name)
        if images and isinstance(src, (VideoSourceConfig, ImageFolderSourceConfig)):
            start, phase = self.offsets.get(src.name, (0, 0.0))
            return MemorySource(src.name, images, self.pace_fps, start, phase)
        return super().source(cfg, src)


class BenchAgent(Agent):
    """An agent that counts the detections of every frame it decodes (each one is then
    published), on the frames its ``BenchAssembly`` plays."""

    def __init__(
        self,
        config: AgentConfig,
        max_frames: int = 0,
        played: Played | None = None,
        pace_fps: float = 0.0,
        offsets: dict[str, tuple[int, float]] | None = None,
    ) -> None:
        super().__init__(config, assembly=BenchAssembly(max_frames, played, pace_fps, offsets))
        self.detections: list[int] = []  # per decoded frame, in order (one writer: post)

    def build(self) -> None:
        super().build()
        for m in self.models.values():
            m.decode = self._counting(m.decode)

    def _counting(self, decode: BoundDecoder) -> BoundDecoder:
        record = self.detections.append

        class Counted(BoundDecoder):
            def __call__(self, outputs: Any, params: Any) -> Any:
                result = super().__call__(outputs, params)
                record(len(result[1]))
                return result

        return Counted(decode.decoder, decode.outputs)


@contextlib.contextmanager
def started(agent: Agent) -> Iterator[Agent]:
    """``agent`` (built) started for the block and stopped after it, on every path. After
    the block: BenchError when its pipeline failed, or a stage thread did not end (its
    models then stay loaded: never closed under a stage)."""
    assert agent.pipeline is not None
    try:
        agent.start()
        yield agent
    except BaseException:
        agent.stop()
        raise
    clean = agent.stop()
    failure = agent.pipeline.failure()
    if failure:
        raise BenchError(f"the pipeline failed during the measurement: {failure}")
    if not clean:
        raise BenchError(f"a stage thread did not end when the measurement stopped: {agent.pipeline.alive()}")
