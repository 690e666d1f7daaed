"""A real MQTT broker for the uplink's tests: Debian's Mosquitto on a free loopback port
(``.ci/run`` installs it when missing), and a real paho subscriber that records."""

from __future__ import annotations

import getpass
import itertools
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from conftest import end_process, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


def mosquitto_binary() -> str:
    found = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else ""
    )
    if not found:
        raise AssertionError("the uplink's tests need Mosquitto (apt-get install mosquitto; .ci/run does)")
    return found


class Mosquitto:
    """One broker process on ``port``, stopped and started again on the same port and with
    the same persistence file (sessions and queued messages survive, as on a real broker)."""

    def __init__(self, folder: Path, extra: str = "") -> None:
        """``extra``: more mosquitto.conf lines (an ACL, a password file)."""
        self.folder = folder
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"mqtt://127.0.0.1:{self.port}"
        self.conf = folder / "mosquitto.conf"
        self.conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            f"{extra or 'allow_anonymous true'}\n"
            "persistence true\n"
            f"persistence_location {folder}/\n"
            f"user {getpass.getuser()}\n"
            "log_dest stderr\n"
        )
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [mosquitto_binary(), "-c", str(self.conf)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.folder / "mosquitto.log", "ab"),  # noqa: SIM115 - closed with the process
            start_new_session=True,
        )
        wait_until(self._listening, 15, message=f"mosquitto listening on port {self.port}")

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"mosquitto exited: {(self.folder / 'mosquitto.log').read_text()[-2000:]}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc)  # SIGTERM: it writes its persistence file
            self.proc = None

    def __enter__(self) -> Mosquitto:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Recorder:
    """A paho subscriber (its own persistent session: messages queued for it while it is
    away are delivered when it is back) that records (topic, payload, retained)."""

    def __init__(
        self,
        broker: Mosquitto,
        *topics: str,
        client_id: str = "",
        username: str = "",
        password: str = "",
        ca_file: str = "",
    ) -> None:
        self.topics = topics
        self.messages: list[tuple[str, bytes, bool]] = []
        self.lock = threading.Lock()
        self.subscribed = threading.Event()
        self.client = mqtt.Client(
            callback_api_version=CallbackAPIVersion.VERSION2,
            client_id=client_id or f"recorder-{os.getpid()}-{id(self)}",
            protocol=mqtt.MQTTv5,
        )
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.reconnect_delay_set(1, 2)
        if username:
            self.client.username_pw_set(username, password)
        if ca_file:
            self.client.tls_set(ca_certs=ca_file)
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
        self.client.connect_async("127.0.0.1", broker.port, keepalive=5, clean_start=False, properties=props)
        self.client.loop_start()
        wait_until(self.subscribed.is_set, 15, message="the recorder subscribed")

    def _on_connect(self, client: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        if not reason.is_failure:  # subscribed again at each connection (the broker may be new)
            client.subscribe([(t, 1) for t in self.topics])
            self.subscribed.set()

    def _on_message(self, _c: Any, _u: Any, msg: Any) -> None:
        with self.lock:
            self.messages.append((msg.topic, bytes(msg.payload), bool(msg.retain)))

    def bodies(self, suffix: str = "") -> list[dict[str, Any]]:
        with self.lock:
            items = list(self.messages)
        return [json.loads(p) for t, p, _ in items if t.endswith(suffix) and p.startswith(b"{")]

    def payloads(self, topic: str) -> list[bytes]:
        with self.lock:
            return [p for t, p, _ in self.messages if t == topic]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def seqs_in_order(bodies: list[dict[str, Any]]) -> list[int]:
    """The seqs as first seen (a QoS 1 redelivery after a reconnect repeats one: at least once)."""
    seen: set[int] = set()
    out = []
    for b in bodies:
        if b["seq"] not in seen:
            seen.add(b["seq"])
            out.append(b["seq"])
    return out


def gaps(seqs: list[int]) -> int:
    """Messages missing between the first and the last seq."""
    return sum(b - a - 1 for a, b in itertools.pairwise(seqs) if b > a + 1)


def settle(condition: Any, timeout_s: float, message: str) -> Any:
    return wait_until(condition, timeout_s, interval_s=0.05, message=message)


def monotonic_s() -> float:
    return time.monotonic()


def make_tls(folder: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (openssl): (ca, cert, key)."""
    ca_key, ca, key, csr, cert = (
        folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.crt")
    )
    ext = folder / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    for cmd in (
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=edge-agent test CA",
            "-keyout",
            ca_key,
            "-out",
            ca,
        ],
        ["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", csr],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            cert,
        ],
    ):
        subprocess.run(["openssl", *map(str, cmd)], check=True, capture_output=True)
    return ca, cert, key
