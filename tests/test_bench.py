"""`edge-agent bench --json` as a subprocess: every phase measured, the schema complete."""

from __future__ import annotations

import json
import subprocess
import sys

from edge_agent.pipelines.handoff import STAGES


def bench(model, endpoint, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(f"model:\n  path: {model}\npublish:\n  endpoint: {endpoint}\n")
    cmd = [sys.executable, "-m", "edge_agent", "bench", "-c", str(cfg), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
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
