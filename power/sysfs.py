"""Read-only view of a Jetson's clocks, power rails and thermals, from sysfs and CLI output.

Every function that touches the filesystem takes ``root`` (default "/") and resolves paths under it,
so tests can point it at a temporary tree laid out like a Jetson (see tests/jetson_tree.py).
Nothing here writes: locking clocks and switching power modes live elsewhere.

Units follow the kernel: GPU and EMC clocks in Hz, CPU clocks in kHz, temperatures in m°C on
disk (°C in ``Telemetry``), INA3221 voltage in mV and current in mA (power in mW).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

# Module part numbers (the "pNNNN-SSSS" in /proc/device-tree/compatible). Carrier boards
# (p3737, p3768, p3509, p3449, ...) are deliberately absent: only the module says which SoC it is.
_ORIN_NX_SKUS = {"0000", "0001"}  # 16 GB, 8 GB
_ORIN_NANO_SKUS = {"0003", "0004", "0005"}  # 8 GB, 4 GB, 8 GB devkit module
_MODULE_BY_PART = {
    "p3701": "AGX Orin",
    "p3668": "Xavier NX",
    "p2888": "AGX Xavier",
    "p3448": "Nano",
    "p3450": "Nano",
}
# Checked in order: "Orin Nano" must win over "Nano", "AGX Orin" over a bare "Orin".
_MODULE_BY_MODEL = ("Orin Nano", "Orin NX", "AGX Orin", "Xavier NX", "AGX Xavier", "Nano")

# jtop's GPU discovery: the devfreq entry whose device tree node has one of these names.
_GPU_NODE_NAMES = {"gv11b", "gp10b", "ga10b", "gpu"}

# The hwmon ina3221 driver reports the sum of the shunt voltages on channel 7; it is not a rail.
_SUM_OF_SHUNT_CHANNEL = 7
_TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")


@dataclass(frozen=True)
class JetsonInfo:
    """What board this is, from the device tree and the L4T release file."""

    is_jetson: bool
    module: str  # "Orin Nano", "Orin NX", "AGX Orin", "Xavier NX", "AGX Xavier", "Nano", "" when unknown
    model: str  # /proc/device-tree/model
    l4t: str  # first line of /etc/nv_tegra_release, stripped of "# "
    compatible: tuple[str, ...]


@dataclass(frozen=True)
class GpuPaths:
    """The integrated GPU's devfreq directory (governor, *_freq in Hz) and device directory (load)."""

    devfreq: Path
    device: Path


@dataclass
class Telemetry:
    """One snapshot of clocks, load, temperatures and power. Missing values are None or empty."""

    gpu_freq_hz: int | None = None
    gpu_min_hz: int | None = None
    gpu_max_hz: int | None = None
    gpu_governor: str = ""
    gpu_load_pct: float | None = None
    cpu_freq_khz: dict[str, int] = field(default_factory=dict)  # "cpu0" -> kHz
    temps_c: dict[str, float] = field(default_factory=dict)  # thermal zone type -> °C
    rails_mw: dict[str, float] = field(default_factory=dict)  # INA3221 label -> mW
    total_mw: float | None = None
    emc_hz: int | None = None
    errors: list[str] = field(default_factory=list)  # one line per file that exists but failed


# --------------------------------------------------------------------------------------------
# Small helpers


def _under(root: str | Path, path: str) -> Path:
    """``path`` (absolute or relative) resolved below ``root``."""
    return Path(root) / path.lstrip("/")


def _read(path: Path) -> str | None:
    """File contents stripped of whitespace and device-tree NULs, or None when it does not exist.

    Other OSErrors propagate: telemetry reports them (see ``_read_int``).
    """
    try:
        return path.read_text(errors="replace").strip().strip("\0").strip()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _probe(path: Path) -> str | None:
    """Like ``_read`` but None on any OSError: for detection and discovery, where unreadable = absent."""
    try:
        return _read(path)
    except OSError:
        return None


# --------------------------------------------------------------------------------------------
# Board detection


def split_compatible(text: str) -> tuple[str, ...]:
    """Entries of /proc/device-tree/compatible (NUL-separated, NUL-terminated)."""
    return tuple(s.strip() for s in text.split("\0") if s.strip())


def module_from_compatible(compatible: tuple[str, ...]) -> str:
    """Module name from the module part number, or "" when no entry names a known module.

    Searched with a regex rather than split on "+", so a paste whose NULs were lost
    ("nvidia,p3737-0000+p3701-0005nvidia,p3701-0005...") still maps.
    """
    for entry in compatible:
        for part, sku in re.findall(r"(p\d{4})-(\d{4})", entry):
            if part == "p3767":
                if sku in _ORIN_NX_SKUS:
                    return "Orin NX"
                if sku in _ORIN_NANO_SKUS:
                    return "Orin Nano"
            elif part in _MODULE_BY_PART:
                return _MODULE_BY_PART[part]
    return ""


def module_from_model(model: str) -> str:
    """Module name from the /proc/device-tree/model string, or ""."""
    return next((name for name in _MODULE_BY_MODEL if name.lower() in model.lower()), "")


def detect(root: str = "/") -> JetsonInfo:
    """Identify the board under ``root``. Never raises for missing files."""
    release = _probe(_under(root, "etc/nv_tegra_release"))
    model = _probe(_under(root, "proc/device-tree/model")) or ""
    raw_compatible = _probe(_under(root, "proc/device-tree/compatible")) or ""
    compatible = split_compatible(raw_compatible)
    l4t = release.splitlines()[0].lstrip("#").strip() if release else ""
    # Substring test, not startswith: a compatible file with lost NULs is one long string.
    is_jetson = release is not None or "nvidia,tegra" in raw_compatible
    module = (module_from_compatible(compatible) or module_from_model(model)) if is_jetson else ""
    return JetsonInfo(is_jetson=is_jetson, module=module, model=model, l4t=l4t, compatible=compatible)


# --------------------------------------------------------------------------------------------
# Discovery


def find_gpu(root: str = "/") -> GpuPaths | None:
    """The integrated GPU's devfreq and device dirs, found the way jetson-stats does, or None.

    Paths move between releases (``17000000.gv11b``, ``bus@0/17000000.gpu``, ...), so match on
    the device tree node name behind each ``/sys/class/devfreq`` entry instead of a fixed path.
    """
    devfreq_class = _under(root, "sys/class/devfreq")
    if not devfreq_class.is_dir():
        return None
    for entry in sorted(devfreq_class.iterdir()):
        if _probe(entry / "device" / "of_node" / "name") in _GPU_NODE_NAMES:
            return GpuPaths(devfreq=entry.resolve(), device=(entry / "device").resolve())
    return None


def _cpu_index(path: Path) -> int:
    return int(path.name[3:])


def cpu_dirs(root: str = "/") -> list[Path]:
    """Existing ``cpu<N>/cpufreq`` dirs (files in kHz), sorted by N numerically (cpu2 before cpu10)."""
    cpus = [p for p in _under(root, "sys/devices/system/cpu").glob("cpu*") if re.fullmatch(r"cpu\d+", p.name)]
    return [p / "cpufreq" for p in sorted(cpus, key=_cpu_index) if (p / "cpufreq").is_dir()]


def ina3221_hwmon_dirs(root: str = "/") -> list[Path]:
    """hwmon dirs of every INA3221 on the I2C bus. The hwmonN index changes between boots: glob it."""
    found = []
    for device in sorted(_under(root, "sys/bus/i2c/devices").glob("*")):
        if _probe(device / "name") == "ina3221":
            found.extend(sorted(device.glob("hwmon/hwmon*")))
    return found


# --------------------------------------------------------------------------------------------
# Pure parsers


def parse_frequencies(text: str) -> list[int]:
    """``available_frequencies`` (space separated; Hz for devfreq, kHz for cpufreq), sorted."""
    return sorted(int(tok) for tok in text.split())


def nearest_frequency(available: list[int], target: int) -> int:
    """The available frequency closest to ``target``; on a tie the lower one (never overshoot)."""
    if not available:
        raise ValueError("no available frequencies")
    return min(available, key=lambda f: (abs(f - target), f))


def parse_nvpmodel_query(text: str) -> tuple[str, int]:
    """(mode name, mode id) from ``nvpmodel -q`` or ``nvpmodel -q --verbose`` output.

    The name follows "NV Power Mode:" (in --verbose after "NVPM VERB: Current mode: "); the id is
    the first later line that is a bare integer. Prompt lines and NVPM WARN/ERROR lines are ignored.
    """
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        _, marker, name = line.partition("NV Power Mode:")
        if not marker or not name.strip():
            continue
        mode_id = next((int(s) for s in lines[i + 1 :] if s.isdigit()), None)
        if mode_id is not None:
            return name.strip(), mode_id
    raise ValueError(f"cannot parse nvpmodel -q output: {text!r}")


_POWER_MODEL_RE = re.compile(r"<\s*POWER_MODEL\s+ID=(\d+)\s+NAME=([^\s>]+)\s*>")


def parse_nvpmodel_conf(text: str) -> dict[int, str]:
    """POWER_MODEL id -> name from an nvpmodel.conf. Comment lines (which show the syntax) are skipped."""
    models = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        match = _POWER_MODEL_RE.search(line)
        if match:
            models[int(match.group(1))] = match.group(2)
    return models


_CLOCKS_CPU_RE = re.compile(
    r"^(cpu\d+):\s+Online=(\d)\s+Governor=(\S+)\s+MinFreq=(\d+)\s+MaxFreq=(\d+)\s+CurrentFreq=(\d+)"
)
_CLOCKS_DEV_RE = re.compile(
    r"^(GPU|EMC)\s+MinFreq=(\d+)\s+MaxFreq=(\d+)\s+CurrentFreq=(\d+)(?:\s+FreqOverride=(\d+))?"
)


def parse_jetson_clocks_show(text: str) -> dict:
    """``jetson_clocks --show`` as a dict; any line it does not know is ignored (partial output is fine).

    Keys: ``cpuN`` -> {online: bool, governor, min, max, cur} (kHz); ``gpu`` / ``emc`` ->
    {min, max, cur} (Hz, ``emc`` also ``override``); ``nv_power_mode``; ``soc_family``; ``machine``;
    ``online_cpus`` (the range text, e.g. "0-11"). Spacing after ``cpuN:`` varies between releases.
    """
    out: dict = {}
    for raw in text.splitlines():
        line = raw.strip()
        if m := _CLOCKS_CPU_RE.match(line):
            name, online, governor, lo, hi, cur = m.groups()
            out[name] = {
                "online": online == "1",
                "governor": governor,
                "min": int(lo),
                "max": int(hi),
                "cur": int(cur),
            }
        elif m := _CLOCKS_DEV_RE.match(line):
            entry = {"min": int(m[2]), "max": int(m[3]), "cur": int(m[4])}
            if m[5] is not None:
                entry["override"] = int(m[5])
            out[m[1].lower()] = entry
        elif m := re.match(r"^SOC family:(\S+)\s+Machine:(.*)$", line):
            out["soc_family"], out["machine"] = m[1], m[2].strip()
        elif m := re.match(r"^Online CPUs:\s*(\S+)", line):
            out["online_cpus"] = m[1]
        elif "NV Power Mode:" in line:
            out["nv_power_mode"] = line.partition("NV Power Mode:")[2].strip()
    return out


# --------------------------------------------------------------------------------------------
# Telemetry


def _read_int(path: Path, errors: list[str]) -> int | None:
    """Integer in ``path``; None when absent, or when unreadable (then one line goes to ``errors``)."""
    try:
        text = _read(path)
        return None if text is None else int(text)
    except (OSError, ValueError) as exc:
        errors.append(f"{path}: {exc}")
        return None


def _read_str(path: Path, errors: list[str]) -> str | None:
    try:
        return _read(path)
    except OSError as exc:
        errors.append(f"{path}: {exc}")
        return None


def _read_gpu(t: Telemetry, gpu: GpuPaths) -> None:
    t.gpu_freq_hz = _read_int(gpu.devfreq / "cur_freq", t.errors)
    t.gpu_min_hz = _read_int(gpu.devfreq / "min_freq", t.errors)
    t.gpu_max_hz = _read_int(gpu.devfreq / "max_freq", t.errors)
    t.gpu_governor = _read_str(gpu.devfreq / "governor", t.errors) or ""
    load = _read_int(gpu.device / "load", t.errors)
    t.gpu_load_pct = None if load is None else load / 10.0  # per-mille -> %


def _read_cpus(t: Telemetry, root: str) -> None:
    for cpufreq in cpu_dirs(root):
        khz = _read_int(cpufreq / "scaling_cur_freq", t.errors)
        if khz is not None:
            t.cpu_freq_khz[cpufreq.parent.name] = khz


def _read_temps(t: Telemetry, root: str) -> None:
    zones = [
        p
        for p in _under(root, "sys/devices/virtual/thermal").glob("thermal_zone*")
        if p.name.removeprefix("thermal_zone").isdigit()
    ]
    for zone in sorted(zones, key=lambda p: int(p.name.removeprefix("thermal_zone"))):
        kind = _read_str(zone / "type", t.errors)
        # jtop skips the PMIC zone: it reports a fixed placeholder (e.g. 50 °C), not a measurement.
        if not kind or "PMIC" in kind:
            continue
        milli = _read_int(zone / "temp", t.errors)
        if milli is not None:
            t.temps_c[kind] = milli / 1000.0


def _read_rails(t: Telemetry, root: str) -> None:
    for hwmon in ina3221_hwmon_dirs(root):
        for label_file in sorted(hwmon.glob("in*_label")):
            channel = int(label_file.name[2:].removesuffix("_label"))
            label = _read_str(label_file, t.errors)
            if channel == _SUM_OF_SHUNT_CHANNEL or not label or "NC" in label:
                continue  # not connected, or the sum-of-shunts pseudo channel
            mv_file, ma_file = hwmon / f"in{channel}_input", hwmon / f"curr{channel}_input"
            missing = [p for p in (mv_file, ma_file) if not p.exists()]
            if missing:
                # A labelled rail without its reading is a driver/board oddity worth reporting.
                t.errors.append(f"{missing[0]}: missing for rail {label}")
                continue
            mv, ma = _read_int(mv_file, t.errors), _read_int(ma_file, t.errors)
            if mv is not None and ma is not None:
                t.rails_mw[label] = mv * ma / 1000.0


def total_power_mw(rails_mw: dict[str, float]) -> float | None:
    """Board input power: the VDD_IN (or POM_5V_IN) rail when present, else the sum, else None."""
    total = next((rails_mw[name] for name in _TOTAL_RAILS if name in rails_mw), None)
    if total is None and rails_mw:
        total = sum(rails_mw.values())
    return total


def read_telemetry(root: str = "/", gpu: GpuPaths | None = None) -> Telemetry:
    """Everything readable under ``root``; never raises. Pass ``gpu`` to skip discovery each call."""
    t = Telemetry()
    gpu = gpu or find_gpu(root)
    if gpu is not None:
        _read_gpu(t, gpu)
    _read_cpus(t, root)
    _read_temps(t, root)
    _read_rails(t, root)
    t.total_mw = total_power_mw(t.rails_mw)
    t.emc_hz = _read_emc_hz(root, t.errors)
    return t


def _read_emc_hz(root: str, errors: list[str]) -> int | None:
    # debugfs is root-only (mode 700) and not always mounted: absent or forbidden is normal, not an
    # error, or a non-root agent would log one line per sample.
    path = _under(root, "sys/kernel/debug/bpmp/debug/clk/emc/rate")
    try:
        path.stat()
    except OSError:
        return None
    return _read_int(path, errors)
