"""The power manager on Jetson-shaped trees, with fake nvpmodel / jetson_clocks on PATH.

The trees (tests/fakes/jetson_tree.py) hold real files laid out like an Orin Nano's and a
Xavier NX's; the two tools are fakes (they cannot exist here) that record their
arguments and keep the power mode in a file, as the real nvpmodel does in the kernel.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import agent_command, run_process, spawn_run, started, wait_until
from fakes.jetson_tree import make_tree

from edge_agent.core.power_config import PowerConfig
from edge_agent.power import controller, sysfs
from edge_agent.power.controller import PowerError, ReadOnlyController, SysfsController, make_controller
from edge_agent.power.manager import PowerManager, throttle_reasons
from edge_agent.power.state import load_state

# What both fake tools start with: an atomic write, and where they record their calls.
FAKE_PRELUDE = """\
import os, sys, pathlib
def put(path, text):  # atomically: whoever reads the file sees the old or the new text
    tmp = path.with_name(f".{{path.name}}.{{os.getpid()}}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
base = pathlib.Path({base!r})
"""

FAKE_NVPMODEL = """\
#!{python}
# FakeNvpmodel: records its arguments; keeps the mode where the real tool keeps it (the
# kernel); like the real tool, switching a mode resets the GPU clock range to the mode's
# own (mode N caps max_freq at the (N+1)-th highest available frequency).
{prelude}with open(base / "calls.log", "a") as f:
    f.write("nvpmodel " + " ".join(sys.argv[1:]) + "\\n")
mode = base / "nvpmodel.mode"
if sys.argv[1:2] == ["-q"]:
    m = mode.read_text().strip() if mode.exists() else "0"
    print("NV Power Mode: MODE" + m)
    print(m)
elif sys.argv[1:2] == ["-m"]:
    put(mode, sys.argv[2])
    d = os.environ.get("FAKE_DEVFREQ")
    if d:
        d = pathlib.Path(d)
        avail = sorted(int(x) for x in (d / "available_frequencies").read_text().split())
        put(d / "min_freq", str(avail[0]) + "\\n")
        put(d / "max_freq", str(avail[-1 - int(sys.argv[2])]) + "\\n")
"""

FAKE_JETSON_CLOCKS = """\
#!{python}
# FakeJetsonClocks: records its arguments; no argument pins the GPU at its maximum;
# --store refuses to overwrite (the real script asks "Can I overwrite it? Y/N" and, with
# no answer, exits 1); --restore writes the stored range back.
{prelude}with open(base / "calls.log", "a") as f:
    f.write("jetson_clocks " + " ".join(sys.argv[1:]) + "\\n")
d = pathlib.Path(os.environ.get("FAKE_DEVFREQ", base))
if sys.argv[1:2] == ["--store"]:
    store = pathlib.Path(sys.argv[2])
    if store.exists():
        print("File exists: Can I overwrite it? Y/N"); sys.exit(1)
    put(store, (d / "min_freq").read_text().strip() + " " + (d / "max_freq").read_text().strip())
elif sys.argv[1:2] == ["--restore"]:
    store = pathlib.Path(sys.argv[2])
    if not store.exists():
        print("no such file", store); sys.exit(1)
    lo, hi = store.read_text().split()
    put(d / "min_freq", lo + "\\n")
    put(d / "max_freq", hi + "\\n")
elif len(sys.argv) == 1 and (d / "available_frequencies").exists():
    top = max(int(x) for x in (d / "available_frequencies").read_text().split())
    put(d / "max_freq", f"{{top}}\\n")
    put(d / "min_freq", f"{{top}}\\n")
"""


@pytest.fixture
def tools(tmp_path, monkeypatch) -> Path:
    """Fake nvpmodel and jetson_clocks first on PATH; returns the folder with calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("nvpmodel", FAKE_NVPMODEL), ("jetson_clocks", FAKE_JETSON_CLOCKS)):
        prelude = FAKE_PRELUDE.format(base=str(tmp_path))
        put(
            bin_dir / name,
            body.format(python=sys.executable, prelude=prelude, base=str(tmp_path)),
            mode=0o755,
        )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def put(path: Path, text: str, mode: int | None = None) -> None:
    """Write ``path`` atomically (a temporary file renamed over it): a process reading it
    meanwhile sees the old text or the new, never a half-written file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    if mode is not None:
        tmp.chmod(mode)
    os.replace(tmp, path)


def calls(tools: Path) -> list[str]:
    log = tools / "calls.log"
    return [line.rstrip() for line in log.read_text().splitlines()] if log.exists() else []


def _user_cap(root: Path) -> None:
    """A GPU cap that is no mode's default: a restore that let nvpmodel have the last word
    would lose it."""
    gpu = sysfs.find_gpu(str(root))
    avail = sysfs.parse_frequencies((gpu.devfreq / "available_frequencies").read_text())
    (gpu.devfreq / "max_freq").write_text(f"{avail[-3]}\n")


@pytest.fixture(params=["orin-nano", "xavier-nx"])
def board(request, tmp_path, monkeypatch) -> tuple[str, Path]:
    root = make_tree(tmp_path / "root", request.param)
    _user_cap(root)
    monkeypatch.setenv("FAKE_DEVFREQ", str(sysfs.find_gpu(str(root)).devfreq))
    return request.param, root


def read_whole_int(path: Path) -> int | None:
    """The integer in ``path``, or None while a writer has it half-written: the agent writes
    sysfs files in place (the kernel requires it), so a reader in another process may see
    the file truncated and not yet written. A whole value ends with its newline."""
    text = path.read_text()
    return int(text) if text.endswith("\n") and text.strip().isdigit() else None


def gpu_range(root: Path, timeout_s: float = 10.0) -> tuple[int, int]:
    """The GPU's [min_freq, max_freq], each read again until it is whole."""
    gpu = sysfs.find_gpu(str(root))
    assert gpu is not None

    def whole() -> tuple[int, int] | None:
        lo, hi = read_whole_int(gpu.devfreq / "min_freq"), read_whole_int(gpu.devfreq / "max_freq")
        return None if lo is None or hi is None else (lo, hi)

    return wait_until(whole, timeout_s, message=f"{gpu.devfreq}/min_freq, max_freq never whole")


def cpu_values(root: Path, name: str) -> list[str]:
    return [(d / name).read_text().strip() for d in sysfs.cpu_dirs(str(root))]


def profile(root: Path, tmp_path: Path, **kw) -> PowerConfig:
    base = dict(
        manage=True,
        nvpmodel="1",
        gpu_freq_mhz=600,
        cpu_governor="performance",
        state_file=str(tmp_path / "state" / "power.json"),
        root=str(root),
        sample_hz=20,
    )
    base.update(kw)
    return PowerConfig(**base)


def test_apply_locks_the_gpu_and_restore_puts_everything_back(board, tools, tmp_path):
    name, root = board
    gpu_before, gov_before = gpu_range(root), cpu_values(root, "scaling_governor")
    cfg = profile(root, tmp_path)
    pm = PowerManager(cfg)
    assert isinstance(pm.controller, SysfsController), (
        f"{name}: a Jetson tree with tools gets the sysfs backend"
    )
    pm.start()
    try:
        lo, hi = gpu_range(root)
        avail = sysfs.parse_frequencies(
            (sysfs.find_gpu(str(root)).devfreq / "available_frequencies").read_text()
        )
        assert lo == hi == sysfs.nearest_frequency(avail, 600_000_000), "min = max = nearest available"
        assert set(cpu_values(root, "scaling_governor")) == {"performance"}
        assert "nvpmodel -m 1" in calls(tools)
        assert load_state(cfg.state_file) is not None, "the old state is saved before anything changes"
        assert any("GPU locked at" in line for line in pm.applied)
    finally:
        pm.close()
    assert gpu_range(root) == gpu_before, "the exact range comes back, not the mode's default"
    assert cpu_values(root, "scaling_governor") == gov_before
    assert "nvpmodel -m 0" in calls(tools)
    assert not Path(cfg.state_file).exists()
    n = len(calls(tools))
    assert pm.restore() == [] and len(calls(tools)) == n, "restoring twice is harmless"


def test_jetson_clocks_is_stored_and_restored_run_after_run(board, tools, tmp_path):
    _, root = board
    before = gpu_range(root)
    cfg = profile(root, tmp_path, jetson_clocks=True, gpu_freq_mhz=0, nvpmodel="", cpu_governor="")
    store = str(Path(cfg.state_file).parent / "l4t_dfs.conf")
    # A store file left by a run that died between `--store` and saving its state.
    Path(store).parent.mkdir(parents=True, exist_ok=True)
    Path(store).write_text("left over\n")
    for _ in range(2):
        pm = PowerManager(cfg)
        pm.start()
        lo, hi = gpu_range(root)
        assert lo == hi, "jetson_clocks pins the GPU"
        pm.close()
        assert gpu_range(root) == before
    assert (
        calls(tools)
        == [f"jetson_clocks --store {store}", "jetson_clocks", f"jetson_clocks --restore {store}"] * 2
    )


def test_jetson_clocks_off_needs_jetson_stats(board, tools, tmp_path):
    _, root = board
    with pytest.raises(PowerError, match="jetson-stats"):
        PowerManager(profile(root, tmp_path, jetson_clocks=False, gpu_freq_mhz=0)).start()
    assert not any(c.startswith("nvpmodel -m") for c in calls(tools))


@pytest.mark.parametrize("breakage, word", [("missing", "missing"), ("directory", "not writable")])
def test_a_missing_or_unwritable_file_is_reported_and_nothing_changes(board, tools, tmp_path, breakage, word):
    _, root = board
    gpu = sysfs.find_gpu(str(root))
    target = gpu.devfreq / "max_freq"
    target.unlink()
    if breakage == "directory":
        target.mkdir()  # root may write any file, so "not writable" is a node that is no file
    gov_before = cpu_values(root, "scaling_governor")
    cfg = profile(root, tmp_path)
    with pytest.raises(PowerError, match=rf"max_freq \({word}\)") as e:
        PowerManager(cfg).start()
    assert "nothing was changed" in str(e.value)
    assert not any("-m" in c for c in calls(tools)), "the power mode must not change either"
    assert cpu_values(root, "scaling_governor") == gov_before
    assert not Path(cfg.state_file).exists()


def test_a_write_that_fails_midway_is_rolled_back(board, tools, tmp_path, monkeypatch):
    """A file that is there and writable but whose write the kernel refuses (sysfs does,
    e.g. EINVAL for a value out of range): what changed before it is undone."""
    _, root = board
    last_cpu = sysfs.cpu_dirs(str(root))[-1] / "scaling_governor"
    real_write = controller._write

    def refusing_write(path, value):
        if path == last_cpu and value == "performance":
            raise PowerError(f"cannot write {value!r} to {path}: Invalid argument")
        real_write(path, value)

    monkeypatch.setattr(controller, "_write", refusing_write)
    gpu_before, gov_before = gpu_range(root), cpu_values(root, "scaling_governor")
    with pytest.raises(PowerError, match=r"Invalid argument"):
        PowerManager(profile(root, tmp_path)).start()
    assert gpu_range(root) == gpu_before, "the GPU lock written before the failure is undone"
    assert "nvpmodel -m 0" in calls(tools), "the mode set before the failure is put back"
    assert cpu_values(root, "scaling_governor") == gov_before


def test_unknown_power_mode_names_the_modes(board, tools, tmp_path):
    _, root = board
    with pytest.raises(PowerError, match=r"not in /etc/nvpmodel\.conf"):
        PowerManager(profile(root, tmp_path, nvpmodel="WARP_SPEED")).start()


def test_mode_by_name_resolves_to_its_id(tools, tmp_path):
    root = make_tree(tmp_path / "root", "orin-nano")
    ctl = SysfsController(str(root))
    modes = ctl.nvpmodel_modes()
    assert modes, "the tree carries the board's nvpmodel.conf"
    mode, name = next(iter(modes.items()))
    assert ctl.nvpmodel_id(name) == mode and ctl.nvpmodel_id(str(mode)) == mode


def test_not_a_jetson_is_read_only(tmp_path):
    root = make_tree(tmp_path / "root", "not-jetson")
    cfg = profile(root, tmp_path)
    ctl = make_controller(cfg)
    assert isinstance(ctl, ReadOnlyController)
    assert "not a Jetson" in ctl.apply(cfg)[0]
    pm = PowerManager(cfg, ctl)
    pm.start()
    pm.close()
    assert not Path(cfg.state_file).exists()


def test_throttling_from_a_hot_zone_and_a_low_clock(board, tools, tmp_path):
    _, root = board
    cfg = profile(root, tmp_path, manage=False, gpu_freq_mhz=600, thermal_limit_c=60)
    t = sysfs.read_telemetry(str(root))
    assert t.temps_c, "the tree has thermal zones"
    zone = next(iter(t.temps_c))
    hot = [
        z
        for z in Path(root, "sys/devices/virtual/thermal").glob("thermal_zone*")
        if (z / "type").read_text().strip() == zone
    ]
    (hot[0] / "temp").write_text("71500\n")
    gpu = sysfs.find_gpu(str(root))
    (gpu.devfreq / "cur_freq").write_text("306000000\n")
    reasons = throttle_reasons(sysfs.read_telemetry(str(root)), cfg)
    assert any(zone in r and "71.5" in r for r in reasons), reasons
    assert any(r.startswith("GPU at 306 MHz") for r in reasons), reasons


# -- the agent's lifetime, as subprocesses --------------------------------------------------


def agent_config(tmp_path: Path, root: Path, endpoint: str) -> Path:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        textwrap.dedent(
            f"""\
            source: {{type: synthetic, fps: 30}}
            publish: {{endpoint: "{endpoint}"}}
            power:
              manage: true
              nvpmodel: "1"
              gpu_freq_mhz: 600
              state_file: {tmp_path / "state" / "power.json"}
              root: {root}
            """
        )
    )
    return cfg


def run_agent(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return run_process(agent_command("run", "--config", str(cfg), "--quiet", *args), timeout_s=60)


def wait_applied(root: Path, proc: subprocess.Popen, endpoint: str, timeout_s: float = 60.0) -> None:
    """Until the agent has locked the GPU and finished applying its power profile: it opens
    its result stream only after that, so its first result marks the end of the writes."""
    from helpers import Subscriber

    sub = Subscriber(endpoint, "det")
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the agent exited ({proc.returncode}): {proc.communicate()[1]}")
            return bool(sub.messages) and gpu_range(root)[0] == gpu_range(root)[1]

        wait_until(ready, timeout_s, interval_s=0.05, message="the agent never locked the GPU and ran")
    finally:
        sub.close()


@pytest.mark.parametrize("ending", ["sigterm", "frames"])
def test_the_agent_restores_on_exit_and_on_sigterm(ending, tools, tmp_path, endpoint):
    root = make_tree(tmp_path / "root", "orin-nano")
    before = gpu_range(root)
    cfg = agent_config(tmp_path, root, endpoint)
    if ending == "frames":
        proc = run_agent(cfg, "--frames", "15")
        assert proc.returncode == 0, proc.stderr
    else:
        with spawn_run(cfg) as proc:
            wait_applied(root, proc, endpoint)
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
    assert gpu_range(root) == before
    assert "nvpmodel -m 0" in calls(tools)
    assert not (tmp_path / "state" / "power.json").exists()


def test_sigkill_then_the_next_agent_start_restores_before_applying(tools, tmp_path, endpoint):
    root = make_tree(tmp_path / "root", "orin-nano")
    before = gpu_range(root)
    cfg = agent_config(tmp_path, root, endpoint)
    with spawn_run(cfg) as proc:
        wait_applied(root, proc, endpoint)
        proc.kill()
        proc.communicate(timeout=20)
    # Another device state sneaks in while the agent is down: the restart must restore
    # the state saved before the first run, not this one.
    put(tools / "nvpmodel.mode", "2")
    n = len(calls(tools))
    again = run_agent(cfg, "--frames", "10")
    assert again.returncode == 0, again.stderr
    assert "never restored" in again.stderr, "the recovery is logged"
    restart_calls = calls(tools)[n:]
    # Recovery (query, back to mode 0) comes before the new snapshot and apply.
    assert restart_calls[:4] == ["nvpmodel -q", "nvpmodel -m 0", "nvpmodel -q", "nvpmodel -m 1"], (
        restart_calls
    )
    assert gpu_range(root) == before and not (tmp_path / "state" / "power.json").exists()


def test_sigkill_then_power_restore_puts_it_back(tools, tmp_path, endpoint):
    root = make_tree(tmp_path / "root", "orin-nano")
    before = gpu_range(root)
    cfg = agent_config(tmp_path, root, endpoint)
    with spawn_run(cfg) as proc:
        wait_applied(root, proc, endpoint)
        proc.kill()  # SIGKILL: nothing runs, the device stays locked
        proc.communicate(timeout=20)
    state_file = tmp_path / "state" / "power.json"
    assert state_file.exists() and gpu_range(root) != before
    saved = json.loads(state_file.read_text())
    assert saved["gpu"]["min_freq"] == str(before[0])
    # `edge-agent power restore` (what the power unit's ExecStop runs) puts it back.
    out = run_process(agent_command("power", "restore", "--config", str(cfg)), timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert gpu_range(root) == before and not state_file.exists()
    assert "nvpmodel -m 0" in calls(tools)
    # And restoring again finds nothing to do.
    again = run_process(agent_command("power", "restore", "--config", str(cfg)), timeout_s=60)
    assert again.returncode == 0 and "nothing to restore" in again.stdout


def test_power_status_here_says_not_a_jetson():
    out = run_process(agent_command("power", "status"), timeout_s=60)
    assert out.returncode == 0, out.stderr
    assert "not a Jetson" in out.stdout
    js = run_process(agent_command("power", "status", "--json"), timeout_s=60)
    report = json.loads(js.stdout)
    assert report["jetson"] is False and report["backend"] == "read-only"


def test_power_apply_and_restore_cli_on_a_tree(tools, tmp_path):
    root = make_tree(tmp_path / "root", "xavier-nx")
    before = gpu_range(root)
    cfg = tmp_path / "p.yaml"
    cfg.write_text(f"power:\n  gpu_freq_mhz: 600\n  state_file: {tmp_path / 's.json'}\n  root: {root}\n")
    run = lambda *a: run_process(agent_command("power", *a, "--config", str(cfg)), timeout_s=60)  # noqa: E731
    applied = run("apply")
    assert applied.returncode == 0, applied.stderr
    assert "GPU locked at" in applied.stdout
    lo, hi = gpu_range(root)
    assert lo == hi
    restored = run("restore")
    assert restored.returncode == 0, restored.stderr
    assert gpu_range(root) == before


def test_throttling_reaches_the_health_stream_and_each_result(tmp_path, const_model, endpoint):
    """manage: false (the unprivileged agent): telemetry is read, nothing is written."""
    from helpers import Subscriber

    from edge_agent.core.config import AgentConfig
    from edge_agent.core.model_config import ModelConfig
    from edge_agent.core.publish_config import PublishConfig
    from edge_agent.core.source_config import SyntheticSourceConfig

    root = make_tree(tmp_path / "root", "orin-nano")
    before = gpu_range(root)
    zone = next(Path(root, "sys/devices/virtual/thermal").glob("thermal_zone*"))
    (zone / "temp").write_text("99000\n")
    cfg = AgentConfig(
        source=SyntheticSourceConfig(fps=30),
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.1),
        power=PowerConfig(root=str(root), thermal_limit_c=80, state_file=str(tmp_path / "s.json")),
    )
    sub = Subscriber(endpoint)
    with started(cfg, sub):
        sub.wait_for(15)
    health = [m for m, t in zip(sub.messages, sub.topics) if t == "health"]
    results = [m for m, t in zip(sub.messages, sub.topics) if t.startswith("det")]
    assert health and results
    power = health[-1]["power"]
    assert power["throttled"] and "99.0 °C" in power["throttle_reasons"][0], power
    assert power["telemetry"]["temps_c"] and power["backend"] == "sysfs"
    assert all(m["throttled"] for m in results), "each result says the device was throttling"
    assert gpu_range(root) == before, "an agent that does not manage power writes nothing"


# -- the jetson-stats backend, against FakeJtop ---------------------------------------------


@pytest.fixture
def jtop_backend(tmp_path, monkeypatch):
    from fakes.fake_jtop import FakeJtopService, fake_jtop_class

    root = make_tree(tmp_path / "root", "orin-nano")
    svc = FakeJtopService()
    ctl = make_controller(PowerConfig(root=str(root)), jtop=fake_jtop_class(svc))
    return root, svc, ctl


def test_jtop_backend_switches_mode_waits_for_it_and_restores(jtop_backend, tmp_path):
    root, svc, ctl = jtop_backend
    assert ctl.name == "jtop"
    cfg = profile(
        root,
        tmp_path,
        nvpmodel="1",
        jetson_clocks=False,
        gpu_freq_mhz=0,
        cpu_governor="",
        fan_mode="manual",
        fan_speed=80,
    )
    pm = PowerManager(cfg, ctl)
    pm.start()
    assert svc.nvpmodel_id == 1, "the asynchronous mode switch is waited for"
    assert svc.jetson_clocks is False and (svc.fan_profile, svc.fan_speed) == ("manual", 80)
    pm.close()
    assert svc.nvpmodel_id == 0 and svc.jetson_clocks is True
    assert svc.fan_profile == "quiet" and svc.fan_speed == 80, (
        "a speed is only restored under the manual profile"
    )
    assert svc.calls.index("nvpmodel=0") < svc.calls.index("jetson_clocks=True"), "the mode comes back first"


def test_jtop_service_down_is_a_power_error(jtop_backend, tmp_path):
    root, svc, ctl = jtop_backend
    svc.running = False
    with pytest.raises(PowerError, match=r"jtop\.service is not active"):
        PowerManager(profile(root, tmp_path, nvpmodel="1", gpu_freq_mhz=0, cpu_governor=""), ctl).start()


def test_a_state_file_that_cannot_be_written_is_named_and_nothing_changes(board, tools, tmp_path):
    import resource

    _, root = board
    cfg = profile(root, tmp_path)
    before = gpu_range(root)
    pm = PowerManager(cfg)
    # A full disk, as the kernel reports it to a writer: no byte more may be written.
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        with pytest.raises(OSError) as err:
            pm.start()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert cfg.state_file in str(err.value), "the error names the state file"
    assert gpu_range(root) == before and calls(tools) == [], "nothing changed without a saved state"


def test_not_a_jetson_starts_where_the_state_file_could_never_be_written(tmp_path):
    # Nothing will change on this machine, so there is no state to keep: the default
    # /var/lib/edge-agent need not exist (here: a folder that cannot be made at all).
    root = make_tree(tmp_path / "root", "not-jetson")
    cfg = profile(root, tmp_path, state_file="/proc/edge-agent-test/power.json")
    pm = PowerManager(cfg)
    pm.start()
    pm.close()
    assert any("not a Jetson" in line for line in pm.applied)


def test_a_state_file_written_before_the_jtop_rename_still_loads(tmp_path):
    """A crash before an upgrade leaves the old key behind; the new agent must restore it."""
    from edge_agent.power.state import load_state

    path = tmp_path / "state.json"
    path.write_text('{"nvpmodel_id": 2, "fan": {"jetson_clocks": true, "profile": "quiet"}}')
    state = load_state(path)
    assert state is not None and state.nvpmodel_id == 2
    assert state.jtop == {"jetson_clocks": True, "profile": "quiet"}
