"""A real RTSP camera that dies and comes back, under a fake systemd (slow: ``-m slow``).

tools/rtsp_server.py (gst-rtsp-server, under the system Python) is the camera. The agent
runs as ``edge-agent run`` with NOTIFY_SOCKET and a 10 s WATCHDOG_USEC; the test kills the
server for 15 s, starts it again on the same port, and then checks what systemd and a
consumer would have seen: watchdog pings all along (the outage included: a camera outage
is no reason for systemd to restart the agent), results again soon after the camera
returns, every frame accounted for, sequence numbers without gaps, a clean exit.

``pytest -s -m slow tests/pipelines/sources/test_rtsp_live.py`` prints a timeline of the run; with
EDGE_AGENT_TIMELINE=FILE it is also written to FILE.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, agent_command, free_endpoint, spawn, wait_until
from helpers import NotifySocket, Subscriber

SYSTEM_PYTHON = "/usr/bin/python3"
SERVER = REPO / "tools" / "rtsp_server.py"

WATCHDOG_USEC = 10_000_000
# systemd's watchdog fires after WATCHDOG_USEC without a ping; the agent pings every third
# of it, so no gap may exceed half of it (the bar).
PING_GAP_LIMIT_S = WATCHDOG_USEC / 2e6
FLOWING_S, OUTAGE_S, AFTER_S = 5.0, 15.0, 10.0
# Back within: the last retry's backoff (up to retry_max_s, 1.5 s) and an FFmpeg open
# (about 1 s: it probes the stream and waits for a keyframe).
RESUME_WITHIN_S = 3.0


def gst_rtsp_missing() -> str:
    """Why the system Python cannot run the server ('' when it can)."""
    probe = "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer"
    try:
        r = subprocess.run([SYSTEM_PYTHON, "-c", probe], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return r.stderr.strip().splitlines()[-1] if r.returncode else ""


@contextlib.contextmanager
def rtsp_server(port: int, timeout_s: float = 30.0):
    """The test camera on ``port`` (0: any), yielding (process, url) once it serves."""
    args = [SYSTEM_PYTHON, str(SERVER), "--port", str(port), "--fps", "30", "--size", "640x480"]
    with spawn(args, stdout=subprocess.PIPE, text=True) as proc:
        ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
        line = proc.stdout.readline() if ready else ""
        assert line.startswith("READY "), f"the RTSP server did not start: {line!r}, rc {proc.poll()}"
        yield proc, line.split()[1]


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL, as a camera that loses power: no RTSP TEARDOWN, no TCP goodbye it chose."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


class Recorder(Subscriber):
    """Every message on the publish endpoint (results and heartbeats), with its arrival time."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint, "", keep_all=True)

    def _entries(self, health: bool) -> list[tuple[float, dict[str, Any]]]:
        n = len(self.messages)  # appended last by the receiving thread: a consistent prefix
        rows = zip(self.arrivals[:n], self.topics[:n], self.messages[:n])
        return [(t, m) for t, topic, m in rows if (topic == "health") == health]

    @property
    def results(self) -> list[tuple[float, dict[str, Any]]]:
        return self._entries(health=False)

    @property
    def beats(self) -> list[tuple[float, dict[str, Any]]]:
        return self._entries(health=True)


def first(entries, after: float, test) -> tuple[float, dict[str, Any]] | None:
    return next(((t, m) for t, m in entries if t >= after and test(m)), None)


def drops(beat: tuple[float, dict[str, Any]] | None) -> dict[str, int]:
    return beat[1]["counts"]["dropped_by_reason"] if beat else {}


@pytest.mark.slow
def test_camera_outage_keeps_the_watchdog_fed_and_every_frame_accounted(tmp_path, const_model):
    missing = gst_rtsp_missing()
    if missing:
        pytest.skip(
            f"{SYSTEM_PYTHON} cannot import GstRtspServer ({missing}): apt-get install "
            "gir1.2-gst-rtsp-server-1.0 gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly"
        )
    endpoint = free_endpoint()
    notify = NotifySocket(tmp_path, abstract=True)
    rec = Recorder(endpoint)
    log_path = tmp_path / "agent.log"
    env = {**os.environ, "NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": str(WATCHDOG_USEC)}
    env.pop("WATCHDOG_PID", None)
    marks: dict[str, float] = {}
    try:
        with contextlib.ExitStack() as servers:
            server, url = servers.enter_context(rtsp_server(0))
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            cfg = tmp_path / "agent.yaml"
            cfg.write_text(
                "device_id: rtsp-live\n"
                f"source: {{type: rtsp, name: cam, url: '{url}', transport: tcp,"
                " stall_timeout_s: 2, retry_initial_s: 0.5, retry_max_s: 1.5}\n"
                f"model: {{path: '{const_model}'}}\n"
                f"publish: {{endpoint: '{endpoint}', health_interval_s: 0.2, send_hwm: 100000,"
                " wait_for_subscribers: 1, subscriber_timeout_s: 60}\n"
                "metrics: {enabled: false}\n"
            )
            with (
                log_path.open("w") as log,
                spawn(agent_command("run", "--config", str(cfg), "--quiet"), stderr=log, env=env) as agent,
            ):
                t0 = marks["start"] = time.monotonic()
                alive = lambda: agent.poll() is None  # noqa: E731
                wait_until(lambda: "READY" in notify.names() or not alive(), 120, message="READY=1")
                wait_until(lambda: rec.results or not alive(), 60, message="a first result")
                assert alive(), f"the agent exited early ({agent.returncode}): {log_path.read_text()[-3000:]}"
                time.sleep(FLOWING_S)
                kill(server)
                marks["server killed"] = time.monotonic()
                time.sleep(OUTAGE_S)
                servers.close()  # (its process is already gone)
                servers.enter_context(rtsp_server(port))
                marks["server back"] = time.monotonic()
                time.sleep(AFTER_S)
                marks["stop"] = time.monotonic()
                agent.send_signal(signal.SIGTERM)
                returncode = agent.wait(60)
            marks["exited"] = time.monotonic()
        wait_until(lambda: "STOPPING" in notify.names(), 10, message="STOPPING=1")
        wait_until(lambda: any(m.get("final") for _, m in rec.beats), 10, message="the final heartbeat")
    finally:
        notify.close()
        rec.close()

    # -- what happened, in order ----------------------------------------------------------
    killed, back = marks["server killed"], marks["server back"]
    pings = [t for t, m in notify.messages if "WATCHDOG" in m]
    ready_at = next(t for t, m in notify.messages if "READY" in m)
    stopping_at = next((t for t, m in notify.messages if "STOPPING" in m), marks["exited"])
    lost = first(rec.beats, killed, lambda m: not m["source_state"].get("connected", True))
    found = first(rec.beats, back, lambda m: m["source_state"].get("connected"))
    resumed = next(((t, m) for t, m in rec.results if m["capture_mono_ns"] >= back * 1e9), None)
    before_kill = next((b for b in reversed(rec.beats) if b[0] < killed), None)
    before_back = next((b for b in reversed(rec.beats) if b[0] < back), None)
    settled = first(rec.beats, (found[0] if found else back) + 3.0, lambda m: True)
    final = next(m for _, m in rec.beats if m.get("final"))

    at = lambda t: f"{t - t0:7.2f} s"  # noqa: E731
    lines = [
        f"{at(ready_at)}  READY=1",
        f"{at(rec.results[0][0])}  first result",
        f"{at(killed)}  server killed (SIGKILL); drops so far {drops(before_kill)}",
        f"{at(lost[0])}  source disconnected: {lost[1]['source_state'].get('last_error')!r}"
        if lost
        else "           source never reported disconnected",
        "           watchdog pings during the outage: "
        + (", ".join(f"{t - t0:.1f}" for t in pings if killed <= t <= back) or "none"),
        f"{at(back)}  server back on port {port}; drops so far {drops(before_back)}",
        f"{at(found[0])}  reconnected, says a heartbeat (failures {found[1]['source_state'].get('failures')})"
        if found
        else "           source never reported reconnected",
        f"{at(resumed[0])}  first result after (captured at {at(resumed[1]['capture_mono_ns'] / 1e9)})"
        if resumed
        else "           no result after the server came back",
        f"           drops 3 s after reconnecting {drops(settled)}",
        f"{at(marks['stop'])}  SIGTERM",
        f"{at(stopping_at)}  STOPPING=1; exit code {returncode}",
        f"           final counts {final['counts']}",
        f"           source state {final['source_state']}",
        f"           watchdog pings at {', '.join(f'{t - t0:.1f}' for t in pings)}",
    ]
    timeline = "timeline (seconds since the agent started):\n" + "\n".join(lines)
    print("\n" + timeline)
    if os.environ.get("EDGE_AGENT_TIMELINE"):
        Path(os.environ["EDGE_AGENT_TIMELINE"]).write_text(timeline + "\n")

    # -- what systemd and a consumer need (every failure reported at once) ----------------
    problems = []
    alive = [ready_at, *pings, stopping_at]
    gaps = [(a, b) for a, b in itertools.pairwise(alive) if b - a > PING_GAP_LIMIT_S]
    if gaps:
        problems.append(
            f"(a) watchdog silent for longer than {PING_GAP_LIMIT_S} s: "
            + ", ".join(f"{at(a).strip()} to {at(b).strip()} ({b - a:.1f} s)" for a, b in gaps)
        )
    if resumed is None or resumed[1]["capture_mono_ns"] / 1e9 - back > RESUME_WITHIN_S:
        problems.append(f"(b) no result captured within {RESUME_WITHIN_S} s of the server's return")
    c = final["counts"]
    if c["captured"] != c["on_time"] + c["late"] + c["dropped"] or c["in_flight"]:
        problems.append(f"(c) frames unaccounted for in the final heartbeat: {c}")
    seqs = [m["seq"] for _, m in rec.results]
    if seqs != list(range(len(seqs))):
        holes = [(a, b) for a, b in itertools.pairwise(seqs) if b != a + 1]
        problems.append(f"(d) seq not continuous from 0: first {seqs[:1]}, jumps {holes[:10]}")
    if len(seqs) != c["on_time"] + c["late"]:
        problems.append(f"(d) {len(seqs)} results arrived, {c['on_time'] + c['late']} published")
    if returncode != 0:
        problems.append(f"(e) exit code {returncode}")
    if problems:
        problems.append("agent log tail:\n" + log_path.read_text()[-3000:])
    assert not problems, "\n".join(problems)
