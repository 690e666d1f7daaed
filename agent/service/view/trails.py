"""The recent path of each track in a source's live view: the centres of its boxes in the
last view frames, for ``annotate`` to draw behind them. The view thread's only, off the
frame path; bounded: a track unseen for ``keep_frames`` view frames is forgotten, and at
most ``max_tracks`` are kept."""

from __future__ import annotations

from collections import deque

from edge_agent.pipelines.view_tap import ViewFrame


class Trails:
    def __init__(self, length: int = 16, keep_frames: int = 10, max_tracks: int = 512) -> None:
        self.length = length
        self.keep_frames = keep_frames
        self.max_tracks = max_tracks
        self._points: dict[int, deque[tuple[float, float]]] = {}
        self._seen: dict[int, int] = {}  # track id -> the view frame it was last in
        self._frame = 0

    def update(self, f: ViewFrame) -> dict[int, deque[tuple[float, float]]]:
        """Add ``f``'s tracked boxes' centres; the trails of the tracks in ``f``, by id."""
        self._frame += 1
        now: dict[int, deque[tuple[float, float]]] = {}
        for i in range(f.det_count):
            track = int(f.det_track[i])
            if track <= 0:
                continue
            x1, y1, x2, y2 = (float(v) for v in f.det_xyxy[i])
            points = self._points.get(track)
            if points is None:
                points = self._points[track] = deque(maxlen=self.length)
            points.append(((x1 + x2) / 2, (y1 + y2) / 2))
            self._seen[track] = self._frame
            now[track] = points
        stale = [t for t, at in self._seen.items() if self._frame - at > self.keep_frames]
        if len(self._seen) - len(stale) > self.max_tracks:  # the oldest go first
            stale = sorted(self._seen, key=self._seen.__getitem__)[: len(self._seen) - self.max_tracks]
        for t in stale:
            del self._points[t], self._seen[t]
        return now
