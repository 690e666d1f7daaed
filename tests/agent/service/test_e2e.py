"""`edge-agent run` as a real subprocess, its results read over real ZeroMQ.

Uses the bundled detector on the synthetic camera and checks the published detections
against the scene's ground truth, regenerated here from the seed and frame id.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess

import numpy as np
from conftest import agent_command, run_process, spawn
from helpers import Subscriber

from edge_agent.core.stamps import STAGES
from edge_agent.models.decoders.nms import box_iou
from edge_agent.pipelines.sources.synthetic import CLASSES, SceneSpec, SyntheticScene

SEED = 4242  # not a training seed's frames: any seed renders new scenes; this one is fixed


def start_agent(tmp_path, endpoint, extra_args=()):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"device_id: e2e\nsource:\n  type: synthetic\n  name: cam0\n  fps: 30\n  seed: {SEED}\n"
        f"publish:\n  endpoint: {endpoint}\n"
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Ended (with its process group) when the block exits, also when the test fails.
    return spawn(
        agent_command("run", "--config", str(cfg), *extra_args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_run_publishes_correct_detections_and_exits_cleanly_on_sigterm(tmp_path, endpoint):
    sub = Subscriber(endpoint, "det")
    try:
        with start_agent(tmp_path, endpoint) as proc:
            sub.wait_for(90, timeout_s=60)
            proc.send_signal(signal.SIGTERM)
            # It must exit by itself: the agent's own stop is bounded (2 s, checked in
            # test_pipeline); this bound only adds interpreter teardown on a loaded machine.
            _, err = proc.communicate(timeout=10)
    finally:
        sub.close()
    assert proc.returncode == 0, err
    assert "received SIGTERM" in err and "frames: captured" in err, err
    messages = sub.messages
    assert len(messages) >= 90, f"only {len(messages)} messages; stderr:\n{err}"

    seqs = [m["seq"] for m in messages]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "gap in sequence numbers"

    scene = SyntheticScene(SceneSpec(seed=SEED))
    image = np.empty((480, 640, 3), np.uint8)
    gt = np.zeros((6, 6), np.float32)
    matched = total = 0
    for m in messages:
        assert m["source"] == "cam0" and m["device"] == "e2e"
        lat = m["latency_ms"]
        assert set(lat) == {*STAGES, "total"}
        assert all(v >= 0 for v in lat.values()), lat
        assert abs(sum(lat[s] for s in STAGES) - lat["total"]) < 0.01, lat
        scene.render(m["frame_id"], image, gt)
        visible = gt[gt[:, 5] >= 0.5]
        total += len(visible)
        dets = m["detections"]
        if not dets or not len(visible):
            continue
        boxes = np.array([d["box_xyxy"] for d in dets], np.float64)
        labels = [d["label"] for d in dets]
        iou = box_iou(visible[:, 1:5].astype(np.float64), boxes)
        for i, row in enumerate(visible):
            want = CLASSES[int(row[0])]
            if any(iou[i, j] >= 0.5 and labels[j] == want for j in range(len(dets))):
                matched += 1
    recall = matched / total
    assert recall >= 0.90, f"matched {matched}/{total} visible objects ({recall:.1%})"


def test_run_with_frames_stops_by_itself(tmp_path, endpoint):
    with start_agent(tmp_path, endpoint, ["--frames", "20", "--quiet"]) as proc:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    # Every one of the 20 frames ends exactly once; how many are on time depends on the
    # machine (a loaded one makes some late or drops them), so only the sum is fixed.
    m = re.search(r"captured (\d+) = (\d+) on time \+ (\d+) late \+ (\d+) dropped", err)
    assert m, err
    captured, on_time, late, dropped = map(int, m.groups())
    assert captured == 20 and on_time + late + dropped == 20, err
    assert on_time + late > 0, f"no frame was published at all:\n{err}"


def test_run_refuses_a_bad_config_with_key_and_line(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("source:\n  type: synthetic\n  fps: -5\n")
    proc = run_process(agent_command("run", "--config", str(cfg)), timeout_s=60)
    assert proc.returncode == 2
    assert f"{cfg}:3:8: source.fps: must be within 0..1000" in proc.stderr, proc.stderr
