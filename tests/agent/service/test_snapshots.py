"""Event snapshots: JPEGs of the annotated frame named by their events, in a folder kept
within its caps (files and bytes, oldest first, an earlier run's files counted, nobody
else's touched), written off the frame path with a bounded queue; nothing while off."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from conftest import free_endpoint, started, wait_until
from helpers import Subscriber

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, SnapshotConfig, ZoneConfig
from edge_agent.core.config import AgentConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import SyntheticSourceConfig
from edge_agent.pipelines.steps.analytics import SourceAnalytics
from edge_agent.service.runner import Agent
from edge_agent.service.snapshots import NAME, POOL, SnapshotService, file_name


def slot(frame_id: int = 7, value: int = 90, noise: bool = False) -> SimpleNamespace:
    pixels = np.full((480, 640, 3), value, np.uint8)
    if noise:  # a JPEG of noise is large: the byte cap has something to cut
        pixels = np.random.default_rng(frame_id).integers(0, 255, (300, 300, 3), np.uint8)
    return SimpleNamespace(
        pixels=pixels,
        det_count=1,
        det_xyxy=np.array([[20, 20, 60, 90]], np.float32),
        det_score=np.array([0.9], np.float32),
        det_class=np.array([1], np.int32),
        det_track=np.array([42], np.int64),
        frame_id=frame_id,
        profile=SimpleNamespace(model=SimpleNamespace(manifest=SimpleNamespace(labels=("a", "b")))),
    )


HALL = ZoneConfig(name="hall", points=((0.5, 0.1), (0.9, 0.1), (0.9, 0.9), (0.5, 0.9)))


def source(snapshots: SnapshotConfig) -> SourceAnalytics:
    """A source's analytics (one zone on the right half) whose events save snapshots."""
    config = AnalyticsConfig(zones=(HALL,), snapshots=snapshots)
    return SourceAnalytics(config, ("a", "b"), 30, 64, "cam0", "dev", "run", lambda *a: None, lambda m: b"")


def event(seq: int, kind: str = "cross", at: float = 1_796_000_000.25) -> dict:
    e = {"seq": seq, "kind": kind, "track_id": 42, "at_unix_s": at}
    return e | ({"line": "door", "direction": "in"} if kind == "cross" else {"zone": "hall"})


def test_a_snapshot_is_the_annotated_frame_named_by_its_event(tmp_path):
    service = SnapshotService()
    assert service._thread is None, "no thread until a snapshot is taken"
    cfg = SnapshotConfig(dir=str(tmp_path / "snaps"))
    service.offer(source(cfg), slot(), [event(3), event(4, "enter")])
    assert service.stop(5.0)
    names = sorted(os.listdir(tmp_path / "snaps"))
    assert names == sorted([file_name("cam0", event(3)), file_name("cam0", event(4, "enter"))])
    assert "_cam0_3_cross_door_in_t42.jpg" in names[0] and names[0].startswith("2026")
    assert all(NAME.match(n) for n in names)
    image = cv2.imread(str(tmp_path / "snaps" / names[0]))
    assert image.shape == (480, 640, 3)
    # the box was drawn on the flat grey frame: some pixels along its edge are not grey
    edge = image[30:90, 20:22].astype(int)
    assert (np.abs(edge - 90).max(axis=2) > 40).any()
    # and the zone (x 320..576 of the 640 px frame): its left edge, not the grey beside it
    assert (np.abs(image[200:300, 319:322].astype(int) - 90).max(axis=2) > 40).all()
    assert (np.abs(image[200:300, 280:300].astype(int) - 90).max(axis=2) < 20).all()
    assert service.written == 2 and service.dropped == 0


def test_the_folder_keeps_within_its_caps_oldest_first_and_leaves_other_files(tmp_path):
    folder = tmp_path / "snaps"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    old = folder / file_name("cam0", event(0, at=1_700_000_000.0))  # an earlier run's
    old.write_bytes(b"x" * 10)
    service = SnapshotService()
    cfg = SnapshotConfig(dir=str(folder), max_files=3)
    for i in range(1, 6):
        service.offer(source(cfg), slot(i), [event(i, at=1_796_000_000.0 + i)])
        wait_until(lambda i=i: service.written == i, 10, message=f"snapshot {i}")
    assert service.stop(5.0)
    names = sorted(n for n in os.listdir(folder) if n.endswith(".jpg"))
    assert [n.split("_")[2] for n in names] == ["3", "4", "5"], names
    assert (folder / "notes.txt").read_text() == "mine", "a file it did not write is never deleted"
    assert not old.exists(), "the earlier run's file counted and went first"
    # bytes: files of noise over 50 KiB each under a 0.1 MiB cap: one at a time
    service = SnapshotService()
    tight = SnapshotConfig(dir=str(folder), max_files=100, max_mib=0.1)
    for i in (9, 10):
        service.offer(source(tight), slot(i, noise=True), [event(i, at=1_796_000_100.0 + i)])
        wait_until(lambda i=i: service.written == i - 8, 10, message=f"snapshot {i}")
    assert service.stop(5.0)
    left = [n for n in os.listdir(folder) if n.endswith(".jpg")]
    assert [n.split("_")[2] for n in left] == ["10"] and os.path.getsize(folder / left[0]) > 50 * 1024


def test_a_busy_writer_drops_and_counts_instead_of_blocking_the_frame_path(tmp_path, monkeypatch):
    import edge_agent.service.snapshots as module

    gate = threading.Event()
    real = module.annotate

    def slow(image, frame):
        gate.wait(10)
        return real(image, frame)

    monkeypatch.setattr(module, "annotate", slow)
    service = SnapshotService()
    cfg = SnapshotConfig(dir=str(tmp_path))
    for i in range(POOL + 3):
        service.offer(source(cfg), slot(i), [event(i)])  # returns at once: the writer waits
    assert service.dropped == 3
    gate.set()
    assert service.stop(10.0)
    assert service.written == POOL


def agent_config(tmp_path, snapshots: SnapshotConfig) -> AgentConfig:
    analytics = AnalyticsConfig(
        zones=(ZoneConfig(name="left", points=((0, 0), (0.5, 0), (0.5, 1), (0, 1)), min_frames=2),),
        lines=(LineConfig(name="door", points=((0.5, 0), (0.5, 1)), min_frames=2),),
        snapshots=snapshots,
    )
    source = SyntheticSourceConfig(fps=60, seed=3, num_objects=8, world_margin=0.1, analytics=analytics)
    return AgentConfig(source=source, publish=PublishConfig(endpoint=free_endpoint(), wait_for_subscribers=1))


def test_an_agent_saves_a_snapshot_per_event_and_nothing_while_off(tmp_path):
    folder = tmp_path / "events"
    cfg = agent_config(tmp_path, SnapshotConfig(dir=str(folder)))
    sub = Subscriber(cfg.publish.endpoint, "event.", keep_all=True)
    with started(Agent(cfg), sub, clean=True) as agent:
        wait_until(lambda: len(sub.messages) >= 4, 60, message="four events")
        assert agent.pipeline._lanes[0].keeps_pixels
    events = {(m["seq"], m["kind"]) for m in sub.messages}
    written = {(int(n.split("_")[2]), n.split("_")[3]) for n in os.listdir(folder)}
    assert written and written <= events | {(s, k) for s, k in written if s >= len(sub.messages)}
    assert {s for s, _ in events} - {s for s, _ in written} <= {m["seq"] for m in sub.messages[-2:]}
    # off: no copy of any frame
    off = agent_config(tmp_path, SnapshotConfig())
    with started(Agent(off), clean=True) as agent:
        lane = agent.pipeline._lanes[0]
        wait_until(lambda: lane.stats.counts().on_time + lane.stats.counts().late >= 10, 30, message="frames")
        assert not lane.keeps_pixels and lane.steps[-1].snapshots is None
        slots = lane.primary.pools[lane.name].slots
        assert all(s.pixels is None for s in slots)


# -- hostile folders (issue 43, trial 1) ----------------------------------------------------
# Whoever can write to the snapshot folder can plant names in it, and the names are
# predictable from the event stream. Nothing of that may make the writer write, or delete,
# anything outside the folder.


def old_temporary(name: str) -> str:
    return f".{name}.tmp"  # what the writer used before: predictable from the event


def test_a_symlink_planted_at_every_temporary_and_final_name_writes_nothing_outside(tmp_path):
    folder, outside = tmp_path / "snaps", tmp_path / "outside"
    folder.mkdir(mode=0o700)
    outside.mkdir()
    events = [event(i, at=1_796_000_000.0 + i) for i in range(84)]
    planted = []
    for e in events:
        name = file_name("cam0", e)
        guesses = [
            old_temporary(name),
            name,
            f".{name}.{'0' * 16}.tmp",
            f".{name}.{e['seq']:08x}{'f' * 8}.tmp",
        ]
        for link in guesses:
            target = outside / f"target{len(planted)}"
            target.write_bytes(b"mine %d" % len(planted))
            (folder / link).symlink_to(target)
            planted.append(target)
    service = SnapshotService()
    cfg = SnapshotConfig(dir=str(folder))
    for k in range(0, 84, 21):
        service.offer(source(cfg), slot(k), events[k : k + 21])
        wait_until(lambda k=k: service.written + service.failed >= k + 21, 30, message=f"events {k}..")
    assert service.stop(5.0)
    unchanged = sum(t.read_bytes() == b"mine %d" % i for i, t in enumerate(planted))
    assert sorted(os.listdir(outside)) == sorted(t.name for t in planted), "a file appeared outside"
    assert unchanged == len(planted), (
        f"{len(planted) - unchanged} of {len(planted)} files outside overwritten"
    )
    assert service.written == 84 and service.failed == 0
    for e in events:  # the final names: now the snapshots themselves, not links
        written = folder / file_name("cam0", e)
        assert not written.is_symlink() and written.read_bytes()[:2] == b"\xff\xd8", written


@pytest.mark.parametrize("tail", ["", "/", "/.", "//"])
def test_a_snapshot_folder_that_is_a_symlink_is_refused_and_nothing_in_its_target_deleted(
    tmp_path, caplog, tail
):
    """Spelled with a trailing slash too (``dir: /var/lib/edge-agent/snapshots/``): the
    kernel follows ``snaps/`` whatever O_NOFOLLOW says, so the path is normalised first."""
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    theirs = [file_name("cam0", event(i, at=1_700_000_000.0 + i)) for i in range(5)]
    for name in theirs:  # named as snapshots are: rotation would take them for its own
        (target / name).write_bytes(b"theirs")
    theirs.append(f".{theirs[0]}.0123456789abcdef.tmp")  # named as a temporary: not stale
    (target / theirs[-1]).write_bytes(b"theirs")
    (tmp_path / "snaps").symlink_to(target)
    service = SnapshotService()
    cfg = SnapshotConfig(dir=f"{tmp_path / 'snaps'}{tail}", max_files=1)
    service.offer(source(cfg), slot(), [event(1), event(2)])
    assert service.stop(10.0)
    assert sorted(os.listdir(target)) == sorted(theirs), "the symlinked folder was written to or rotated"
    assert (service.written, service.failed) == (0, 1)
    assert "is a symlink" in caplog.text and str(tmp_path / "snaps") in caplog.text, caplog.text


FULL_DISK = """
import json, os, resource, signal, sys
sys.path[:0] = sys.argv[2:]
from conftest import wait_until
from test_snapshots import SnapshotConfig, SnapshotService, event, slot, source
folder = sys.argv[1]
# The disk is full for this process: a file may not grow past 32 KiB (EFBIG, not a signal).
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (32768, 32768))
service = SnapshotService()
cfg = SnapshotConfig(dir=folder)
for i in range(3):  # noise: each JPEG is over 60 KiB
    service.offer(source(cfg), slot(i, noise=True), [event(i)])
    wait_until(lambda i=i: service.failed == i + 1, 30, message=f"failure {i}")
service.offer(source(cfg), slot(9), [event(9)])  # flat grey: about 20 KiB, fits
wait_until(lambda: service.written == 1, 30, message="the small one")
assert service.stop(5.0)
print(json.dumps({"failed": service.failed, "dropped": service.dropped, "written": service.written}))
"""


def test_a_full_disk_leaves_no_temporary_and_counts_the_failures(tmp_path):
    import json
    import sys

    from conftest import REPO, run_process

    folder = tmp_path / "snaps"
    paths = [str(REPO / "tests"), str(REPO / "tests" / "agent" / "service")]
    env = os.environ | {"PYTHONDONTWRITEBYTECODE": "1"}  # no .pyc is written under the limit
    done = run_process([sys.executable, "-c", FULL_DISK, str(folder), *paths], 120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts == {"failed": 3, "dropped": 3, "written": 1}, counts
    names = os.listdir(folder)
    assert names == [file_name("cam0", event(9))], f"left behind: {names}"


def test_stale_temporaries_of_an_earlier_run_are_removed_at_start_and_counted(tmp_path):
    folder = tmp_path / "snaps"
    folder.mkdir(mode=0o700)
    name = file_name("cam0", event(1, at=1_700_000_000.0))
    stale = [old_temporary(name), f".{name}.0123456789abcdef.tmp"]  # the old naming and the new
    for s in stale:
        (folder / s).write_bytes(b"\xff\xd8 half a jpeg")
    kept = ["notes.tmp", ".hidden", old_temporary("not-a-snapshot.jpg")]  # not the writer's
    for k in kept:
        (folder / k).write_text("mine")
    service = SnapshotService()
    service.offer(source(SnapshotConfig(dir=str(folder))), slot(), [event(3)])
    wait_until(lambda: service.written == 1, 10, message="a snapshot")
    assert service.stop(5.0)
    assert sorted(os.listdir(folder)) == sorted([*kept, file_name("cam0", event(3))])
    assert service.stale == 2


def test_the_folder_is_made_0700_and_one_others_can_write_to_is_refused(tmp_path, caplog):
    service = SnapshotService()
    made = tmp_path / "made" / "snaps"
    service.offer(source(SnapshotConfig(dir=str(made))), slot(), [event(1)])
    wait_until(lambda: service.written == 1, 10, message="a snapshot")
    assert oct(made.stat().st_mode & 0o777) == oct(0o700)
    assert [oct(p.stat().st_mode & 0o777) for p in made.iterdir()] == [oct(0o600)]
    for n, mode in enumerate((0o777, 0o770, 0o702), 1):
        shared = tmp_path / f"shared{mode:o}"
        shared.mkdir()
        shared.chmod(mode)
        service.offer(source(SnapshotConfig(dir=str(shared))), slot(), [event(2)])
        wait_until(lambda n=n: service.failed == n, 10, message=f"refused: {mode:04o}")
        assert os.listdir(shared) == [], oct(mode)
        assert f"{shared}: others can write to it (mode {mode:04o})" in caplog.text, caplog.text
    theirs = tmp_path / "theirs"  # another user's folder: they could swap what is in it
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    service.offer(source(SnapshotConfig(dir=str(theirs))), slot(), [event(3)])
    wait_until(lambda: service.failed == 4, 10, message="refused: another user's")
    assert f"{theirs}: owned by uid 65534, not by this user" in caplog.text
    assert os.listdir(theirs) == []
    assert service.stop(5.0)
