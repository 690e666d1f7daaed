"""Several sources on one agent: priorities, batching across sources, per-source accounting.

Real pipeline, real ONNX Runtime sessions, real ZeroMQ sockets, synthetic cameras.
The assertions are about behaviour (who drops, who waits, how batches form) and
accounting (every frame ends exactly once), not about how fast this machine is: where
overload or a batch's cost matters, the model's cost is fixed by ``CostedBackend``
(slept, so another process's load adds to it but cannot take the overload away), and
runs last until enough has happened rather than for a fixed time.
"""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from conftest import REPO, free_endpoint, started, wait_until, write_manifest
from helpers import Subscriber

from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError, load
from edge_agent.core.deadline_config import BatchingConfig
from edge_agent.core.endpoint_config import MetricsConfig
from edge_agent.core.model_config import ModelConfig, OnnxRuntimeConfig
from edge_agent.core.publish_config import PublishConfig
from edge_agent.core.source_config import ImageFolderSourceConfig, SyntheticSourceConfig, V4L2SourceConfig
from edge_agent.models.testmodels import constant_detector, yolov8_output
from edge_agent.pipelines.model import load_model
from edge_agent.pipelines.profile import Profile
from edge_agent.pipelines.sources.synthetic import SceneSpec, SyntheticScene
from edge_agent.service.runner import Agent

SCHEMA = json.loads((REPO / "pipelines/schema/message-v2.schema.json").read_text())


class CostedBackend:
    """A real backend whose every run first sleeps ``base_ms + per_frame_ms`` × batch size:
    a model cost that is the same on any machine (a loaded one only adds to it)."""

    def __init__(self, inner, base_ms: float, per_frame_ms: float) -> None:
        self.inner = inner
        self.base_ms = base_ms
        self.per_frame_ms = per_frame_ms

    def cost_ns(self, size: int) -> int:
        return int((self.base_ms + self.per_frame_ms * size) * 1e6)

    def infer(self, io) -> None:
        time.sleep(self.cost_ns(next(iter(io.inputs.values())).shape[0]) / 1e9)
        self.inner.infer(io)

    def warmup(self, io, runs: int = 3) -> None:
        for _ in range(runs):
            self.infer(io)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def with_cost(agent: Agent, base_ms: float, per_frame_ms: float) -> Agent:
    """``agent`` (built) with its model's cost fixed; the scheduler's warm-up estimates
    (taken at build, on the bare model) are replaced by the costs it will see."""
    profile = agent.primary_profile()
    backend = profile.model.backend = CostedBackend(profile.model.backend, base_ms, per_frame_ms)
    for size in profile.warm_ns:
        profile.warm_ns[size] = backend.cost_ns(size)
    agent.pipeline.warm_up()  # every size is warm: this seeds the scheduler with the costs
    return agent


def make_agent(model: Path, endpoint: str, sources, **kw) -> Agent:
    kw.setdefault("metrics", MetricsConfig(enabled=False))
    cfg = AgentConfig(
        device_id="multi",
        sources=tuple(sources),
        model=ModelConfig(path=str(model)),
        publish=PublishConfig(endpoint=endpoint, health_interval_s=0.2),
        **kw,
    )
    agent = Agent(cfg)
    agent.build()
    return agent


@contextmanager
def running(agent: Agent, until, *subscribers: Subscriber, timeout_s: float = 60.0, message: str = ""):
    """The agent started until ``until()`` holds (AssertionError after ``timeout_s``), then
    stopped (and ``subscribers`` closed)."""
    with started(agent, *subscribers, clean=True):
        wait_until(until, timeout_s, interval_s=0.05, message=message or "the run's condition")
        yield agent


def published(agent: Agent, name: str) -> int:
    return lane(agent, name).published


def counts(agent: Agent) -> dict[str, dict]:
    """Per source, after the drain; asserts that each source's frames all ended once."""
    out = {}
    for lane in agent.pipeline.figures().lanes:
        c = lane.counts.as_dict()
        assert c["in_flight"] == 0, (lane.name, c)
        assert c["captured"] == c["on_time"] + c["late"] + c["dropped"], (lane.name, c)
        out[lane.name] = c
    return out


def lane(agent: Agent, name: str):
    """The source ``name``'s figures, now."""
    return agent.pipeline.figures().lane(name)


def test_high_priority_source_keeps_its_budget_while_the_others_overload(const_model, endpoint):
    # The low-priority cameras offer more frames than inference can take (3 x 40 a second
    # plus front's 30, against 10 ms each, one frame at a time), and have tighter budgets,
    # so earliest-deadline-first alone would serve them first.
    front = SyntheticSourceConfig(name="front", fps=30, priority=10, budget_ms=60, seed=1)
    sides = [
        SyntheticSourceConfig(name=f"side{i}", fps=40, budget_ms=45, seed=2 + i, width=320, height=240)
        for i in range(3)
    ]
    agent = make_agent(const_model, endpoint, [front, *sides], batching=BatchingConfig(max_batch=1))
    with_cost(agent, 0.0, 10.0)
    with running(agent, lambda: published(agent, "front") >= 60, message="60 results of front"):
        pass
    c = counts(agent)

    def lost(name: str) -> float:
        """The share of a source's frames not published on time (late or dropped)."""
        return (c[name]["late"] + c[name]["dropped"]) / c[name]["captured"]

    sides_lost = [lost(f"side{i}") for i in range(3)]
    assert all(x > 0.2 for x in sides_lost), ("past capacity, the low-priority sources drop", c)
    # Served first: it loses far fewer of its frames than any of them (what it loses, a
    # loaded machine took from it before the scheduler saw the frame) ...
    assert lost("front") < 0.25 * min(sides_lost), (lost("front"), sides_lost, c)
    # ... and its frames wait for inference less than any low-priority source's: at most
    # for the inference under way, never behind the others' frames (earliest-deadline-first
    # alone would hold them back until the sides' tighter deadlines had passed theirs).
    # The 90th percentile, where that shows: a side's frame that waited long is replaced
    # by its newer one, so the low waits of all sources are alike.
    waits = {x.name: x.stages["wait_infer"].percentile_ms(90) for x in agent.pipeline.figures().lanes}
    assert waits["front"] < min(waits[f"side{i}"] for i in range(3)), waits


def test_batches_grow_with_load_and_shrink_when_slack_is_tight(const_model):
    # A batch costs 1 ms + 5 ms a frame (6, 11, 16, 21 ms for 1..4 frames) on any machine.
    def batches(sources, **kw) -> dict:
        agent = with_cost(make_agent(const_model, free_endpoint(), sources, **kw), 1.0, 5.0)

        def batching() -> dict:
            return agent.pipeline.figures().batching.summary()

        with running(agent, lambda: batching()["batches"] >= 40, message="40 batches"):
            pass
        c = counts(agent)
        summary = batching()
        # Every published frame ran in exactly one batch of at most one frame per source.
        assert set(summary["sizes"]) <= {"1", "2", "3", "4"}, summary
        frames = sum(int(k) * n for k, n in summary["sizes"].items())
        assert frames == sum(v["on_time"] + v["late"] for v in c.values()), (summary, c)
        return summary

    def share_of_4(summary: dict) -> float:
        return summary["sizes"].get("4", 0) / summary["batches"]

    small = {"width": 320, "height": 240}
    # Light load: four cameras at a few frames a second, out of phase: they rarely meet.
    light = batches(
        [SyntheticSourceConfig(name=f"c{i}", fps=fps, seed=i, **small) for i, fps in enumerate((5, 6, 7, 9))],
        batching=BatchingConfig(max_wait_ms=1.0),
    )
    # Four cameras in step at 20 fps: every frame has company, and slack to wait for it
    # (a generous max_wait and budget: the slack, not the cap, decides how long).
    synced = [SyntheticSourceConfig(name=f"c{i}", fps=20, seed=i, budget_ms=200, **small) for i in range(4)]
    patient = BatchingConfig(max_wait_ms=40.0)
    loaded = batches(synced, batching=patient)
    # The same cameras with a budget too tight for a batch of four (21 ms > 20 ms).
    tight = batches([replace(s, budget_ms=20) for s in synced], batching=patient)
    assert light["mean_size"] < 1.5, light
    assert loaded["mean_size"] > 3.0, loaded
    assert tight["mean_size"] < loaded["mean_size"] - 1.0, (tight, loaded)
    assert share_of_4(tight) < 0.1 < share_of_4(loaded), (tight, loaded)


def test_a_dead_or_ended_source_does_not_stall_the_others(const_model, endpoint, tmp_path):
    import cv2

    folder = tmp_path / "three"
    folder.mkdir()
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((120, 160, 3), 40 * i, np.uint8))
    sources = [
        SyntheticSourceConfig(name="a", fps=30, seed=1),
        SyntheticSourceConfig(name="b", fps=30, seed=2),
        # A camera that is not there: its reader retries with backoff, and delivers nothing.
        V4L2SourceConfig(name="dead", device=str(tmp_path / "video-missing"), retry_initial_s=0.05),
        # Three images, then the end of the stream.
        ImageFolderSourceConfig(name="ends", path=str(folder)),
    ]
    sub = Subscriber(endpoint, "health")
    # A long allowed wait: only the scheduler's judgement keeps it from waiting for "dead".
    agent = make_agent(const_model, endpoint, sources, batching=BatchingConfig(max_wait_ms=50.0))

    def progressed() -> bool:
        # The folder has ended and the live cameras go on: 30 results each (a second at
        # 30 fps), with every source's heartbeat seen.
        ends = lane(agent, "ends").counts.as_dict()
        return (
            ends["captured"] == 3
            and ends["in_flight"] == 0
            and all(published(agent, n) >= 30 for n in ("a", "b"))
            and {m["source"] for m in sub.messages} == {"a", "b", "dead", "ends"}
        )

    with running(agent, progressed, sub, message="a and b kept running past the ended and the dead"):
        pass
    c = counts(agent)
    assert c["dead"]["captured"] == 0
    # Each of the three images ends once; a file source's frames are not replaced (a loaded
    # machine may still make one too old to run, which is counted as such).
    assert c["ends"]["captured"] == 3 and c["ends"]["dropped"] == c["ends"]["dropped_by_reason"]["stale"]
    for name in ("a", "b"):
        assert c[name]["on_time"] + c[name]["late"] >= 30, (name, c[name])
    beats = {m["source"]: m for m in sub.messages}
    assert set(beats) == {"a", "b", "dead", "ends"}
    assert beats["dead"]["source_state"]["connected"] is False


def test_every_source_has_its_topic_seq_heartbeat_and_budget(const_model, endpoint):
    sources = [
        SyntheticSourceConfig(name="left", fps=40, seed=1, budget_ms=30),
        SyntheticSourceConfig(name="right", fps=40, seed=2, priority=3),
    ]
    sub = Subscriber(endpoint)
    agent = make_agent(const_model, endpoint, sources)
    try:

        def enough() -> bool:
            # Results of both, and (in-step cameras) at least one batch that both shared.
            return (
                all(published(agent, n) >= 20 for n in ("left", "right"))
                and any(m.get("batch_size") == 2 for m in sub.messages)
                and any(m.get("type") == "health" for m in sub.messages)
            )

        with running(agent, enough, message="results of both sources, one shared batch, a heartbeat"):
            pass
        wait_until(
            lambda: sum(bool(m.get("final")) for m in sub.messages) >= 2, 10, message="final heartbeats"
        )
    finally:
        sub.close()
    c = counts(agent)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    for topic, msg in zip(sub.topics, sub.messages):
        errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(msg)]
        assert not errors, (topic, errors)
    for name, budget in (("left", 30.0), ("right", 50.0)):
        results = [m for t, m in zip(sub.topics, sub.messages) if t == f"det.{name}"]
        assert results and all(m["source"] == name and m["deadline_ms"] == budget for m in results)
        seqs = [m["seq"] for m in results]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), f"{name}: one sequence per source"
        final = next(m for m in sub.messages if m.get("final") and m["source"] == name)
        assert final["counts"] == c[name]
        assert final["deadline"]["budget_ms"] == budget
        assert final["batching"]["max_batch"] == 2
    right = next(m for m in sub.messages if m.get("source") == "right" and m.get("type") == "health")
    assert right["source_state"]["priority"] == 3
    assert any(m.get("batch_size") == 2 for m in sub.messages), "in-step cameras share batches"


def test_batched_inference_gives_each_frame_its_own_result():
    """A batch of three different frames decodes exactly as each frame alone."""
    model = load_model(ModelConfig(), OnnxRuntimeConfig())
    profile = Profile("bundled", model)
    pool = profile.pool("cam")
    profile.prepare_batches(3)
    scene = SyntheticScene(SceneSpec(width=640, height=480, seed=7, num_objects=6))
    image, gt = np.empty((480, 640, 3), np.uint8), np.zeros((6, 6), np.float32)
    slots = [pool.acquire(1.0) for _ in range(3)]
    alone = []
    for k, slot in enumerate(slots):
        scene.render(k * 17, image, gt)
        model.preprocessor(image, slot.tensor, slot.geo)
        profile.infer([slot])
        alone.append(slot.io.outputs[0].copy())
        slot.io.outputs[0][:] = 0
    profile.infer(list(slots))
    for k, slot in enumerate(slots):
        np.testing.assert_allclose(slot.io.outputs[0], alone[k], rtol=1e-4, atol=1e-3)
    assert not np.allclose(alone[0], alone[1]), "the frames differ, so a mix-up would show"
    model.backend.close()


def test_a_fixed_batch_model_is_padded(tmp_path, endpoint):
    out = yolov8_output([(160, 160, 40, 40)], [1], [0.9], 4, 2100)
    model = constant_detector(str(tmp_path / "model.onnx"), out, batch=4)
    write_manifest(tmp_path / "manifest.yaml")
    sources = [SyntheticSourceConfig(name=f"c{i}", fps=30, seed=i) for i in range(2)]
    sub = Subscriber(endpoint, "det")
    agent = make_agent(Path(model), endpoint, sources)
    assert agent.pipeline.figures().batching.max_batch == 2
    assert agent.primary_profile().batches[2].inputs["images"].shape[0] == 4  # padded to 4
    with running(agent, lambda: all(published(agent, f"c{i}") >= 15 for i in range(2)), sub):
        pass
    counts(agent)
    assert sub.messages and all(m["detections"][0]["label"] == "square" for m in sub.messages)


def test_reload_adds_a_source_and_keeps_the_others_running(const_model, endpoint):
    a = SyntheticSourceConfig(name="a", fps=50, seed=1)
    agent = make_agent(const_model, endpoint, [a])
    agent.start()
    try:
        wait_until(lambda: published(agent, "a") >= 10, 30, message="a runs")
        kept = agent.sources["a"]
        seq_before = lane(agent, "a").seq
        new = replace(agent.config, sources=(a, SyntheticSourceConfig(name="b", fps=50, seed=2)))
        assert agent.reload(new) == ["sources"]
        assert agent.sources["a"] is kept, "an unchanged source is not reopened"
        assert lane(agent, "a").seq >= seq_before
        wait_until(
            lambda: published(agent, "b") >= 10 and lane(agent, "a").seq >= seq_before + 10,
            30,
            message="b runs, and a goes on",
        )
    finally:
        assert agent.stop()
    counts(agent)


def test_config_sources_are_checked_with_their_place():
    text = (
        "sources:\n"
        "  - {name: front, priority: 5, budget_ms: 40, max_fps: 15}\n"
        "  - {name: front, fps: 10}\n"
        "  - {name: side, budget_ms: -1}\n"
    )
    with pytest.raises(ConfigError) as e:
        load(AgentConfig, text, "fleet.yaml")
    problems = {(p.path, p.line) for p in e.value.problems}
    assert ("sources[2].budget_ms", 4) in problems, problems
    text = "source: {fps: 10}\nsources:\n  - {name: a}\n"
    with pytest.raises(ConfigError) as e:
        load(AgentConfig, text, "fleet.yaml")
    assert "either source" in str(e.value)
    text = "sources:\n  - {name: a}\n  - {name: a, fps: 5}\n"
    with pytest.raises(ConfigError) as e:
        load(AgentConfig, text, "fleet.yaml")
    assert "fleet.yaml:2:3: sources: source names must be unique" in str(e.value)
    ok = load(AgentConfig, "sources:\n  - {name: front, priority: 5, max_fps: 15}\n", "f.yaml")
    assert ok.source_list()[0].priority == 5 and ok.source_list()[0].max_fps == 15


def test_frame_rate_cap_limits_what_a_source_sends(const_model, endpoint):
    sources = [
        SyntheticSourceConfig(name="capped", fps=0, max_fps=20, seed=1),
        SyntheticSourceConfig(name="paced", fps=60, max_fps=15, seed=2),
    ]
    agent = make_agent(const_model, endpoint, sources)
    t0 = time.monotonic()
    with running(agent, lambda: all(published(agent, n) >= 15 for n in ("capped", "paced"))):
        pass
    elapsed = time.monotonic() - t0  # at least as long as the sources ran
    c = counts(agent)

    def taken(name: str) -> int:
        """Frames the pipeline read from the source (not skipped by it)."""
        return c[name]["captured"] - c[name]["dropped_by_reason"]["source_gap"]

    # The cap is a ceiling (a loaded machine only reads fewer): about 20 and 15 a second,
    # not hundreds. It runs on a clock like a camera's: a read that comes late may be
    # followed by one less than a period later, so the bound is loose, but far below what
    # the sources offer.
    assert taken("capped") <= 1.5 * 20 * elapsed + 2, (elapsed, c["capped"])
    assert taken("paced") <= 1.5 * 15 * elapsed + 2, (elapsed, c["paced"])
    # The 60 fps camera's other frames are skipped: most of them.
    assert c["paced"]["dropped_by_reason"]["source_gap"] > taken("paced"), c["paced"]


def test_metrics_have_every_source_and_the_batch_sizes(const_model, endpoint):
    from helpers import free_port, scrape, value

    port = free_port()
    sources = [SyntheticSourceConfig(name=n, fps=30, seed=i) for i, n in enumerate(("north", "south"))]
    agent = make_agent(const_model, endpoint, sources, metrics=MetricsConfig(port=port))
    with running(agent, lambda: all(published(agent, n) >= 5 for n in ("north", "south"))):
        families = scrape(port)
    c = counts(agent)
    for name in ("north", "south"):
        captured = value(
            families, "edge_agent_frames_captured", "edge_agent_frames_captured_total", source=name
        )
        assert 0 < captured <= c[name]["captured"]
        budget = value(
            families, "edge_agent_deadline_budget_seconds", "edge_agent_deadline_budget_seconds", source=name
        )
        assert budget == 0.05
    sizes = {s.labels["size"]: s.value for s in families["edge_agent_inference_batches"]}
    assert sizes and set(sizes) <= {"1", "2"}, sizes


def test_reload_of_scheduling_settings_keeps_the_camera_open(const_model, endpoint):
    a = SyntheticSourceConfig(name="a", fps=50, seed=1)
    agent = make_agent(const_model, endpoint, [a, SyntheticSourceConfig(name="b", fps=50, seed=2)])
    agent.start()
    try:
        wait_until(lambda: published(agent, "a") >= 5, 30, message="a runs")
        kept = agent.sources["a"]
        frame_before = kept._next
        faster = replace(a, priority=7, budget_ms=30, max_fps=20)
        new = replace(agent.config, sources=(faster, agent.config.sources[1]))
        assert agent.reload(new) == ["sources"]
        assert agent.sources["a"] is kept and kept._next >= frame_before, "not reopened, not rewound"
        assert lane(agent, "a").priority == 7 and lane(agent, "a").deadline.budget_ms == 30
        after = lane(agent, "a").seq
        wait_until(lambda: lane(agent, "a").seq >= after + 5, 30, message="a goes on after the reload")
    finally:
        assert agent.stop()
    counts(agent)


def test_batched_inference_and_scheduling_allocate_nothing_frame_sized(const_model):
    """The batched hot path on its own thread, without the pipeline's other threads (their
    heartbeats and histograms would blur the figure): scheduling a batch of three sources,
    copying into the batch set, inference and copying back allocate nothing that lasts and
    nothing frame-sized (one output copy is 67 KB, one model input 300 KB). The whole
    pipeline's check is test_pipeline's tracemalloc test."""
    import threading
    import tracemalloc

    from edge_agent.pipelines.scheduler import BatchScheduler

    model = load_model(ModelConfig(path=str(const_model)), OnnxRuntimeConfig())
    profile = Profile("const", model)
    pools = [profile.pool(f"c{i}") for i in range(3)]
    profile.prepare_batches(3)

    class Lane:
        """A live source as the scheduler reads it, whose frames are all taken in time."""

        priority, budget_ns, newest_wins, fresh_only = 0, 10**12, True, False

        def around_ns(self) -> tuple[float, float]:
            return (0.0, 0.0)

        def current(self) -> Profile:
            return profile

        def drop(self, slot, reason: str) -> None:
            raise AssertionError(f"no frame is replaced here ({reason})")

    batching = BatchingConfig(max_batch=0, max_wait_ms=0.0, margin_ms=0.0)
    scheduler = BatchScheduler([Lane() for _ in range(3)], batching, lambda p: 3)
    stop = threading.Event()

    def one_round() -> None:
        for lane, pool in enumerate(pools):
            slot = pool.acquire(1.0)
            slot.lane_index = lane
            slot.stamps[0] = time.monotonic_ns()
            scheduler.put(lane, slot, stop)
        batch = scheduler.next_batch(1.0)
        profile.infer(batch)
        scheduler.record(profile, len(batch), 1)
        for slot in batch:
            slot.pool.release(slot)

    for _ in range(200):  # warm-up
        one_round()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    for _ in range(2000):
        one_round()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    model.backend.close()
    assert scheduler.figures().sizes == {"3": 2200}
    assert current - base < 16 * 1024, f"grew by {current - base} B over 2000 batches"
    assert peak - base < 48 * 1024, f"peak {peak - base} B: a frame-sized buffer per batch?"


def test_a_source_with_its_own_model_gets_its_results_and_never_shares_a_batch(
    const_model, endpoint, tmp_path
):
    own_dir = tmp_path / "dock"
    own_dir.mkdir()
    out = yolov8_output([(50, 60, 20, 20)], [3], [0.95], 4, 2100)
    own = constant_detector(str(own_dir / "model.onnx"), out)
    write_manifest(own_dir / "manifest.yaml", name="dock-det")
    sources = [
        SyntheticSourceConfig(name="a", fps=30, seed=1),
        SyntheticSourceConfig(name="b", fps=30, seed=2),
        SyntheticSourceConfig(name="dock", fps=30, seed=3, model=own),
    ]
    sub = Subscriber(endpoint, "det")
    agent = make_agent(const_model, endpoint, sources)
    assert {p.name for p in agent.profiles.values()} == {"const", "dock-det"}

    def enough() -> bool:
        # 20 results of each, and one batch that a and b (in step) shared.
        return all(sum(m["source"] == n for m in sub.messages) >= 20 for n in ("a", "b", "dock")) and any(
            m["batch_size"] == 2 for m in sub.messages if m["source"] in ("a", "b")
        )

    with running(agent, enough, sub, message="20 results each, a batch shared by a and b"):
        pass
    counts(agent)
    by = {name: [m for m in sub.messages if m["source"] == name] for name in ("a", "b", "dock")}
    assert all(m["model"] == "dock-det" and m["batch_size"] == 1 for m in by["dock"])
    assert all(m["detections"][0]["label"] == "cross" for m in by["dock"])
    shared = by["a"] + by["b"]
    assert all(m["model"] == "const" and m["detections"][0]["label"] == "circle" for m in shared)
    assert any(m["batch_size"] == 2 for m in shared), "a and b, in step, still share batches"


def test_a_reload_from_a_file_to_a_live_source_lets_its_ladder_step(tmp_path, const_model, endpoint):
    """A file's frames never step the ladder; after a reload to the same source played in
    real time (a live source: same name, same deadline, so the monitor carries over), they do."""
    from helpers import write_video

    from edge_agent.core.source_config import VideoSourceConfig

    src = VideoSourceConfig(path=str(write_video(tmp_path / "clip.avi", 30)), loop=True)
    cfg = AgentConfig(
        source=src,
        model=ModelConfig(path=str(const_model)),
        publish=PublishConfig(endpoint=endpoint, wait_for_subscribers=0),
        metrics=MetricsConfig(enabled=False),
    )
    with started(cfg) as agent:
        # White-box: the lane's own monitor (its figures show its numbers, not its identity).
        monitor = agent.pipeline._lanes[0].monitor
        assert monitor.fixed
        agent.reload(replace(cfg, source=replace(src, realtime=True)))
        assert agent.pipeline._lanes[0].monitor is monitor and not monitor.fixed
