"""The ``uplink`` section: what `edge-agent uplink` (a process of its own) carries from the
agent's result stream to an MQTT broker, and how it reaches the broker. The agent itself
ignores this section (a change to it reloads nothing in the agent)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from edge_agent.core.configfields import check, path_field
from edge_agent.core.reloads import LOCAL

#: What of the results goes up: every result, the results with detections, one summary per
#: source and interval (counts per label, fps, end-to-end p50/p99, misses, drops, zone and
#: line counts), or none. The zones' and lines' events are another key (``events``): they
#: are not results to thin out but records each of which counts, so every kind keeps them.
FORWARD_KINDS = ("all", "with_detections", "summary", "none")
_SCHEMES = {"mqtt": 1883, "mqtts": 8883}


@dataclass(frozen=True)
class UplinkMetricsConfig:
    """The uplink's own Prometheus endpoint (sent, spooled, dropped, reconnects, connected)."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9109  # 0: any free port (logged)

    def __post_init__(self) -> None:
        check(0 <= self.port <= 65535, "port", "must be within 0..65535")


@dataclass(frozen=True)
class UplinkConfig:
    # mqtt://host[:port] (1883), or mqtts://host[:port] (TLS, 8883)
    broker: str = "mqtt://127.0.0.1:1883"
    prefix: str = "edge-agent"  # topics: <prefix>/<device>/{det,summary,event}/<source>, health, status
    forward: Literal["all", "with_detections", "summary", "none"] = "summary"
    # Every event of the sources' zones and lines on event/<source>, whatever `forward`
    # is: through the spool, never rate-capped or summarised (about 280 B an event, 1.2 kB/s
    # on the synthetic camera's busy scene; nothing for a source without zones or lines:
    # docs/fleet.md).
    events: bool = True
    interval_s: float = 1.0  # one summary per source per interval
    max_rate_hz: float = 0.0  # at most this many results a second per topic (0: no cap; not events)
    health_interval_s: float = 5.0  # the device's retained health, at most this often
    keepalive_s: int = 10  # the broker declares the device offline (its Last Will) after 1.5x this
    # TLS (mqtts): the broker's CA (empty: the system's), and a client certificate if the
    # broker asks for one; or a user name with the password in a file (not in a fleet's YAML).
    ca_file: str = path_field("file")
    cert_file: str = path_field("file")
    key_file: str = path_field("file")
    username: str = ""
    password_file: str = path_field("file")
    # The stream uses CURVE (publish.curve_server_key): the uplink's own secret certificate,
    # whose public half is in publish.curve_clients_dir.
    curve_client_cert: str = path_field("file")
    # Store and forward: what the broker has not acknowledged, on disk, bounded; when full
    # the oldest are dropped and counted.
    spool_path: str = path_field("path", "/var/lib/edge-agent/uplink-spool.sqlite", local=True)
    spool_max_mib: float = 64.0
    metrics: UplinkMetricsConfig = field(default_factory=UplinkMetricsConfig, metadata=LOCAL)

    def __post_init__(self) -> None:
        url = urlsplit(self.broker)
        check(
            url.scheme in _SCHEMES and bool(url.hostname) and not url.path.strip("/"),
            "broker",
            f"expected mqtt://host[:port] or mqtts://host[:port], got {self.broker!r}",
        )
        try:
            url.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError as e:
            check(False, "broker", f"bad port in {self.broker!r}: {e}")
        check(bool(self.prefix) and not set(self.prefix) & set("#+"), "prefix", "no MQTT wildcards (# +)")
        check(0.1 <= self.interval_s <= 3600, "interval_s", "must be within 0.1..3600")
        check(self.max_rate_hz >= 0, "max_rate_hz", "must be >= 0 (0: no cap)")
        check(0.5 <= self.health_interval_s <= 3600, "health_interval_s", "must be within 0.5..3600")
        check(2 <= self.keepalive_s <= 3600, "keepalive_s", "must be within 2..3600")
        check(bool(self.cert_file) == bool(self.key_file), "key_file", "a client certificate needs both")
        check(
            not (self.ca_file or self.cert_file) or url.scheme == "mqtts",
            "broker",
            "TLS files are set: use mqtts://",
        )
        check(not self.password_file or bool(self.username), "username", "a password_file needs a username")
        check(0.01 <= self.spool_max_mib <= 100_000, "spool_max_mib", "must be within 0.01..100000")

    def address(self) -> tuple[str, int, bool]:
        """(host, port, tls) of the broker."""
        url = urlsplit(self.broker)
        return str(url.hostname), url.port or _SCHEMES[url.scheme], url.scheme == "mqtts"
