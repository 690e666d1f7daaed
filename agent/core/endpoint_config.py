"""The agent's HTTP endpoints: the Prometheus ``metrics`` and the live ``view`` in a
browser, both on loopback unless told otherwise."""

from __future__ import annotations

from dataclasses import dataclass, field

from edge_agent.core.configfields import check
from edge_agent.core.reloads import LOCAL


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint. Loopback by default: metrics are not for the open network."""

    enabled: bool = True
    host: str = field(default="127.0.0.1", metadata=LOCAL)
    port: int = field(default=9108, metadata=LOCAL)  # 0: any free port (logged)

    def __post_init__(self) -> None:
        check(0 <= self.port <= 65535, "port", "must be within 0..65535")


@dataclass(frozen=True)
class ViewConfig:
    """The live view in a browser (`edge-agent run --view`). Loopback by default, like the
    metrics; a ``token`` is then asked for in every URL (``?token=...``) when set. It answers
    only requests whose Host is a loopback name, ``host`` or one of ``allowed_hosts`` (a web
    page on another site cannot read it through DNS rebinding)."""

    enabled: bool = False
    host: str = "127.0.0.1"  # an address or name to bind ("::1" too); "": all interfaces
    port: int = 8090  # 0: any free port (logged)
    fps: float = 5.0  # annotated frames a second per source, at most
    quality: int = 70  # JPEG quality
    max_width: int = 960  # wider frames are scaled down (aspect kept)
    token: str = ""
    allowed_hosts: tuple[str, ...] = ()  # more names/addresses browsers may use to reach the view

    @staticmethod
    def host_ok(host: str) -> bool:
        """An IP address, or a DNS name (letters, digits, '-', '_', dot-separated labels)."""
        import ipaddress
        import re

        try:
            ipaddress.ip_address(host)
            return True
        except ValueError:
            pass
        label = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
        return len(host) <= 253 and re.fullmatch(rf"{label}(?:\.{label})*\.?", host) is not None

    def __post_init__(self) -> None:
        check(self.host == "" or self.host_ok(self.host), "host", "must be an IP address or a host name")
        check(
            all(self.host_ok(h) for h in self.allowed_hosts),
            "allowed_hosts",
            "each must be an IP address or a host name (no port, no brackets)",
        )
        check(0 <= self.port <= 65535, "port", "must be within 0..65535")
        check(0.1 <= self.fps <= 30, "fps", "must be within 0.1..30")
        check(10 <= self.quality <= 100, "quality", "must be within 10..100")
        check(64 <= self.max_width <= 7680, "max_width", "must be within 64..7680")
        check(all(c.isalnum() or c in "-_" for c in self.token), "token", "letters, digits, '-' and '_' only")
