"""CURVE clients allowed on the result stream: a folder of public keys, read key by key (a
bad file is named and skipped), swapped in atomically, refusals logged once a minute."""

from __future__ import annotations

import logging
import os
import time

from zmq.utils import z85
from zmq.utils.z85 import Z85CHARS

log = logging.getLogger(__name__)

REFUSED_LOG_INTERVAL_S = 60.0  # one warning per refused client key in this long


class AllowedClients:
    """The CURVE credentials provider: the allowed clients' public keys (z85), swapped
    whole by ``ZmqPublisher.refresh_clients``; the authenticator thread calls ``callback``
    at every handshake (no file is read there)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.allowed: frozenset[bytes] = frozenset()
        self._refused: dict[bytes, list[float]] = {}  # key -> [last warning, refusals since]

    def callback(self, domain: str, key: bytes) -> bool:
        """``key``: the client's public key, z85-encoded bytes. True admits it."""
        if key in self.allowed:
            return True
        self._log_refused(key)
        return False

    def _log_refused(self, key: bytes) -> None:
        # A refused client reconnects every 100 ms: one warning per key a minute, not each.
        now = time.monotonic()
        seen = self._refused.get(key)
        if seen is not None and now - seen[0] < REFUSED_LOG_INTERVAL_S:
            seen[1] += 1
            return
        if len(self._refused) >= 1024:  # many keys: forget those quiet for a minute
            self._refused = {k: v for k, v in self._refused.items() if now - v[0] < REFUSED_LOG_INTERVAL_S}
        self._refused[key] = [now, 0]
        # Logged in the authenticator thread; libzmq itself does not retry a refused
        # connection, so repeats come from a client that opens new ones.
        log.warning(
            "CURVE: refused client %s...: its key is not in the allowed folder %s%s",
            key[:8].decode("ascii", "replace"),
            self.folder,
            f" ({int(seen[1])} more refusal(s) of it not logged since)" if seen and seen[1] else "",
        )


def read_client_keys(folder: str) -> tuple[frozenset[bytes], str]:
    """The public keys (z85) of the ``*.key`` files in ``folder`` (the files pyzmq's
    ``load_certificates`` reads), and what made the folder unreadable ("" if nothing). Each
    file is read on its own: a bad one is named in a warning and skipped."""
    import zmq.auth

    try:
        names = sorted(
            e.name for e in os.scandir(folder) if e.name.endswith(".key") and not e.name.startswith(".")
        )
    except OSError as e:
        return frozenset(), f"cannot read the allowed-clients folder {folder}: {e.strerror or e}"
    keys = set()
    # A bad file is skipped rather than failing the whole read: refusing the reload would
    # keep the old list, and with it a client whose key was just removed.
    for name in names:
        path = os.path.join(folder, name)
        try:
            public, secret = zmq.auth.load_certificate(path)
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
