"""Sources on real files, real OpenCV decoding and the real synthetic renderer."""

from __future__ import annotations

import os
import random
import threading
import time

import cv2
import numpy as np
import pytest
from conftest import wait_until
from helpers import write_video

from edge_agent.core.source_config import (
    GStreamerSourceConfig,
    ImageFolderSourceConfig,
    RtspSourceConfig,
    SyntheticSourceConfig,
    V4L2SourceConfig,
    VideoSourceConfig,
)
from edge_agent.pipelines.sources.base import BufferPolicy, EndOfStream, Pacer, SourceError
from edge_agent.pipelines.sources.files import (
    ImageFolderSource,
    VideoFileSource,
    file_frames,
    frame_count,
    list_images,
    preload,
)
from edge_agent.pipelines.sources.live import Backoff, OpenCvCapture, has_gstreamer, open_capture
from edge_agent.pipelines.sources.memory import MemorySource
from edge_agent.pipelines.sources.registry import create_source, source_rate
from edge_agent.pipelines.sources.synthetic import SceneSpec, SyntheticScene, SyntheticSource


def render(spec: SceneSpec, index: int):
    scene = SyntheticScene(spec)
    img = np.empty((spec.height, spec.width, 3), np.uint8)
    gt = np.zeros((spec.num_objects, 6), np.float32)
    scene.render(index, img, gt)
    return img, gt


def test_synthetic_scene_is_a_function_of_seed_and_index():
    spec = SceneSpec(seed=5)
    a_img, a_gt = render(spec, 40)
    # A second instance, rendering other frames first, gives the same frame 40.
    scene = SyntheticScene(spec)
    img = np.empty_like(a_img)
    gt = np.zeros_like(a_gt)
    for i in (3, 99, 40):
        scene.render(i, img, gt)
    assert np.array_equal(img, a_img)
    assert np.array_equal(gt, a_gt)
    b_img, _ = render(SceneSpec(seed=6), 40)
    assert not np.array_equal(a_img, b_img), "different seeds must give different scenes"


def test_synthetic_ground_truth_is_inside_the_frame_and_objects_move():
    spec = SceneSpec(seed=2, num_objects=8)
    _, gt0 = render(spec, 0)
    _, gt1 = render(spec, 30)
    for gt in (gt0, gt1):
        assert np.all(gt[:, 1] >= 0) and np.all(gt[:, 3] <= spec.width)
        assert np.all(gt[:, 2] >= 0) and np.all(gt[:, 4] <= spec.height)
        assert np.all((gt[:, 5] >= 0) & (gt[:, 5] <= 1))
    assert not np.array_equal(gt0[:, 1:5], gt1[:, 1:5]), "objects should move between frames"


def test_a_scene_with_margins_is_the_middle_of_a_larger_world():
    """world_margin: objects move in a world larger than the view (the tracker's ground
    truth needs objects that enter and leave): the view is the world's middle, pixel for
    pixel, and the truth is in view pixels, clipped, zero visible outside it."""
    view = SceneSpec(seed=3, num_objects=10, margin_x=128, margin_y=96)
    world = SceneSpec(seed=3, num_objects=10, width=896, height=672)
    outside = inside = 0
    for t in range(0, 300, 10):
        img, gt = render(view, t)
        w_img, w_gt = render(world, t)
        assert img.shape == (480, 640, 3) and np.array_equal(img, w_img[96:576, 128:768])
        assert np.all(gt[:, 1:5] >= 0) and np.all(gt[:, [1, 3]] <= 640) and np.all(gt[:, [2, 4]] <= 480)
        gone = (gt[:, 3] <= gt[:, 1]) | (gt[:, 4] <= gt[:, 2])
        assert np.all(gt[gone, 5] == 0), "an object outside the view is not visible"
        assert np.all(gt[~gone, 5] <= w_gt[~gone, 5] + 1e-6), "partly outside: less visible"
        outside += int(gone.sum())
        inside += int((~gone).sum())
    assert outside and inside, "over 300 frames objects are seen, leave and come back"
    cfg = SyntheticSourceConfig(world_margin=0.2)
    source = SyntheticSource(cfg)
    source.open()
    try:
        assert source.scene.spec.margin_x == 128 and source.scene.spec.margin_y == 96
    finally:
        source.close()


def test_synthetic_occlusion_lowers_visibility():
    # Over many frames of a crowded scene some object must be partly hidden by another.
    spec = SceneSpec(seed=1, num_objects=20)
    scene = SyntheticScene(spec)
    img = np.empty((spec.height, spec.width, 3), np.uint8)
    gt = np.zeros((spec.num_objects, 6), np.float32)
    seen = []
    for i in range(0, 200, 10):
        scene.render(i, img, gt)
        seen.append(gt[:, 5].min())
    assert min(seen) < 0.9


def test_unpaced_synthetic_source_delivers_every_frame_with_truth():
    src = SyntheticSource(SyntheticSourceConfig(fps=0, seed=3))
    assert src.policy is BufferPolicy.WAIT
    src.open()
    ids = []
    for _ in range(5):
        f = src.read(1.0)
        ids.append(f.frame_id)
        assert f.gt is not None and f.gt.shape == (6, 6)
        assert f.image.shape == (480, 640, 3)
    _, gt = render(SceneSpec(seed=3), 4)
    assert np.array_equal(f.gt, gt)
    assert ids == [0, 1, 2, 3, 4]


def test_paced_synthetic_source_skips_to_the_newest_frame():
    src = SyntheticSource(SyntheticSourceConfig(fps=200, seed=3))
    assert src.policy is BufferPolicy.NEWEST
    src.open()
    first = src.read(1.0).frame_id
    time.sleep(0.05)  # ~10 frame periods pass without a read
    f = src.read(1.0)
    assert f.frame_id >= first + 3, "a late reader must get the newest frame, not the next one"
    assert src.skipped == f.frame_id - first - 1
    assert f.capture_ns <= time.monotonic_ns()


def test_paced_source_times_out_before_the_next_frame():
    src = SyntheticSource(SyntheticSourceConfig(fps=1, seed=3))
    src.open()
    assert src.read(1.0).frame_id == 0
    assert src.read(0.01) is None


def test_a_pacer_never_bursts_to_catch_up_and_a_stop_cuts_its_wait_short():
    """One clock paces cameras, real-time files and the frame-rate cap: after a stall it
    goes on from the newest due frame (no burst of reads), and a stop ends a wait."""
    stop = threading.Event()
    pacer = Pacer(100, stop.wait)
    assert pacer.tick(1.0)[0] == 0
    time.sleep(0.1)  # ~10 periods without a read
    index, _, skipped = pacer.tick(1.0)
    assert index >= 5 and skipped == index - 1
    due_next = pacer.tick(1.0)
    assert due_next is not None and due_next[0] == index + 1 and due_next[2] == 0  # waited, not burst
    slow = Pacer(0.5, stop.wait)
    assert slow.tick(1.0)[0] == 0
    stop.set()
    assert slow.tick(5.0) is None  # frame 1 is due within 5 s; the stop abandons the wait
    assert slow.next_index == 1


def test_video_file_source_delivers_every_frame_in_order(tmp_path):
    path = write_video(tmp_path / "clip.avi", 12)
    src = create_source(VideoSourceConfig(path=str(path)))
    assert src.policy is BufferPolicy.WAIT
    src.open()
    ids, buffers = [], set()
    with pytest.raises(EndOfStream):
        while True:
            f = src.read(1.0)
            ids.append(f.frame_id)
            buffers.add(f.image.ctypes.data)
    src.close()
    assert ids == list(range(12))
    assert len(buffers) == 1, "decoding must reuse one buffer"


def test_video_file_source_loops(tmp_path):
    path = write_video(tmp_path / "clip.avi", 3)
    src = VideoFileSource(VideoSourceConfig(path=str(path), loop=True))
    src.open()
    ids = [src.read(1.0).frame_id for _ in range(7)]
    src.close()
    assert ids == [0, 1, 2, 0, 1, 2, 0]


def test_missing_video_file_is_named(tmp_path):
    src = VideoFileSource(VideoSourceConfig(path=str(tmp_path / "nope.mp4")))
    with pytest.raises(SourceError, match=r"nope\.mp4"):
        src.open()


def test_image_folder_in_name_order_skipping_unreadable(tmp_path):
    for i in (2, 0, 1):
        cv2.imwrite(str(tmp_path / f"img{i}.png"), np.full((40, 50, 3), i * 50, np.uint8))
    (tmp_path / "img15_broken.png").write_bytes(b"not a png")
    src = ImageFolderSource(ImageFolderSourceConfig(path=str(tmp_path)))
    src.open()
    values = []
    with pytest.raises(EndOfStream):
        while True:
            values.append(int(src.read(1.0).image[0, 0, 0]))
    assert values == [0, 50, 100]
    assert src.unreadable == 1


def test_an_image_folder_skips_an_image_over_max_pixels_unread(tmp_path, caplog):
    """Trial 6 on an image folder: a PNG declaring 30000x30000 pixels is skipped, counted
    and logged with its size, without being decoded; the next image plays. The cap is the
    source's ``max_pixels`` (file_frames, which bench and tune read, too)."""
    import tracemalloc

    from test_watch_source import png_bomb

    (tmp_path / "a.png").write_bytes(png_bomb())
    cv2.imwrite(str(tmp_path / "b.png"), np.full((8, 8, 3), 9, np.uint8))
    src = ImageFolderSource(ImageFolderSourceConfig(path=str(tmp_path)))
    src.open()
    tracemalloc.start()
    try:
        value = int(src.read(1.0).image[0, 0, 0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (value, src.unreadable) == (9, 1)
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB allocated skipping the bomb"
    assert "a.png: PNG of 30000x30000 pixels (900.0 MP) is over max_pixels, 40.0 MP" in caplog.text
    small = ImageFolderSourceConfig(path=str(tmp_path), max_pixels=63)  # b.png has 64
    with pytest.raises(SourceError, match="no readable image"):
        ImageFolderSource(small).open() or ImageFolderSource(small).read(1.0)
    assert list(file_frames(small, [0, 1])) == []


@pytest.mark.parametrize(
    ("kind", "value", "says"),
    [
        ("images", 0, "must be within 1..100000000"),
        ("watch", 100_000_001, "must be within 1..100000000"),
        ("images", "lots", "expected an integer"),
    ],
)
def test_max_pixels_is_checked_with_file_and_line(tmp_path, kind, value, says):
    from edge_agent.core.config import load_config
    from edge_agent.core.configload import ConfigError

    path = tmp_path / "agent.yaml"
    path.write_text(f"source:\n  type: {kind}\n  path: {tmp_path}\n  max_pixels: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    (p,) = info.value.problems
    assert (p.line, p.path) == (4, "source.max_pixels") and says in p.message, p


def test_empty_image_folder_is_an_error(tmp_path):
    with pytest.raises(SourceError, match="no images"):
        ImageFolderSource(ImageFolderSourceConfig(path=str(tmp_path))).open()


def test_an_image_folder_named_with_glob_characters_is_read(tmp_path):
    folder = tmp_path / "cam[1]"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((20, 30, 3), i * 50, np.uint8))
    # "cam[1]" as a glob pattern matches this folder, not the one named so.
    (tmp_path / "cam1").mkdir()
    cv2.imwrite(str(tmp_path / "cam1" / "other.png"), np.full((20, 30, 3), 255, np.uint8))
    assert list_images(str(folder)) == [str(folder / f"{i}.png") for i in range(3)]
    cfg = ImageFolderSourceConfig(path=str(folder))
    src = ImageFolderSource(cfg)
    src.open()
    assert [int(src.read(1.0).image[0, 0, 0]) for _ in range(3)] == [0, 50, 100]
    assert frame_count(cfg) == 3
    assert [int(img[0, 0, 0]) for img in preload(cfg, 10)] == [0, 50, 100]


def test_memory_source_plays_its_frames_in_order_looped():
    images = [np.full((4, 4, 3), v, np.uint8) for v in (10, 20, 30)]
    src = MemorySource("mem", images)
    assert src.policy is BufferPolicy.WAIT
    src.open()
    assert [src.read(1.0).frame_id for _ in range(7)] == list(range(7))
    src.open()  # from the first frame again
    got = [int(src.read(1.0).image[0, 0, 0]) for _ in range(7)]
    assert got == [10, 20, 30, 10, 20, 30, 10] and src.skipped == 0
    assert src.describe()["frames"] == 3
    with pytest.raises(SourceError, match="no frames"):
        MemorySource("empty", [])


def test_a_paced_memory_source_is_a_camera():
    images = [np.full((4, 4, 3), v, np.uint8) for v in (10, 20, 30)]
    src = MemorySource("mem", images, fps=200)
    assert src.policy is BufferPolicy.NEWEST
    src.open()
    first = src.read(1.0)
    assert first.frame_id == 0
    t0 = first.capture_ns
    time.sleep(0.05)  # ~10 frame periods pass without a read
    f = src.read(1.0)
    assert f.frame_id >= 3, "a late reader gets the newest frame, not the next one"
    assert src.skipped == f.frame_id - 1
    assert f.image is images[f.frame_id % 3]
    # Captured when it was due, not when it was read.
    assert f.capture_ns - t0 == f.frame_id * int(1e9 / 200)
    slow = MemorySource("slow", images, fps=1)
    slow.open()
    assert slow.read(1.0).frame_id == 0 and slow.read(0.01) is None


def test_preload_decodes_a_files_first_frames_within_a_memory_bound(tmp_path):
    path = write_video(tmp_path / "clip.avi", 12)
    cfg = VideoSourceConfig(path=str(path), loop=True, realtime=True)  # read once, as fast as it decodes
    frames = preload(cfg, 5)
    levels = [round(f.mean()) for f in frames]
    assert len(frames) == 5 and levels == sorted(levels), levels
    assert len({f.ctypes.data for f in frames}) == 5, "copies, not the decoder's one buffer"
    assert len(preload(cfg, 100)) == 12, "one pass at most: a shorter file is looped when played"
    one_frame_mib = 160 * 120 * 3 / (1 << 20)
    assert len(preload(cfg, 100, max_mib=3.5 * one_frame_mib)) == 3
    with pytest.raises(SourceError, match=r"gone\.avi"):
        preload(VideoSourceConfig(path=str(tmp_path / "gone.avi")), 5)


def test_file_frames_reads_the_frames_picked(tmp_path):
    path = write_video(tmp_path / "clip.avi", 12)
    cfg = VideoSourceConfig(path=str(path))
    assert frame_count(cfg) == 12
    every = [f.mean() for f in file_frames(cfg)]
    picked = [f.mean() for f in file_frames(cfg, [11, 0, 5])]
    assert len(every) == 12 and picked == [every[0], every[5], every[11]]
    folder = tmp_path / "frames"
    folder.mkdir()
    for i in range(4):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((8, 8, 3), i * 10, np.uint8))
    images = ImageFolderSourceConfig(path=str(folder))
    assert [int(f[0, 0, 0]) for f in file_frames(images, [3, 1, 9])] == [10, 30]


def test_the_rate_a_source_is_played_at(tmp_path):
    vw = cv2.VideoWriter(str(tmp_path / "c.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 25.0, (32, 32))
    vw.write(np.zeros((32, 32, 3), np.uint8))
    vw.release()
    assert source_rate(VideoSourceConfig(path=str(tmp_path / "c.avi"), max_fps=5)) == 25.0
    assert source_rate(VideoSourceConfig(path=str(tmp_path / "gone.avi"))) == 30.0
    assert source_rate(SyntheticSourceConfig(fps=12)) == 12.0
    assert source_rate(SyntheticSourceConfig(fps=0)) == 30.0
    assert source_rate(ImageFolderSourceConfig(path=str(tmp_path), max_fps=5)) == 30.0
    assert source_rate(V4L2SourceConfig(fps=15)) == 15.0


def test_live_capture_hands_out_the_newest_frame(tmp_path):
    path = write_video(tmp_path / "clip.avi", 200)
    cfg = RtspSourceConfig(url="rtsp://test/x", retry_initial_s=0.01, retry_max_s=0.05)
    src = OpenCvCapture(cfg, opener=lambda: cv2.VideoCapture(str(path)))
    src.open()
    try:
        first = src.read(2.0)
        assert first is not None
        first_id = first.frame_id
        time.sleep(0.1)  # the reader decodes ahead; the consumer must get the newest
        later = src.read(2.0)
        assert later.frame_id > first_id
        assert src.skipped >= 0
    finally:
        src.close()
    assert not src._thread, "close() must join the reader thread"


def test_live_capture_retries_with_backoff_until_the_camera_appears(tmp_path, caplog):
    path = tmp_path / "late.avi"
    write_video(path, 2000)  # read as fast as it decodes: long enough not to end under the asserts
    attempts = []

    def opener():
        attempts.append(time.monotonic())
        if len(attempts) < 3:
            raise SourceError("camera not there yet")
        return cv2.VideoCapture(str(path))

    cfg = RtspSourceConfig(url="rtsp://test/x", retry_initial_s=0.01, retry_max_s=0.02)
    src = OpenCvCapture(cfg, opener=opener)
    src.open()
    try:
        f = src.read(5.0)
        assert f is not None, "the source must recover once the camera appears"
        assert src.failures >= 2
        # why, as logged (last_failure holds only the latest: the file's end, on a slow host)
        assert sum("camera not there yet" in r.getMessage() for r in caplog.records) == 2
        assert src.connected and src.last_error == "", "the state now: connected, no error"
    finally:
        src.close()


def test_backoff_grows_exponentially_with_jitter_and_resets():
    b = Backoff(0.5, 4.0, random.Random(1))
    delays = [b.next_delay() for _ in range(6)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    for d, c in zip(delays, ceilings):
        assert c / 2 <= d <= c, (d, c)
    b.reset()
    assert 0.25 <= b.next_delay() <= 0.5


@pytest.mark.skipif(has_gstreamer(), reason="this OpenCV has GStreamer")
def test_gstreamer_source_without_gstreamer_says_so():
    cfg = GStreamerSourceConfig(pipeline="videotestsrc ! videoconvert ! appsink")
    with pytest.raises(SourceError, match="no GStreamer support"):
        open_capture(cfg)


def test_realtime_video_is_paced_at_its_frame_rate_and_skips_late_frames(tmp_path):
    path = write_video(tmp_path / "clip.avi", 60)  # 30 fps
    src = VideoFileSource(VideoSourceConfig(path=str(path), realtime=True))
    assert src.policy is BufferPolicy.NEWEST
    src.open()
    t0 = time.monotonic()
    ids = [src.read(1.0).frame_id for _ in range(4)]
    elapsed = time.monotonic() - t0
    # In order from the first; a busy machine may read one a frame time late, and then the
    # source rightly skips it, so the ids need not be consecutive. The pacing is a floor.
    assert ids[0] == 0 and ids == sorted(set(ids)), ids
    assert elapsed >= ids[-1] / 30 * 0.9, f"frame {ids[-1]} at 30 fps came after {elapsed * 1000:.0f} ms"
    time.sleep(0.2)  # ~6 frame times without reading
    f = src.read(1.0)
    src.close()
    assert f.frame_id >= ids[-1] + 5 and src.skipped == f.frame_id - 4


class FakeStalledCapture:
    """A camera that delivers ``frames`` frames, then blocks in read() until released.

    Stands in for a V4L2/GStreamer capture whose driver hangs, which cannot exist here.
    """

    def __init__(self, frames: int) -> None:
        self.left = frames
        self.unblock = threading.Event()
        self.blocked = threading.Event()  # set once a read() is in the hang
        self.released = False

    def read(self, image=None):
        if self.left > 0:
            # A driver's read returns at the camera's rate (50 fps here), each picture a new
            # one: a fake that returned at once, forever, would hog the reader's lock (seen
            # on Python 3.12) and its identical frames would count as a frozen camera.
            time.sleep(0.02)
            self.left -= 1
            return True, np.full((48, 64, 3), self.left % 256, np.uint8)
        self.blocked.set()
        self.unblock.wait(10)
        return False, None

    def release(self) -> None:
        self.released = True


def test_stalled_camera_is_replaced_by_a_new_reader(tmp_path):
    caps = [FakeStalledCapture(3), FakeStalledCapture(1000)]
    opened = []

    def opener():
        cap = caps[len(opened)]
        opened.append(cap)
        return cap

    cfg = V4L2SourceConfig(stall_timeout_s=0.3, retry_initial_s=0.01, retry_max_s=0.02)
    src = OpenCvCapture(cfg, opener=opener)
    src.open()
    try:
        deadline = time.monotonic() + 5
        ids = []
        while len(opened) < 2 and time.monotonic() < deadline:
            f = src.read(0.05)
            if f is not None:
                ids.append(f.frame_id)
        assert len(opened) == 2, "a stall must open the camera again"
        assert src.stalls == 1 and "stalled" in src.last_failure
        f = None
        while f is None and time.monotonic() < deadline:
            f = src.read(0.1)
        assert f is not None, "frames must flow again from the new capture"
    finally:
        caps[0].unblock.set()  # the stuck driver call returns; its reader must just leave
        src.close()
    wait_until(lambda: caps[0].released, 10, message="the stuck capture is released once its call returns")


def test_a_stop_waits_for_a_reader_blocked_in_the_driver_only_as_long_as_asked(tmp_path):
    cap = FakeStalledCapture(2)
    cfg = V4L2SourceConfig(stall_timeout_s=60, retry_initial_s=0.01, retry_max_s=0.02)
    src = OpenCvCapture(cfg, opener=lambda: cap)
    src.open()
    try:
        # In the hang itself: after its last frame the reader could still see the stop.
        wait_until(cap.blocked.is_set, 10, message="the reader blocked in the driver")
        assert src.stop(0.05) is False  # it says the reader did not end
    finally:
        cap.unblock.set()
    wait_until(lambda: cap.released, 10, message="the blocked reader leaves once its call returns")
    assert src.stop(1.0) is True  # nothing left to wait for


class FakeFrozenCapture:
    """A camera whose driver keeps returning the very same picture (cannot exist here)."""

    def __init__(self) -> None:
        self.img = np.full((48, 64, 3), 77, np.uint8)
        self.released = False

    def read(self, image=None):
        time.sleep(0.01)
        if image is not None and image.shape == self.img.shape:
            image[:] = self.img
            return True, image
        return True, self.img.copy()

    def release(self) -> None:
        self.released = True


def test_a_frozen_camera_is_reopened():
    opened = []

    def opener():
        opened.append(FakeFrozenCapture())
        return opened[-1]

    cfg = V4L2SourceConfig(stall_timeout_s=0.3, retry_initial_s=0.01, retry_max_s=0.02)
    src = OpenCvCapture(cfg, opener=opener)
    src.open()
    try:
        end = time.monotonic() + 5
        while len(opened) < 2 and time.monotonic() < end:
            src.read(0.05)
    finally:
        src.close()
    assert len(opened) >= 2, "identical frames past stall_timeout_s must reopen the camera"
    assert "frozen" in src.last_failure and src.failures >= 1


class FakeFailingCapture:
    """A camera that delivers ``frames`` frames, then fails its reads (cannot exist here)."""

    def __init__(self, frames: int) -> None:
        self.left = frames

    def read(self, image=None):
        time.sleep(0.01)
        if self.left > 0:
            self.left -= 1
            return True, np.random.default_rng(self.left).integers(0, 255, (48, 64, 3), np.uint8)
        return False, None

    def release(self) -> None:
        pass


def test_state_is_disconnected_during_the_backoff_and_clean_after_a_reconnect():
    opened = []

    def opener():
        opened.append(FakeFailingCapture(3))
        return opened[-1]

    # A long first backoff: the state is read while the reader waits in it.
    cfg = V4L2SourceConfig(retry_initial_s=2.0, retry_max_s=2.0)
    src = OpenCvCapture(cfg, opener=opener)
    src.open()
    try:
        wait_until(lambda: src.failures == 1, 10, message="the read failure")
        state = src.describe()
        assert state["connected"] is False, "not connected while waiting to retry"
        assert "read failed" in state["last_error"]
        wait_until(lambda: len(opened) == 2 and src.connected, 10, message="the reconnect")
        state = src.describe()
        assert state["last_error"] == "" and "read failed" in state["last_failure"]
    finally:
        src.close()


class FakeBurstCapture:
    """A stream that hands over ``backlog`` buffered frames at once on connect, then one
    frame per period, as FFmpeg does after probing an RTSP stream (a fake: an RTSP server
    is in the slow tests)."""

    def __init__(self, backlog: int, fps: float = 30.0) -> None:
        self.backlog, self.fps, self.n = backlog, fps, 0

    def get(self, prop):
        return self.fps if prop == cv2.CAP_PROP_FPS else 0.0

    def read(self, image=None):
        if self.n >= self.backlog:
            time.sleep(1 / self.fps)
        self.n += 1
        img = np.full((48, 64, 3), self.n % 256, np.uint8)
        return True, img

    def release(self) -> None:
        pass


def test_the_backlog_a_stream_bursts_on_connect_is_drained_as_stale():
    cfg = RtspSourceConfig(url="rtsp://test/x")
    src = OpenCvCapture(cfg, opener=lambda: FakeBurstCapture(24))
    src.open()
    try:
        f = src.read(10.0)
        assert f is not None
        first = f.frame_id
    finally:
        src.close()
    # The buffered frames are never handed over: the first one is a live one. (All 24 are
    # drained unless this machine is so loaded that reading one took half a frame time.)
    assert first == src.stale and src.stale >= 20, (src.stale, first)


def test_every_source_type_of_the_config_is_registered_and_an_unknown_one_is_named():
    """The registry collects each source module's SOURCES; every type the config schema
    knows builds a source, and a type nobody registered is refused by name."""
    import typing
    from dataclasses import replace

    from edge_agent.core.source_config import SourceConfig
    from edge_agent.pipelines.sources.registry import register, source_types

    schema = {cls.__dataclass_fields__["type"].default for cls in typing.get_args(SourceConfig)}
    assert schema == set(source_types())
    with pytest.raises(ValueError, match="'synthetic' is already registered"):
        register("synthetic", SyntheticSource)
    bogus = replace(SyntheticSourceConfig(), type="nope")  # type: ignore[arg-type]
    with pytest.raises(SourceError, match=r"unknown source type 'nope' \(one of .*'watch'"):
        create_source(bogus)


def test_an_image_folder_lists_regular_files_only(tmp_path):
    """A FIFO named like an image would block the read; a link to a device never ends."""
    cv2.imwrite(str(tmp_path / "a.png"), np.full((8, 8, 3), 5, np.uint8))
    os.mkfifo(tmp_path / "b.png")
    os.symlink("/dev/zero", tmp_path / "c.png")
    assert [os.path.basename(p) for p in list_images(str(tmp_path))] == ["a.png"]
    # Swapped in after the listing: refused on the open file, never waited on.
    from edge_agent.pipelines.sources.files import read_image

    assert read_image(str(tmp_path / "b.png"), "s") is None
    assert read_image(str(tmp_path / "c.png"), "s") is None
    assert read_image(str(tmp_path / "a.png"), "s", max_bytes=10) is None
    assert read_image(str(tmp_path / "a.png"), "s")[0, 0, 0] == 5


def test_a_scene_without_objects_renders_its_background():
    """num_objects: 0 is a valid config (an empty room): the background and noise, no truth."""
    scene = SyntheticScene(SceneSpec(num_objects=0))
    image = np.zeros((480, 640, 3), np.uint8)
    scene.render(5, image, np.zeros((0, 6), np.float32))
    assert image.std() > 1.0
