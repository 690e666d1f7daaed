"""`edge-agent bench --json` as a subprocess: every phase measured, the schema complete."""

from __future__ import annotations

import json
import subprocess

from conftest import agent_command, run_process

from edge_agent.pipelines.handoff import STAGES


def bench(model, endpoint, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(f"model:\n  path: {model}\npublish:\n  endpoint: {endpoint}\n")
    proc = run_process(agent_command("bench", "-c", str(cfg), *args), timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_bench_json_reports_every_phase(const_model, endpoint, tmp_path):
    proc = bench(
        const_model,
        endpoint,
        tmp_path,
        "--frames",
        "80",
        "--source-fps",
        "50",
        "--live-seconds",
        "1",
        "--json",
    )
    r = json.loads(proc.stdout)
    assert r["schema"] == 1 and r["model"] == str(const_model)
    for h in (
        r["pure_inference_ms"],
        r["sequential"]["per_frame_ms"],
        r["pipelined"]["end_to_end_ms"],
        r["live"]["end_to_end_ms"],
        r["live"]["overhead_ms"],
    ):
        assert h["count"] > 0 and 0 < h["p50"] <= h["p99"] <= h["max"], h
    assert r["pure_inference_ms"]["count"] >= 80
    assert r["sequential"]["per_frame_ms"]["count"] == 80
    assert r["pipelined"]["end_to_end_ms"]["count"] >= 80
    assert r["sequential"]["throughput_fps"] > 0 and r["pipelined"]["throughput_fps"] > 0
    for phase in ("pipelined", "live"):
        stages = r[phase]["stages"]
        assert list(stages) == list(STAGES)
        assert abs(sum(s["share"] for s in stages.values()) - 1.0) < 0.01
    c = r["live"]["counts"]
    assert c["captured"] == 50 and c["in_flight"] == 0
    assert c["captured"] == c["on_time"] + c["late"] + c["dropped"]
    assert r["live"]["ladder"]["final_step"] == "full"


def test_bench_human_report_names_the_phases(const_model, endpoint, tmp_path):
    proc = bench(const_model, endpoint, tmp_path, "--frames", "40", "--live-seconds", "0.5")
    for phrase in ("pure inference", "sequential", "pipelined, saturated", "overhead around model", "ladder"):
        assert phrase in proc.stdout, proc.stdout


def test_multi_source_bench_reports_batching_and_each_source(const_model, endpoint, tmp_path):
    args = ("--sources", "3", "--frames", "40", "--source-fps", "40", "--live-seconds", "1")
    r = json.loads(bench(const_model, endpoint, tmp_path, *args, "--json").stdout)
    assert r["mode"] == "multi-source" and r["sources"] == 3
    assert set(r["inference_per_frame_ms"]) == {"1", "2", "3"}
    assert all(ms > 0 for ms in r["inference_per_frame_ms"].values())
    sat = r["saturated"]
    assert sat["single_source_fps"] > 0 and sat["unbatched_fps"] > 0 and sat["batched_fps"] > 0
    assert sat["gain_from_batching"] == round(sat["batched_fps"] / sat["unbatched_fps"], 3)
    # At most one frame per camera in a batch, and every frame in exactly one batch.
    assert sat["batches"]["max_batch"] == 3 and set(sat["batches"]["sizes"]) <= {"1", "2", "3"}
    assert sum(int(k) * v for k, v in sat["batches"]["sizes"].items()) == 3 * 40, sat["batches"]
    live = r["live"]
    assert set(live["per_source"]) == {"cam0", "cam1", "cam2"}
    for name, src in live["per_source"].items():
        c = src["counts"]
        # About 1 s at 40 fps, not an unpaced camera's hundreds (a loaded machine may start a
        # camera late: fewer; "seconds" starts once the agent has started: a little more).
        assert 0 < c["captured"] <= 1.5 * 40 * live["seconds"] + 2 and c["in_flight"] == 0, (name, c)
        assert src["source_fps"] == 40
        assert c["captured"] == c["on_time"] + c["late"] + c["dropped"]
        h = src["end_to_end_ms"]
        assert h["count"] == c["on_time"] + c["late"] and h["p50"] <= h["p99"], h
    assert sum(int(k) * v for k, v in live["batches"]["sizes"].items()) == sum(
        s["counts"]["on_time"] + s["counts"]["late"] for s in live["per_source"].values()
    ), "every published frame ran in exactly one batch"
    text = bench(const_model, endpoint, tmp_path, *args).stdout
    assert "from batching" in text and "cam2" in text


def test_bench_of_a_config_with_several_sources_keeps_their_rates(const_model, endpoint, tmp_path):
    cfg = tmp_path / "multi.yaml"
    cfg.write_text(
        f"model: {{path: {const_model}}}\npublish: {{endpoint: {endpoint}}}\n"
        "sources:\n  - {name: front, fps: 40, priority: 5, budget_ms: 30}\n  - {name: side, fps: 10}\n"
    )
    cmd = agent_command("bench", "-c", str(cfg), "--frames", "30", "--live-seconds", "1", "--json")
    proc = run_process(cmd, timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    front, side = r["live"]["per_source"]["front"], r["live"]["per_source"]["side"]
    assert (front["source_fps"], front["priority"], front["budget_ms"]) == (40, 5, 30)
    assert (side["source_fps"], side["budget_ms"]) == (10, 50)
    # Each at its own rate (as above, give or take the start), and the 40 fps camera gives
    # more than the 10 fps one (4x, less what a late start on a loaded machine takes).
    seconds = r["live"]["seconds"]
    assert front["counts"]["captured"] <= 1.5 * 40 * seconds + 2, front["counts"]
    assert side["counts"]["captured"] <= 1.5 * 10 * seconds + 2, side["counts"]
    assert front["counts"]["captured"] > side["counts"]["captured"] > 0


def test_bench_runs_beside_an_agent_on_the_same_config(const_model, endpoint, tmp_path):
    """A service runs the config; bench on that same config must not need its socket."""
    from conftest import spawn_run, wait_until
    from test_pipeline import Subscriber

    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"model: {{path: {const_model}}}\npublish: {{endpoint: '{endpoint}'}}\nmetrics: {{port: 0}}\n"
    )
    health = Subscriber(endpoint, "health")
    try:
        with spawn_run(cfg):
            wait_until(lambda: health.messages, 60, message="the agent publishes on its endpoint")
            cmd = agent_command("bench", "-c", str(cfg), "--frames", "20", "--live-seconds", "0.5", "--json")
            proc = run_process(cmd, timeout_s=120)
            assert proc.returncode == 0, proc.stderr[-2000:]
            beats = len(health.messages)
            wait_until(lambda: len(health.messages) > beats, 30, message="the agent still publishes")
    finally:
        health.close()
    assert json.loads(proc.stdout)["live"]["counts"]["captured"] > 0
