"""The device state before the agent changed it, kept in a file until it is restored.

The file is written atomically before the first change and removed only after a
successful restore, so a crash or SIGKILL in between leaves it for the next start (or
``edge-agent power restore``) to put the device back.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from edge_agent.core.files import atomic_write


@dataclass
class PowerState:
    """What was there before; None or empty for what was not read or will not change."""

    nvpmodel_id: int | None = None
    jetson_clocks_store: str = ""  # file written by `jetson_clocks --store`, for --restore
    gpu: dict[str, str] = field(default_factory=dict)  # devfreq file name -> value
    cpus: dict[str, dict[str, str]] = field(default_factory=dict)  # cpuN -> cpufreq file -> value
    # What was set through the jetson-stats service: jetson_clocks, the fan's profile and speed.
    jtop: dict[str, object] = field(default_factory=dict)
    backend: str = ""


def save_state(path: str | os.PathLike, state: PowerState) -> None:
    """Raises OSError naming the file (a full disk, a read-only or missing folder): the
    profile is then not applied, since it could not be put back after a crash."""
    try:
        atomic_write(path, json.dumps(asdict(state), indent=2).encode())
    except OSError as e:
        raise OSError(
            e.errno,
            f"cannot save the power state to {path} ({e.strerror or e}); the power profile "
            "was not applied (power.state_file must be on a writable disk with free space)",
        ) from None


def load_state(path: str | os.PathLike) -> PowerState | None:
    """The saved state, or None if there is none. A corrupt file raises ValueError."""
    p = Path(path)
    if not p.exists():
        return None
    try:
        data = json.loads(p.read_text())
        if isinstance(data, dict) and "fan" in data:  # written before 0.1.0's rename
            data["jtop"] = data.pop("fan")
        return PowerState(**data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{p}: unreadable power state file ({e}); inspect it, then delete it") from None


def clear_state(path: str | os.PathLike) -> None:
    Path(path).unlink(missing_ok=True)
