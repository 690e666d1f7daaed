"""The ``publish`` section: the ZeroMQ result stream (where it binds, its topic and
encoding, CURVE keys, and how many subscribers the agent waits for before its first frame)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core.configfields import check, path_field
from edge_agent.core.names import NAME_RULE, name_ok
from edge_agent.core.reloads import LOCAL, REBIND, reloads


@dataclass(frozen=True)
class PublishConfig:
    endpoint: str = field(default="tcp://127.0.0.1:5556", metadata=reloads(REBIND) | LOCAL)
    topic: str = "det"  # messages go out as "<topic>.<source name>"
    # messages queued per subscriber before ZeroMQ drops for it
    send_hwm: int = field(default=100, metadata=reloads(REBIND))
    # connections to the stream at once; past it the newest is closed (docs/security.md)
    max_subscribers: int = field(default=32, metadata=reloads(REBIND))
    health_interval_s: float = 1.0  # heartbeat on topic "health"
    # msgpack (the msgpack extra) for bandwidth
    encoding: Literal["json", "msgpack"] = field(default="json", metadata=reloads(REBIND))
    # CURVE encryption and authentication: the server's secret certificate (written by
    # `edge-agent keys generate`) and a folder of the allowed clients' public ones.
    curve_server_key: str = path_field("file", reload=(REBIND,))
    curve_clients_dir: str = path_field("dir", reload=(REBIND,))
    # ZeroMQ drops what is published before a subscriber's subscription arrives. At start,
    # wait for this many subscriptions (up to subscriber_timeout_s) before the first frame
    # is read. null: 1 when a source is a file (every result counts), 0 for live cameras.
    wait_for_subscribers: int | None = None
    subscriber_timeout_s: float = 2.0

    def __post_init__(self) -> None:
        check(0.05 <= self.health_interval_s <= 1.0, "health_interval_s", "must be within 0.05..1.0")
        check(
            self.wait_for_subscribers is None or 0 <= self.wait_for_subscribers <= 1000,
            "wait_for_subscribers",
            "must be within 0..1000 (or null: 1 for file sources, 0 for cameras)",
        )
        check(0 <= self.subscriber_timeout_s <= 3600, "subscriber_timeout_s", "must be within 0..3600")
        check(
            bool(self.curve_server_key) == bool(self.curve_clients_dir),
            "curve_clients_dir" if self.curve_server_key else "curve_server_key",
            "CURVE needs both curve_server_key and curve_clients_dir",
        )
        check("://" in self.endpoint, "endpoint", "expected a ZeroMQ endpoint like tcp://host:port")
        check(name_ok(self.topic), "topic", NAME_RULE)
        # "event.<source>" carries a source's events and "health" the heartbeats on the same
        # socket: results under either would be read as the other by every subscriber
        check(
            self.topic not in ("event", "health"), "topic", "'event' and 'health' are the stream's own topics"
        )
        check(self.send_hwm >= 1, "send_hwm", "must be >= 1")
        check(1 <= self.max_subscribers <= 1000, "max_subscribers", "must be within 1..1000")
