"""Damaged video files: written by OpenCV, damaged on disk, decoded by OpenCV.

A damaged file must not end as if it had finished: the source reads (or seeks) past the
damage, counts the frames not decoded in ``lost`` and says what happened in ``damage``.
Each frame carries its number in ten black/white blocks, so what came out can be checked.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from helpers import FRAMES, damage, write_numbered_video

from edge_agent.core.source_config import VideoSourceConfig
from edge_agent.pipelines.sources.base import EndOfStream, SourceError
from edge_agent.pipelines.sources.files import VideoFileSource


def number_of(img: np.ndarray) -> int:
    """The frame number drawn by ``frame`` (garbage for a picture concealing damage)."""
    levels = img[2:14].mean(axis=(0, 2))
    return sum(1 << bit for bit in range(10) if levels[bit * 16 + 3 : bit * 16 + 13].mean() > 127)


def truncate(src: Path, dst: Path, keep: float) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: int(len(data) * keep)])
    return dst


def plain_read_count(path: Path) -> int:
    """Frames a plain OpenCV loop reads before its first failed read."""
    cap = cv2.VideoCapture(str(path))
    n = 0
    while cap.read()[0]:
        n += 1
    cap.release()
    return n


def read_to_end(src: VideoFileSource) -> tuple[list[int], list[int]]:
    """Frame ids and drawn frame numbers of everything ``src`` delivers until its end."""
    ids, numbers = [], []
    with pytest.raises(EndOfStream):
        while True:
            f = src.read(1.0)
            if f is not None:
                ids.append(f.frame_id)
                numbers.append(number_of(f.image))
    return ids, numbers


def open_source(path: Path, **options) -> VideoFileSource:
    src = VideoFileSource(VideoSourceConfig(path=str(path), **options))
    src.open()
    return src


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("videos")
    return {
        "avi": write_numbered_video(folder / "clip.avi", "MJPG"),
        "mp4": write_numbered_video(folder / "clip.mp4", "mp4v"),
    }


def warnings_about(caplog, path: Path) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()
    ]


# MJPG in AVI: one failed read, then the demuxer resynchronises on the next intact chunk.
# mp4v in MP4, 1 % damaged: one failed read per damaged frame, fewer than MAX_FAILED_READS.
# mp4v in MP4, 5 % damaged: more failed reads than that; the source seeks past the damage.
@pytest.mark.parametrize(
    ("kind", "end", "how"),
    [
        ("avi", 0.45, "resumed after 1 failed read"),
        ("mp4", 0.41, "resumed after"),
        ("mp4", 0.45, "sought past"),
    ],
)
def test_a_damaged_middle_is_skipped_counted_and_warned_about(videos, tmp_path, caplog, kind, end, how):
    path = damage(videos[kind], tmp_path / f"damaged.{kind}", 0.40, end)
    plain = plain_read_count(path)
    assert plain < FRAMES * 0.5, "this damage no longer stops OpenCV early: the test needs another"

    caplog.set_level(logging.WARNING)
    src = open_source(path)
    ids, numbers = read_to_end(src)
    src.close()

    assert len(ids) > plain + 200, f"read {len(ids)} frames, a plain read loop {plain}"
    assert ids == list(range(len(ids)))
    assert numbers[-1] == FRAMES - 1, "the frames after the damage must come out, up to the last"
    high = np.maximum.accumulate(numbers)
    assert np.all(np.asarray(numbers) > high - 20), "no frames may be delivered twice (a seek back)"
    assert src.lost == FRAMES - len(ids) > 0
    assert src.damage.startswith(f"damaged: {src.lost} of {FRAMES} frames not decoded")
    assert f"reads failed at frame {plain}" in src.damage and how in src.damage
    assert src.describe()["lost"] == src.lost and src.describe()["damage"] == src.damage
    assert src.describe()["name"] == src.name, "describe() keeps what the base class says"
    said = warnings_about(caplog, path)
    assert len(said) == 1 and f"frame {plain}" in said[0], said


def test_a_truncated_file_ends_short_of_its_declared_length(videos, tmp_path, caplog):
    path = truncate(videos["avi"], tmp_path / "cut.avi", 0.5)
    assert cv2.VideoCapture(str(path)).get(cv2.CAP_PROP_FRAME_COUNT) == FRAMES  # AVI's header
    caplog.set_level(logging.WARNING)
    src = open_source(path)
    ids, numbers = read_to_end(src)
    src.close()
    assert FRAMES * 0.4 < len(ids) < FRAMES * 0.6
    assert numbers == list(range(len(ids)))
    assert src.lost == FRAMES - len(ids)
    ended = f"decoding ended at frame {len(ids)} of {FRAMES}"
    assert src.damage == f"damaged: {src.lost} of {FRAMES} frames not decoded ({ended})"
    said = warnings_about(caplog, path)
    assert len(said) == 1 and f"frame {len(ids)}" in said[0], said


def test_a_truncated_mp4_cannot_be_opened(videos, tmp_path):
    # Its index (the moov box) comes last: without it OpenCV opens nothing.
    src = VideoFileSource(VideoSourceConfig(path=str(truncate(videos["mp4"], tmp_path / "cut.mp4", 0.5))))
    with pytest.raises(SourceError, match=r"cut\.mp4"):
        src.open()


@pytest.mark.parametrize("kind", ["avi", "mp4"])
def test_a_healthy_file_is_not_damaged(videos, caplog, kind):
    caplog.set_level(logging.WARNING)
    src = open_source(videos[kind])
    ids, numbers = read_to_end(src)
    src.close()
    assert ids == numbers == list(range(FRAMES))
    assert (src.lost, src.damage) == (0, "")
    assert warnings_about(caplog, videos[kind]) == []


def test_a_healthy_file_looped_is_not_damaged_at_the_pass_boundaries(videos, caplog):
    caplog.set_level(logging.WARNING)
    src = open_source(videos["mp4"], loop=True)
    numbers = [number_of(src.read(1.0).image) for _ in range(2 * FRAMES + 10)]
    src.close()
    assert numbers == [*range(FRAMES), *range(FRAMES), *range(10)]
    assert (src.lost, src.damage) == (0, "")
    assert warnings_about(caplog, videos["mp4"]) == []


@pytest.mark.parametrize("kind", ["avi", "mp4"])
def test_realtime_skipped_frames_are_not_lost(tmp_path, caplog, kind):
    # 60 frames at 300 fps: a pass takes 0.2 s; a slow reader skips frames with grab().
    path = write_numbered_video(tmp_path / f"fast.{kind}", "MJPG" if kind == "avi" else "mp4v", 60, 300.0)
    caplog.set_level(logging.WARNING)
    src = open_source(path, realtime=True, loop=True)
    passes, last_id = 0, -1
    while passes < 3:
        f = src.read(1.0)
        if f is None:
            continue
        passes += f.frame_id < last_id
        last_id = f.frame_id
        if f.frame_id % 7 == 3:
            time.sleep(0.01)  # busy now and then
    src.close()
    assert src.skipped > 0
    assert (src.lost, src.damage) == (0, "")
    assert warnings_about(caplog, path) == []


def test_realtime_reading_of_a_damaged_file_counts_what_was_lost(videos, tmp_path):
    # Real time at 600 fps: grab() meets the damage as often as read() does.
    fast = write_numbered_video(tmp_path / "fast.mp4", "mp4v", FRAMES, 600.0)
    path = damage(fast, tmp_path / "damaged.mp4", 0.40, 0.45)
    src = open_source(path, realtime=True)
    ids, _ = read_to_end(src)
    src.close()
    assert src.lost > 0 and "not decoded" in src.damage
    assert len(ids) + src.skipped + src.lost == FRAMES


def test_looping_over_a_damaged_file_adds_up_each_pass(videos, tmp_path, caplog):
    path = damage(videos["avi"], tmp_path / "damaged.avi", 0.40, 0.45)
    caplog.set_level(logging.WARNING)
    src = open_source(path, loop=True)
    first_pass = None
    passes, last_id = 0, -1
    while passes < 2:
        f = src.read(1.0)
        if f.frame_id < last_id:
            passes += 1
            if passes == 1:
                first_pass = src.lost
                assert f"damaged: {first_pass} of {FRAMES} frames not decoded (" in src.damage
        last_id = f.frame_id
    src.close()
    assert first_pass > 0
    assert src.lost == 2 * first_pass
    assert src.damage.startswith(
        f"damaged: {src.lost} frames not decoded in 2 passes; pass 2: {first_pass} of"
    )
    said = warnings_about(caplog, path)
    assert len(said) == 2 and "(pass 1)" in said[0] and "(pass 2)" in said[1], said
