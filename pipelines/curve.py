"""CURVE clients allowed on the result stream: a folder of public keys, read key by key (a
bad file is named and skipped), swapped in atomically, refusals logged with a bound: once a
minute per key and at most ``REFUSED_LOG_MAX`` warnings a minute in all."""

from __future__ import annotations

import logging
import os
import stat
import time

from zmq.utils import z85
from zmq.utils.z85 import Z85CHARS

log = logging.getLogger(__name__)

REFUSED_LOG_INTERVAL_S = 60.0  # one warning per refused client key in this long
# A client with a fresh key at every attempt gets past the per-key limit: all keys together
# get at most this many warnings an interval; the rest are counted in the next one.
REFUSED_LOG_MAX = 10
REFUSED_KEYS_TRACKED = 1024  # keys remembered for the per-key limit (the oldest forgotten)
MAX_KEY_FILE_BYTES = 64 * 1024  # a public certificate is ~300 bytes
MAX_CLIENT_KEY_FILES = 10_000  # files read from the allowed-clients folder, at most


class AllowedClients:
    """The CURVE credentials provider: the allowed clients' public keys (z85), swapped
    whole by ``ZmqPublisher.refresh_clients``; the authenticator thread calls ``callback``
    at every handshake (no file is read there)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.allowed: frozenset[bytes] = frozenset()
        # key -> [last warning, refusals since]; insertion order is age, so the oldest entry
        # goes first when full: O(1) a refusal, however many keys an attacker makes.
        self._refused: dict[bytes, list[float]] = {}
        self._window_start = float("-inf")  # the global limit's current interval
        self._window_logged = 0  # warnings in it
        self._unlogged = 0  # refusals not logged because of the global limit
        self._unlogged_keys = 0  # of them, refusals of keys not seen before (fresh keys)
        self.refusals = 0  # all of them, for tests and diagnostics

    def callback(self, domain: str, key: bytes) -> bool:
        """``key``: the client's public key, z85-encoded bytes. True admits it."""
        if key in self.allowed:
            return True
        self._log_refused(key)
        return False

    def _log_refused(self, key: bytes) -> None:
        # A refused client reconnects every 100 ms: one warning per key a minute, not each.
        self.refusals += 1
        now = time.monotonic()
        seen = self._refused.get(key)
        if seen is not None and now - seen[0] < REFUSED_LOG_INTERVAL_S:
            seen[1] += 1
            return
        if now - self._window_start >= REFUSED_LOG_INTERVAL_S:
            self._window_start, self._window_logged = now, 0
        if self._window_logged >= REFUSED_LOG_MAX:
            self._unlogged += 1
            self._unlogged_keys += seen is None
            return
        self._window_logged += 1
        self._remember(key, now)
        # Logged in the authenticator thread; libzmq itself does not retry a refused
        # connection, so repeats come from a client that opens new ones.
        log.warning(
            "CURVE: refused client %s...: its key is not in the allowed folder %s%s%s",
            key[:8].decode("ascii", "replace"),
            self.folder,
            f" ({int(seen[1])} more refusal(s) of it not logged since)" if seen and seen[1] else "",
            self._take_unlogged(),
        )

    def _remember(self, key: bytes, now: float) -> None:
        self._refused.pop(key, None)  # re-inserted last: the newest
        while len(self._refused) >= REFUSED_KEYS_TRACKED:
            del self._refused[next(iter(self._refused))]
        self._refused[key] = [now, 0]

    def _take_unlogged(self) -> str:
        if not self._unlogged:
            return ""
        text = (
            f"; {self._unlogged} other refusal(s) ({self._unlogged_keys} of new keys) not logged "
            f"since: more than {REFUSED_LOG_MAX} warnings in {REFUSED_LOG_INTERVAL_S:.0f} s"
        )
        self._unlogged = self._unlogged_keys = 0
        return text


def read_client_keys(folder: str) -> tuple[frozenset[bytes], str]:
    """The public keys (z85) of the ``*.key`` files in ``folder`` (the files pyzmq's
    ``load_certificates`` reads), and what made the folder unreadable ("" if nothing). Each
    file is read on its own: a bad one is named in a warning and skipped; only regular files
    (a symlink to one included) of at most ``MAX_KEY_FILE_BYTES`` are read."""

    try:
        names = sorted(
            e.name for e in os.scandir(folder) if e.name.endswith(".key") and not e.name.startswith(".")
        )
    except OSError as e:
        return frozenset(), f"cannot read the allowed-clients folder {folder}: {e.strerror or e}"
    keys = set()
    # A bad file is skipped rather than failing the whole read: refusing the reload would
    # keep the old list, and with it a client whose key was just removed.
    if len(names) > MAX_CLIENT_KEY_FILES:
        log.warning(
            "CURVE: %d .key files in %s: only the first %d (by name) are read",
            len(names),
            folder,
            MAX_CLIENT_KEY_FILES,
        )
        names = names[:MAX_CLIENT_KEY_FILES]
    for name in names:
        path = os.path.join(folder, name)
        try:
            public, secret = _parse_certificate(_read_key_file(path))
        except (OSError, ValueError) as e:
            log.warning("CURVE: skipped allowed-client file %s: %s", path, e)
            continue
        except Exception as e:  # e.g. a "public-key" line cut off before its "="
            log.warning("CURVE: skipped allowed-client file %s: not a public certificate (%r)", path, e)
            continue
        key = bytes(public)
        if not _z85_key(key):
            log.warning(
                "CURVE: skipped allowed-client file %s: its public-key %r is not a 40-character "
                "Z85 key (truncated?)",
                path,
                key[:50],
            )
            continue
        if secret:
            log.warning(
                "CURVE: allowed-client file %s holds a secret key; only the public .key belongs there",
                path,
            )
        keys.add(key)
    return frozenset(keys), ""


def _z85_key(key: bytes) -> bool:
    if len(key) != 40 or any(c not in Z85CHARS for c in key):
        return False
    try:
        z85.decode(key)  # a group above 2**32 does not decode
    except Exception:
        return False
    return True


def _read_key_file(path: str) -> bytes:
    """The file's bytes, if it is a regular file of at most ``MAX_KEY_FILE_BYTES``. Opened
    non-blocking and checked on the open descriptor: a FIFO would hang the reload and a
    device such as /dev/zero would never end, and the check must hold for what is read,
    not for what was at the path a moment before."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file (a FIFO, device or folder is never read)")
        if st.st_size > MAX_KEY_FILE_BYTES:
            raise ValueError(f"{st.st_size} bytes, more than a certificate ({MAX_KEY_FILE_BYTES} at most)")
        data = os.read(fd, MAX_KEY_FILE_BYTES + 1)  # the size may have grown since fstat
    finally:
        os.close(fd)
    if len(data) > MAX_KEY_FILE_BYTES:
        raise ValueError(f"more than {MAX_KEY_FILE_BYTES} bytes, more than a certificate")
    return data


def _parse_certificate(data: bytes) -> tuple[bytes, bytes | None]:
    """(public key, secret key or None) as pyzmq's ``load_certificate`` reads a file, from
    bytes already read with a bound."""
    public = secret = None
    for raw in data.splitlines():
        line = raw.strip()
        if line.startswith(b"#"):
            continue
        if line.startswith(b"public-key"):
            public = line.split(b"=", 1)[1].strip(b" \t'\"")
        if line.startswith(b"secret-key"):
            secret = line.split(b"=", 1)[1].strip(b" \t'\"")
        if public and secret:
            break
    if public is None:
        raise ValueError("no public key found")
    return public, secret
