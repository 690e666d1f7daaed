"""Frames decoded beforehand, played from memory as a source (bench and tune play a file's
frames this way); built by its callers, not from a config."""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_agent.pipelines.sources.base import PacedSource, Pacer, SourceError, SourceFrame


class MemorySource(PacedSource):
    """Frames decoded beforehand (``preload``), played from memory, looped; nothing is
    decoded while it plays.

    Unpaced (``fps`` 0) it hands over the next frame whenever the pipeline asks, each one
    processed, as a file source does. Paced, it is a live camera (``Pacer``, as the
    synthetic camera): a busy pipeline gets the newest frame, those in between are
    skipped, and a frame's capture time is when it was due. (The file sources are no
    camera: a video's ``realtime`` decodes on the capture thread and stamps a frame after
    decoding it, and ``max_fps`` only spaces the reads of a source that still hands over
    every frame.)
    """

    def __init__(
        self, name: str, images: list[np.ndarray], fps: float = 0.0, start: int = 0, phase: float = 0.0
    ) -> None:
        """``start``: the frame it plays first; ``phase``: paced, its first frame is due that
        fraction of a frame period after the first read (cameras out of step)."""
        super().__init__(name, fps)
        if not images:
            raise SourceError(f"source {name!r}: no frames to play")
        self.images = images
        self.fps = fps
        self._start = start
        self._pacer = Pacer(fps, phase=phase)

    def open(self) -> None:
        self._pacer.reset()

    def _fill(self, index: int, frame: SourceFrame) -> None:
        frame.image = self.images[(index + self._start) % len(self.images)]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "frames": len(self.images), "fps": self.fps}
