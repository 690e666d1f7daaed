"""The live view's tracks: the id beside each label and the trail of a track's recent
centres (agent/service/view/trails.py, annotate), bounded."""

from __future__ import annotations

import numpy as np

from edge_agent.pipelines.view_tap import ViewFrame
from edge_agent.service.view.annotate import annotate, colour
from edge_agent.service.view.trails import Trails


def frame(boxes: list[tuple[float, float, float, float]], tracks: list[int]) -> ViewFrame:
    f = ViewFrame(8)
    n = len(boxes)
    if n:
        f.det_xyxy[:n] = boxes
        f.det_track[:n] = tracks
    f.det_class[:n] = 2
    f.det_score[:n] = 0.9
    f.det_count, f.labels, f.frame_id, f.e2e_ms = n, ["a", "b", "c"], 1, 5.0
    return f


def test_a_track_draws_its_trail_and_its_id():
    trails = Trails(length=16)
    for t in range(10):  # a track moving right, 10 px per view frame
        now = trails.update(frame([(20 + 10 * t, 100, 60 + 10 * t, 140), (250, 20, 280, 50)], [7, 0]))
    assert list(now) == [7], "an untracked detection has no trail"
    assert now[7][0] == (40.0, 120.0) and now[7][-1] == (130.0, 120.0)
    plain = np.zeros((200, 320, 3), np.uint8)
    annotate(plain, frame([(110, 100, 150, 140)], [7]))
    image = np.zeros((200, 320, 3), np.uint8)
    annotate(image, frame([(110, 100, 150, 140)], [7]), 1.0, now)
    c = np.array(colour(2))
    assert (image[120, 45:100] == c).all(axis=1).any(), "the trail runs back along the path"
    assert not (plain[120, 45:100] == c).all(axis=1).any()
    # the label is wider with its id ("c #7 0.90" against "c 0.90")
    untracked = np.zeros((200, 320, 3), np.uint8)
    annotate(untracked, frame([(110, 100, 150, 140)], [0]))

    def label_width(img: np.ndarray) -> int:  # the filled label above the box, in its colour
        cols = np.nonzero((img[80:100] == c).all(axis=2).any(axis=0))[0]
        return int(cols.max() - cols.min())

    assert label_width(plain) > label_width(untracked)


def test_trails_are_bounded_in_length_age_and_number():
    trails = Trails(length=4, keep_frames=3, max_tracks=5)
    for t in range(10):
        now = trails.update(frame([(t, 0, t + 10, 10)], [1]))
    assert len(now[1]) == 4, "the last 4 centres only"
    for _ in range(4):  # track 1 unseen for more than keep_frames view frames
        trails.update(frame([], []))
    assert 1 not in trails._points
    for t in range(20):  # a new track every frame: at most max_tracks kept
        trails.update(frame([(0, 0, 10, 10)], [100 + t]))
        assert len(trails._points) <= 5
