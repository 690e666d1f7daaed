"""What the candidates run on: the user's frames or the config's file played from memory as a
camera, else the synthetic camera; and the fixed frames accuracy is judged on."""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np

from edge_agent.bench.configs import lane_settings, private_config
from edge_agent.core.config import AgentConfig
from edge_agent.core.source_config import (
    ImageFolderSourceConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.pipelines.images import ImageError, read_image_file
from edge_agent.pipelines.sources.base import SourceError
from edge_agent.pipelines.sources.files import (
    IMAGE_PATTERNS,
    PRELOAD_MIB,
    FileSourceConfig,
    file_frames,
    frame_count,
    list_images,
    preload,
)
from edge_agent.pipelines.sources.registry import source_rate
from edge_agent.tune.candidates import TuneSettings

log = logging.getLogger(__name__)


class FramesError(ValueError):
    """Frames to tune on that cannot be read; the message names the path."""


def image_files(
    folder: str, patterns: tuple[str, ...] = IMAGE_PATTERNS, what: str = "frames folder"
) -> list[str]:
    """The images of ``folder`` in name order (as the image-folder source plays them);
    FramesError naming the folder when it is missing, holds no image, or none reads."""
    if not os.path.isdir(folder):
        raise FramesError(
            f"{what} {folder} {'is not a folder' if os.path.exists(folder) else 'does not exist'}"
        )
    files = list_images(folder, patterns)
    if not files:
        raise FramesError(f"{what} {folder} holds no images (looked for {' '.join(patterns)})")
    if not any(_readable(f) for f in files):
        raise FramesError(f"{what} {folder}: none of its {len(files)} images can be read")
    return files


def _readable(path: str) -> bool:
    try:
        read_image_file(path)
    except ImageError:
        return False
    return True


@dataclass
class FrameSet:
    """The fixed frames every candidate's detections are compared on: up to ``wanted`` of
    the ``total`` (0: unknown) ``where``, read again for each candidate (none is held in
    memory; a yielded image is valid until the next one). ``count``: how many the last
    full pass gave."""

    where: str  # e.g. "images in DIR", "frames of VIDEO"
    total: int
    wanted: int
    read: Callable[[], Iterator[np.ndarray]]
    count: int | None = None

    def __iter__(self) -> Iterator[np.ndarray]:
        n = 0
        for image in self.read():
            n += 1
            yield image
        self.count = n

    @property
    def what(self) -> str:
        """The frames in words: the count a pass gave, once one did (else the count asked)."""
        n = self.count if self.count is not None else min(self.wanted, self.total or self.wanted)
        if not self.total:
            return f"the first {n} {self.where}"
        if n == self.total:
            return f"the {n} {self.where}"
        return f"{n} of the {self.total} {self.where}, spread evenly"


def _spread(total: int, n: int) -> list[int]:
    """``n`` indices spread evenly over ``range(total)`` (all of them when fewer)."""
    if total <= n:
        return list(range(total))
    return sorted({int(i) for i in np.linspace(0, total - 1, n).round()})


def _file_frames(src: FileSourceConfig, n: int, where: str) -> FrameSet:
    """``n`` frames spread evenly over a video file or an image folder (a video that
    declares no frame count: its first ``n``). FramesError when it cannot be read."""
    try:
        total = frame_count(src)
    except SourceError as e:
        raise FramesError(f"{e} (the config's source)") from None
    picks = _spread(total, n) if total else None

    def read() -> Iterator[np.ndarray]:
        with contextlib.closing(file_frames(src, picks)) as frames:
            yield from itertools.islice(frames, n)

    return FrameSet(where, total, n, read)


def _synthetic_frames(src: SyntheticSourceConfig | None, n: int) -> FrameSet:
    from edge_agent.checks.evaluation import heldout_images
    from edge_agent.pipelines.sources.synthetic import SceneSpec

    spec = SceneSpec()
    if src is not None:
        spec = replace(
            spec, width=src.width, height=src.height, num_objects=src.num_objects, noise_sigma=src.noise_sigma
        )

    def read() -> Iterator[np.ndarray]:
        for image, _ in heldout_images(n, spec):
            yield image

    return FrameSet("held-out synthetic frames", n, n, read)


def judged_frames(base: AgentConfig, s: TuneSettings) -> FrameSet:
    """The frames accuracy is judged on: ``s.frames``, else the config's first source when
    it is a file, else held-out synthetic scenes. Raises FramesError for a missing file."""
    n = s.eval_frames
    if s.frames:
        image_files(s.frames)
        return _file_frames(ImageFolderSourceConfig(path=s.frames), n, f"images in {s.frames}")
    src = base.source_list()[0]
    if isinstance(src, ImageFolderSourceConfig):
        image_files(src.path, src.patterns, "image folder")
        return _file_frames(src, n, f"images in {src.path}")
    if isinstance(src, VideoSourceConfig):
        return _file_frames(src, n, f"frames of {src.path}")
    return _synthetic_frames(src if isinstance(src, SyntheticSourceConfig) else None, n)


def measured_source(src: SourceConfig, fps: float, frames: str) -> SourceConfig:
    """What a source is measured on, with its name and lane settings: the ``frames``
    folder, else a file source itself (both played from memory, see ``Workload``), else
    the synthetic camera at ``fps`` (a live camera is in use by the agent, and its scene is
    not repeatable)."""
    if frames:
        return ImageFolderSourceConfig(path=frames, **lane_settings(src))
    if isinstance(src, SyntheticSourceConfig):
        return replace(src, fps=fps)
    if isinstance(src, (ImageFolderSourceConfig, VideoSourceConfig)):
        return src
    return SyntheticSourceConfig(fps=fps, **lane_settings(src))


@dataclass
class Workload:
    """What every candidate runs on: the camera rate, and the frames of each file source
    (by source name) decoded into memory once and played, looped, as a camera at that rate
    (``sources.MemorySource``, as bench plays them: nothing is decoded during a
    measurement, and a frame's capture time is when it was due). ``what``: in words."""

    fps: float
    played: dict[str, list[np.ndarray]]
    what: str


def make_workload(base: AgentConfig, s: TuneSettings) -> Workload:
    """Decode the frames the candidates are measured on (enough for a warm-up and a window
    at the camera rate, within ``PRELOAD_MIB`` in all); FramesError naming a file that
    cannot be read."""
    first = base.source_list()[0]
    fps = s.source_fps or source_rate(first)
    made = [measured_source(src, fps, s.frames) for src in base.source_list()]
    files = [src for src in made if isinstance(src, (ImageFolderSourceConfig, VideoSourceConfig))]
    wanted = math.ceil(fps * (s.warmup_s + s.window_s)) + 1
    budget_mib = PRELOAD_MIB / max(len({src.path for src in files}), 1)
    by_path: dict[str, list[np.ndarray]] = {}
    try:
        for src in files:
            if src.path not in by_path:
                by_path[src.path] = preload(src, wanted, budget_mib)
    except SourceError as e:
        raise FramesError(str(e)) from None
    played = {src.name: by_path[src.path] for src in files}
    each = f"{len(made)} sources, each on " if len(made) > 1 else ""
    src = made[0]
    if isinstance(src, (ImageFolderSourceConfig, VideoSourceConfig)):
        kind = "images in" if isinstance(src, ImageFolderSourceConfig) else "frames of"
        n, total = len(by_path[src.path]), frame_count(src)
        frames = f"the {n} {kind}" if n == total else f"the first {n} {kind}"
        what = f"{each}{frames} {src.path}, decoded into memory and played looped as a camera at {fps:g} fps"
    else:
        live = (
            ""
            if isinstance(first, SyntheticSourceConfig)
            else f" (the config's {first.type} camera: give --frames)"
        )
        what = f"{each}the synthetic camera at {fps:g} fps{live}"
    return Workload(fps, played, what)


def measured_config(cfg: AgentConfig, s: TuneSettings, fps: float) -> AgentConfig:
    """The candidate's config as measured: each source as ``measured_source`` makes it, its
    results on a private loopback port and no metrics endpoint (it runs beside the agent
    on the same config; see ``bench.private_config``), power read-only, and the tuning
    budget as its deadline: admission drops a frame as stale by the budget being tuned for,
    not by the config's (a slow candidate measured against a tighter one would publish
    nothing to judge)."""
    made = tuple(measured_source(src, fps, s.frames) for src in cfg.source_list())
    power = replace(cfg.power, manage=False)
    if s.budget_ms > 0:
        cfg = replace(cfg, deadline=replace(cfg.deadline, budget_ms=s.budget_ms))
    if len(made) == 1:
        return private_config(replace(cfg, source=made[0], sources=(), power=power))
    return private_config(replace(cfg, source=SyntheticSourceConfig(), sources=made, power=power))
