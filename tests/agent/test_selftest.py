"""`edge-agent selftest` and `engine build` where TensorRT is absent (this machine)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import agent_command, run_process

from edge_agent.evaluation import FrameResult
from edge_agent.selftest import compare


def test_selftest_checks_what_it_can_and_says_tensorrt_is_absent(tmp_path):
    report = tmp_path / "st"
    proc = run_process(agent_command("selftest", "--frames", "20", "--report", str(report)), timeout_s=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = {c["name"]: c for c in json.loads(report.with_suffix(".json").read_text())}
    assert checks["onnxruntime-cpu"]["status"] == "pass"
    assert checks["onnxruntime-cpu"]["data"]["map50"] >= 0.9
    assert checks["tensorrt"]["status"] == "skip"
    assert "not available on this machine" in checks["tensorrt"]["detail"]
    assert "| tensorrt | skip |" in report.with_suffix(".md").read_text()


def test_engine_build_without_tensorrt_says_where_it_comes_from():
    proc = run_process(agent_command("engine", "build"), timeout_s=60)
    assert proc.returncode == 1
    assert "JetPack" in proc.stderr and "tensorrt" in proc.stderr.lower(), proc.stderr


def _result(boxes, classes, scores):
    return FrameResult(
        np.array(boxes, np.float32).reshape(-1, 4),
        np.array(scores, np.float32),
        np.array(classes, np.int32),
        np.zeros((0, 6), np.float32),
    )


@pytest.mark.parametrize(
    "got_boxes, got_classes, matched",
    [
        ([[10, 10, 50, 50], [100, 100, 140, 140]], [0, 1], 1.0),  # both found
        ([[10, 10, 50, 50]], [0], 0.5),  # one missing
        ([[10, 10, 50, 50], [100, 100, 140, 140]], [0, 2], 0.5),  # wrong class
        ([[12, 12, 52, 52], [101, 99, 141, 139]], [0, 1], 1.0),  # small shift: still IoU >= 0.5
    ],
)
def test_compare_counts_reference_detections_found_again(got_boxes, got_classes, matched):
    ref = [_result([[10, 10, 50, 50], [100, 100, 140, 140]], [0, 1], [0.9, 0.8])]
    got = [_result(got_boxes, got_classes, [0.9] * len(got_classes))]
    raw = [np.zeros((1, 8, 4), np.float32)]
    raw2 = [np.zeros((1, 8, 4), np.float32)]
    raw2[0][0, 5, 1] = 0.02  # a score differs by 0.02
    raw2[0][0, 0, 2] = 1.5  # a box coordinate by 1.5 px
    score_err, box_err, found = compare(raw, raw2, ref, got)
    assert found == matched
    assert score_err == pytest.approx(0.02) and box_err == pytest.approx(1.5)
