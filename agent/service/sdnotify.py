"""systemd's notify protocol, spoken directly: one datagram per notification.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the
abstract namespace) and, with ``WatchdogSec=``, ``$WATCHDOG_USEC``. The agent says
READY=1 only once the model is loaded and warmed up, WATCHDOG=1 while the agent does
its job (a stage stuck in a backend or a driver stops it, and systemd restarts the
agent), STATUS= with the live figures, RELOADING=1 around a reload, and STOPPING=1 on
the way out. Outside
systemd every call is a cheap no-op. Written against sd_notify(3) and
sd_watchdog_enabled(3); JetPack 6's systemd 249 has no notify-reload/MONOTONIC_USEC.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(self, address: str | None, watchdog_usec: int | None = None) -> None:
        self.address = address
        self.watchdog_usec = watchdog_usec
        self._sock: socket.socket | None = None
        self.sent: list[str] = []  # the last messages, for status and tests
        if address:
            addr = "\0" + address[1:] if address.startswith("@") else address
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._addr = addr

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, pid: int | None = None) -> Notifier:
        env = os.environ if env is None else env
        usec = env.get("WATCHDOG_USEC")
        wd_pid = env.get("WATCHDOG_PID")
        # The watchdog is ours only if WATCHDOG_PID is unset or names this process.
        mine = not wd_pid or int(wd_pid) == (pid if pid is not None else os.getpid())
        return cls(env.get("NOTIFY_SOCKET") or None, int(usec) if usec and mine else None)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def watchdog_interval_s(self) -> float | None:
        """How often to ping: a third of the watchdog timeout. sd_watchdog_enabled(3) advises
        half; a third keeps every gap under half even when the main loop's 0.1 s turns are
        late on a loaded machine."""
        return self.watchdog_usec / 3e6 if self.watchdog_usec else None

    def notify(self, **fields: object) -> bool:
        """Send ``KEY=VALUE`` lines (e.g. ``notify(READY=1, STATUS="running")``)."""
        if self._sock is None:
            return False
        payload = "\n".join(f"{k}={str(v).replace(chr(10), ' ')}" for k, v in fields.items())
        try:
            self._sock.sendto(payload.encode(), self._addr)
        except OSError as e:  # systemd gone or the socket full: never fatal for the agent
            log.debug("sd_notify failed: %s", e)
            return False
        self.sent = [*self.sent[-31:], payload]
        return True

    def ready(self, status: str = "") -> bool:
        return self.notify(READY=1, **({"STATUS": status} if status else {}))

    def status(self, text: str) -> bool:
        return self.notify(STATUS=text)

    def watchdog(self) -> bool:
        return self.notify(WATCHDOG=1)

    def reloading(self) -> bool:
        return self.notify(RELOADING=1, STATUS="reloading the configuration")

    def stopping(self) -> bool:
        return self.notify(STOPPING=1, STATUS="stopping")

    def extend_timeout(self, seconds: float, status: str) -> bool:
        """Ask for more start/stop time (an engine build can outlast TimeoutStartSec)."""
        return self.notify(EXTEND_TIMEOUT_USEC=int(seconds * 1e6), STATUS=status)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
