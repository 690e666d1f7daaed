"""Build a directory laid out like a Jetson's filesystem, for tests of edge_agent.power.sysfs.

Not a test file: ``make_tree(tmp_path, "orin-nano" | "xavier-nx" | "not-jetson")`` returns the root to
pass as ``root=``. Files end with a newline as sysfs files do; device-tree strings end with NUL.

Where the values come from (captured files are in ``tests/data/jetson``, copies of the team's
captured board data, see its README for each file's source):

orin-nano (Orin Nano 8 GB on the devkit carrier, JetPack 6 / L4T R36 paths)
- GPU path ``sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu``, of_node name ``gpu``:
  the L4T 36.3 jtop log (orin-nx-16gb_jp6_jtop-service-log-partial.txt).
- GPU frequencies: NOT captured (the README lists Orin ``available_frequencies`` as wanted). The
  list is plausible: it contains 408000000, the 7W mode's GPU MAX_FREQ in the P3767-0003 conf.
  Governor ``nvhost_podgov``: not captured, the usual Jetson GPU devfreq governor.
- CPU kHz: 729600 (MIN_FREQ in the P3767-0003 conf) and the 76800 kHz steps seen in both captured
  ``jetson_clocks --show`` files (1190400, 1344000, 1728000...); max 1510400 is NOT captured (the
  JP5 Orin Nano 15W ceiling, from memory).
- Thermal zone types: ``cpu-thermal``/``gpu-thermal`` from agx-orin_jp6_thermal-zone-types-partial.txt;
  soc0/1/2 and tj from the sensor names in agx-orin-64gb_jp-unstated_tegrastats.txt (tegrastats drops
  the ``-thermal`` suffix). Temperatures from that log's first line. Both are AGX Orin, not Orin Nano.
- INA3221 rails: no captured file has labels. ``VDD_IN``/``VDD_CPU_GPU_CV``/``VDD_SOC`` are the rail
  names in xavier-nx_jp5_tegrastats.txt (the Orin Nano devkit uses the same three; NOT captured).
  mV/mA values are plausible. ``curr3_input`` (VDD_SOC) is left out on purpose ("missing rail").
  The second chip at 1-0041 (address from agx-orin_jp-unstated_ina3221-sysfs-partial.txt) with its
  one ``NC`` channel is synthetic, for the "skip NC" rule.
- GPU load 391 per-mille: ``GR3D_FREQ 39%`` in that AGX Orin log.
- EMC rate 204000000 Hz: ``EMC_FREQ 12%@204`` in the AGX Orin tegrastats log.
- model, compatible, nv_tegra_release: NOT captured for this board (only an AGX Orin compatible
  was); written in the shape of the captured AGX Orin compatible (``nvidia,p3737-0000+p3701-0005``
  -> carrier p3768, module p3767-0003) and of the R36 release line.
- etc/nvpmodel.conf: copied from orin-nano-8gb_jp5_nvpmodel-conf.txt (P3767-0003).

xavier-nx (Xavier NX, JetPack 5 paths)
- GPU path ``sys/devices/17000000.gv11b/devfreq/17000000.gv11b``, of_node name ``gv11b``: the paths
  in xavier-nx_jp5_nvpmodel-conf.txt and xavier-nx_jp4_nvpmodel-q-verbose.txt. Min 114750000 and
  max 1109250000 Hz are in the verbose output; the steps between them are plausible, NOT captured.
- CPU kHz 1190400-1420800 (MODE_15W_6CORE) from the verbose output; 1907200 from the conf.
- Thermal zone types from the sensors in xavier-nx_jp5_tegrastats.txt (AUX CPU thermal AO GPU PMIC),
  with the full names the Nano 2GB list uses (``*-therm``, ``PMIC-Die``, ``thermal-fan-est``).
  Temperatures and GPU load (221 per-mille, ``GR3D_FREQ 22%``) from that log's first line.
- INA3221 rail names from xavier-nx_jp5_tegrastats.txt; mV/mA chosen so mV*mA/1000 lands near its
  first line (5542, 1594, 1234 mW). The bus address 7-0040 is NOT captured.
- model, compatible, nv_tegra_release: NOT captured; plausible values (p3509 carrier, p3668 module, R35).
- etc/nvpmodel.conf: copied from xavier-nx_jp5_nvpmodel-conf.txt.

not-jetson: a VM-like host: one CPU without cpufreq, no device tree, no devfreq, no hwmon.
"""

from __future__ import annotations

import os
from pathlib import Path

# Captured board output, kept in the repo so the tests need nothing outside it.
DATA = Path(__file__).resolve().parent.parent / "data" / "jetson"

BOARDS = ("orin-nano", "xavier-nx", "not-jetson")

ORIN_NANO_GPU_HZ = [306000000, 408000000, 510000000, 612000000, 624750000]
XAVIER_NX_GPU_HZ = [
    114750000,
    204000000,
    306000000,
    408000000,
    510000000,
    599250000,
    701250000,
    803250000,
    854250000,
    905250000,
    956250000,
    1007250000,
    1058250000,
    1109250000,
]
ORIN_NANO_CPU_KHZ = [729600 + 76800 * i for i in range(10)] + [1510400]  # 729600 ... 1420800, 1510400
XAVIER_NX_CPU_KHZ = [1190400 + 76800 * i for i in range(9)] + [1907200]  # 1190400 ... 1804800, 1907200


def write(root: Path, rel: str, text: str) -> Path:
    """Write ``text`` (plus a trailing newline, as sysfs does) to ``root/rel``, creating parents."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith(("\n", "\0")) else text + "\n")
    return path


def link(root: Path, rel: str, target: str) -> None:
    """Relative symlink ``root/rel`` -> ``target`` (relative to the link's dir), as sysfs has."""
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)


def add_cpus(root: Path, count: int, available: list[int], cur: int, start: int = 0) -> None:
    """cpu<start>..cpu<start+count-1> with online and cpufreq files (kHz)."""
    for n in range(start, start + count):
        base = f"sys/devices/system/cpu/cpu{n}"
        write(root, f"{base}/online", "1")
        write(root, f"{base}/cpufreq/scaling_governor", "schedutil")
        write(root, f"{base}/cpufreq/scaling_available_frequencies", " ".join(map(str, available)) + " ")
        write(root, f"{base}/cpufreq/scaling_min_freq", str(available[0]))
        write(root, f"{base}/cpufreq/scaling_max_freq", str(available[-1]))
        write(root, f"{base}/cpufreq/scaling_cur_freq", str(cur))


def add_gpu(root: Path, device: str, devfreq_name: str, node: str, available: list[int], load: int) -> None:
    """GPU device dir ``device`` with ``devfreq/<devfreq_name>`` and the /sys/class/devfreq symlink."""
    freq = f"{device}/devfreq/{devfreq_name}"
    write(root, f"{freq}/governor", "nvhost_podgov")
    write(root, f"{freq}/available_frequencies", " ".join(map(str, available)))
    write(root, f"{freq}/min_freq", str(available[0]))
    write(root, f"{freq}/max_freq", str(available[-1]))
    write(root, f"{freq}/cur_freq", str(available[0]))
    link(root, f"{freq}/device", "../..")
    write(root, f"{device}/load", str(load))  # per-mille
    add_of_node(root, device, node)
    depth = "/".join([".."] * 2)  # sys/class/devfreq -> sys
    link(root, f"sys/class/devfreq/{devfreq_name}", f"{depth}/{freq.removeprefix('sys/')}")


def add_of_node(root: Path, device: str, name: str) -> None:
    """``device/of_node`` -> a device-tree node whose ``name`` is NUL-terminated, as in the kernel."""
    node = f"sys/firmware/devicetree/base/{name}@{device.rsplit('/', 1)[-1].split('.')[0]}"
    write(root, f"{node}/name", name + "\0")
    up = "/".join([".."] * device.count("/"))
    link(root, f"{device}/of_node", f"{up}/{node.removeprefix('sys/')}")


def add_zones(root: Path, zones: list[tuple[str, int]]) -> None:
    """thermal_zone<i> with ``type`` and ``temp`` (m°C)."""
    for i, (kind, milli_c) in enumerate(zones):
        write(root, f"sys/devices/virtual/thermal/thermal_zone{i}/type", kind)
        write(root, f"sys/devices/virtual/thermal/thermal_zone{i}/temp", str(milli_c))


def add_ina3221(root: Path, bus_dev: str, device: str, hwmon: str, channels: dict[int, tuple]) -> None:
    """INA3221 at ``device`` (linked from sys/bus/i2c/devices/<bus_dev>); channel -> (label, mV, mA).

    A ``None`` mA leaves ``curr<k>_input`` out (a labelled rail without its current reading).
    """
    write(root, f"{device}/name", "ina3221")
    for k, (label, mv, ma) in channels.items():
        write(root, f"{device}/hwmon/{hwmon}/in{k}_label", label)
        write(root, f"{device}/hwmon/{hwmon}/in{k}_input", str(mv))
        if ma is not None:
            write(root, f"{device}/hwmon/{hwmon}/curr{k}_input", str(ma))
    link(root, f"sys/bus/i2c/devices/{bus_dev}", "../../../" + device.removeprefix("sys/"))


def add_identity(root: Path, model: str, compatible: list[str], release: str, conf: str | None) -> None:
    write(root, "proc/device-tree/model", model + "\0")
    write(root, "proc/device-tree/compatible", "".join(c + "\0" for c in compatible))
    write(root, "etc/nv_tegra_release", release)
    if conf:  # a missing captured file is an error (FileNotFoundError), never a silent skip
        write(root, "etc/nvpmodel.conf", (DATA / conf).read_text())


def _orin_nano(root: Path) -> None:
    add_identity(
        root,
        "NVIDIA Jetson Orin Nano Developer Kit",
        ["nvidia,p3768-0000+p3767-0003", "nvidia,p3767-0003", "nvidia,tegra234"],
        "# R36 (release), REVISION: 3.0, GCID: 36923193, BOARD: generic, EABI: aarch64, "
        "DATE: Fri Jul 19 23:24:25 UTC 2024\n# KERNEL_VARIANT: oot\n",
        "orin-nano-8gb_jp5_nvpmodel-conf.txt",
    )
    add_gpu(root, "sys/devices/platform/bus@0/17000000.gpu", "17000000.gpu", "gpu", ORIN_NANO_GPU_HZ, 391)
    # A devfreq entry that is not the GPU, so discovery has to look at the of_node name.
    vic = "sys/devices/platform/bus@0/13e00000.host1x/15340000.vic"
    write(root, f"{vic}/devfreq/15340000.vic/cur_freq", "115200000")
    link(root, f"{vic}/devfreq/15340000.vic/device", "../..")
    add_of_node(root, vic, "vic")
    link(
        root, "sys/class/devfreq/15340000.vic", "../../" + vic.removeprefix("sys/") + "/devfreq/15340000.vic"
    )
    add_cpus(root, 6, ORIN_NANO_CPU_KHZ, cur=1344000)
    add_zones(
        root,
        [
            ("cpu-thermal", 43906),
            ("gpu-thermal", 40093),
            ("soc0-thermal", 41187),
            ("soc1-thermal", 40437),
            ("soc2-thermal", 40406),
            ("tj-thermal", 43906),
        ],
    )
    i2c = "sys/devices/platform/bus@0/c240000.i2c/i2c-1"
    add_ina3221(
        root,
        "1-0040",
        f"{i2c}/1-0040",
        "hwmon1",
        {
            1: ("VDD_IN", 5064, 1020),
            2: ("VDD_CPU_GPU_CV", 5064, 248),
            3: ("VDD_SOC", 5064, None),  # curr3_input missing on purpose
            7: ("sum of shunt voltages", 880, 0),
        },
    )
    add_ina3221(root, "1-0041", f"{i2c}/1-0041", "hwmon2", {1: ("NC", 0, 0)})
    write(root, "sys/kernel/debug/bpmp/debug/clk/emc/rate", "204000000")


def _xavier_nx(root: Path) -> None:
    add_identity(
        root,
        "NVIDIA Jetson Xavier NX Developer Kit",
        ["nvidia,p3509-0000+p3668-0001", "nvidia,p3668-0001", "nvidia,tegra194"],
        "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64, "
        "DATE: Tue Aug  1 19:57:35 UTC 2023\n",
        "xavier-nx_jp5_nvpmodel-conf.txt",
    )
    add_gpu(root, "sys/devices/17000000.gv11b", "17000000.gv11b", "gv11b", XAVIER_NX_GPU_HZ, 221)
    add_cpus(root, 6, XAVIER_NX_CPU_KHZ, cur=1190400)
    add_zones(
        root,
        [
            ("AUX-therm", 36500),
            ("CPU-therm", 40000),
            ("thermal-fan-est", 37850),
            ("AO-therm", 37500),
            ("GPU-therm", 38000),
            ("PMIC-Die", 50000),
        ],
    )
    add_ina3221(
        root,
        "7-0040",
        "sys/devices/platform/3180000.i2c/i2c-7/7-0040",
        "hwmon3",
        {
            1: ("VDD_IN", 4976, 1114),
            2: ("VDD_CPU_GPU_CV", 4976, 320),
            3: ("VDD_SOC", 4976, 248),
            7: ("sum of shunt voltages", 1008, 0),
        },
    )


def _not_jetson(root: Path) -> None:
    write(root, "etc/os-release", 'NAME="Ubuntu"')
    write(root, "sys/devices/system/cpu/online", "0")
    (root / "sys/devices/system/cpu/cpu0").mkdir(parents=True)  # a VM: no cpufreq
    (root / "sys/class/devfreq").mkdir(parents=True)


def make_tree(root: Path, board: str) -> Path:
    """Lay out ``board``'s filesystem under ``root`` and return ``root``."""
    builders = {"orin-nano": _orin_nano, "xavier-nx": _xavier_nx, "not-jetson": _not_jetson}
    if board not in builders:
        raise ValueError(f"unknown board {board!r}; expected one of {BOARDS}")
    root.mkdir(parents=True, exist_ok=True)
    builders[board](root)
    return root
