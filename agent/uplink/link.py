"""The MQTT side of the uplink: one paho-mqtt client (MQTT 5, QoS 1) that sends the spool
in order, and the device's retained ``status`` with its Last Will.

Messages go from the spool to the broker through a small window: at most ``WINDOW`` are
handed to paho at a time, and a message leaves the spool only when the broker has
acknowledged it (PUBACK). paho itself resends the window after a reconnect, in order; a
restart of the process resends what the spool still holds. Delivery is at least once: a
message whose PUBACK was lost with the connection can arrive twice, never zero times.

``status`` is ``online`` (retained) once connected, ``offline`` (retained) at a clean stop,
and the Last Will ``offline`` (retained) when the connection dies without one (a kill, a
power cut, a cable pulled), which the broker sends after 1.5 keep-alives.
"""

from __future__ import annotations

import collections
import logging
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from edge_agent.core.uplink_config import UplinkConfig
from edge_agent.uplink.spool import Spool

log = logging.getLogger(__name__)

WINDOW = 32  # messages handed to paho and not yet acknowledged
_RECONNECT_S = (1, 10)  # paho's backoff between connection attempts: from 1 s, doubling to 10 s


class LinkError(RuntimeError):
    """The broker settings cannot work (TLS files, password file): fix the config."""


@dataclass
class LinkCounters:
    sent: int = 0  # acknowledged by the broker
    rejected: int = 0  # refused by the broker (a PUBACK with an error reason): not retried
    connects: int = 0
    connect_failures: int = 0


def topic_root(cfg: UplinkConfig, device_id: str) -> str:
    return f"{cfg.prefix}/{device_id}"


def make_client(cfg: UplinkConfig, client_id: str, will_topic: str = "") -> mqtt.Client:
    """A paho client for the broker (MQTT 5, TLS and credentials as configured, the Last
    Will ``offline`` on ``will_topic`` if given). Raises LinkError when TLS or password
    files are bad."""
    client = mqtt.Client(
        callback_api_version=CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
    )
    _, _, tls = cfg.address()
    if tls:
        try:
            client.tls_set(
                ca_certs=cfg.ca_file or None,
                certfile=cfg.cert_file or None,
                keyfile=cfg.key_file or None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        except (OSError, ssl.SSLError) as e:
            files = ", ".join(f for f in (cfg.ca_file, cfg.cert_file, cfg.key_file) if f) or "system CAs"
            raise LinkError(f"uplink TLS: cannot use {files}: {e}") from e
    if cfg.username:
        password = None
        if cfg.password_file:
            try:
                with open(cfg.password_file, encoding="utf-8") as f:
                    password = f.read().strip("\r\n")
            except OSError as e:
                raise LinkError(f"uplink.password_file: cannot read {cfg.password_file}: {e}") from e
        client.username_pw_set(cfg.username, password)
    if will_topic:
        client.will_set(will_topic, "offline", qos=1, retain=True)
    client.reconnect_delay_set(*_RECONNECT_S)
    return client


class Link:
    """Owns the paho client and the sending thread (``uplink-send``)."""

    def __init__(self, cfg: UplinkConfig, device_id: str, spool: Spool) -> None:
        self.cfg = cfg
        self.spool = spool
        self.root = topic_root(cfg, device_id)
        self.client = make_client(cfg, device_id, f"{self.root}/status")  # client id = device id
        self.client.max_inflight_messages_set(WINDOW)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_connect_fail = self._on_connect_fail
        self.counters = LinkCounters()
        self.connected = threading.Event()
        self._acked: collections.deque[tuple[int, bool]] = collections.deque()  # (mid, ok) from paho
        self._window: dict[int, int] = {}  # paho mid -> spool id, the sending thread's own
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_fail_log = 0.0

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        host, port, _ = self.cfg.address()
        self.client.connect_async(host, port, keepalive=self.cfg.keepalive_s)
        try:  # the first attempt here, so a refused or unknown broker is reported plainly
            self.client.reconnect()
        except (OSError, ValueError) as e:
            self.counters.connect_failures += 1
            log.warning(
                "uplink: broker %s unreachable (%s); retrying with backoff, spooling meanwhile",
                self.cfg.broker,
                e,
            )
            self._last_fail_log = time.monotonic()
        self.client.loop_start()  # paho's network thread: reconnects with backoff
        self._thread = threading.Thread(target=self._send_loop, name="uplink-send", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Drain what the broker can take within ``timeout_s``, say ``offline``, disconnect."""
        deadline = time.monotonic() + timeout_s
        while self.connected.is_set() and (self.spool.count or self._window) and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        if self.connected.is_set():
            info = self.client.publish(f"{self.root}/status", "offline", qos=1, retain=True)
            info.wait_for_publish(max(0.1, deadline - time.monotonic()))
        self.client.disconnect()
        self.client.loop_stop()
        return self._thread is None or not self._thread.is_alive()

    # -- what the receiving side calls ----------------------------------------------

    def wake(self) -> None:
        """New messages are in the spool."""
        self._wake.set()

    def publish_now(self, subtopic: str, payload: bytes, retain: bool = False) -> bool:
        """Send outside the spool (the latest health: only the newest is worth sending);
        False when not connected (the message is not kept)."""
        if not self.connected.is_set():
            return False
        return self.client.publish(f"{self.root}/{subtopic}", payload, qos=1, retain=retain).rc == 0

    # -- paho's callbacks (its network thread) --------------------------------------

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if reason.is_failure:
            self.counters.connect_failures += 1
            log.error("uplink: broker %s refused the connection: %s", self.cfg.broker, reason)
            return
        self.counters.connects += 1
        client.publish(f"{self.root}/status", "online", qos=1, retain=True)
        self.connected.set()
        self._wake.set()
        log.info("uplink: connected to %s (spool: %d messages)", self.cfg.broker, self.spool.count)

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if self.connected.is_set() and not self._stop.is_set():
            log.warning("uplink: lost the broker (%s); spooling until it is back", reason)
        self.connected.clear()

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        self.counters.connect_failures += 1
        now = time.monotonic()
        if now - self._last_fail_log >= 60:  # once a minute while it lasts, not every retry
            self._last_fail_log = now
            log.warning(
                "uplink: broker %s still unreachable; spool: %d messages", self.cfg.broker, self.spool.count
            )

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, reason: Any, _props: Any) -> None:
        # Only a note for the sending thread: paho may call this while holding its own
        # lock, so nothing here may wait for a lock the sending thread holds over publish.
        self._acked.append((mid, not reason.is_failure))
        self._wake.set()

    # -- the sending thread ---------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            try:
                self._settle()
                if self.connected.is_set():
                    self._fill()
            except Exception:  # a spool or client error: logged, retried, never silent
                log.exception("uplink: sending failed")
                self._stop.wait(1.0)

    def _settle(self) -> None:
        """Remove what the broker acknowledged from the spool."""
        done = []
        while self._acked:
            mid, ok = self._acked.popleft()
            spool_id = self._window.pop(mid, None)
            if spool_id is None:
                continue  # a status or health message, not from the spool
            done.append(spool_id)
            if ok:
                self.counters.sent += 1
            else:
                self.counters.rejected += 1
                log.warning("uplink: the broker refused a message (mid %d); it is not retried", mid)
        if done:
            self.spool.ack(done)

    def _fill(self) -> None:
        room = WINDOW - len(self._window)
        if room <= 0:
            return
        for m in self.spool.peek(room):
            info = self.client.publish(m.topic, m.payload, qos=m.qos, retain=m.retain)
            if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                raise RuntimeError(f"paho publish: {mqtt.error_string(info.rc)}")
            self._window[info.mid] = m.id  # NO_CONN: queued in paho, sent on reconnect
