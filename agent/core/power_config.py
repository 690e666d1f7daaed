"""The ``power`` section: the device state the agent runs in on a Jetson (power mode,
clocks, CPU governor, fan) and the telemetry that watches it."""

from __future__ import annotations

from dataclasses import dataclass

from edge_agent.core.configfields import check, path_field


@dataclass(frozen=True)
class PowerConfig:
    """The device state the agent runs in (Jetson), and the telemetry that watches it.

    With ``manage: false`` (default) the agent only reads: a privileged step (the
    edge-agent-power unit: ``edge-agent power apply`` / ``restore``, as root) applies the
    profile. With ``manage: true`` the agent applies it at start and restores it at exit
    itself, which needs root.
    """

    manage: bool = False
    nvpmodel: str = ""  # power mode by name (e.g. "15W") or id ("0"); empty: leave as is
    jetson_clocks: bool | None = None  # true: clocks to the mode's max; false: off; null: leave
    gpu_freq_mhz: float = 0.0  # lock the GPU (min = max) at the nearest available; 0: leave
    cpu_governor: str = ""  # e.g. performance; empty: leave
    cpu_max_freq_mhz: float = 0.0  # cap (nearest available); 0: leave
    fan_mode: str = ""  # jetson-stats fan profile (quiet, cool, manual); needs the jtop service
    fan_speed: int = -1  # 0..100 with fan_mode manual; -1: leave
    thermal_limit_c: float = 85.0  # a zone above this counts as throttling
    # kept until restored
    state_file: str = path_field("path", "/var/lib/edge-agent/power-state.json", local=True)
    sample_hz: float = 2.0  # telemetry rate, off the frame path
    root: str = path_field("dir", "/")  # filesystem root to read and write (a copied tree, for tests)

    def __post_init__(self) -> None:
        check(0 <= self.gpu_freq_mhz <= 10_000, "gpu_freq_mhz", "must be within 0..10000")
        check(0 <= self.cpu_max_freq_mhz <= 10_000, "cpu_max_freq_mhz", "must be within 0..10000")
        check(-1 <= self.fan_speed <= 100, "fan_speed", "must be within 0..100 (or -1: leave)")
        check(20 <= self.thermal_limit_c <= 120, "thermal_limit_c", "must be within 20..120")
        check(0.1 <= self.sample_hz <= 50, "sample_hz", "must be within 0.1..50")
        check(bool(self.state_file), "state_file", "a state file is required")
        check(
            not (self.jetson_clocks and self.gpu_freq_mhz),
            "gpu_freq_mhz",
            "jetson_clocks true already sets the GPU to its maximum: choose one",
        )

    def changes_anything(self) -> bool:
        return bool(
            self.nvpmodel
            or self.jetson_clocks is not None
            or self.gpu_freq_mhz
            or self.cpu_governor
            or self.cpu_max_freq_mhz
            or self.fan_mode
            or self.fan_speed >= 0
        )
