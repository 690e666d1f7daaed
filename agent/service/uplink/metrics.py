"""The uplink's own Prometheus metrics, on the same bounded endpoint as the agent's."""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

_COUNTERS = {
    "received": "Messages read from the agent's stream",
    "spooled": "Messages written to the spool (what the forwarding policy sends)",
    "sent": "Messages the broker acknowledged",
    "rejected": "Messages dropped as unsendable: refused by the broker, or not what the stream schema allows",
    "dropped": "Messages dropped from a full spool, oldest first (kept across restarts)",
    "rate_limited": "Messages not sent because of uplink.max_rate_hz",
    "stream_gaps": "Results the agent's socket dropped before the uplink read them (seq gaps)",
    "events": "Zone and line events read from the agent's stream (valid ones)",
    "event_gaps": "Events the agent's socket dropped before the uplink read them (seq gaps in a run)",
    "lost": "Messages read from the stream but not spooled (the spool failed, e.g. a full disk)",
    "reconnects": "Connections to the broker after the first",
    "connect_failures": "Failed attempts to connect to the broker",
}
_GAUGES = {
    "spool_messages": "Messages in the spool, not yet acknowledged by the broker",
    "spool_bytes": "Size of the spooled messages (topics and payloads)",
    "connected": "Connected to the broker (1) or not (0)",
}


class UplinkCollector:
    def __init__(self, uplink: Any) -> None:
        self.uplink = uplink

    def collect(self):
        c = self.uplink.counters()
        for name, text in _COUNTERS.items():
            yield CounterMetricFamily(f"edge_agent_uplink_{name}", text, value=float(c[name]))
        for name, text in _GAUGES.items():
            yield GaugeMetricFamily(f"edge_agent_uplink_{name}", text, value=float(c[name]))
