"""Issue 43, trial 4: `fleet status` against retained healths that are valid JSON but hold
numbers out of range, or are far too large. One bad device is shown ``invalid``; every
other device still prints, in the table, with --json and with --watch. Real Mosquitto, the
real CLI."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from broker import Mosquitto
from conftest import agent_command, read_line, run_process, spawn
from test_uplink_foreign_input import _retain, good_health

from edge_agent.service.uplink.status import health_problem, safe_row, table

HUGE = 10**4299  # 4300 digits: Python's int-to-string limit


@pytest.fixture
def broker(tmp_path):
    with Mosquitto(tmp_path) as b:
        yield b


def huge_health(now: float) -> bytes:
    """Valid JSON whose sources' events sum past what str() may print."""
    sources = {f"cam{i}": {"fps": 1.0, "events": HUGE} for i in range(10)}
    return json.dumps(good_health(now) | {"sources": sources}).encode()


def retain_fleet(broker: Mosquitto, bad: dict[str, bytes]) -> None:
    now = time.time()
    messages = {f"edge-agent/{d}/health": p for d, p in bad.items()}
    for d in ("good1", "good2"):
        messages[f"edge-agent/{d}/health"] = json.dumps(good_health(now)).encode()
    for d in [*bad, "good1", "good2"]:
        messages[f"edge-agent/{d}/status"] = b"online"
    _retain(broker, messages)


def rows_of(stdout: str) -> dict[str, str]:
    return {line.split()[0]: line for line in stdout.splitlines()[1:] if line.strip() and line[0] != " "}


def test_a_huge_integer_in_one_health_leaves_every_other_device_printed(broker):
    retain_fleet(broker, {"huge": huge_health(time.time())})
    out = run_process(agent_command("fleet", "status", "--broker", broker.url), 60)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = rows_of(out.stdout)
    assert rows["huge"].split()[1] == "invalid", rows["huge"]
    assert rows["good1"].split()[1] == "online" and "30.0" in rows["good1"], out.stdout
    assert rows["good2"].split()[1] == "online", out.stdout
    js = run_process(agent_command("fleet", "status", "--broker", broker.url, "--json"), 60)
    assert js.returncode == 0, js.stderr[-2000:]
    found = {r["device"]: r for r in json.loads(js.stdout.splitlines()[-1])}
    assert found["huge"]["status"] == "invalid" and "range" in found["huge"]["error"]
    assert found["good1"]["status"] == found["good2"]["status"] == "online"
    command = agent_command("fleet", "status", "--broker", broker.url, "--watch")
    with spawn(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        lines = [read_line(proc.stdout, 30) for _ in range(8)]
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    watched = rows_of("".join(lines))
    assert watched["huge"].split()[1] == "invalid" and watched["good2"].split()[1] == "online", lines


def test_oversized_healths_are_marked_and_the_settle_waits_for_the_rest(broker):
    """Trial 4: with 20 MB retained healths, a table run ended its settle early and showed
    devices online with blank cells; now each is skipped unread and marked, and every
    other device prints whole."""
    now = time.time()
    big = json.dumps(good_health(now) | {"model": "m" * (20 << 20)}).encode()
    retain_fleet(broker, {f"big{i}": big for i in range(3)})
    out = run_process(agent_command("fleet", "status", "--broker", broker.url, "--json"), 120)
    assert out.returncode == 0, out.stderr[-2000:]
    found = {r["device"]: r for r in json.loads(out.stdout.splitlines()[-1])}
    for i in range(3):
        row = found[f"big{i}"]
        assert row["status"] == "invalid" and "too large" in row["error"], row
    for d in ("good1", "good2"):
        assert found[d]["status"] == "online" and found[d]["fps"] == 30.0, found[d]


NUMBERS: list[tuple[str, Any]] = [
    ("ts_unix_s", 2.0**53),
    ("agent_silent_s", -1.0),
    ("events_interval_s", 10**30),
    ("health_interval_s", -5),
]
SOURCE_NUMBERS: list[tuple[str, Any]] = [
    pytest.param("events", HUGE, id="events-10**4299"),
    ("events", 2**53),
    ("fps", 1e300),
    ("fps", -1.0),
    ("miss_rate", -0.5),
    ("e2e_p99_ms", 2**60),
]


@pytest.mark.parametrize("key, value", NUMBERS)
def test_a_number_out_of_range_makes_the_row_invalid(key, value):
    now = time.time()
    health = good_health(now) | {key: value}
    assert health_problem(health, now + 1e6) is not None
    r = safe_row("d", "online", health, now)
    assert r["status"] == "invalid" and key in r["error"], r
    table([r])


@pytest.mark.parametrize("key, value", SOURCE_NUMBERS)
def test_a_source_number_out_of_range_makes_the_row_invalid(key, value):
    now = time.time()
    health = good_health(now) | {"sources": {"cam0": {"fps": 1.0, key: value}}}
    r = safe_row("d", "online", health, now)
    assert r["status"] == "invalid" and key in r["error"], r
    json.dumps([r])
    table([r, safe_row("ok", "online", good_health(now), now)])
