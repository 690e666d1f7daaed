"""The agent's whole configuration, ``AgentConfig``: one frozen dataclass per section, with
defaults, validated once at load; its hash across a fleet, its printed form, and loading it.

Every section can be omitted; ``AgentConfig()`` is the embedded default (synthetic camera,
bundled detector, ONNX Runtime on the CPU). Each section's dataclasses live in a module of
their topic (``model_config``, ``source_config``, ``publish_config``, ``deadline_config``,
``power_config``, ``endpoint_config``, ``resilience_config``, ``uplink_config``). Sources and
backends are told apart by their ``type`` key. Config objects do no I/O: files named here
are opened by the components.
"""

from __future__ import annotations

import hashlib
import json
import socket
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core import configload
from edge_agent.core.configfields import check
from edge_agent.core.deadline_config import BatchingConfig, DeadlineConfig
from edge_agent.core.endpoint_config import MetricsConfig, ViewConfig
from edge_agent.core.model_config import AutoBackendConfig, BackendConfig, ModelConfig
from edge_agent.core.names import MAX_NAME, level_problem
from edge_agent.core.power_config import PowerConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.reloads import AT_START, ELSEWHERE, LOCAL, MODELS, drop_local, reloads
from edge_agent.core.resilience_config import FaultsConfig, ResilienceConfig, ServiceConfig
from edge_agent.core.source_config import (
    ImageFolderSourceConfig,
    SourceConfig,
    SyntheticSourceConfig,
    VideoSourceConfig,
)
from edge_agent.core.uplink_config import UplinkConfig


@dataclass(frozen=True)
class AgentConfig:
    device_id: str = field(default_factory=socket.gethostname, metadata=LOCAL)
    source: SourceConfig = field(default_factory=SyntheticSourceConfig)
    # Several cameras on one accelerator: give ``sources`` instead of ``source``.
    sources: tuple[SourceConfig, ...] = field(default=(), metadata={"unordered": True})
    model: ModelConfig = field(default_factory=ModelConfig, metadata=reloads(MODELS))
    backend: BackendConfig = field(default_factory=AutoBackendConfig, metadata=reloads(MODELS))
    publish: PublishConfig = field(default_factory=PublishConfig)
    deadline: DeadlineConfig = field(default_factory=DeadlineConfig)
    power: PowerConfig = field(default_factory=PowerConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    service: ServiceConfig = field(default_factory=ServiceConfig)
    faults: FaultsConfig = field(default_factory=FaultsConfig)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    # a person watching one device is no drift: the view is local
    view: ViewConfig = field(default_factory=ViewConfig, metadata=reloads(AT_START) | LOCAL)
    uplink: UplinkConfig = field(default_factory=UplinkConfig, metadata=reloads(ELSEWHERE))
    log_level: Literal["debug", "info", "warning", "error"] = "info"

    def __post_init__(self) -> None:
        # The id names the device on the stream and in MQTT topics and client ids.
        # No control character: U+0000 makes the broker drop the uplink's connection, silently.
        check(
            level_problem(self.device_id) is None,
            "device_id",
            f"must be non-empty, at most {MAX_NAME} characters, without '/', '+', '#', spaces or "
            "control characters (an MQTT topic level)",
        )
        check(
            not self.sources or self.source == SyntheticSourceConfig(),
            "source",
            "give either source (one camera) or sources (several), not both",
        )
        names = [s.name for s in self.sources]
        dup = sorted({n for n in names if names.count(n) > 1})
        check(not dup, "sources", f"source names must be unique (they are topics): {', '.join(dup)}")

    def source_list(self) -> tuple[SourceConfig, ...]:
        """Every source, in config order (``source`` alone when ``sources`` is empty)."""
        return self.sources or (self.source,)

    def subscribers_to_wait_for(self) -> int:
        """``publish.wait_for_subscribers``, its null resolved: 1 when a source is a file
        read frame by frame (a video not paced in real time, an image folder), else 0."""
        if self.publish.wait_for_subscribers is not None:
            return self.publish.wait_for_subscribers
        files = (ImageFolderSourceConfig, VideoSourceConfig)
        sources = self.source_list()
        return int(any(isinstance(s, files) and not getattr(s, "realtime", False) for s in sources))


def config_hash(cfg: AgentConfig) -> str:
    """A short hash of the effective config without the fields marked LOCAL (who the
    device is, where this instance binds and keeps its state: the same across a fleet, and
    different between several agents on one host), so devices that run the same config
    show the same hash (and drift across a fleet shows)."""
    plain = drop_local(cfg, configload.to_plain(cfg))
    text = json.dumps(plain, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def printed(cfg: AgentConfig, home: bool = False) -> dict:
    """The config as ``config show``, ``render`` and ``diff`` print it: ``to_plain`` (``home``:
    ``~`` expanded), with every backend type in one shape, ``type`` and then each backend's
    settings under its name (``backend.onnxruntime.allow_spinning`` whether the type is
    ``auto`` or ``onnxruntime``), so two configs compare key by key, and a printed ``auto``
    loads as one of its types once ``type`` is changed and the other section dropped. The
    flat form (``{type: onnxruntime, providers: ...}``) loads too."""
    plain = configload.to_plain(cfg, home)
    backend = plain["backend"]
    if backend["type"] == "auto":
        sections = {k: v for k, v in backend.items() if k != "type"}
    else:
        sections = {backend["type"]: backend}
    plain["backend"] = {"type": backend["type"]}
    for name, section in sections.items():
        plain["backend"][name] = {k: v for k, v in section.items() if k != "type"}
    return plain


def load_config(path: str | None) -> AgentConfig:
    """The config of file ``path`` as written (relative paths resolved against its folder),
    or the embedded default when ``path`` is None. The command line loads configs through
    ``fleet.load_effective``, which adds environment overrides and file checks.

    Raises ``ConfigError`` naming file, line and key path of every problem.
    """
    if path is None:
        return AgentConfig()
    return configload.load_file(AgentConfig, path)
