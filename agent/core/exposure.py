"""What a config serves to other hosts without protection: one loopback test for every
listener (the stream, the metrics, the live view), and the warnings ``config validate``
prints and the listeners log when they bind."""

from __future__ import annotations

import ipaddress

from edge_agent.core.config import AgentConfig


def on_loopback(address: str) -> bool:
    """Whether a host (``127.0.0.1``, ``localhost``) or a ZeroMQ endpoint (``tcp://[::1]:5556``,
    ``ipc://...``) is reachable from this machine only. ``*``, ``0.0.0.0``, ``""``, an
    interface or a host name are not."""
    if address.startswith(("ipc://", "inproc://")):
        return True
    host = address.split("://", 1)[1].rsplit(":", 1)[0] if "://" in address else address
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposure_warnings(cfg: AgentConfig) -> list[str]:
    """What the config serves to other hosts without protection, one line each, starting with
    the key path it is about. Warnings, not errors: on a closed network an operator may mean
    it. (The live view counts when ``view.enabled``, which ``run --view`` sets.)"""
    warnings = []
    publish, metrics, view = cfg.publish, cfg.metrics, cfg.view
    if not publish.curve_server_key and not on_loopback(publish.endpoint):
        warnings.append(
            f"publish.endpoint: {publish.endpoint} is not loopback and has no CURVE: anyone who reaches "
            "it reads the results (set publish.curve_server_key and curve_clients_dir)"
        )
    if metrics.enabled and not on_loopback(metrics.host):
        warnings.append(
            f"metrics.host: {metrics.host or '(all interfaces)'} is not loopback: anyone who reaches port "
            f"{metrics.port} reads the metrics, /metrics has no authentication (bind 127.0.0.1 with a "
            "scraper on the device, or firewall the port)"
        )
    if view.enabled and not view.token and not on_loopback(view.host):
        warnings.append(
            f"view.host: {view.host or '(all interfaces)'} is not loopback and view.token is not set: "
            f"anyone who reaches port {view.port} sees the cameras (set view.token, or bind 127.0.0.1)"
        )
    return warnings
