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
import contextlib
import logging
import os
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from edge_agent.core.names import topic_chars_problem
from edge_agent.core.uplink_config import UplinkConfig
from edge_agent.service.uplink.spool import Spool

log = logging.getLogger(__name__)

WINDOW = 32  # messages handed to paho and not yet acknowledged
_RECONNECT_S = (1, 10)  # paho's backoff between connection attempts: from 1 s, doubling to 10 s


class LinkError(RuntimeError):
    """The broker settings cannot work (TLS files, password file): fix the config."""


@dataclass
class LinkCounters:
    sent: int = 0  # acknowledged by the broker
    rejected: int = 0  # refused by the broker for good, or over its packet size: dropped
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
        if not tls:
            log.warning(
                "uplink.username: the user name and password go to %s in clear text: use mqtts://",
                cfg.broker,
            )
        client.username_pw_set(cfg.username, _read_password(cfg.password_file) if cfg.password_file else None)
    if will_topic:
        client.will_set(will_topic, "offline", qos=1, retain=True)
    client.reconnect_delay_set(*_RECONNECT_S)
    return client


def _read_password(path: str) -> str:
    """The password in ``path``; a warning when others may read the file too."""
    try:
        with open(path, encoding="utf-8") as f:
            mode = os.fstat(f.fileno()).st_mode & 0o777
            if mode & 0o077:
                log.warning(
                    "uplink.password_file %s is readable by others (mode %s): chmod 600 it", path, oct(mode)
                )
            return f.read(65536).strip("\r\n")
    except (OSError, UnicodeDecodeError) as e:
        raise LinkError(f"uplink.password_file: cannot read {path}: {e}") from e


def topic_problem(topic: str) -> str | None:
    """Why no broker takes ``topic`` for a publish (None when one does): a spool written
    before messages were checked may hold such a message, and it must not block the rest."""
    problem = topic_chars_problem(topic)
    if problem is not None:
        return f"the topic {problem}"
    if len(topic.encode("utf-8", "surrogatepass")) > 65535:
        return "a topic over 65535 bytes"
    return None


# PUBACK reasons after which a message may go through later (the broker's quota, or its
# own trouble); any other failure means it never will (not authorized, bad topic, too big).
_TEMPORARY = {0x80, 0x83, 0x97}
_RETRY_S = 5.0  # after a temporary refusal: wait, then send from the oldest again
# paho's answers to a publish that mean this message can never be sent (any other error
# is the connection's, and the message is sent again later)
_NEVER = {MQTTErrorCode.MQTT_ERR_PAYLOAD_SIZE, MQTTErrorCode.MQTT_ERR_INVAL}


class Link:
    """Owns the paho client and the sending thread (``uplink-send``)."""

    def __init__(self, cfg: UplinkConfig, device_id: str, spool: Spool) -> None:
        self.cfg = cfg
        self.spool = spool
        self.root = topic_root(cfg, device_id)
        self.client = make_client(cfg, device_id, f"{self.root}/status")  # client id = device id
        self.client.max_inflight_messages_set(WINDOW + 1)  # paho's own cap; ours is _room
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_connect_fail = self._on_connect_fail
        self.counters = LinkCounters()
        self.connected = threading.Event()
        self.last_error = ""  # why the broker refused the connection or a message, for health
        self.progress = time.monotonic()  # the sending thread's last turn (for the watchdog)
        self._acked: collections.deque[tuple[int, int]] = collections.deque()  # (mid, reason) from paho
        # paho mid -> (spool id, connection it was first sent on): the sending thread's own
        self._window: dict[int, tuple[int, int]] = {}
        self._generation = 0  # connections so far; paho's thread bumps it
        self._room = WINDOW  # the broker's Receive Maximum may be lower
        self._max_packet = 0  # the broker's Maximum Packet Size (0: none given)
        self._retry_at = 0.0  # after a temporary refusal: send nothing new until then
        self._unsettled: list[tuple[list[int], bool]] = []  # acks the spool could not take yet
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_log: dict[str, float] = {}

    # -- lifecycle ------------------------------------------------------------------

    def start(self) -> None:
        host, port, _ = self.cfg.address()
        self.client.connect_async(host, port, keepalive=self.cfg.keepalive_s)
        try:  # the first attempt here, so a refused or unknown broker is reported plainly
            self.client.reconnect()
        except (OSError, ValueError) as e:
            self.counters.connect_failures += 1
            self.last_error = f"unreachable: {e}"
            self._log_every(
                "fail",
                logging.WARNING,
                "uplink: broker %s unreachable (%s); retrying with backoff, spooling meanwhile",
                self.cfg.broker,
                e,
            )
        self.client.loop_start()  # paho's network thread: reconnects with backoff
        self._thread = threading.Thread(target=self._send_loop, name="uplink-send", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> bool:
        """Drain what the broker can take within ``timeout_s``, say ``offline``, disconnect.
        Every step runs, whatever the one before did."""
        deadline = time.monotonic() + timeout_s
        while self.connected.is_set() and (self.spool.count or self._window) and time.monotonic() < deadline:
            self._wake.set()
            time.sleep(0.02)
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        try:
            if self.connected.is_set():
                info = self.client.publish(f"{self.root}/status", "offline", qos=1, retain=True)
                info.wait_for_publish(max(0.1, deadline - time.monotonic()))
        except (RuntimeError, ValueError) as e:  # the connection went in between
            log.warning("uplink: could not say offline at the stop (%s); the Last Will will", e)
        finally:
            self.client.disconnect()
            self.client.loop_stop()
        with contextlib.suppress(Exception):
            self._settle()  # acks that came after the sending thread ended
        return self._thread is None or not self._thread.is_alive()

    def alive(self) -> bool:
        """The sending thread and paho's network thread run (for the watchdog)."""
        paho = getattr(self.client, "_thread", None)  # paho keeps its loop thread here
        sending = self._thread is not None and self._thread.is_alive()
        return sending and paho is not None and paho.is_alive() and time.monotonic() - self.progress < 10

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

    def _on_connect(self, client: Any, _userdata: Any, _flags: Any, reason: Any, props: Any) -> None:
        if reason.is_failure:
            self.counters.connect_failures += 1
            self.last_error = f"connection refused: {reason}"
            self._log_every(
                "refused",
                logging.ERROR,
                "uplink: broker %s refused the connection: %s",
                self.cfg.broker,
                reason,
            )
            return
        # The broker's limits (MQTT 5 CONNACK), which paho itself does not apply: more in
        # flight than its Receive Maximum, or a bigger packet, and it disconnects us.
        receive_max = getattr(props, "ReceiveMaximum", 0) or WINDOW
        self._room = max(1, min(WINDOW, receive_max - 1))  # one left for status and health
        self._max_packet = getattr(props, "MaximumPacketSize", 0) or 0
        # paho resends the previous connection's window after this returns: nothing new
        # may go before it (the sending thread waits for those acks).
        self._generation += 1
        self.counters.connects += 1
        self.last_error = ""
        client.publish(f"{self.root}/status", "online", qos=1, retain=True)
        self.connected.set()
        self._wake.set()
        log.info("uplink: connected to %s (spool: %d messages)", self.cfg.broker, self.spool.count)

    def _on_disconnect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _props: Any) -> None:
        if self.connected.is_set() and not self._stop.is_set():
            if getattr(reason, "value", 0) == 0x8E:
                log.error(
                    "uplink: another client took over this device's session (two devices with the "
                    "same device_id?)"
                )
            log.warning("uplink: lost the broker (%s); spooling until it is back", reason)
        self.connected.clear()

    def _on_connect_fail(self, _client: Any, _userdata: Any) -> None:
        self.counters.connect_failures += 1
        self.last_error = "unreachable"
        self._log_every(
            "fail",
            logging.WARNING,
            "uplink: broker %s still unreachable; spool: %d messages",
            self.cfg.broker,
            self.spool.count,
        )

    def _on_publish(self, _client: Any, _userdata: Any, mid: int, reason: Any, _props: Any) -> None:
        # Only a note for the sending thread: paho calls this holding its own lock, so
        # nothing here may wait for a lock the sending thread holds over publish.
        self._acked.append((mid, int(getattr(reason, "value", 0))))
        self._wake.set()

    def _log_every(self, key: str, level: int, message: str, *args: Any) -> None:
        """Log once a minute while a condition lasts, not at every retry."""
        now = time.monotonic()
        if now - self._last_log.get(key, -1e9) >= 60:
            self._last_log[key] = now
            log.log(level, message, *args)

    # -- the sending thread ---------------------------------------------------------

    def _send_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(0.5)
            self._wake.clear()
            self.progress = time.monotonic()
            try:
                self._settle()
                if self.connected.is_set() and time.monotonic() >= self._retry_at:
                    self._fill()
            except Exception:  # a spool or client error: logged, retried, never silent
                log.exception("uplink: sending failed")
                self._stop.wait(1.0)

    def _settle(self) -> None:
        """Remove what the broker took (or refused for good) from the spool."""
        delivered, refused = [], []
        retry = False
        while self._acked:
            mid, reason = self._acked.popleft()
            entry = self._window.pop(mid, None)
            if entry is None:
                continue  # a status or health message, not from the spool
            if reason < 0x80:
                delivered.append(entry[0])
            elif reason in _TEMPORARY:
                retry = True  # stays in the spool, sent again from the oldest after a pause
                self.last_error = f"the broker refused a message for now (reason 0x{reason:02x})"
            else:
                refused.append(entry[0])
                self.last_error = f"the broker refused a message (reason 0x{reason:02x}); dropped"
                self._log_every("rejected", logging.WARNING, "uplink: %s", self.last_error)
        self.counters.sent += len(delivered)
        self._unsettled += [(ids, dropped) for ids, dropped in ((delivered, False), (refused, True)) if ids]
        while self._unsettled:  # a failed ack (a full disk) is tried again next turn
            ids, dropped = self._unsettled[0]
            self.spool.ack(ids, dropped=dropped)
            if dropped:  # counted once the spool counts them dropped: never ahead of it in a scrape
                self.counters.rejected += len(ids)
            self._unsettled.pop(0)
        if retry:
            self._retry_at = time.monotonic() + _RETRY_S
            self._log_every(
                "retry", logging.WARNING, "uplink: %s; resending in %g s", self.last_error, _RETRY_S
            )
        if self._retry_at and not self._window and time.monotonic() >= self._retry_at:
            self._retry_at = 0.0
            self.spool.release()  # the refused ones are handed out again, oldest first

    def _drop(self, spool_id: int, why: str) -> None:
        """A spooled message no broker will take: dropped and counted, never retried."""
        self.spool.ack([spool_id], dropped=True)
        self.counters.rejected += 1
        self.last_error = f"a message dropped: {why}"
        self._log_every("unsendable", logging.WARNING, "uplink: %s (logged once a minute)", self.last_error)

    def _fill(self) -> None:
        if self._retry_at or any(gen != self._generation for _, gen in self._window.values()):
            return  # a pause after a refusal, or paho still resends an earlier connection's window
        room = self._room - len(self._window)
        if room <= 0:
            return
        sent = None
        batch = self.spool.peek(room)
        try:
            for m in batch:
                if self._max_packet and len(m.topic) + len(m.payload) + 16 > self._max_packet:
                    # the broker would disconnect us for it
                    self._drop(m.id, f"over the broker's maximum packet size ({self._max_packet} B)")
                    sent = m.id
                    continue
                problem = topic_problem(m.topic)
                if problem is not None:  # the broker would disconnect us for it, paho may raise
                    self._drop(m.id, problem)
                    sent = m.id
                    continue
                try:
                    info = self.client.publish(m.topic, m.payload, qos=m.qos, retain=m.retain)
                except ValueError as e:  # what paho refuses to send, ever (a topic it rejects)
                    self._drop(m.id, f"paho refuses it: {e}")
                    sent = m.id
                    continue
                if info.rc in _NEVER:
                    self._drop(m.id, f"paho refuses it: {mqtt.error_string(info.rc)}")
                    sent = m.id
                    continue
                if info.rc not in (MQTTErrorCode.MQTT_ERR_SUCCESS, MQTTErrorCode.MQTT_ERR_NO_CONN):
                    raise RuntimeError(f"paho publish: {mqtt.error_string(info.rc)}")
                self._window[info.mid] = (m.id, self._generation)  # NO_CONN: paho sends it on reconnect
                sent = m.id
        finally:
            if batch and sent != batch[-1].id:  # the rest were not sent: hand them out again
                self.spool.rewind(sent if sent is not None else batch[0].id - 1)
