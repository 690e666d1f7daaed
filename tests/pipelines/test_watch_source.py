"""The watched-folder source (pipelines/sources/watch.py, type ``watch``): new images once
each, in the order they were written, only once their size settled; what was there at start
skipped unless ``existing``; unreadable files skipped; and the real agent running on one,
configured from YAML with the config's file/line errors."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest
from conftest import end_process, free_endpoint
from helpers import Subscriber

from edge_agent.core.config import load_config
from edge_agent.core.configload import ConfigError
from edge_agent.core.source_config import WatchFolderSourceConfig
from edge_agent.pipelines.sources.base import SourceError
from edge_agent.pipelines.sources.registry import create_source
from edge_agent.pipelines.sources.watch import WatchFolderSource


def image(path, value: int, mtime_ns: int | None = None) -> None:
    cv2.imwrite(str(path), np.full((24, 32, 3), value, np.uint8))
    if mtime_ns is not None:
        os.utime(path, ns=(mtime_ns, mtime_ns))


def values(src: WatchFolderSource, n: int, timeout_s: float = 10.0) -> list[int]:
    got: list[int] = []
    end = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < end:
        frame = src.read(0.1)
        if frame is not None:
            got.append(int(frame.image[0, 0, 0]))
    return got


def test_new_images_once_each_in_the_order_written_and_none_of_those_there_before(tmp_path):
    image(tmp_path / "old.png", 7)
    src = create_source(WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0))
    assert isinstance(src, WatchFolderSource)
    src.open()
    assert src.read(0.05) is None  # what was there at start is not new
    now = time.time_ns()
    image(tmp_path / "b.png", 20, now - 2_000_000_000)  # written first, named later
    image(tmp_path / "a.png", 40, now - 1_000_000_000)
    (tmp_path / "c.png").write_bytes(b"not a png")
    assert values(src, 2) == [20, 40]
    assert src.read(0.05) is None and src.unreadable == 1  # each once; the broken one skipped
    # Removed, then written again under its name: new again.
    os.remove(tmp_path / "b.png")
    assert src.read(0.05) is None
    image(tmp_path / "b.png", 60)
    assert values(src, 1) == [60]
    # What the folder holds (old, a, b, c), not everything ever seen.
    assert src.describe()["seen"] == 4


def test_existing_images_are_read_when_asked(tmp_path):
    image(tmp_path / "x.png", 11)
    cfg = WatchFolderSourceConfig(path=str(tmp_path), existing=True, poll_s=0.01, settle_s=0)
    src = WatchFolderSource(cfg)
    src.open()
    assert values(src, 1) == [11]


def test_a_file_still_growing_is_read_once_its_size_settled(tmp_path):
    src = WatchFolderSource(WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0.3))
    src.open()
    _, png = cv2.imencode(".png", np.full((24, 32, 3), 90, np.uint8))
    data = png.tobytes()
    path = tmp_path / "upload.png"
    with open(path, "wb") as f:  # half of it, as an upload in progress
        f.write(data[: len(data) // 2])
        f.flush()
        assert src.read(0.2) is None  # not settled yet (and not readable)
        f.write(data[len(data) // 2 :])
    assert src.unreadable == 0
    assert values(src, 1) == [90]


def test_a_missing_folder_is_named(tmp_path):
    src = WatchFolderSource(WatchFolderSourceConfig(path=str(tmp_path / "nope")))
    with pytest.raises(SourceError, match=r"folder to watch not found: .*nope"):
        src.open()


def test_its_settings_are_checked_with_file_and_line(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(f"source:\n  type: watch\n  path: {tmp_path}\n  poll_s: 0\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    (p,) = info.value.problems
    assert (p.line, p.path) == (4, "source.poll_s") and "0.01..60" in p.message


def test_the_agent_publishes_the_images_dropped_into_the_folder(tmp_path):
    folder = tmp_path / "drop"
    folder.mkdir()
    endpoint = free_endpoint()
    config = tmp_path / "agent.yaml"
    config.write_text(
        "source:\n  type: watch\n  name: trap\n"
        f"  path: {folder}\n  poll_s: 0.05\n  settle_s: 0.1\n"
        f"publish:\n  endpoint: {endpoint}\nmetrics:\n  enabled: false\n"
    )
    sub = Subscriber(endpoint, "det.trap")
    agent = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "run", "--config", str(config), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        # Dropped until the agent (once up) has published the first; then two more.
        i = 0
        while not sub.messages:
            assert agent.poll() is None, agent.stderr.read().decode()[-2000:]
            image(folder / f"img{i:03d}.png", 10 * i)
            i += 1
            time.sleep(0.3)
        first = len(sub.messages)
        for k in range(2):
            image(folder / f"late{k}.png", 200 + k)
        sub.wait_for(first + 2, 60)
        seqs = [m["seq"] for m in sub.messages]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "each image published once, in order"
        ids = [m["frame_id"] for m in sub.messages]
        assert ids == sorted(set(ids)) and len(ids) <= i + 2
    finally:
        sub.close()
        end_process(agent)


def test_a_fifo_a_device_link_and_an_oversized_file_are_skipped_without_blocking(tmp_path, monkeypatch):
    """The folder may be written by others: a FIFO (opening it would block the capture
    thread) and a link to a device are not listed, a file over the size cap is skipped and
    counted."""
    from edge_agent.pipelines.sources import files

    monkeypatch.setattr(files, "MAX_IMAGE_BYTES", 10_000)
    src = WatchFolderSource(WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0))
    src.open()
    os.mkfifo(tmp_path / "pipe.png")
    os.symlink("/dev/zero", tmp_path / "zero.png")
    (tmp_path / "big.png").write_bytes(b"\0" * 20_000)
    image(tmp_path / "good.png", 33)
    assert values(src, 1) == [33]  # the read returned: nothing blocked on the FIFO
    assert src.unreadable == 1  # the oversized file; the FIFO and the device are never listed
    assert src.read(0.05) is None  # each looked at once
