"""Power controllers: snapshot / apply / restore, behind one interface.

- ``SysfsController``: the nvpmodel and jetson_clocks commands plus devfreq/cpufreq
  files, as root. Every file it will write is checked first, so a read-only or missing
  file is reported before anything changes.
- ``JtopController``: the same, with nvpmodel, jetson_clocks and the fan through the
  jetson-stats service where it answers (it runs as root, so the agent need not).
- ``ReadOnlyController``: not a Jetson (or nothing to write): reports, changes nothing.

Changes go in a fixed order (power mode, jetson_clocks, GPU, CPU, fan: the mode sets the
caps the others live within) and are undone in reverse. Commands run with a timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from edge_agent.core.power_config import PowerConfig
from edge_agent.power import sysfs
from edge_agent.power.state import PowerState

log = logging.getLogger(__name__)

Runner = Callable[[list[str]], tuple[int, str]]
_GPU_FILES = ("governor", "min_freq", "max_freq")
_CPU_FILES = ("scaling_governor", "scaling_min_freq", "scaling_max_freq")


class PowerError(RuntimeError):
    """A change could not be made; the message names the file or command and why."""


def run_command(argv: list[str], timeout_s: float = 20.0) -> tuple[int, str]:
    """Run a tool (nvpmodel, jetson_clocks) with a timeout; (exit code, stdout+stderr)."""
    try:
        p = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL, check=False
        )
    except FileNotFoundError:
        return 127, f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]}: no answer in {timeout_s:.0f} s"
    return p.returncode, (p.stdout + p.stderr).strip()


class PowerController(ABC):
    name = "controller"

    def __init__(self, root: str = "/") -> None:
        self.root = root
        self.info = sysfs.detect(root)
        # The GPU frequency the last apply locked (0: none), for the throttling check.
        self.locked_gpu_hz = 0

    @abstractmethod
    def snapshot(self, cfg: PowerConfig) -> PowerState:
        """The current state of everything ``cfg`` would change."""

    @abstractmethod
    def apply(self, cfg: PowerConfig) -> list[str]:
        """Make the changes; returns what was done. Raises PowerError, having changed nothing
        when a target is not writable."""

    @abstractmethod
    def restore(self, state: PowerState) -> list[str]:
        """Put ``state`` back; harmless to repeat. Raises PowerError listing what failed."""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "jetson": self.info.is_jetson, "module": self.info.module}


class ReadOnlyController(PowerController):
    name = "read-only"

    def snapshot(self, cfg: PowerConfig) -> PowerState:
        return PowerState(backend=self.name)

    def apply(self, cfg: PowerConfig) -> list[str]:
        if not cfg.changes_anything():
            return []
        why = "not a Jetson" if not self.info.is_jetson else "read-only backend"
        return [f"{why}: the power profile was not applied, nothing changed"]

    def restore(self, state: PowerState) -> list[str]:
        return []


def _read(path: Path) -> str:
    return path.read_text().strip()


class SysfsController(PowerController):
    name = "sysfs"
    restores_service_state = False  # fan and jetson_clocks set through jetson-stats

    def __init__(self, root: str = "/", runner: Runner = run_command, store_dir: str = "") -> None:
        super().__init__(root)
        self.run = runner
        self.gpu = sysfs.find_gpu(root)
        self.cpus = sysfs.cpu_dirs(root)
        self.store_dir = store_dir

    # -- reading --------------------------------------------------------------------

    def nvpmodel_modes(self) -> dict[int, str]:
        conf = Path(self.root, "etc/nvpmodel.conf")
        return sysfs.parse_nvpmodel_conf(conf.read_text()) if conf.exists() else {}

    def nvpmodel_id(self, wanted: str) -> int:
        modes = self.nvpmodel_modes()
        if wanted.isdigit():
            mode = int(wanted)
            if modes and mode not in modes:
                raise PowerError(f"nvpmodel mode {mode} is not in /etc/nvpmodel.conf (modes: {modes})")
            return mode
        for mode, name in modes.items():
            if name.lower() == wanted.lower():
                return mode
        raise PowerError(f"nvpmodel mode {wanted!r} is not in /etc/nvpmodel.conf (modes: {modes})")

    def current_nvpmodel(self) -> int | None:
        code, out = self.run(["nvpmodel", "-q"])
        if code != 0:
            return None
        try:
            return sysfs.parse_nvpmodel_query(out)[1]
        except ValueError:
            return None

    def snapshot(self, cfg: PowerConfig) -> PowerState:
        state = PowerState(backend=self.name)
        if cfg.nvpmodel:
            state.nvpmodel_id = self.current_nvpmodel()
        if cfg.jetson_clocks is True:
            store_dir = Path(self.store_dir or Path(cfg.state_file).parent)
            store_dir.mkdir(parents=True, exist_ok=True)
            store = store_dir / "l4t_dfs.conf"
            # The real tool asks before overwriting a store file and, with no answer,
            # fails: a leftover from an earlier run is removed first.
            store.unlink(missing_ok=True)
            code, out = self.run(["jetson_clocks", "--store", str(store)])
            if code != 0:
                raise PowerError(f"jetson_clocks --store {store} failed: {out}")
            state.jetson_clocks_store = str(store)
        if (cfg.gpu_freq_mhz or cfg.jetson_clocks is not None) and self.gpu is not None:
            state.gpu = {
                f: _read(self.gpu.devfreq / f) for f in _GPU_FILES if (self.gpu.devfreq / f).is_file()
            }
        if cfg.cpu_governor or cfg.cpu_max_freq_mhz:
            for d in self.cpus:
                state.cpus[d.parent.name] = {f: _read(d / f) for f in _CPU_FILES if (d / f).is_file()}
        return state

    # -- writing --------------------------------------------------------------------

    def _targets(self, cfg: PowerConfig) -> list[Path]:
        """Every file ``cfg`` will write, to be checked before anything changes."""
        files: list[Path] = []
        if cfg.gpu_freq_mhz:
            if self.gpu is None:
                raise PowerError("no GPU devfreq node found (sys/class/devfreq/*/device/of_node/name)")
            files += [self.gpu.devfreq / "min_freq", self.gpu.devfreq / "max_freq"]
        for d in self.cpus:
            if cfg.cpu_governor:
                files.append(d / "scaling_governor")
            if cfg.cpu_max_freq_mhz:
                files += [d / "scaling_min_freq", d / "scaling_max_freq"]
        return files

    def _file_writes(self, cfg: PowerConfig) -> tuple[list[tuple[Path, str]], list[str]]:
        """The writes, ordered against the files' values *now* (after nvpmodel and
        jetson_clocks changed them), so min never exceeds max on the way."""
        writes: list[tuple[Path, str]] = []
        notes: list[str] = []
        self.locked_gpu_hz = 0
        if cfg.gpu_freq_mhz and self.gpu is not None:
            avail = sysfs.parse_frequencies(_read(self.gpu.devfreq / "available_frequencies"))
            target = sysfs.nearest_frequency(avail, round(cfg.gpu_freq_mhz * 1e6))
            self.locked_gpu_hz = target
            notes.append(f"GPU locked at {target / 1e6:.2f} MHz (asked {cfg.gpu_freq_mhz:g} MHz)")
            writes += _range_writes(self.gpu.devfreq, "min_freq", "max_freq", target, target)
        for d in self.cpus:
            if cfg.cpu_governor:
                writes.append((d / "scaling_governor", cfg.cpu_governor))
            if cfg.cpu_max_freq_mhz:
                avail_file = d / "scaling_available_frequencies"
                avail = sysfs.parse_frequencies(_read(avail_file)) if avail_file.is_file() else []
                want = round(cfg.cpu_max_freq_mhz * 1000)
                top = sysfs.nearest_frequency(avail, want) if avail else want
                low = min(int(_read(d / "scaling_min_freq")), top)
                writes += _range_writes(d, "scaling_min_freq", "scaling_max_freq", low, top)
        if cfg.cpu_governor or cfg.cpu_max_freq_mhz:
            gov, top_mhz = cfg.cpu_governor or "unchanged", cfg.cpu_max_freq_mhz or "unchanged"
            notes.append(f"CPU governor {gov}, max {top_mhz} MHz")
        return writes, notes

    def _tools(self, cfg: PowerConfig, mode: int | None) -> list[str]:
        return (["nvpmodel"] if mode is not None else []) + (["jetson_clocks"] if cfg.jetson_clocks else [])

    def apply(self, cfg: PowerConfig) -> list[str]:
        mode = self.nvpmodel_id(cfg.nvpmodel) if cfg.nvpmodel else None
        if cfg.jetson_clocks is False:
            raise PowerError(
                "jetson_clocks: false needs the jetson-stats service (the jetson_clocks command "
                "can only restore a state it stored earlier); leave it null, or install jetson-stats"
            )
        blocked = [
            f"{p} ({'missing' if not p.exists() else 'not writable'})"
            for p in self._targets(cfg)
            if not _writable(p)
        ]
        missing = [t for t in self._tools(cfg, mode) if shutil.which(t) is None]
        if blocked or missing:
            raise PowerError(
                "nothing was changed: "
                + "; ".join(
                    [*(f"cannot write {b}" for b in blocked), *(f"{t} not found on PATH" for t in missing)]
                )
                + " (power changes need root: run `edge-agent power apply` from the edge-agent-power unit)"
            )
        done: list[str] = []
        if mode is not None:
            self._set_nvpmodel(mode)
            done.append(f"nvpmodel mode {mode} ({self.nvpmodel_modes().get(mode, '?')})")
        done += self._jetson_clocks(cfg)
        writes, notes = self._file_writes(cfg)
        for path, value in writes:
            _write(path, value)
        return done + notes + self._fan(cfg)

    def _set_nvpmodel(self, mode: int) -> None:
        self._command(["nvpmodel", "-m", str(mode)])

    def _jetson_clocks(self, cfg: PowerConfig) -> list[str]:
        if cfg.jetson_clocks is True:
            self._command(["jetson_clocks"])
            return ["jetson_clocks on"]
        return []

    def _fan(self, cfg: PowerConfig) -> list[str]:
        if cfg.fan_mode or cfg.fan_speed >= 0:
            return ["fan: not set (fan control needs the jetson-stats service)"]
        return []

    def _command(self, argv: list[str]) -> None:
        code, out = self.run(argv)
        if code != 0:
            raise PowerError(f"`{' '.join(argv)}` failed ({code}): {out}")

    def _restore_steps(self, state: PowerState) -> list[tuple[str, Callable[[], None]]]:
        """Reverse layers: the power mode first (it resets the clocks to its own defaults),
        then jetson_clocks' stored clocks, then the exact files as they were."""
        steps: list[tuple[str, Callable[[], None]]] = []
        if state.nvpmodel_id is not None and self.current_nvpmodel() != state.nvpmodel_id:
            steps.append(("nvpmodel", lambda: self._set_nvpmodel(int(state.nvpmodel_id))))
        if state.jetson_clocks_store:
            store = Path(state.jetson_clocks_store)

            def restore_clocks() -> None:
                if store.exists():
                    self._command(["jetson_clocks", "--restore", str(store)])
                    store.unlink()

            steps.append(("jetson_clocks", restore_clocks))
        if state.gpu and self.gpu is not None:
            steps.append(
                ("GPU devfreq", lambda: _restore_files(self.gpu.devfreq, state.gpu, "min_freq", "max_freq"))
            )
        for cpu, files in state.cpus.items():
            d = Path(self.root, "sys/devices/system/cpu", cpu, "cpufreq")
            steps.append(
                (
                    f"{cpu} cpufreq",
                    lambda d=d, f=files: _restore_files(d, f, "scaling_min_freq", "scaling_max_freq"),
                )
            )
        return steps

    def restore(self, state: PowerState) -> list[str]:
        done: list[str] = []
        errors: list[str] = []
        if state.jtop and not self.restores_service_state:
            log.warning(
                "power: fan/jetson_clocks were set through jetson-stats; its service must restore them"
            )
        for what, step in self._restore_steps(state):
            try:  # every step is tried: one failure must not keep the rest changed
                step()
                done.append(f"{what} restored")
            except Exception as e:  # OSError, PowerError, the service's own errors
                errors.append(f"{what}: {e}")
        if errors:
            raise PowerError("restore incomplete: " + "; ".join(errors))
        return done


def _writable(path: Path) -> bool:
    """Whether ``path`` can be opened for writing. Root passes every permission check on a
    plain file, but sysfs refuses the open of an attribute that has no write handler, so
    opening (without writing) is the test that holds on a device."""
    if not path.is_file():
        return False
    try:
        os.close(os.open(path, os.O_WRONLY))
    except OSError:
        return False
    return True


def _write(path: Path, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(f"{value}\n")
    except OSError as e:
        raise PowerError(f"cannot write {value!r} to {path}: {e.strerror}") from None


def _range_writes(d: Path, lo: str, hi: str, new_lo: int, new_hi: int) -> list[tuple[Path, str]]:
    """Writes that move [min, max] to [new_lo, new_hi] without ever having min > max
    (the kernel refuses such a write)."""
    cur_hi = int(_read(d / hi)) if (d / hi).is_file() else new_hi
    if new_lo > cur_hi:
        return [(d / hi, str(new_hi)), (d / lo, str(new_lo))]
    return [(d / lo, str(new_lo)), (d / hi, str(new_hi))]


def _restore_files(d: Path, files: dict[str, str], lo: str, hi: str) -> None:
    if lo in files and hi in files:
        for path, value in _range_writes(d, lo, hi, int(files[lo]), int(files[hi])):
            _write(path, value)
    for name, value in files.items():
        if name not in (lo, hi):
            _write(d / name, value)


class JtopController(SysfsController):
    """nvpmodel, jetson_clocks and the fan through the jetson-stats service (jtop 4.x).

    The service runs as root, so these need no privileges of ours; the GPU lock and the
    CPU settings still go through sysfs. jtop errors become PowerError.
    """

    name = "jtop"
    restores_service_state = True
    MODE_SWITCH_TIMEOUT_S = 30.0

    def __init__(self, root: str = "/", runner: Runner = run_command, jtop: Any = None) -> None:
        super().__init__(root, runner)
        self._jtop = jtop

    @contextlib.contextmanager
    def _session(self):
        try:
            with self._jtop() as j:
                yield j
        except PowerError:
            raise
        except Exception as e:  # JtopException and the service's other failures
            raise PowerError(f"jetson-stats: {e}") from None

    def current_nvpmodel(self) -> int | None:
        with self._session() as j:
            return None if j.nvpmodel is None else int(j.nvpmodel.id)

    def _tools(self, cfg: PowerConfig, mode: int | None) -> list[str]:
        return []  # the service runs the tools

    def _set_nvpmodel(self, mode: int) -> None:
        # The switch is asynchronous (jtop turns jetson_clocks off, switches, turns it
        # back on): wait until the service reports the new mode.
        deadline = time.monotonic() + self.MODE_SWITCH_TIMEOUT_S
        with self._session() as j:
            if j.nvpmodel is None:
                raise PowerError("jetson-stats reports no nvpmodel on this device")
            j.nvpmodel = int(mode)  # an int sets the mode by id (jtop 4.x)
            while j.ok() and int(j.nvpmodel.id) != mode:
                if time.monotonic() > deadline:
                    raise PowerError(
                        f"nvpmodel did not switch to mode {mode} in {self.MODE_SWITCH_TIMEOUT_S:.0f} s"
                    )

    def snapshot(self, cfg: PowerConfig) -> PowerState:
        state = super().snapshot(replace(cfg, nvpmodel="", jetson_clocks=None))
        state.backend = self.name
        with self._session() as j:
            if cfg.nvpmodel and j.nvpmodel is not None:
                state.nvpmodel_id = int(j.nvpmodel.id)
            if cfg.jetson_clocks is not None and j.jetson_clocks is not None:
                state.jtop["jetson_clocks"] = bool(j.jetson_clocks)
            if (cfg.fan_mode or cfg.fan_speed >= 0) and j.fan is not None:
                state.jtop.update(profile=j.fan.profile, speed=j.fan.speed)
        return state

    def apply(self, cfg: PowerConfig) -> list[str]:
        # jetson_clocks false works here (the service keeps the state to go back to), so
        # the command backend's refusal is skipped and the service turns it off.
        off = cfg.jetson_clocks is False
        done = super().apply(replace(cfg, jetson_clocks=None) if off else cfg)
        return done + (self._jetson_clocks(cfg) if off else [])

    def _jetson_clocks(self, cfg: PowerConfig) -> list[str]:
        if cfg.jetson_clocks is None:
            return []
        with self._session() as j:
            if j.jetson_clocks is None:
                raise PowerError("jetson-stats reports no jetson_clocks on this device")
            j.jetson_clocks = bool(cfg.jetson_clocks)
        return [f"jetson_clocks {'on' if cfg.jetson_clocks else 'off'} (jtop)"]

    def _fan(self, cfg: PowerConfig) -> list[str]:
        if not (cfg.fan_mode or cfg.fan_speed >= 0):
            return []
        done = []
        with self._session() as j:
            if j.fan is None:
                raise PowerError("jetson-stats reports no fan on this device")
            if cfg.fan_mode:
                j.fan.profile = cfg.fan_mode
                done.append(f"fan profile {cfg.fan_mode} (jtop)")
            if cfg.fan_speed >= 0:
                j.fan.speed = cfg.fan_speed
                done.append(f"fan speed {cfg.fan_speed} % (jtop)")
        return done

    def _restore_steps(self, state: PowerState) -> list[tuple[str, Callable[[], None]]]:
        steps = super()._restore_steps(state)
        fan = dict(state.jtop)
        if "jetson_clocks" in fan:

            def clocks() -> None:
                with self._session() as j:
                    j.jetson_clocks = bool(fan["jetson_clocks"])

            steps.insert(1, ("jetson_clocks (jtop)", clocks))
        if "profile" in fan:

            def fan_back() -> None:
                with self._session() as j:
                    j.fan.profile = fan["profile"]
                    if fan["profile"] == "manual":  # a speed only holds under the manual profile
                        j.fan.speed = fan["speed"]

            steps.append(("fan (jtop)", fan_back))
        return steps


def jtop_session() -> Any | None:
    """The jtop class if the jetson-stats service answers, else None (reason logged)."""
    try:
        from jtop import JtopException, jtop
    except ImportError:
        return None
    try:
        with jtop() as j:
            if not j.ok():
                return None
    except JtopException as e:
        log.info("power: jetson-stats service not usable (%s); using the commands and sysfs", e)
        return None
    return jtop


def make_controller(cfg: PowerConfig, runner: Runner = run_command, jtop: Any = None) -> PowerController:
    """The best controller for this machine: jtop, else sysfs, else read-only."""
    info = sysfs.detect(cfg.root)
    if not info.is_jetson:
        return ReadOnlyController(cfg.root)
    jtop = jtop or (jtop_session() if cfg.root == "/" else None)
    if jtop is not None:
        return JtopController(cfg.root, runner, jtop)
    return SysfsController(cfg.root, runner)
