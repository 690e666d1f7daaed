"""The uplink's disk spool: FIFO order, in-flight windows, the byte bound and its dropped
count, persistence across restarts (kill -9 included) and refusing files that are not a
spool. Real SQLite files in tmp_path throughout."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import read_line, spawn

from edge_agent.service.uplink.spool import Message, Spool, SpoolError


def batch(start: int, n: int, size: int = 10, topic: str = "t") -> list[tuple[str, bytes, int, bool]]:
    """Messages ``start``..``start+n-1``, each ``size`` bytes of topic and payload; the
    payload starts with its number so order can be read back."""
    out = []
    for i in range(start, start + n):
        head = f"{i}:".encode()
        out.append((topic, head + b"x" * (size - len(topic) - len(head)), 1, i % 2 == 0))
    return out


def number(m: Message) -> int:
    return int(m.payload.split(b":", 1)[0])


def everything(spool: Spool) -> list[Message]:
    """Every message in the spool, oldest first (forgets the in-flight marks)."""
    spool.release()
    out = spool.peek(1_000_000)
    spool.release()
    return out


def test_fifo_across_put_many_calls(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", 1_000_000) as spool:
        assert spool.put_many(batch(0, 3)) == 0
        assert spool.put_many([]) == 0
        assert spool.put_many(batch(3, 4)) == 0
        assert spool.put_many(iter(batch(7, 2))) == 0  # any iterable
        got = spool.peek(100)
        assert [number(m) for m in got] == list(range(9))
        assert [m.id for m in got] == sorted({m.id for m in got})
        assert spool.count == 9
        assert spool.size_bytes == 90
        first = got[0]
        assert (first.topic, first.qos, first.retain) == ("t", 1, True)
        assert got[1].retain is False
        assert isinstance(first.payload, bytes)


def test_peek_windows_never_repeat_until_release(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", 1_000_000) as spool:
        spool.put_many(batch(0, 5))
        assert [number(m) for m in spool.peek(2)] == [0, 1]
        assert [number(m) for m in spool.peek(2)] == [2, 3]
        spool.put_many(batch(5, 3))
        assert [number(m) for m in spool.peek(10)] == [4, 5, 6, 7]
        assert spool.peek(10) == []
        assert spool.peek(0) == []
        spool.put_many(batch(8, 1))
        assert [number(m) for m in spool.peek(10)] == [8]
        # After a reconnect the sender starts over from the oldest unacknowledged.
        spool.ack([m.id for m in everything(spool)[:3]])
        spool.release()
        assert [number(m) for m in spool.peek(3)] == [3, 4, 5]
        assert [number(m) for m in spool.peek(10)] == [6, 7, 8]


def test_ack_removes_and_ignores_unknown_ids(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", 1_000_000) as spool:
        spool.put_many(batch(0, 6))
        window = spool.peek(4)
        spool.ack([window[0].id, window[2].id, 999_999, -1])
        assert spool.count == 4
        assert spool.size_bytes == 40
        spool.ack([window[0].id])  # acked twice: ignored
        assert spool.count == 4
        spool.ack([])
        assert [number(m) for m in everything(spool)] == [1, 3, 4, 5]
        # More ids than one SQL statement takes at once.
        spool.put_many(batch(6, 1200))
        spool.ack([m.id for m in everything(spool)])
        assert (spool.count, spool.size_bytes, spool.dropped) == (0, 0, 0)
        assert spool.peek(10) == []


def test_state_persists_across_close_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "spool.db"  # parents created
    spool = Spool(path, 100)
    spool.put_many(batch(0, 12))  # two over the bound
    assert spool.dropped == 2
    acked = spool.peek(1)
    spool.ack([m.id for m in acked])
    last_id = everything(spool)[-1].id
    spool.close()
    spool.close()  # idempotent
    with pytest.raises(SpoolError, match="closed"):
        spool.peek(1)
    with pytest.raises(SpoolError, match="closed"):
        spool.put_many(batch(0, 1))

    with Spool(path, 100) as again:
        assert again.count == 9
        assert again.size_bytes == 90
        assert again.dropped == 2
        assert [number(m) for m in again.peek(100)] == list(range(3, 12))
        again.ack([m.id for m in everything(again)])
        assert again.count == 0
    # Ids are never reused, also once every row was deleted.
    with Spool(path, 100) as third:
        third.put_many(batch(100, 1))
        (m,) = third.peek(1)
        assert m.id > last_id
        assert third.dropped == 2
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_committed_messages_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    script = textwrap.dedent(
        """
        import sys, time
        from edge_agent.service.uplink.spool import Spool
        spool = Spool(sys.argv[1], 10_000_000)
        for b in range(20):
            spool.put_many([("t/%d" % b, b"%d" % (b * 50 + i), 1, False) for i in range(50)])
        spool.peek(10)  # in-flight marks live in memory only
        print("ok", flush=True)
        time.sleep(600)
        """
    )
    with spawn([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE) as proc:
        assert read_line(proc.stdout, 30) == "ok\n"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    # Nothing was checkpointed: the messages are only in the WAL the killed process left.
    assert os.path.getsize(f"{path}-wal") > 0

    with Spool(path, 10_000_000) as spool:
        assert spool.count == 1000
        got = spool.peek(2000)
        assert [int(m.payload) for m in got] == list(range(1000))
        assert [m.topic for m in got[::50]] == [f"t/{b}" for b in range(20)]
        assert spool.size_bytes == sum(len(m.topic) + len(m.payload) for m in got)


def test_bound_drops_exactly_the_oldest_not_in_flight(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", 100) as spool:
        assert spool.put_many(batch(0, 10)) == 0  # exactly at the bound: all kept
        assert spool.size_bytes == 100
        ids = [m.id for m in everything(spool)]
        in_flight = spool.peek(3)
        assert [m.id for m in in_flight] == ids[:3]

        assert spool.put_many(batch(10, 2)) == 2
        assert spool.dropped == 2
        remaining = everything(spool)
        assert [number(m) for m in remaining] == [0, 1, 2, *range(5, 12)]
        assert [m.id for m in remaining][:8] == ids[:3] + ids[5:]
        assert (spool.count, spool.size_bytes) == (10, 100)

        # The marks were forgotten by everything(): the oldest go first again.
        assert spool.put_many(batch(12, 1)) == 1
        assert [number(m) for m in everything(spool)][:2] == [1, 2]
        assert spool.dropped == 3

        # Sizes differ: only as many as needed to fit go.
        assert spool.put_many([("t", b"y" * 29, 1, False)]) == 3  # 30 bytes: 1, 2, 5 go
        assert [number(m) for m in everything(spool)[:2]] == [6, 7]
        assert spool.dropped == 6
        assert spool.size_bytes == 100


def test_in_flight_messages_outlive_the_bound(tmp_path: Path) -> None:
    with Spool(tmp_path / "spool.db", 100) as spool:
        spool.put_many(batch(0, 10))
        window = spool.peek(10)  # everything in flight: the newest go instead
        assert spool.put_many(batch(10, 3)) == 3
        assert spool.dropped == 3
        assert (spool.count, spool.size_bytes) == (10, 100)
        assert spool.peek(10) == []
        spool.ack([m.id for m in window[:5]])
        assert spool.put_many(batch(13, 5)) == 0
        assert [number(m) for m in spool.peek(10)] == [13, 14, 15, 16, 17]
        assert [number(m) for m in everything(spool)] == [5, 6, 7, 8, 9, 13, 14, 15, 16, 17]


def test_a_message_bigger_than_the_bound_is_dropped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    with Spool(path, 100) as spool:
        assert spool.put_many([("t", b"a" * 99, 0, False), ("t", b"b" * 100, 0, False)]) == 1
        assert spool.dropped == 1
        assert spool.count == 1
        assert spool.peek(10)[0].payload == b"a" * 99
        assert spool.put_many([("t", b"c" * 1000, 0, False)]) == 1
        assert spool.count == 1
    with Spool(path, 100) as spool:
        assert spool.dropped == 2


def test_a_corrupt_file_is_refused_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    garbage = bytes(range(256)) * 16
    path.write_bytes(garbage)
    with pytest.raises(SpoolError, match=re.escape(str(path))):
        Spool(path, 100)
    assert path.read_bytes() == garbage  # never deleted or rewritten


@pytest.mark.parametrize("suffix", ["", "-wal", "-shm", ".lock"])
def test_a_link_a_fifo_or_a_folder_at_any_spool_file_is_refused_naming_it(
    tmp_path: Path, suffix: str
) -> None:
    """Each of the spool's files goes through ``core.files.open_private``: never followed,
    never blocked on, and the SpoolError names the file and why."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    cases = {
        "link": (lambda p: p.symlink_to(victim), re.escape("is a symlink: refused (give the real path)")),
        "fifo": (os.mkfifo, "not a regular file"),
        "dir": (lambda p: p.mkdir(), "not a regular file|Is a directory"),
    }
    for kind, (plant, why) in cases.items():
        path = tmp_path / f"{kind}.sqlite"
        planted = Path(f"{path}{suffix}")
        if suffix in ("-wal", "-shm"):  # checked only when SQLite left one there
            Spool(path, 1000).close()
            planted.unlink(missing_ok=True)
        plant(planted)
        with pytest.raises(SpoolError) as raised:
            Spool(path, 1000)
        assert str(planted) in str(raised.value) and re.search(why, str(raised.value)), raised.value
    assert victim.read_bytes() == b"keep"


def test_a_database_that_is_not_a_spool_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE frames (n INTEGER)")
    with pytest.raises(SpoolError, match=rf"{re.escape(str(other))}.*not a spool.*frames"):
        Spool(other, 100)

    wrong = tmp_path / "wrong.db"
    with sqlite3.connect(wrong) as db:
        db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, body BLOB)")
        db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER)")
    with pytest.raises(SpoolError, match=rf"{re.escape(str(wrong))}.*wrong schema.*messages"):
        Spool(wrong, 100)
    for path, tables in ((other, ["frames"]), (wrong, ["messages", "meta"])):  # left as they were
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone() == ("delete",)
            names = db.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            assert [name for (name,) in names] == tables


def test_concurrent_put_and_peek_ack_lose_nothing(tmp_path: Path) -> None:
    batches, per_batch = 300, 7
    total = batches * per_batch
    spool = Spool(tmp_path / "spool.db", 10_000_000)
    errors: list[BaseException] = []
    got: list[Message] = []

    def produce() -> None:
        try:
            for b in range(batches):
                spool.put_many(batch(b * per_batch, per_batch))
        except BaseException as e:
            errors.append(e)

    def consume() -> None:
        # Keep a window in flight, acking the previous one after asking for the next.
        try:
            deadline = time.monotonic() + 60
            held: list[Message] = []
            while len(got) < total and time.monotonic() < deadline and not errors:
                window = spool.peek(5)
                got.extend(window)
                spool.ack([m.id for m in held])
                held = window
            spool.ack([m.id for m in held])
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=produce), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert not any(t.is_alive() for t in threads)
    assert not errors
    assert [number(m) for m in got] == list(range(total))
    assert len({m.id for m in got}) == total
    assert [m.id for m in got] == sorted(m.id for m in got)
    assert (spool.count, spool.size_bytes, spool.dropped) == (0, 0, 0)
    spool.close()


def test_a_second_process_cannot_open_a_spool_in_use(tmp_path):
    """Two uplinks on one spool would send the same messages twice: the second is refused
    while the first holds it, and opens it once the first has closed it."""
    path = tmp_path / "spool.sqlite"
    first = Spool(str(path), 1024)
    with pytest.raises(SpoolError, match="in use by another process"):
        Spool(str(path), 1024)
    first.close()
    Spool(str(path), 1024).close()


def test_undeliverable_messages_count_as_dropped_and_a_rewind_hands_out_the_unsent_again(tmp_path):
    path = tmp_path / "spool.sqlite"
    with Spool(str(path), 10_000) as spool:
        spool.put_many([("t", bytes([i]), 1, False) for i in range(5)])
        first = spool.peek(5)
        spool.rewind(first[1].id)  # only two were published
        assert [m.id for m in spool.peek(5)] == [m.id for m in first[2:]]
        spool.ack([first[0].id], dropped=True)  # refused by the broker
        spool.ack([first[1].id])
        assert spool.dropped == 1 and spool.count == 3
    with Spool(str(path), 10_000) as again:
        assert again.dropped == 1
