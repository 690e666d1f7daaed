"""edge_agent.power.sysfs: board detection, GPU/CPU discovery, CLI-output parsers and telemetry.

Trees come from tests/fakes/jetson_tree.py; parser tests read the real captured files in
tests/data/jetson (copies kept in the repo: a missing file fails its test, it is never skipped).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes.jetson_tree import (
    DATA,
    ORIN_NANO_CPU_KHZ,
    ORIN_NANO_GPU_HZ,
    XAVIER_NX_GPU_HZ,
    add_cpus,
    make_tree,
    write,
)

from edge_agent.power.sysfs import (
    GpuPaths,
    JetsonInfo,
    cpu_dirs,
    detect,
    find_gpu,
    nearest_frequency,
    parse_frequencies,
    parse_jetson_clocks_show,
    parse_nvpmodel_conf,
    parse_nvpmodel_query,
    read_telemetry,
)


def data_files(pattern: str) -> list[str]:
    return sorted(p.name for p in DATA.glob(pattern))


@pytest.fixture
def tree(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    return make_tree(tmp_path / "root", request.param)


# --------------------------------------------------------------------------------------------
# detect


@pytest.mark.parametrize(
    ("tree", "module", "l4t_prefix", "model"),
    [
        ("orin-nano", "Orin Nano", "R36 (release), REVISION: 3.0", "NVIDIA Jetson Orin Nano Developer Kit"),
        ("xavier-nx", "Xavier NX", "R35 (release), REVISION: 4.1", "NVIDIA Jetson Xavier NX Developer Kit"),
    ],
    indirect=["tree"],
)
def test_detect_boards(tree: Path, module: str, l4t_prefix: str, model: str) -> None:
    info = detect(str(tree))
    assert info.is_jetson
    assert info.module == module
    assert info.model == model  # trailing NUL stripped
    assert info.l4t.startswith(l4t_prefix)
    assert not info.l4t.startswith("#")
    assert "\n" not in info.l4t
    assert info.compatible[-1].startswith("nvidia,tegra")


@pytest.mark.parametrize("tree", ["not-jetson"], indirect=True)
def test_detect_not_jetson(tree: Path) -> None:
    assert detect(str(tree)) == JetsonInfo(is_jetson=False, module="", model="", l4t="", compatible=())


def test_detect_missing_root(tmp_path: Path) -> None:
    assert not detect(str(tmp_path / "nothing")).is_jetson


@pytest.mark.parametrize(
    ("compatible", "module"),
    [
        ("nvidia,p3768-0000+p3767-0000", "Orin NX"),
        ("nvidia,p3768-0000+p3767-0001", "Orin NX"),
        ("nvidia,p3768-0000+p3767-0003", "Orin Nano"),
        ("nvidia,p3768-0000+p3767-0004", "Orin Nano"),
        ("nvidia,p3768-0000+p3767-0005", "Orin Nano"),
        ("nvidia,p3737-0000+p3701-0005", "AGX Orin"),
        ("nvidia,p3509-0000+p3668-0001", "Xavier NX"),
        ("nvidia,p2822-0000+p2888-0001", "AGX Xavier"),
        ("nvidia,p3449-0000-b00+p3448-0002", "Nano"),
        ("nvidia,p9999-0000", ""),  # unknown part, and a model string that names nothing
    ],
)
def test_detect_module_by_compatible(tmp_path: Path, compatible: str, module: str) -> None:
    write(tmp_path, "proc/device-tree/compatible", f"{compatible}\0nvidia,tegra234\0")
    write(tmp_path, "proc/device-tree/model", "Some Carrier\0")
    assert detect(str(tmp_path)).module == module


@pytest.mark.parametrize(
    ("model", "module"),
    [
        ("NVIDIA Jetson Orin Nano Developer Kit", "Orin Nano"),
        ("NVIDIA Jetson Orin NX Engineering Reference Developer Kit", "Orin NX"),
        ("Jetson AGX Orin Developer Kit", "AGX Orin"),
        ("NVIDIA Jetson Xavier NX Developer Kit", "Xavier NX"),
        ("Jetson AGX Xavier Developer Kit", "AGX Xavier"),
        ("Jetson-AGX", ""),  # too vague to name a module: unknown rather than a guess
        ("NVIDIA Jetson Nano Developer Kit", "Nano"),  # the captured Nano model string
    ],
)
def test_detect_module_falls_back_to_model(tmp_path: Path, model: str, module: str) -> None:
    write(tmp_path, "etc/nv_tegra_release", "# R32 (release), REVISION: 7.1")
    write(tmp_path, "proc/device-tree/model", model + "\0")
    info = detect(str(tmp_path))
    assert info.is_jetson and info.module == module
    assert info.compatible == ()


def test_detect_captured_agx_orin_compatible(tmp_path: Path) -> None:
    # The paste lost its NUL separators: one long string must still say Jetson and AGX Orin.
    pasted = (DATA / "agx-orin-64gb_jp-unstated_devicetree-compatible.txt").read_text().splitlines()[1]
    write(tmp_path, "proc/device-tree/compatible", pasted)
    info = detect(str(tmp_path))
    assert (info.is_jetson, info.module, info.l4t) == (True, "AGX Orin", "")


# --------------------------------------------------------------------------------------------
# find_gpu, cpu_dirs


@pytest.mark.parametrize(
    ("tree", "device", "name"),
    [
        ("orin-nano", "sys/devices/platform/bus@0/17000000.gpu", "17000000.gpu"),
        ("xavier-nx", "sys/devices/17000000.gv11b", "17000000.gv11b"),
    ],
    indirect=["tree"],
)
def test_find_gpu(tree: Path, device: str, name: str) -> None:
    gpu = find_gpu(str(tree))
    real = (tree / device).resolve()
    assert gpu == GpuPaths(devfreq=real / "devfreq" / name, device=real)
    assert (gpu.devfreq / "available_frequencies").is_file()
    assert (gpu.device / "load").is_file()
    assert not gpu.devfreq.is_symlink()


@pytest.mark.parametrize("tree", ["not-jetson"], indirect=True)
def test_find_gpu_absent(tree: Path, tmp_path: Path) -> None:
    assert find_gpu(str(tree)) is None
    assert find_gpu(str(tmp_path / "nothing")) is None


@pytest.mark.parametrize("tree", ["orin-nano"], indirect=True)
def test_find_gpu_ignores_other_devfreq(tree: Path) -> None:
    # Only 15340000.vic is left: its of_node name is "vic", not a GPU.
    (tree / "sys/class/devfreq/17000000.gpu").unlink()
    assert (tree / "sys/class/devfreq/15340000.vic").exists()
    assert find_gpu(str(tree)) is None


@pytest.mark.parametrize(
    ("tree", "count"), [("orin-nano", 6), ("xavier-nx", 6), ("orin-nano", 12)], indirect=["tree"]
)
def test_cpu_dirs_numeric_order(tree: Path, count: int) -> None:
    if count > 6:
        add_cpus(tree, count - 6, ORIN_NANO_CPU_KHZ, cur=729600, start=6)
    dirs = cpu_dirs(str(tree))
    assert [d.parent.name for d in dirs] == [f"cpu{n}" for n in range(count)]  # cpu10 after cpu2
    assert all(d.name == "cpufreq" and d.is_dir() for d in dirs)


@pytest.mark.parametrize("tree", ["not-jetson"], indirect=True)
def test_cpu_dirs_skips_cpus_without_cpufreq(tree: Path) -> None:
    assert (tree / "sys/devices/system/cpu/cpu0").is_dir()
    assert cpu_dirs(str(tree)) == []


# --------------------------------------------------------------------------------------------
# Pure parsers


def test_parse_frequencies() -> None:
    assert parse_frequencies("408000000 306000000 624750000 \n") == [306000000, 408000000, 624750000]
    assert parse_frequencies("") == []


def test_parse_frequencies_captured_nano() -> None:
    freqs = parse_frequencies((DATA / "nano_jp4_gpu-available-frequencies.txt").read_text().splitlines()[1])
    assert (len(freqs), freqs[0], freqs[-1]) == (13, 76800000, 998400000)
    assert 921600000 in freqs


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (0, 114750000),  # below the table
        (114750000, 114750000),  # exact
        (2_000_000_000, 1109250000),  # above the table
        (600_000_000, 599250000),
        (650_000_000, 599250000),  # 50.75 MHz below vs 51.25 MHz above
        (650_250_000, 599250000),  # exactly halfway (51 MHz each side): the lower one
        (650_250_001, 701250000),
        (1_100_000_000, 1109250000),
    ],
)
def test_nearest_frequency(target: int, expected: int) -> None:
    assert nearest_frequency(XAVIER_NX_GPU_HZ, target) == expected


def test_nearest_frequency_unsorted_and_empty() -> None:
    assert nearest_frequency([30, 10, 20], 25) == 20
    with pytest.raises(ValueError):
        nearest_frequency([], 100)


NVPMODEL_Q = {
    "agx-orin-64gb_jp6_nvpmodel-q.txt": ("MAXN", 0),
    "nano_jp4_nvpmodel-q.txt": ("5W", 1),
    "nano_jp4_nvpmodel-q-nonroot-error.txt": ("5W", 1),
    "nano_jp4_nvpmodel-q-verbose.txt": ("MAXN", 0),
    "xavier-nx_jp4_nvpmodel-q-verbose.txt": ("MODE_15W_6CORE", 2),
}


@pytest.mark.parametrize("name", sorted(NVPMODEL_Q))
def test_parse_nvpmodel_query_captured(name: str) -> None:
    assert parse_nvpmodel_query((DATA / name).read_text()) == NVPMODEL_Q[name]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "NVPM ERROR: Error opening /sys/kernel/nvpmodel_emc_cap/emc_iso_cap: 13\n",
        "NV Power Mode: MAXN\n",  # no id line
        "NV Power Mode:\n0\n",  # no name
    ],
)
def test_parse_nvpmodel_query_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="nvpmodel"):
        parse_nvpmodel_query(text)


def test_parse_nvpmodel_query_warn_between_name_and_id() -> None:
    text = "NV Power Mode: 15W\nNVPM WARN: fan mode is not set!\n0\n"
    assert parse_nvpmodel_query(text) == ("15W", 0)


# IDs and names as the captured data README lists them.
NVPMODEL_CONF = {
    "agx-orin-64gb_jp5_nvpmodel-conf.txt": ["MAXN", "MODE_15W", "MODE_30W", "MODE_50W"],
    "agx-orin-32gb_jp5_nvpmodel-conf.txt": ["MAXN", "MODE_15W", "MODE_30W", "MODE_40W"],
    "orin-nx-16gb_jp5_nvpmodel-conf.txt": ["MAXN", "10W", "15W", "25W"],
    "orin-nx-8gb_jp5_nvpmodel-conf.txt": ["MAXN", "10W", "15W", "20W"],
    "orin-nano-8gb_jp5_nvpmodel-conf.txt": ["15W", "7W"],
    "orin-nano-4gb_jp5_nvpmodel-conf.txt": ["10W", "7W_AI", "7W_CPU"],
    "orin-nano-8gb_jp6-super_nvpmodel-conf-excerpt.txt": ["15W", "25W", "MAXN_SUPER"],
    "orin-nx-16gb_jp6-super_nvpmodel-conf-excerpt.txt": ["MAXN_SUPER", "10W", "15W", "25W", "40W"],
    "agx-xavier_jp5_nvpmodel-conf.txt": [
        "MAXN",
        "MODE_10W",
        "MODE_15W",
        "MODE_30W_ALL",
        "MODE_30W_6CORE",
        "MODE_30W_4CORE",
        "MODE_30W_2CORE",
        "MODE_15W_DESKTOP",
    ],
    "xavier-nx_jp5_nvpmodel-conf.txt": [
        "MODE_15W_2CORE",
        "MODE_15W_4CORE",
        "MODE_15W_6CORE",
        "MODE_10W_2CORE",
        "MODE_10W_4CORE",
        "MODE_10W_DESKTOP",
        "MODE_20W_2CORE",
        "MODE_20W_4CORE",
        "MODE_20W_6CORE",
    ],
    "nano_jp4_nvpmodel-conf-excerpt-modified.txt": ["MAXN", "5W", "BirdEdge"],
}


@pytest.mark.parametrize("name", sorted(NVPMODEL_CONF))
def test_parse_nvpmodel_conf_captured(name: str) -> None:
    assert parse_nvpmodel_conf((DATA / name).read_text()) == dict(enumerate(NVPMODEL_CONF[name]))


def test_parse_nvpmodel_conf_ignores_syntax_comment() -> None:
    text = "# < POWER_MODEL ID=7 NAME=mode_name >\n< POWER_MODEL ID=1 NAME=5W >\n<POWER_MODEL ID=2 NAME=X>\n"
    assert parse_nvpmodel_conf(text) == {1: "5W", 2: "X"}


CLOCKS_SHOW = {
    # file: (online CPU range, number of cpuN lines, cpu0 min/max/cur kHz)
    "agx-orin_jp5-predp_jetson-clocks-show-partial.txt": ("0-11", 9, (115200, 2201600, 2112000)),
    "orin-nx-16gb_jp-unstated_jetson-clocks-show-partial.txt": ("0-7", 7, (729600, 1984000, 1728000)),
}


@pytest.mark.parametrize("name", sorted(CLOCKS_SHOW))
def test_parse_jetson_clocks_show_captured(name: str) -> None:
    online, count, (lo, hi, cur) = CLOCKS_SHOW[name]
    show = parse_jetson_clocks_show((DATA / name).read_text())
    assert show["soc_family"] == "tegra234"
    assert show["machine"].startswith("NVIDIA ")
    assert show["online_cpus"] == online
    cpus = {k: v for k, v in show.items() if k.startswith("cpu")}
    assert len(cpus) == count
    assert cpus["cpu0"] == {"online": True, "governor": "schedutil", "min": lo, "max": hi, "cur": cur}
    assert "gpu" not in show and "nv_power_mode" not in show  # both files are cut before these lines


def test_parse_jetson_clocks_show_gpu_emc_mode() -> None:
    # Format of the lines after the CPUs, per jetson-stats' parser (no capture has them).
    text = (
        "cpu5: Online=0 Governor=schedutil MinFreq=1190400 MaxFreq=1420800 CurrentFreq=1190400 \n"
        "GPU MinFreq=114750000 MaxFreq=1109250000 CurrentFreq=114750000\n"
        "EMC MinFreq=204000000 MaxFreq=1600000000 CurrentFreq=1600000000 FreqOverride=0\n"
        "Fan: PWM=0\n"
        "NV Power Mode: MODE_15W_6CORE\n"
    )
    show = parse_jetson_clocks_show(text)
    assert show["cpu5"]["online"] is False
    assert show["gpu"] == {"min": 114750000, "max": 1109250000, "cur": 114750000}
    assert show["emc"] == {"min": 204000000, "max": 1600000000, "cur": 1600000000, "override": 0}
    assert show["nv_power_mode"] == "MODE_15W_6CORE"
    assert parse_jetson_clocks_show("") == {}


# --------------------------------------------------------------------------------------------
# read_telemetry


@pytest.mark.parametrize("tree", ["orin-nano"], indirect=True)
def test_telemetry_orin_nano(tree: Path) -> None:
    t = read_telemetry(str(tree))
    assert (t.gpu_freq_hz, t.gpu_min_hz, t.gpu_max_hz) == (306000000, 306000000, ORIN_NANO_GPU_HZ[-1])
    assert t.gpu_governor == "nvhost_podgov"
    assert t.gpu_load_pct == pytest.approx(39.1)
    assert t.cpu_freq_khz == {f"cpu{n}": 1344000 for n in range(6)}
    assert t.temps_c["cpu-thermal"] == pytest.approx(43.906)
    assert len(t.temps_c) == 6
    # NC skipped, channel 7 skipped, VDD_SOC has no curr3_input: left out with one error line.
    assert t.rails_mw == pytest.approx({"VDD_IN": 5064 * 1020 / 1000, "VDD_CPU_GPU_CV": 5064 * 248 / 1000})
    assert t.total_mw == pytest.approx(5165.28)  # VDD_IN, not the sum
    assert t.emc_hz == 204000000
    assert len(t.errors) == 1
    assert "curr3_input" in t.errors[0] and "VDD_SOC" in t.errors[0]


@pytest.mark.parametrize("tree", ["xavier-nx"], indirect=True)
def test_telemetry_xavier_nx(tree: Path) -> None:
    gpu = find_gpu(str(tree))
    t = read_telemetry(str(tree), gpu=gpu)
    assert (t.gpu_freq_hz, t.gpu_max_hz, t.gpu_load_pct) == (114750000, 1109250000, pytest.approx(22.1))
    assert t.temps_c == pytest.approx(
        {"AUX-therm": 36.5, "CPU-therm": 40.0, "thermal-fan-est": 37.85, "AO-therm": 37.5, "GPU-therm": 38.0}
    )  # PMIC-Die skipped, as jtop does
    assert set(t.rails_mw) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}
    assert t.rails_mw["VDD_SOC"] == pytest.approx(1234.048)
    assert t.total_mw == pytest.approx(5543.264)
    assert t.emc_hz is None  # no debugfs in this tree
    assert t.errors == []


@pytest.mark.parametrize("tree", ["xavier-nx"], indirect=True)
def test_telemetry_total_is_sum_without_vdd_in(tree: Path) -> None:
    hwmon = tree / "sys/bus/i2c/devices/7-0040/hwmon/hwmon3"
    write(hwmon, "in1_label", "VDD_GPU")
    t = read_telemetry(str(tree))
    assert "VDD_IN" not in t.rails_mw
    assert t.total_mw == pytest.approx(sum(t.rails_mw.values()))


@pytest.mark.parametrize("tree", ["xavier-nx"], indirect=True)
@pytest.mark.parametrize("broken", ["directory", "garbage"])
def test_telemetry_unreadable_zone(tree: Path, broken: str) -> None:
    # chmod 000 is no obstacle to root, so make the temp file unreadable in other ways.
    temp = tree / "sys/devices/virtual/thermal/thermal_zone1/temp"  # CPU-therm
    if broken == "directory":
        temp.unlink()
        temp.mkdir()
    else:
        temp.write_text("not a number\n")
    t = read_telemetry(str(tree))
    assert "CPU-therm" not in t.temps_c
    assert "GPU-therm" in t.temps_c
    assert len(t.errors) == 1 and str(temp) in t.errors[0]


@pytest.mark.parametrize("tree", ["orin-nano"], indirect=True)
def test_telemetry_hwmon_index_is_globbed(tree: Path) -> None:
    hwmon = tree / "sys/bus/i2c/devices/1-0040/hwmon"
    (hwmon / "hwmon1").rename(hwmon / "hwmon4")
    assert "VDD_IN" in read_telemetry(str(tree)).rails_mw


@pytest.mark.parametrize("tree", ["orin-nano"], indirect=True)
def test_telemetry_gpu_vanished(tree: Path) -> None:
    # GPU paths cached by the caller, then the files went away: values None, no exception.
    gpu = find_gpu(str(tree))
    shutil.rmtree(gpu.device)
    t = read_telemetry(str(tree), gpu=gpu)
    assert (t.gpu_freq_hz, t.gpu_load_pct, t.gpu_governor) == (None, None, "")


@pytest.mark.parametrize("tree", ["not-jetson"], indirect=True)
def test_telemetry_not_jetson(tree: Path) -> None:
    t = read_telemetry(str(tree))
    assert (t.gpu_freq_hz, t.gpu_min_hz, t.gpu_max_hz, t.gpu_load_pct, t.total_mw, t.emc_hz) == (None,) * 6
    assert (t.gpu_governor, t.cpu_freq_khz, t.temps_c, t.rails_mw, t.errors) == ("", {}, {}, {}, [])


def test_telemetry_missing_root(tmp_path: Path) -> None:
    assert read_telemetry(str(tmp_path / "nothing")).errors == []


@pytest.mark.parametrize(
    ("board", "conf"),
    [("orin-nano", "orin-nano-8gb_jp5_nvpmodel-conf.txt"), ("xavier-nx", "xavier-nx_jp5_nvpmodel-conf.txt")],
)
def test_tree_nvpmodel_conf_is_the_captured_one(tmp_path: Path, board: str, conf: str) -> None:
    root = make_tree(tmp_path, board)
    modes = parse_nvpmodel_conf((root / "etc/nvpmodel.conf").read_text())
    assert modes == dict(enumerate(NVPMODEL_CONF[conf]))


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("*nvpmodel-q*.txt", NVPMODEL_Q),
        ("*nvpmodel-conf*.txt", NVPMODEL_CONF),
        ("*jetson-clocks-show*.txt", CLOCKS_SHOW),
    ],
)
def test_every_captured_file_is_parsed_and_every_expected_one_is_there(pattern: str, expected: dict) -> None:
    """The parser tests above are parametrized by their expectations, so a captured file that is
    missing fails there; this catches the other way round: a captured file no test parses."""
    assert DATA.is_dir(), f"captured Jetson data missing at {DATA}"
    assert data_files(pattern) == sorted(expected)
