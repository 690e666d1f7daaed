"""The uplink's disk spool: a bounded FIFO of MQTT messages in SQLite.

While the broker is out of reach the receiving thread keeps appending what the agent
publishes (``put_many``, one transaction per batch) and the sending thread takes the
oldest messages out in windows (``peek``), deleting each once the broker acknowledged it
(``ack``). A restart, even after ``kill -9``, resumes from what was committed.

The bound is on the bytes of topics and payloads (``len(topic) + len(payload)`` per
message), not on the size of the file: SQLite's pages, the WAL file and free pages left by
deletes come on top. Over the bound the oldest messages that are not in flight are
deleted and counted in ``dropped``, which persists with the messages; below it nothing is
lost.

Durability: WAL journal mode with ``synchronous=NORMAL``. A committed transaction is in
the WAL before ``COMMIT`` returns, so it survives the process being killed at any moment,
which is what a restarting uplink needs. What it gives up is the last transactions on a
power cut or kernel crash (the WAL is not fsynced on every commit); the database stays
consistent, and fsyncing every batch would cost a flash write per message batch for a
stream that is best-effort telemetry anyway.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from edge_agent.core.files import UnsafePathError, open_dir, open_private

__all__ = ["Message", "Spool", "SpoolError"]

#: Stored in the meta table; a spool written by a different layout is refused, not guessed at.
SPOOL_VERSION = 1

_SCHEMA = (
    # AUTOINCREMENT: ids are never reused, also after the newest rows were deleted and the
    # spool reopened, so an id the sender holds can never name a different message.
    "CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL,"
    " payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL)",
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    f"INSERT INTO meta (key, value) VALUES ('version', {SPOOL_VERSION}), ('dropped', 0)",
)
_COLUMNS = {
    "messages": ["id", "topic", "payload", "qos", "retain"],
    "meta": ["key", "value"],
}
_SIZE = "length(topic) + length(payload)"
#: Ids per ``IN (...)`` list: below SQLite's oldest default limit of 999 host parameters.
_CHUNK = 500


def _private(path: str) -> int:
    """Open (create) ``path`` read-write as a regular file of mode 0600, not through a
    symlink (``core.files.open_private``); the descriptor. SpoolError names the file when
    that cannot be."""
    try:
        return open_private(path)
    except UnsafePathError as e:
        if e.errno == errno.ELOOP:
            raise SpoolError(f"spool file {path}: is a symlink: refused (give the real path)") from e
        raise SpoolError(f"spool file {path}: {e.reason}") from e
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise SpoolError(f"spool file {path}: cannot be written: {e.strerror}") from e
        raise


class SpoolError(Exception):
    """The spool's file cannot be used (not a spool, corrupt, unwritable) or the spool is
    closed. The message names the file."""


@dataclass(frozen=True, slots=True)
class Message:
    """One spooled message; ``id`` is what ``ack`` takes once the broker has it."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool


class Spool:
    """A bounded FIFO of MQTT messages in the SQLite file ``path`` (created with its parent
    directory when missing).

    Thread-safe: one connection under a lock, so the receiving thread can ``put_many``
    while the sending thread ``peek``s and ``ack``s.

    In flight: ``peek`` hands out the oldest messages after everything it handed out
    before and marks them in flight until they are acked or ``release()`` forgets the
    marks. In-flight messages are never dropped by the bound (the broker may already have
    them, and a message counted as dropped must never reach a subscriber), so while the
    sender holds a window the spool may stay above ``max_bytes`` by at most that window.

    The bound is applied by ``put_many``; opening a spool with a smaller ``max_bytes``
    than it was written with drops nothing until the next ``put_many``.
    """

    def __init__(self, path: str | os.PathLike[str], max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        self.path = os.fspath(path)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        # Every id up to this one was handed out by peek() and, unless acked since (then
        # deleted), is in flight. Ids only grow, so this one number is all the marks.
        self._handed_out = 0
        parent = os.path.dirname(os.path.abspath(self.path))
        self._db: sqlite3.Connection | None = None
        try:
            # Made 0700 with its parents whatever the umask, never through a symlink; refused
            # (UnsafePathError) when it, or a folder above, is one another user owns or can write to.
            open_dir(parent, 0o700, private=False).close()
            # One process per spool: a second uplink on the same file would hand out the
            # same messages (its in-flight marks are its own). The lock goes with the process.
            self._lockfile: int | None = _private(self.path + ".lock")
            fcntl.flock(self._lockfile, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._prepare_files()
        except BlockingIOError as e:
            self._unlock()
            raise SpoolError(f"spool {self.path}: in use by another process (another uplink?)") from e
        except SpoolError:
            self._unlock()
            raise
        except OSError as e:
            self._unlock()
            raise SpoolError(f"spool {self.path}: cannot open: {e}") from e
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self._count, self._size, self._dropped = self._open(self._db)
            self._check_writable(self._db)
        except BaseException as e:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._unlock()
            if isinstance(e, sqlite3.Error):
                raise SpoolError(f"spool {self.path}: cannot open: {e}") from e
            raise

    def _prepare_files(self) -> None:
        """The database and its WAL files: regular files of mode 0600 (messages and the
        broker's topics are nobody else's to read), never followed through a symlink (one
        planted there would have the uplink write wherever it points)."""
        os.close(_private(self.path))
        for suffix in ("-wal", "-shm"):
            name = self.path + suffix
            if os.path.lexists(name):  # SQLite creates them with the database's mode
                os.close(_private(name))

    def _check_writable(self, db: sqlite3.Connection) -> None:
        """A spool that opens but cannot be written (a read-only file system, an immutable
        file) is refused now, naming the file, rather than failing on every batch."""
        with self._transaction("a test write", db):
            db.execute("UPDATE meta SET value = value WHERE key = 'version'")

    def _unlock(self) -> None:
        lockfile, self._lockfile = getattr(self, "_lockfile", None), None
        if lockfile is not None:
            os.close(lockfile)  # closing the descriptor releases the lock

    # -- opening -------------------------------------------------------------------------

    def _open(self, db: sqlite3.Connection) -> tuple[int, int, int]:
        """Check the schema (or create it in an empty file), set the journal mode; the count,
        size and dropped count found. Anything wrong is a SpoolError naming the file."""
        try:
            # Checked before anything is written: a file that is not a spool stays as it was.
            tables = {
                name
                for (name,) in db.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                )
            }
            if tables:
                self._check_schema(db, tables)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            if not tables:
                with self._transaction("create", db):
                    for statement in _SCHEMA:
                        db.execute(statement)
            count, size = db.execute(f"SELECT COUNT(*), COALESCE(SUM({_SIZE}), 0) FROM messages").fetchone()
            (dropped,) = db.execute("SELECT value FROM meta WHERE key = 'dropped'").fetchone()
        except SpoolError:
            raise
        except sqlite3.Error as e:
            raise SpoolError(f"spool {self.path}: not a usable spool database: {e}") from e
        return count, size, dropped

    def _check_schema(self, db: sqlite3.Connection, tables: set[str]) -> None:
        missing = sorted(set(_COLUMNS) - tables)
        if missing:
            raise SpoolError(
                f"spool {self.path}: not a spool: an SQLite database without the table(s) "
                f"{', '.join(missing)} (it has {', '.join(sorted(tables))})"
            )
        for table, expected in _COLUMNS.items():
            columns = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
            if columns != expected:
                raise SpoolError(
                    f"spool {self.path}: wrong schema: table {table} has columns {columns}, "
                    f"a spool's has {expected}"
                )
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        if meta.get("version") != SPOOL_VERSION or not isinstance(meta.get("dropped"), int):
            raise SpoolError(
                f"spool {self.path}: wrong schema: meta holds {meta}, expected version "
                f"{SPOOL_VERSION} and a dropped count"
            )

    # -- transactions --------------------------------------------------------------------

    @contextmanager
    def _transaction(self, what: str, db: sqlite3.Connection | None = None) -> Iterator[sqlite3.Connection]:
        """BEGIN IMMEDIATE ... COMMIT, rolled back on any error; SQLite's errors come out as
        a SpoolError naming the file. The caller holds the lock."""
        if db is None:
            db = self._db
            if db is None:
                raise SpoolError(f"spool {self.path}: closed")
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException as e:
            if db.in_transaction:
                with suppress(sqlite3.Error):
                    db.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise SpoolError(f"spool {self.path}: {what} failed: {e}") from e
            raise

    # -- the FIFO ------------------------------------------------------------------------

    def put_many(self, items: Iterable[tuple[str, bytes, int, bool]]) -> int:
        """Append ``(topic, payload, qos, retain)`` messages in one transaction, then drop
        the oldest messages not in flight while the spool is over ``max_bytes``, counting
        them in the same transaction. A message bigger than ``max_bytes`` on its own is
        dropped (and counted) instead of stored. Returns how many this call dropped."""
        rows = []
        added = oversized = 0
        for topic, payload, qos, retain in items:
            size = len(topic) + len(payload)
            if size > self.max_bytes:
                oversized += 1
                continue
            rows.append((topic, payload, qos, 1 if retain else 0))
            added += size
        with self._lock:
            self._require_open()
            if not rows and not oversized and self._size <= self.max_bytes:
                return 0
            with self._transaction("put") as db:
                db.executemany("INSERT INTO messages (topic, payload, qos, retain) VALUES (?, ?, ?, ?)", rows)
                trimmed, freed = self._trim(db, self._size + added - self.max_bytes)
                dropped = trimmed + oversized
                if dropped:
                    db.execute("UPDATE meta SET value = value + ? WHERE key = 'dropped'", (dropped,))
            self._count += len(rows) - trimmed
            self._size += added - freed
            self._dropped += dropped
            return dropped

    def _trim(self, db: sqlite3.Connection, excess: int) -> tuple[int, int]:
        """Delete the oldest messages not in flight until ``excess`` bytes are freed (or none
        is left to delete); how many and how many bytes. Visits only the rows it deletes."""
        if excess <= 0:
            return 0, 0
        cursor = db.execute(f"SELECT id, {_SIZE} FROM messages WHERE id > ? ORDER BY id", (self._handed_out,))
        freed, last = 0, None
        for row_id, size in cursor:
            last = row_id
            freed += size
            if freed >= excess:
                break
        cursor.close()
        if last is None:
            return 0, 0
        deleted = db.execute(
            "DELETE FROM messages WHERE id > ? AND id <= ?", (self._handed_out, last)
        ).rowcount
        return deleted, freed

    def peek(self, limit: int) -> list[Message]:
        """Up to ``limit`` of the oldest messages after every one handed out before (and not
        yet released), marked in flight: the sender keeps a window of messages in flight
        and asks for more as acks come back."""
        with self._lock:
            db = self._require_open()
            if limit <= 0:
                return []
            try:
                rows = db.execute(
                    "SELECT id, topic, payload, qos, retain FROM messages WHERE id > ? ORDER BY id LIMIT ?",
                    (self._handed_out, limit),
                ).fetchall()
            except sqlite3.Error as e:
                raise SpoolError(f"spool {self.path}: peek failed: {e}") from e
            if rows:
                self._handed_out = rows[-1][0]
            return [Message(i, topic, payload, qos, bool(retain)) for i, topic, payload, qos, retain in rows]

    def release(self) -> None:
        """Forget the in-flight marks: after a reconnect the next ``peek`` starts again from
        the oldest message not acknowledged."""
        with self._lock:
            self._handed_out = 0

    def rewind(self, last_sent: int) -> None:
        """Only the messages up to id ``last_sent`` were sent of those ``peek`` handed out
        (a publish failed): the others are handed out again by the next ``peek``."""
        with self._lock:
            self._handed_out = min(self._handed_out, last_sent)

    def ack(self, ids: Iterable[int], dropped: bool = False) -> None:
        """Delete the messages the broker acknowledged, in one transaction; ids that are not
        in the spool (acked before, dropped, never existed) are ignored. ``dropped``: they
        were not delivered (the broker refused them, or they exceed its packet size), so
        they are counted with the dropped ones."""
        ids = list(ids)
        with self._lock:
            self._require_open()
            if not ids:
                return
            count = size = 0
            with self._transaction("ack") as db:
                for start in range(0, len(ids), _CHUNK):
                    chunk = ids[start : start + _CHUNK]
                    marks = ",".join("?" * len(chunk))
                    n, s = db.execute(
                        f"SELECT COUNT(*), COALESCE(SUM({_SIZE}), 0) FROM messages WHERE id IN ({marks})",
                        chunk,
                    ).fetchone()
                    if n:
                        db.execute(f"DELETE FROM messages WHERE id IN ({marks})", chunk)
                        count += n
                        size += s
                if dropped and count:
                    db.execute("UPDATE meta SET value = value + ? WHERE key = 'dropped'", (count,))
            self._count -= count
            self._size -= size
            if dropped:
                self._dropped += count

    # -- state ---------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """Messages in the spool, in flight included."""
        with self._lock:
            return self._count

    @property
    def size_bytes(self) -> int:
        """Sum of ``len(topic) + len(payload)`` over the messages in the spool."""
        with self._lock:
            return self._size

    @property
    def dropped(self) -> int:
        """Messages dropped (by the bound, or not deliverable) since the spool file was
        created (persistent)."""
        with self._lock:
            return self._dropped

    def close(self) -> None:
        """Close the database; harmless when already closed."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            self._unlock()

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require_open(self) -> sqlite3.Connection:
        if self._db is None:
            raise SpoolError(f"spool {self.path}: closed")
        return self._db
