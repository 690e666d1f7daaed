"""The power manager: profile in, telemetry out, and the device always put back.

``start`` (before the first frame): if a state file survived a crash, that state is
restored first; with ``manage`` on, the current state is saved (atomically) before
anything changes, then the profile is applied. ``close`` (normal exit, SIGTERM) restores
and deletes the state file; restoring twice is harmless. A telemetry thread samples
clocks, load, temperatures and rail power off the frame path and flags throttling: a
GPU clock below the locked value, or a zone past the thermal limit.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict
from typing import Any

from edge_agent.core.power_config import PowerConfig
from edge_agent.power import sysfs
from edge_agent.power.controller import PowerController, ReadOnlyController, make_controller
from edge_agent.power.state import clear_state, load_state, save_state

log = logging.getLogger(__name__)
TELEMETRY_JOIN_S = 1.0  # a stop waits this long for the telemetry thread (a sysfs read)

# A locked clock reads back a little lower on some boards: 5 % below is throttling.
_CLOCK_TOLERANCE = 0.95


def throttle_reasons(t: sysfs.Telemetry, cfg: PowerConfig, locked_hz: int = 0) -> list[str]:
    """Why the device is throttled now, from one telemetry sample (empty: it is not).

    ``locked_hz`` is the frequency actually locked (the nearest available one); without
    it the config's request stands in.
    """
    reasons = []
    lock = locked_hz or cfg.gpu_freq_mhz * 1e6
    if lock and t.gpu_freq_hz is not None and t.gpu_freq_hz < lock * _CLOCK_TOLERANCE:
        reasons.append(f"GPU at {t.gpu_freq_hz / 1e6:.0f} MHz, locked at {lock / 1e6:.0f}")
    hot = {zone: c for zone, c in t.temps_c.items() if c > cfg.thermal_limit_c}
    reasons += [f"{zone} at {c:.1f} °C > {cfg.thermal_limit_c:g} °C" for zone, c in hot.items()]
    return reasons


def recover(cfg: PowerConfig, controller: PowerController) -> list[str]:
    """Restore a state a previous run left behind (it crashed or was killed)."""
    state = load_state(cfg.state_file)
    if state is None:
        return []
    log.warning("power: %s holds a state that was never restored (crash?); restoring it", cfg.state_file)
    done = controller.restore(state)
    clear_state(cfg.state_file)
    return done


class PowerManager:
    def __init__(self, cfg: PowerConfig, controller: PowerController | None = None) -> None:
        self.cfg = cfg
        self.controller = controller or make_controller(cfg)
        self.latest: sysfs.Telemetry | None = None
        self.throttled: list[str] = []
        self.samples = 0
        self.throttle_samples = 0
        self.applied: list[str] = []
        self._saved = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._gpu = sysfs.find_gpu(cfg.root)

    def start(self) -> None:
        cfg = self.cfg
        if cfg.manage:
            recover(cfg, self.controller)
            if cfg.changes_anything() and isinstance(self.controller, ReadOnlyController):
                # Not a Jetson: nothing will change, so there is no state to keep (and its
                # folder, /var/lib/edge-agent by default, need not exist or be writable).
                self.applied = self.controller.apply(cfg)
                log.info("power: %s", "; ".join(self.applied))
            elif cfg.changes_anything():
                self.apply_profile()
                log.info("power: %s", "; ".join(self.applied) or "nothing to change")
        elif cfg.changes_anything():
            log.info("power: profile left to the privileged edge-agent-power unit (power.manage is false)")
        self.sample()
        self._thread = threading.Thread(target=self._run, name="power-telemetry", daemon=True)
        self._thread.start()

    def apply_profile(self) -> list[str]:
        """Save the device's state, then apply the profile. On any failure, a signal too,
        what changed is put back and the state forgotten; if that undo fails as well, the
        state file stays for ``recover`` (the first error is raised)."""
        save_state(self.cfg.state_file, self.controller.snapshot(self.cfg))
        self._saved = True
        try:
            self.applied = self.controller.apply(self.cfg)
        except BaseException as e:
            try:
                self.restore()
            except Exception as undo:  # keep the first error; the state file stays
                log.error(
                    "power: undoing the failed apply failed too: %s; state kept in %s",
                    undo,
                    self.cfg.state_file,
                )
            raise e
        return self.applied

    def _run(self) -> None:
        period = 1.0 / self.cfg.sample_hz
        while not self._stop.wait(period):
            try:
                self.sample()
            except Exception:  # telemetry must never take the agent down
                log.exception("power: telemetry sample failed")

    def sample(self) -> sysfs.Telemetry:
        t = sysfs.read_telemetry(self.cfg.root, self._gpu)
        reasons = throttle_reasons(t, self.cfg, self.controller.locked_gpu_hz)
        if reasons and not self.throttled:
            log.warning("power: throttling: %s", "; ".join(reasons))
        self.latest, self.throttled = t, reasons
        self.samples += 1
        self.throttle_samples += bool(reasons)
        return t

    def restore(self) -> list[str]:
        """Put the saved state back and forget it; a second call does nothing."""
        if not self._saved:
            return []
        state = load_state(self.cfg.state_file)
        if state is None:
            self._saved = False
            return []
        done = self.controller.restore(state)
        clear_state(self.cfg.state_file)
        self._saved = False
        log.info("power: restored (%s)", "; ".join(done) or "nothing changed")
        return done

    def stop(self, timeout_s: float = TELEMETRY_JOIN_S) -> bool:
        """The agent's lifecycle: the state put back, whatever the telemetry thread does;
        True if that thread ended within ``timeout_s``."""
        return self.close(timeout_s)

    def close(self, timeout_s: float = TELEMETRY_JOIN_S) -> bool:
        self._stop.set()
        ended = True
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout_s)
            ended = not thread.is_alive()
        try:
            self.restore()
        except Exception as e:  # never let a failed restore hide the rest of the shutdown
            log.error(
                "power: %s (the state stays in %s for `edge-agent power restore`)", e, self.cfg.state_file
            )
        return ended

    def snapshot(self) -> dict[str, Any]:
        """Telemetry and throttling for the health stream."""
        t = self.latest
        return {
            **self.controller.describe(),
            "telemetry": asdict(t) if t is not None else None,
            "throttled": bool(self.throttled),
            "throttle_reasons": list(self.throttled),
            "throttle_samples": self.throttle_samples,
            "samples": self.samples,
            "applied": list(self.applied),
        }
