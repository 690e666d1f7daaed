"""`edge-agent selftest` and `engine build` where TensorRT is absent (this machine)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import agent_command, run_process
from fakes.trt_kit import swap_backend

from edge_agent.checks.evaluation import FrameResult
from edge_agent.checks.selftest import compare


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
    for name in ("tensorrt-gpu-copy", "tensorrt-gpu-preprocess-gpu", "tensorrt-gpu-preprocess-dla"):
        assert checks[name]["status"] == "skip" and "not available" in checks[name]["detail"], name


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


def test_off_device_every_tensorrt_target_is_listed_as_skipped_with_its_reason():
    from edge_agent.checks.selftest import skipped_targets, tensorrt_targets

    names = [c.name for c in skipped_targets("TensorRT is not available on this machine")]
    assert names == [
        "tensorrt-gpu",
        "tensorrt-gpu-copy",
        "tensorrt-gpu-preprocess-gpu",
        "tensorrt-gpu-graphs",
        "tensorrt-gpu-copy-preprocess-graphs",
        "tensorrt-dla0",
        "tensorrt-dla0-copy",
        "tensorrt-gpu-preprocess-dla",
    ]
    assert all(
        c.status == "skip" and "not available" in c.detail
        for c in skipped_targets("TensorRT is not available on this machine")
    )
    no_dla = tensorrt_targets(0)
    assert [t.name for t in no_dla] == names[:5]
    assert [(t.preprocess, t.zero_copy, t.cuda_graphs) for t in no_dla] == [
        ("cpu", True, "off"),
        ("cpu", False, "off"),
        ("gpu", True, "off"),
        ("cpu", True, "on"),
        ("gpu", False, "on"),
    ]


def test_the_float_variant_gives_the_bundled_detectors_outputs(tmp_path):
    """What device preprocessing runs on a device: the same detector taking float NCHW pixels."""
    from edge_agent.checks.evaluation import heldout_images
    from edge_agent.checks.selftest import float_variant
    from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
    from edge_agent.pipelines.model import load_model
    from edge_agent.pipelines.preprocess import Letterbox

    cfg = float_variant(str(tmp_path))
    ref = load_model(ModelConfig(score_threshold=0.001), OnnxRuntimeConfig())
    var = load_model(replace(cfg, input_adapter="off"), OnnxRuntimeConfig())
    try:
        assert var.backend.inputs[0].shape[1:] == (3, 320, 320)
        ((image, _gt),) = list(heldout_images(1))
        outs = []
        for m in (ref, var):
            io = m.backend.allocate()
            m.run_one(image, io, Letterbox())
            outs.append(io.outputs[m.output_index].copy())
        np.testing.assert_allclose(outs[1], outs[0], atol=1e-4)
    finally:
        ref.close()
        var.close()


def test_a_close_that_raises_fails_its_target_and_the_next_target_still_runs(monkeypatch):
    import edge_agent.pipelines.model as model_module
    from edge_agent.checks import selftest

    closed: list[str] = []

    class Model:
        def close(self):
            closed.append("x")
            raise RuntimeError("context already gone")

    def run(model, frames):
        raise ValueError("engine refused the input")

    monkeypatch.setattr(model_module, "load_model", lambda *a: Model())
    monkeypatch.setattr(selftest, "_run_model", run)
    checks = [selftest._tensorrt_check(t, 2, "", [], []) for t in selftest.tensorrt_targets(0)[:2]]
    assert [c.status for c in checks] == ["fail", "fail"] and len(closed) == 2
    assert "engine refused the input" in checks[0].detail
    assert "close() failed: RuntimeError: context already gone" in checks[0].detail


@pytest.mark.parametrize(
    "off_dla, says",
    [
        ({"preprocess": ["Cast_0"]}, "off the DLA: Cast_0"),
        ({"preprocess": []}, "off the DLA: none"),
        ({}, "off the DLA: unknown"),
    ],
)
def test_the_dla_preprocessing_target_says_what_stayed_off_the_dla(off_dla, says):
    from edge_agent.checks.selftest import _judge, tensorrt_targets

    (target,) = [t for t in tensorrt_targets(1) if t.name == "tensorrt-gpu-preprocess-dla"]
    res = [_result([[10, 10, 50, 50]], [0], [0.9])]
    raw = [np.zeros((1, 8, 4), np.float32)]
    info = {"preprocess": "device", "off_dla": off_dla}
    check = _judge(target, info, raw, res, [1.0], {}, 1.0, raw, res)
    assert check.status == "pass" and says in check.detail, check.detail
    (plain,) = [t for t in tensorrt_targets(1) if t.name == "tensorrt-gpu"]
    assert "off the DLA" not in _judge(plain, info, raw, res, [1.0], {}, 1.0, raw, res).detail


@pytest.mark.parametrize("name", ["tensorrt-gpu-graphs", "tensorrt-gpu-copy-preprocess-graphs"])
def test_the_graph_targets_replay_graphs_and_compare_them_with_plain_execution(name, tmp_path, monkeypatch):
    """The graph targets on the fakes (what a Jetson runs for real): graphs replayed on every
    frame, the same engine run plainly on the same frames, the CPU time of both."""
    from fakes.trt_kit import Fakes

    from edge_agent.checks import selftest
    from edge_agent.pipelines.backends.tensorrt import TensorRTBackend

    fakes = Fakes(graphs=True)
    swap_backend(monkeypatch, "tensorrt",
        lambda cfg: TensorRTBackend(cfg, modules=(fakes.trt, fakes.cuda, fakes.cudart)),
    )
    (target,) = [t for t in selftest.tensorrt_targets(0) if t.name == name]
    zeros = [np.zeros((1, 8, 2000), np.float32)] * 3  # what the fake engine writes
    check = selftest._tensorrt_check(target, 3, str(tmp_path), zeros, [])
    assert check.status == "pass", check.detail
    assert "against plain execution: max |diff| 0.00e+00, 0 of 3 frames differ" in check.detail
    graphs = check.data["graphs"]
    assert graphs["replaying"] and graphs["graphs_cpu_ms"]["count"] == graphs["plain_cpu_ms"]["count"] == 20
    names = [n for n, _ in fakes.calls]
    assert "cudaGraphLaunch" in names and fakes.cudart.live_execs() == [], "every model closed"
    assert check.data["backend"]["preprocess"] == ("device" if "preprocess" in name else "cpu")


def test_a_graph_target_fails_when_a_replay_differs_from_plain_execution():
    from edge_agent.checks.selftest import Check, _judge_graphs

    raw = [np.zeros((1, 8, 4), np.float32), np.ones((1, 8, 4), np.float32)]
    plain = [raw[0], raw[1] + 0.5]
    graphs = {"replaying": True, "off": "", "graphs_cpu_ms": {"p50": 0.1}, "plain_cpu_ms": {"p50": 0.4}}
    check = _judge_graphs(Check("t", "pass", "ok"), raw, graphs, plain)
    assert (
        check.status == "fail"
        and "1 of 2 frames differ" in check.detail
        and "max |diff| 5.00e-01" in check.detail
    )
    off = {"replaying": False, "off": "a DLA engine", "graphs_cpu_ms": None, "plain_cpu_ms": {"p50": 0.4}}
    check = _judge_graphs(Check("t", "pass", "ok"), raw, off, list(raw))
    assert check.status == "fail" and "graphs off: a DLA engine" in check.detail
