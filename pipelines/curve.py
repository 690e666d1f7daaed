"""CURVE clients allowed on the result stream: a folder of public keys, read key by key (a
bad file is named and skipped), swapped in atomically, refusals logged with a bound: once a
minute per key and at most ``REFUSED_LOG_MAX`` warnings a minute in all. Also the reading
of every key file (the server's secret one included): bounded, never blocking, each key
checked before libzmq sees it."""

from __future__ import annotations

import logging
import os
import re
import struct
import time

import zmq
from zmq.utils import z85
from zmq.utils.z85 import Z85CHARS

from edge_agent.core.files import FileRefused, read_regular
from edge_agent.core.text import printable

log = logging.getLogger(__name__)

REFUSED_LOG_INTERVAL_S = 60.0  # one warning per refused client key in this long
# A client with a fresh key at every attempt gets past the per-key limit: all keys together
# get at most this many warnings an interval; the rest are counted in the next one.
REFUSED_LOG_MAX = 10
REFUSED_KEYS_TRACKED = 1024  # keys remembered for the per-key limit (the oldest forgotten)
MAX_KEY_FILE_BYTES = 64 * 1024  # a public certificate is ~300 bytes
MAX_CLIENT_KEY_FILES = 10_000  # files read from the allowed-clients folder, at most
# Entries of that folder looked at, at most: listing a folder of millions of names would
# take the reload's time and memory before any cap applied.
MAX_FOLDER_ENTRIES = 100_000
_KEY_LINE = re.compile(rb"(public|secret)-key(?![-\w])")
_SHOWN_MAX = 512  # characters of a path in a message (a name from the folder is anyone's)


class KeyFileError(ValueError):
    """A CURVE key file that cannot be used: the message names the file, and the line."""


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
    (a symlink to one included) of at most ``MAX_KEY_FILE_BYTES`` are read, the first
    ``MAX_CLIENT_KEY_FILES`` by name among the first ``MAX_FOLDER_ENTRIES`` entries."""
    try:
        names, found, looked = _key_names(folder)
    except OSError as e:
        return frozenset(), f"cannot read the allowed-clients folder {_shown(folder)}: {e.strerror or e}"
    if looked > MAX_FOLDER_ENTRIES:
        log.warning(
            "CURVE: more than %d entries in %s: only the first %d (in the folder's order) were looked at",
            MAX_FOLDER_ENTRIES,
            _shown(folder),
            MAX_FOLDER_ENTRIES,
        )
    if found > MAX_CLIENT_KEY_FILES:
        log.warning(
            "CURVE: %d .key files in %s: only the first %d (by name) are read",
            found,
            _shown(folder),
            MAX_CLIENT_KEY_FILES,
        )
    keys = set()
    # A bad file is skipped rather than failing the whole read: refusing the reload would
    # keep the old list, and with it a client whose key was just removed.
    for name in names:
        path = os.path.join(folder, name)
        try:
            public, secret = parse_certificate(read_key_file(path), path)
        except KeyFileError as e:
            log.warning("CURVE: skipped allowed-client file %s", e)
            continue
        if secret is not None:
            log.warning(
                "CURVE: allowed-client file %s holds a secret key; only the public .key belongs there",
                _shown(path),
            )
        keys.add(public)
    return frozenset(keys), ""


def _key_names(folder: str) -> tuple[list[str], int, int]:
    """(the first ``MAX_CLIENT_KEY_FILES`` names of ``*.key`` files by name, how many there
    were, how many entries were looked at): at most ``MAX_FOLDER_ENTRIES`` + 1 entries are
    read and twice the cap of names held, however large the folder."""
    names: list[str] = []
    found = looked = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            looked += 1
            if looked > MAX_FOLDER_ENTRIES:
                break
            if entry.name.endswith(".key") and not entry.name.startswith("."):
                found += 1
                names.append(entry.name)
                if len(names) >= 2 * MAX_CLIENT_KEY_FILES:
                    names = sorted(names)[:MAX_CLIENT_KEY_FILES]
    return sorted(names)[:MAX_CLIENT_KEY_FILES], found, looked


def read_server_key(path: str) -> tuple[bytes, bytes]:
    """The server's (public, secret) key pair, z85, from its ``.key_secret`` file: read as
    ``read_key_file`` reads, each key checked, and the public key the one of the secret.
    Raises KeyFileError naming the file (and the line): libzmq given a malformed key fails
    with a bare "Invalid argument", after the socket exists."""
    public, secret = parse_certificate(read_key_file(path), path)
    if secret is None:
        raise KeyFileError(f"{_shown(path)} holds no secret key (use the .key_secret file)")
    try:
        derived = zmq.curve_public(secret)
    except (zmq.ZMQError, NotImplementedError):  # a libzmq without CURVE: the bind says so
        return public, secret
    if derived != public:
        raise KeyFileError(f"{_shown(path)}: its public-key does not match its secret-key (another pair's?)")
    return public, secret


def read_key_file(path: str) -> bytes:
    """The file's bytes, if it is a regular file of at most ``MAX_KEY_FILE_BYTES``
    (``core.files.read_regular``: a FIFO or device is never opened); raises KeyFileError
    naming it otherwise."""
    try:
        return read_regular(path, MAX_KEY_FILE_BYTES)
    except FileRefused as e:
        raise KeyFileError(f"{_shown(path)}: {e}") from None


def parse_certificate(data: bytes, path: str = "the key file") -> tuple[bytes, bytes | None]:
    """(public key, secret key or None), each 40 Z85 characters, from a certificate's bytes
    already read with a bound: ZeroMQ's zcert text as pyzmq and czmq write it, the
    ``public-key = "..."`` and ``secret-key = "..."`` lines read as pyzmq's
    ``load_certificate`` reads them (any section, quotes optional, ``#`` comments); other
    lines (the metadata) are ignored. Raises KeyFileError naming ``path`` and the line: a
    key line without ``=``, a key given twice, a key that is not 40 Z85 characters."""
    where = _shown(path)
    found: dict[bytes, tuple[bytes, int]] = {}
    for number, raw in enumerate(data.splitlines(), 1):
        line = raw.strip()
        named = _KEY_LINE.match(line)
        if named is None:  # a comment, a section, metadata
            continue
        name = named.group(0)
        what = name.decode()
        rest = line[named.end() :].lstrip()
        if not rest.startswith(b"="):
            raise KeyFileError(f"{where}, line {number}: {what} without '= its key'")
        if name in found:
            raise KeyFileError(
                f"{where}, line {number}: a second {what} (the first on line {found[name][1]})"
            )
        key = rest[1:].strip(b" \t'\"")
        if not _z85_key(key):
            raise KeyFileError(
                f"{where}, line {number}: its {what} is not a 40-character Z85 key "
                f"({len(key)} characters; truncated or mangled?)"
            )
        found[name] = (key, number)
    if b"public-key" not in found:
        raise KeyFileError(f"{where}: no public-key line (not a ZeroMQ certificate)")
    secret = found.get(b"secret-key")
    return found[b"public-key"][0], None if secret is None else secret[0]


def _z85_key(key: bytes) -> bool:
    if len(key) != 40 or any(c not in Z85CHARS for c in key):
        return False
    try:
        z85.decode(key)  # a group above 2**32 does not decode
    except (ValueError, struct.error):
        return False
    return True


def _shown(path: str) -> str:
    # A name in the folder is anyone's who can write there: no raw control characters into
    # the log (a newline would forge a line), and no unbounded length.
    return printable(path, _SHOWN_MAX)
