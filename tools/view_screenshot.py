"""A screenshot of the live view with zones and lines (issue 33), for the docs.

    .venv/bin/python tools/view_screenshot.py            # -> docs/images/analytics-view.png

Runs an agent on its embedded default (synthetic camera, bundled detector) with the view
on, two zones and a line (fractions of the frame), waits until every zone has seen an entry
and the line a crossing (from the heartbeat, ``/api/health``) and it has run ``--settle-s``
(counts of a few passes, not of the first), then has headless Chromium render the view's
page (``CHROMIUM``, else ``chromium`` or ``chromium-browser`` on PATH), niced, and once
its start is over (its load on a small machine would show in the page's figures). A shot
during which the agent still missed frames is taken again, up to ``--tries``. Its ports
are free ones, so it runs beside an agent already on the defaults.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

from agent_process import stop_group

from edge_agent.core.analytics_config import AnalyticsConfig, LineConfig, ZoneConfig
from edge_agent.core.config import AgentConfig
from edge_agent.core.endpoint_config import MetricsConfig, ViewConfig
from edge_agent.service.runner import Agent

REPO = Path(__file__).resolve().parents[1]
BROWSER_START_S = 3.0  # the browser's start, its load spent, before it asks for the page
ANALYTICS = AnalyticsConfig(
    zones=(
        ZoneConfig(name="shelf", points=((0.06, 0.14), (0.42, 0.14), (0.42, 0.55), (0.06, 0.55))),
        ZoneConfig(name="dock", points=((0.58, 0.52), (0.94, 0.46), (0.94, 0.92), (0.62, 0.92))),
    ),
    lines=(LineConfig(name="gate", points=((0.5, 0.06), (0.5, 0.94)), in_side="left"),),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chromium() -> str:
    found = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        sys.exit("view_screenshot: no Chromium (set CHROMIUM, or install chromium; docs/testing.md)")
    return found


def heartbeat(url: str) -> dict:
    return json.loads(urllib.request.urlopen(url + "api/health", timeout=10).read()).get("cam0", {})


def counted(beat: dict) -> bool:
    """Every zone has had an entry and the line a crossing."""
    a = beat.get("analytics") or {}
    zones, lines = a.get("zones", {}), a.get("lines", {})
    entered = [sum(zones.get(z.name, {}).get("entered", {}).values()) for z in ANALYTICS.zones]
    crossed = [
        sum(v for d in ("in", "out") for v in lines.get(ln.name, {}).get(d, {}).values())
        for ln in ANALYTICS.lines
    ]
    return all(entered) and all(crossed)


def missed(beat: dict) -> int:
    """Frames late or dropped since the start."""
    counts = beat.get("counts", {})
    return counts.get("late", 0) + sum(counts.get("dropped_by_reason", {}).values())


@contextlib.contextmanager
def delayed(url: str, delay_s: float, then: Callable[[], object]) -> Iterator[str]:
    """A URL that redirects to ``url`` ``delay_s`` after it was asked for, calling ``then``
    first: the browser's start (a burst of load on a small machine) is over before the page
    takes its figures (a pending request holds the browser's virtual time)."""

    class Redirect(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(delay_s)
            then()
            self.send_response(302)
            self.send_header("Location", url)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirect)
    thread = threading.Thread(target=server.serve_forever, name="redirect")
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5.0)


def screenshot(
    url: str, out: Path, size: tuple[int, int], timeout_s: float, loads: Callable[[], object]
) -> None:
    """Chromium renders ``url`` into ``out`` (PNG), ``loads()`` called just before it asks
    for the page; its whole process group ended after."""
    # niced: the page shows the agent's figures, which the browser's own load would spoil
    nice = ["nice", "-n", "10"] if shutil.which("nice") else []
    with tempfile.TemporaryDirectory() as profile, delayed(url, BROWSER_START_S, loads) as start_url:
        args = [
            *nice,
            chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            "--virtual-time-budget=5000",  # the page's stream and first heartbeats come in
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={out}",
            start_url,
        ]
        proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
        )
        try:
            _, err = proc.communicate(timeout=timeout_s)
        finally:
            stop_group(proc, 5.0)
    if not out.is_file():
        sys.exit(f"view_screenshot: Chromium wrote no screenshot:\n{err.decode(errors='replace')[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "docs/images/analytics-view.png")
    ap.add_argument("--size", default="700x830", help="the browser window, WIDTHxHEIGHT")
    ap.add_argument("--wait-s", type=float, default=180.0, help="at most this long for the counts")
    ap.add_argument("--settle-s", type=float, default=20.0, help="run at least this long first")
    ap.add_argument("--tries", type=int, default=3, help="shots at most, while frames are missed in them")
    args = ap.parse_args()
    size = tuple(int(v) for v in args.size.split("x"))
    default = AgentConfig()
    port = free_port()
    cfg = replace(
        default,
        source=replace(default.source, analytics=ANALYTICS),
        publish=replace(default.publish, endpoint=f"tcp://127.0.0.1:{free_port()}"),
        metrics=MetricsConfig(enabled=False),
        view=ViewConfig(enabled=True, port=port),
    )
    url = f"http://127.0.0.1:{port}/"
    agent = Agent(cfg)
    agent.build()
    agent.start()
    try:
        start = time.monotonic()
        end = start + args.wait_s
        while not counted(heartbeat(url)) or time.monotonic() < start + args.settle_s:
            if time.monotonic() > end:
                sys.exit(f"view_screenshot: no entry in every zone and crossing within {args.wait_s:g} s")
            time.sleep(0.5)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        before: list[int] = []  # frames missed when the browser asked for the page
        for attempt in range(1, args.tries + 1):
            args.out.unlink(missing_ok=True)
            screenshot(url, args.out, size, 120.0, lambda: before.append(missed(heartbeat(url))))
            time.sleep(1.5)  # the heartbeat after the shot (one a second)
            late = missed(heartbeat(url)) - before[-1]
            if late <= 2:
                break
            # the page would show the machine's load (the browser's), not the agent's figures
            again = "taking it again" if attempt < args.tries else "kept as it is"
            print(f"view_screenshot: {late} frames missed while the browser ran (try {attempt}): {again}")
    finally:
        agent.stop()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
