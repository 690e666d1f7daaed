"""The watched-folder source (pipelines/sources/watch.py, type ``watch``): new images once
each, in the order they were written, only once their size settled; what was there at start
skipped unless ``existing``; unreadable files skipped; and the real agent running on one,
configured from YAML with the config's file/line errors."""

from __future__ import annotations

import logging
import os
import struct
import subprocess
import sys
import time
import zlib

import cv2
import numpy as np
import pytest
from conftest import agent_command, end_process, free_endpoint, spawn, wait_until
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


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_bomb(width: int = 30_000, height: int = 30_000) -> bytes:
    """A valid 1-bit grey PNG of ``width`` x ``height`` zeros: about 110 kB for 30000x30000
    (2.7 GB once decoded as BGR), written row by row so it is never whole in memory."""
    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    row = bytes(1 + (width + 7) // 8)  # filter byte "none", then the row's bits
    z = zlib.compressobj(9)
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


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


def _peak_rss_mib(pid: int) -> float:
    """The process's peak resident memory (VmHWM), in MiB."""
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_decompression_bomb_in_the_folder_is_skipped_and_the_agent_stays_small(tmp_path):
    """Trial 6: a ~110 kB PNG of 30000x30000 pixels (2.7 GB as BGR) in the folder, with
    normal images dropped after it. It is skipped, unread, with the reason logged; the
    others are published; the agent's peak RSS stays under 300 MB."""
    folder = tmp_path / "drop"
    folder.mkdir()
    (folder / "a_bomb.png").write_bytes(png_bomb())  # there at start: read first (existing)
    endpoint = free_endpoint()
    config = tmp_path / "agent.yaml"
    config.write_text(
        "source:\n  type: watch\n  name: trap\n"
        f"  path: {folder}\n  existing: true\n  poll_s: 0.05\n  settle_s: 0.1\n"
        f"publish:\n  endpoint: {endpoint}\nmetrics:\n  enabled: false\n"
    )
    sub = Subscriber(endpoint, "det.trap")
    log = tmp_path / "agent.log"
    command = agent_command("run", "--config", str(config), "--quiet")
    try:
        with open(log, "w") as err, spawn(command, stderr=err) as agent:
            dropped = iter(range(1000))

            def published() -> bool:
                # Dropped until the agent (once up, and the subscription through) published one.
                assert agent.poll() is None, log.read_text()[-2000:]
                image(folder / f"img{next(dropped):03d}.png", 50)
                return bool(sub.messages)

            wait_until(published, 60, interval_s=0.3, message="no image published")
            first = len(sub.messages)
            for k in range(2):
                image(folder / f"late{k}.png", 200 + k)
            sub.wait_for(first + 2, 60)
            peak = _peak_rss_mib(agent.pid)
    finally:
        sub.close()
    assert peak < 300, f"peak RSS {peak:.0f} MiB"
    skipped = "a_bomb.png: PNG of 30000x30000 pixels (900.0 MP) is over max_pixels, 40.0 MP"
    assert skipped in log.read_text(), log.read_text()[-2000:]


def test_its_max_pixels_is_the_cap(tmp_path):
    cfg = WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0, max_pixels=700)
    src = WatchFolderSource(cfg)
    src.open()
    image(tmp_path / "a.png", 10, time.time_ns() - 10**9)  # 32x24: 768 pixels
    cv2.imwrite(str(tmp_path / "b.png"), np.full((20, 20, 3), 20, np.uint8))
    assert values(src, 1) == [20]
    assert src.unreadable == 1


class CountedScandir:
    """``os.scandir`` as it is, counting the entries read from every listing."""

    read = 0

    def __init__(self, real, path):
        self._it = real(path)

    def __iter__(self):
        return self

    def __next__(self):
        entry = next(self._it)
        CountedScandir.read += 1
        return entry

    def close(self):
        self._it.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def poll(src: WatchFolderSource) -> int:
    """One poll, as ``read`` runs it every ``poll_s``; the folder entries it read."""
    before = CountedScandir.read
    src._look()
    return CountedScandir.read - before


@pytest.fixture
def counted(monkeypatch):
    real = os.scandir
    monkeypatch.setattr(CountedScandir, "read", 0)
    monkeypatch.setattr(os, "scandir", lambda path: CountedScandir(real, path))


def an_hour_old(folder) -> None:
    """The folder's modification time an hour back: nothing changed in it lately."""
    then = time.time_ns() - 3600 * 10**9
    os.utime(folder, ns=(then, then))


def test_a_poll_reads_at_most_scan_limit_entries_and_the_next_goes_on_where_it_stopped(
    tmp_path, counted, caplog
):
    """A folder larger than a poll handles: each poll reads ``scan_limit`` entries at most,
    the next goes on where it stopped, a new file is found within the pass, and the polls
    cut short are counted (the first one logged)."""
    for i in range(24):
        (tmp_path / f"old{i:02d}.png").write_bytes(b"")
    (tmp_path / "notes.txt").write_bytes(b"")  # not an image: read past, but read
    src = WatchFolderSource(
        WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0), scan_limit=10
    )
    src.open()  # the folder as it is, listed whole once: not new
    assert CountedScandir.read == 25 and src.describe()["seen"] == 24
    image(tmp_path / "new.png", 50)
    caplog.set_level(logging.WARNING, logger="edge_agent.pipelines.sources.watch")
    assert [poll(src) for _ in range(3)] == [10, 10, 6], "the pass over 26 entries, 10 a poll"
    assert src.scan_limited == 2 and src.describe()["scan_limited"] == 2
    warned = [r for r in caplog.records if "scan_limited" in r.getMessage()]
    assert len(warned) == 1, "the first poll cut short is logged, the others counted"
    assert values(src, 1) == [50]
    assert src.read(0.05) is None


def test_a_quiet_folder_is_not_listed_again_until_it_changes(tmp_path, counted):
    """Nothing changed since the last whole pass (the folder's time says so): a poll lists
    nothing. A file added moves the folder's time: the next poll lists it again."""
    for i in range(30):
        (tmp_path / f"old{i:02d}.png").write_bytes(b"")
    an_hour_old(tmp_path)
    src = WatchFolderSource(
        WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0), scan_limit=100
    )
    src.open()
    assert [poll(src) for _ in range(5)] == [0] * 5
    image(tmp_path / "new.png", 70)
    assert poll(src) == 31
    assert values(src, 1) == [70] and src.scan_limited == 0


def test_files_waiting_to_settle_count_against_the_bound_and_each_gets_its_turn(tmp_path, counted):
    """More files waiting for their size to settle than a poll handles: a poll looks at
    ``scan_limit`` of them again (the longest waiting first) before it lists on, and each
    is read once it settled."""
    src = WatchFolderSource(
        WatchFolderSourceConfig(path=str(tmp_path), poll_s=0.01, settle_s=0.2), scan_limit=4
    )
    src.open()
    for i in range(6):
        image(tmp_path / f"up{i}.png", 10 + i, time.time_ns() - (6 - i) * 1_000_000)
    assert poll(src) == 4, "the listing, 4 entries: 4 files waiting"
    assert poll(src) == 0 and src.scan_limited == 2, "the 4 waiting take the whole poll"
    got = values(src, 6)
    assert sorted(got) == [10, 11, 12, 13, 14, 15] and src.read(0.05) is None


@pytest.mark.parametrize(
    "patterns",
    [
        ("*.jpg", "*.jpeg", "*.png", "*.bmp"),
        ("*.PNG",),
        ("cam[12]_*.png", "?.jpg"),
        (".*.png",),
        ("*",),
    ],
)
def test_names_match_the_patterns_as_glob_matches_them(tmp_path, patterns):
    """The listing matches names itself (no glob per poll): the same names as ``glob`` in
    the folder, hidden ones included only by a pattern that starts with a dot."""
    import glob

    from edge_agent.pipelines.sources.watch import name_matcher

    names = ["a.jpg", "b.JPG", "c.png", "c.PNG", ".hidden.png", "cam1_x.png", "cam3_x.png", "x.jpg", "xy.jpg"]
    names += ["a.jpg.txt", "d.jpeg", "e.bmp", "[odd].png", "sp ace.png"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    by_glob = {
        os.path.basename(f) for p in patterns for f in glob.glob(os.path.join(glob.escape(str(tmp_path)), p))
    }
    match = name_matcher(patterns).fullmatch
    assert {n for n in names if match(n)} == by_glob
