"""Running as a service: the main loop under systemd, reload on SIGHUP, and installing the units.

The main thread owns the agent's lifetime. It reports READY=1 only after the models are
loaded and warmed up and the stages run, pings the watchdog while the agent does its job
(every stage thread alive and progressing, none failed: a stage stuck in a backend or a
driver stops the pings, and systemd kills and restarts the agent), keeps STATUS= current
(a camera that is down is named there), and on SIGHUP reloads: the new config is
validated and prepared while the old one still runs, and a bad one is refused with the
old config kept.

A camera outage does not stop the pings: the camera is retried on schedule, and a
restart would not bring it back sooner (with a camera down at boot it would only loop).
``service.stall_watchdog_s`` makes a long one stop them, for those who want a restart.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.core.files import atomic_write
from edge_agent.service.sdnotify import Notifier

log = logging.getLogger(__name__)

UNITS = ("edge-agent.service", "edge-agent-power.service", "edge-agent-uplink.service")
UNIT_PACKAGE = "edge_agent.systemd"  # the repo's systemd/ folder, installed as package data


class Signals:
    """SIGINT/SIGTERM → stop, SIGHUP → reload; handlers only set events."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.reload = threading.Event()
        self.received = ""

    def install(self) -> None:
        def on_stop(signum: int, _frame: Any) -> None:
            self.received = signal.Signals(signum).name
            self.stop.set()

        signal.signal(signal.SIGINT, on_stop)
        signal.signal(signal.SIGTERM, on_stop)
        signal.signal(signal.SIGHUP, lambda *_: self.reload.set())


def e2e_text(window: dict[str, Any], width: int = 0, digits: int = 1) -> str:
    """A heartbeat window's end-to-end p50 and p99; dashes for a second without a published
    frame (its zeros would read as a fast agent, not an idle one)."""
    if window.get("count"):
        p50, p99 = (f"{window[q]:{width}.{digits}f}" for q in ("p50", "p99"))
    else:
        p50 = p99 = f"{'–':>{width}}"
    return f"e2e p50 {p50} ms p99 {p99} ms"


def status_text(beat: dict[str, Any]) -> str:
    c = beat["counts"]
    return (
        f"{beat['fps']:.1f} fps, {e2e_text(beat['latency_ms']['window'])}, "
        f"late {c['late']}, dropped {c['dropped']}, ladder {beat['ladder']['name']}"
    )


class Supervisor:
    """The main loop: status, watchdog, reload, and the end conditions of ``run``."""

    def __init__(
        self,
        agent: Any,
        notifier: Notifier,
        signals: Signals,
        load_config: Callable[[], Any],
        duration_s: float = 0.0,
        on_beat: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.agent = agent
        self.notifier = notifier
        self.signals = signals
        self.load_config = load_config
        self.duration_s = duration_s
        self.on_beat = on_beat
        self.reloads = 0
        self.refused_reloads = 0
        self._last_ping = 0.0
        self._captured = -1  # frames from every source, at the last check ...
        self._captured_at = time.monotonic()  # ... and when that count last grew
        self.withheld = ""  # why the last ping was withheld ("" when it was sent)

    def run(self) -> None:
        agent, n = self.agent, self.notifier
        n.ready("running " + ", ".join(f"{s.name} ({s.type})" for s in agent.config.source_list()))
        t0 = time.monotonic()
        shown = 0
        interval = n.watchdog_interval_s()
        while not self.signals.stop.is_set():
            self.signals.stop.wait(0.1)
            if self.signals.reload.is_set():
                self.signals.reload.clear()
                self.reload()
            if agent.pipeline.breaker.is_set():
                with self._watchdog_fed():  # a recovery can load models for a while
                    action = agent.recover()
                self.notifier.status("inference failing: " + action)
                if agent.pipeline.error is not None:
                    break
            pipeline, health = agent.pipeline, agent.health
            if pipeline.finished.is_set() or (self.duration_s and time.monotonic() - t0 >= self.duration_s):
                break
            if health.beats > shown:
                shown = health.beats
                n.status(status_text(health.latest) + _outages(health.latest_by_source))
                if self.on_beat is not None:
                    self.on_beat(health.latest)
            if interval and time.monotonic() - self._last_ping >= interval:
                self.watchdog()
        n.stopping()

    def watchdog(self) -> None:
        """Ping if the agent is doing its job (see ``unhealthy``); say once why not."""
        why = self.unhealthy()
        if not why:
            self.notifier.watchdog()
            self._last_ping = time.monotonic()
        elif why != self.withheld:
            log.error("watchdog: pings withheld (systemd will restart the agent): %s", why)
        self.withheld = why

    def unhealthy(self) -> str:
        """Why the agent is not doing its job, or "" when it is: a stage failed, a stage
        thread is stuck, or (with ``service.stall_watchdog_s``) no source delivered."""
        pipeline, svc = self.agent.pipeline, self.agent.config.service
        if pipeline.error is not None:
            return pipeline.error
        publisher = self.agent.publisher
        if publisher is not None and publisher.error:
            return publisher.error
        stuck = pipeline.stuck_stages(svc.stage_timeout_s)
        if stuck:
            return f"stage thread(s) {', '.join(stuck)} made no progress for {svc.stage_timeout_s:g} s"
        now = time.monotonic()
        captured = pipeline.figures().captured
        if captured != self._captured:
            self._captured, self._captured_at = captured, now
        if svc.stall_watchdog_s and now - self._captured_at > svc.stall_watchdog_s:
            return f"no frame from any source for {now - self._captured_at:.0f} s (service.stall_watchdog_s)"
        return ""

    def reload(self) -> bool:
        from edge_agent.core.configload import ConfigError

        self.notifier.reloading()
        # Preparing the new config (a model, perhaps an engine build) can take longer than
        # the watchdog: the old pipeline still runs meanwhile, so its frames keep it fed.
        try:
            with self._watchdog_fed():
                new = self.load_config()
                changed = self.agent.reload(new)
        except Exception as e:  # whatever went wrong, the running config stays
            self.refused_reloads += 1
            # ... but a revoked CURVE key must not wait for a valid config.
            if self.agent.publisher is not None:
                try:
                    self.agent.publisher.refresh_clients()
                except Exception:
                    log.exception("reload: re-reading the allowed CURVE clients failed")
            # An expected refusal says why in its message; anything else keeps its traceback.
            expected = isinstance(e, (ConfigError, RuntimeError, OSError, ValueError))
            log.error("reload refused, the running config stays: %s", e, exc_info=not expected)
            self.notifier.ready("reload refused: " + str(e).splitlines()[0][:200])
            return False
        self.reloads += 1
        self.notifier.ready(f"reloaded ({', '.join(changed) or 'no change'})")
        return True

    @contextlib.contextmanager
    def _watchdog_fed(self):
        """Ping the watchdog from a helper thread while the main thread is busy (the
        running pipeline keeps publishing meanwhile, so the pings stay truthful)."""
        done = threading.Event()
        feeder = threading.Thread(target=self._feed_watchdog, args=(done,), name="watchdog-busy")
        feeder.start()
        try:
            yield
        finally:
            done.set()
            feeder.join()

    def _feed_watchdog(self, done: threading.Event) -> None:
        interval = self.notifier.watchdog_interval_s()
        while interval and not done.wait(interval):
            self.watchdog()


def _outages(beats: dict[str, dict[str, Any]]) -> str:
    """The sources that are down now, for STATUS= ("; cam0 down: read failed ...")."""
    down = [
        f"; {name} down: {state.get('last_error') or 'connecting'}"
        for name, beat in beats.items()
        if (state := beat.get("source_state", {})).get("connected") is False
    ]
    return "".join(down)


# -- installing -------------------------------------------------------------------------


def install_steps(
    prefix: str, config: str, user: str = "edge-agent", uplink: bool = False
) -> list[list[str] | tuple[str, str]]:
    """What ``service install`` does, in order: commands, and ("copy", dest) for units.
    Every unit is written; the uplink's is enabled only when asked (it needs a broker)."""
    venv = _venv()
    steps: list[Any] = []
    if (
        shutil.which("getent") is None
        or subprocess.run(["getent", "passwd", user], capture_output=True).returncode
    ):
        steps.append(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user])
    for group in ("video", "render"):  # GPU and camera nodes on JetPack
        steps.append(["usermod", "-aG", group, user])
    steps.append(["install", "-d", "-o", user, "-g", user, "/var/lib/edge-agent", "/var/cache/edge-agent"])
    steps.append(["install", "-d", str(Path(config).parent)])
    for unit in UNITS:
        steps.append(("copy", str(Path(prefix) / unit)))
    steps.append(["systemctl", "daemon-reload"])
    steps.append(["systemctl", "enable", "edge-agent.service"])
    if uplink:
        steps.append(["systemctl", "enable", "edge-agent-uplink.service"])
    steps.append(("note", f"units run {venv}/bin/edge-agent with --config {config}"))
    return steps


def _venv() -> str:
    """The environment whose ``bin/edge-agent`` the units run (this interpreter's)."""
    return str(Path(sys.executable).parent.parent)  # not resolved: a venv's python is a symlink


def unit_text(name: str) -> str:
    """A unit file as shipped in the package (the repo's systemd/ folder)."""
    try:
        units = importlib.resources.files(UNIT_PACKAGE)
    except ModuleNotFoundError as e:  # an editable install made before the units were package data
        raise RuntimeError(
            f"the systemd unit files are not installed ({e}); reinstall edge-agent "
            "(an editable install made before they were package data needs `pip install -e .` again)"
        ) from e
    return units.joinpath(name).read_text()


def render_unit(name: str, config: str) -> str:
    """A unit file with this installation's paths in place of /opt/edge-agent/.venv."""
    text = unit_text(name)
    venv = _venv()
    return text.replace("/opt/edge-agent/.venv", venv).replace("/etc/edge-agent/agent.yaml", config)


def install(
    prefix: str = "/etc/systemd/system",
    config: str = "/etc/edge-agent/agent.yaml",
    dry_run: bool = False,
    uplink: bool = False,
) -> int:
    if not dry_run and os.geteuid() != 0:
        print("edge-agent: service install needs root (or --dry-run)", file=sys.stderr)
        return 1
    # Rendered before any step runs: a missing unit file fails the install before it
    # has created a user or changed anything.
    units = {unit: render_unit(unit, config) for unit in UNITS}
    for step in install_steps(prefix, config, uplink=uplink):
        if isinstance(step, tuple):
            kind, what = step
            if kind == "note":
                print(f"# {what}")
                continue
            text = units[Path(what).name]
            print(f"write {what}")
            if dry_run:  # what would be written, indented under its path
                print("".join(f"    {line}" if line.strip() else line for line in text.splitlines(True)))
            else:
                atomic_write(what, text.encode(), mode=0o644)  # systemd and `systemctl cat` read it
            continue
        print(" ".join(step))
        if not dry_run:
            subprocess.run(step, check=step[0] not in ("usermod",))
    if not Path(config).exists():
        print(f"# no config at {config} yet: the agent runs its embedded default until you write one")
    return 0
