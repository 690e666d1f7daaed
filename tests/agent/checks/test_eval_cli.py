"""`edge-agent eval` on the bundled detector, as a subprocess."""

from __future__ import annotations

import json

from conftest import agent_command, run_process


def test_eval_scores_the_bundled_model_on_heldout_frames():
    proc = run_process(agent_command("eval", "--frames", "60", "--json"), timeout_s=120)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["frames"] == 60
    assert set(r["ap50_per_class"]) == {"circle", "square", "triangle", "cross"}
    assert r["map50"] >= 0.9, r


def test_eval_refuses_a_model_with_other_labels(const_model, tmp_path):
    (const_model.parent / "manifest.yaml").write_text(
        "name: x\ninput: {name: images, height: 320, width: 320, layout: NHWC, dtype: uint8, color: bgr}\n"
        "output: {name: output0, decoder: yolov8}\nlabels: [cat, dog, car, bus]\n"
    )
    proc = run_process(agent_command("eval", "--model", str(const_model), "--frames", "5"), timeout_s=120)
    assert proc.returncode == 1
    assert "not the synthetic scene's classes" in proc.stderr, proc.stderr
