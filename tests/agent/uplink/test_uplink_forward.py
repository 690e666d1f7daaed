"""The uplink's forward policies, driven with explicit times: pass-through and filtering,
the summary's exact frame accounting over random streams, heartbeat-derived drops, the final
partial interval, the per-subtopic rate cap and the registry."""

from __future__ import annotations

import itertools
import random
from typing import Any

import numpy as np
import pytest

from edge_agent.service.uplink.forward import (
    FORWARDERS,
    ForwardAll,
    Forwarder,
    ForwardWithDetections,
    Summarize,
    make_forwarder,
    nearest_rank,
)

T0 = 1764582000.25  # Unix-like times, so float rounding near 1.7e9 s is exercised
LABELS = ("person", "car", "dog")


def result(
    source: str,
    seq: int,
    latency: float = 10.0,
    labels: tuple[str, ...] = (),
    missed: bool = False,
    throttled: bool = False,
) -> dict[str, Any]:
    return {
        "schema": 1,
        "device": "cam-1",
        "source": source,
        "seq": seq,
        "frame_id": seq,
        "capture_unix_s": T0 + seq / 30,
        "image_wh": [640, 480],
        "model": "detector",
        "batch_size": 1,
        "latency_ms": {"capture": 1.0, "total": latency},
        "deadline_ms": 50,
        "deadline_missed": missed,
        "throttled": throttled,
        "detections": [
            {"label": label, "class_id": LABELS.index(label), "score": 0.9, "box_xyxy": [0, 0, 1, 1]}
            for label in labels
        ],
    }


def heartbeat(source: str, dropped: int, throttled: bool | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "type": "health",
        "device": "cam-1",
        "source": source,
        "ts_unix_s": T0,
        "fps": 30.0,
        "counts": {"captured": 0, "on_time": 0, "late": 0, "dropped": dropped, "in_flight": 0},
        "miss_rate": 0.0,
        "latency_ms": {"window": {"p50": 10.0, "p99": 20.0}},
        "ladder": {"name": "full"},
    }
    if throttled is not None:
        body["power"] = {"throttled": throttled}
    return body


def summaries(messages: list[tuple[str, dict[str, Any]]], source: str) -> list[dict[str, Any]]:
    return [payload for subtopic, payload in messages if subtopic == f"summary/{source}"]


# --- pass-through policies ---------------------------------------------------------------


def test_all_forwards_every_result_unchanged_and_nothing_else():
    fwd = make_forwarder("all", 1.0, 0)
    assert isinstance(fwd, ForwardAll)
    empty, found = result("cam0", 0), result("cam1", 0, labels=("person",))
    assert fwd.offer("det.cam0", empty, T0) == [("det/cam0", empty)]
    (sent,) = fwd.offer("det.cam1", found, T0)
    assert sent[0] == "det/cam1" and sent[1] is found  # the body itself, not a copy
    assert fwd.offer("health", heartbeat("cam0", 3), T0) == []
    assert fwd.offer("other", {"source": "cam0"}, T0) == []
    assert fwd.flush(T0 + 5) == [] and fwd.flush(T0 + 5, final=True) == []
    assert fwd.rate_limited.total == 0


def test_all_takes_the_source_from_the_topic_when_the_body_has_none():
    body = result("cam0", 0)
    del body["source"]
    assert make_forwarder("all", 1.0, 0).offer("det.cam7", body, T0) == [("det/cam7", body)]


def test_with_detections_keeps_only_results_that_found_something():
    fwd = make_forwarder("with_detections", 1.0, 0)
    assert isinstance(fwd, ForwardWithDetections)
    bodies = [result("cam0", i, labels=("car",) * (i % 3)) for i in range(9)]
    sent = [m for i, b in enumerate(bodies) for m in fwd.offer("det.cam0", b, T0 + i)]
    assert [payload for _, payload in sent] == [b for b in bodies if b["detections"]]
    assert all(subtopic == "det/cam0" for subtopic, _ in sent)
    no_list = result("cam0", 9)
    del no_list["detections"]
    assert fwd.offer("det.cam0", no_list, T0) == []
    assert fwd.offer("health", heartbeat("cam0", 0), T0) == []


# --- summary: exact accounting over random streams ---------------------------------------


def random_stream(rng: random.Random, source: str, start_s: float, end_s: float):
    """(time, topic, body) for one source: ~30 fps results with pauses (some longer than an
    interval, heartbeats going on), a heartbeat about once a second with growing drops."""
    events, seq, dropped = [], 0, rng.randrange(0, 5)
    t = start_s
    while t < end_s:
        if rng.random() < 0.01:
            t += rng.uniform(1.0, 3.5)  # a stall: no results, heartbeats only
            continue
        labels = tuple(rng.choice(LABELS) for _ in range(rng.choice((0, 0, 1, 2, 3))))
        latency = round(rng.uniform(5.0, 60.0), 1)  # ties, to exercise the percentile rule
        body = result(source, seq, latency, labels, missed=latency > 50, throttled=rng.random() < 0.02)
        events.append((t, f"det.{source}", body))
        seq += 1
        t += rng.uniform(0.0, 0.07)
    t = start_s + rng.uniform(0.0, 1.0)
    while t < end_s + 2:
        dropped += rng.choice((0, 0, 1, 4))
        events.append((t, "health", heartbeat(source, dropped, throttled=rng.random() < 0.05)))
        t += rng.uniform(0.9, 1.1)
    return events


def run_stream(fwd: Forwarder, events, end_s: float):
    """Offers the events in time order with a flush every 0.1 s between them, then a final
    flush; returns everything sent."""
    sent, tick = [], events[0][0]
    for t, topic, body in sorted(events, key=lambda e: e[0]):
        while tick <= t:
            sent += fwd.flush(tick)
            tick += 0.1
        sent += fwd.offer(topic, body, t)
    while tick <= end_s:
        sent += fwd.flush(tick)
        tick += 0.1
    return sent + fwd.flush(end_s, final=True)


def check_source(sums, events, source, interval_s, origin_s):
    results = [(t, b) for t, topic, b in events if topic == f"det.{source}"]
    beats = [b for _, topic, b in events if topic == "health" and b["source"] == source]
    arrival = {b["seq"]: t for t, b in results}
    by_seq = {b["seq"]: b for _, b in results}

    assert [s["seq"] for s in sums] == list(range(len(sums)))
    assert sum(s["frames"] for s in sums) == len(results)
    nonempty = [s for s in sums if s["frames"]]
    assert nonempty[0]["first_seq"] == 0 and nonempty[-1]["last_seq"] == len(results) - 1
    for before, after in itertools.pairwise(nonempty):
        assert after["first_seq"] == before["last_seq"] + 1  # the ranges tile the seq range
    for s in sums[:-1]:
        assert s["end_unix_s"] - s["start_unix_s"] == pytest.approx(interval_s)
        k = (s["start_unix_s"] - origin_s) / interval_s
        assert k == pytest.approx(round(k), abs=1e-6)  # aligned to the first arrival
    for s in sums:
        assert s["type"] == "summary" and s["device"] == "cam-1" and s["source"] == source
        assert s["interval_s"] == interval_s
        if not s["frames"]:
            assert s["first_seq"] is None and s["last_seq"] is None and s["fps"] == 0
            assert s["latency_ms"] == {"p50": None, "p99": None, "max": None}
            continue
        inside = [by_seq[q] for q in range(s["first_seq"], s["last_seq"] + 1)]
        assert s["frames"] == len(inside)
        assert all(s["start_unix_s"] <= arrival[b["seq"]] < s["end_unix_s"] for b in inside)
        totals = np.array([b["latency_ms"]["total"] for b in inside])
        for q in (50, 99):
            assert s["latency_ms"][f"p{q}"] == np.percentile(totals, q, method="inverted_cdf")
        assert s["latency_ms"]["max"] == totals.max()
        assert s["deadline_missed"] == sum(b["deadline_missed"] for b in inside)
        labels: dict[str, int] = {}
        for b in inside:
            for d in b["detections"]:
                labels[d["label"]] = labels.get(d["label"], 0) + 1
        assert s["detections_by_label"] == labels
        assert s["throttled"] >= any(b["throttled"] for b in inside)

    totals_by_label: dict[str, int] = {}
    for s in sums:
        for label, n in s["detections_by_label"].items():
            totals_by_label[label] = totals_by_label.get(label, 0) + n
    truth: dict[str, int] = {}
    for _, b in results:
        for d in b["detections"]:
            truth[d["label"]] = truth.get(d["label"], 0) + 1
    assert totals_by_label == truth
    assert sum(s["deadline_missed"] for s in sums) == sum(b["deadline_missed"] for _, b in results)
    assert sum(s["dropped"] for s in sums) == beats[-1]["counts"]["dropped"] - beats[0]["counts"]["dropped"]
    assert sum(s["throttled"] for s in sums) <= len(sums)


@pytest.mark.parametrize(("seed", "interval_s"), [(1, 1.0), (2, 0.5), (3, 2.5), (4, 0.3)])
def test_summary_accounts_for_every_result_exactly(seed, interval_s):
    rng = random.Random(seed)
    end_s = T0 + 12.0
    starts = {"cam0": T0, "cam1": T0 + 0.37}
    events = [e for source, start in starts.items() for e in random_stream(rng, source, start, end_s)]
    fwd = make_forwarder("summary", interval_s, 0)
    assert isinstance(fwd, Summarize)
    sent = run_stream(fwd, events, end_s + 2.5)
    assert {subtopic for subtopic, _ in sent} == {"summary/cam0", "summary/cam1"}
    for source in starts:
        origin = min(t for t, _, b in events if b["source"] == source)
        check_source(summaries(sent, source), events, source, interval_s, origin)
    # some interval had heartbeats but no results: it was still reported, with frames 0
    assert any(s["frames"] == 0 for _, s in sent)


def test_nearest_rank_is_numpys_inverted_cdf():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3, 7, 99, 100, 101, 1000):
        values = np.round(rng.uniform(0, 50, n), 1)
        ordered = sorted(values.tolist())
        for q in (1, 50, 90, 99, 100):
            assert nearest_rank(ordered, q) == np.percentile(values, q, method="inverted_cdf")


# --- summary: single behaviours -------------------------------------------------------------


def test_a_summary_is_due_at_the_interval_end_from_flush_or_the_next_offer():
    fwd = make_forwarder("summary", 1.0, 0)
    assert fwd.offer("det.cam0", result("cam0", 0, 12.0, ("person",)), T0) == []
    assert fwd.offer("det.cam0", result("cam0", 1, 14.0), T0 + 0.5) == []
    assert fwd.flush(T0 + 0.99) == []
    (msg,) = fwd.flush(T0 + 1.0)
    assert msg == (
        "summary/cam0",
        {
            "type": "summary",
            "device": "cam-1",
            "source": "cam0",
            "run": "",
            "seq": 0,
            "interval_s": 1.0,
            "start_unix_s": T0,
            "end_unix_s": T0 + 1.0,
            "frames": 2,
            "first_seq": 0,
            "last_seq": 1,
            "fps": 2.0,
            "detections_by_label": {"person": 1},
            "detections_other": 0,
            "latency_ms": {"p50": 12.0, "p99": 14.0, "max": 14.0},
            "deadline_missed": 0,
            "dropped": 0,
            "throttled": False,
            "analytics": None,
            "events": {"total": 0, "by_kind": {}, "zones": {}, "lines": {}, "other": 0},
        },
    )
    assert fwd.flush(T0 + 1.5) == []
    fwd.offer("det.cam0", result("cam0", 2), T0 + 1.7)
    # the next result, past the end, closes the interval itself (no flush in between)
    (msg,) = fwd.offer("det.cam0", result("cam0", 3), T0 + 2.2)
    assert msg[1]["seq"] == 1 and (msg[1]["first_seq"], msg[1]["last_seq"]) == (2, 2)
    assert msg[1]["start_unix_s"] == T0 + 1.0
    # intervals in which nothing arrived send nothing and keep the summary numbers consecutive
    (msg,) = fwd.flush(T0 + 7.3)
    assert msg[1]["seq"] == 2 and msg[1]["start_unix_s"] == T0 + 2.0 and msg[1]["last_seq"] == 3
    fwd.offer("det.cam0", result("cam0", 4), T0 + 7.4)
    (msg,) = fwd.flush(T0 + 8.0)
    assert msg[1]["seq"] == 3 and msg[1]["start_unix_s"] == pytest.approx(T0 + 7.0)


def test_an_interval_with_heartbeats_and_no_results_is_still_reported():
    fwd = make_forwarder("summary", 1.0, 0)
    fwd.offer("det.cam0", result("cam0", 0), T0)
    fwd.offer("health", heartbeat("cam0", 2), T0 + 0.5)
    assert summaries(fwd.flush(T0 + 1.0), "cam0")[0]["frames"] == 1
    fwd.offer("health", heartbeat("cam0", 5, throttled=True), T0 + 1.5)
    (msg,) = fwd.flush(T0 + 2.05)
    assert msg[0] == "summary/cam0"
    s = msg[1]
    assert (s["frames"], s["first_seq"], s["last_seq"], s["fps"]) == (0, None, None, 0.0)
    assert s["latency_ms"] == {"p50": None, "p99": None, "max": None}
    assert (s["detections_by_label"], s["deadline_missed"]) == ({}, 0)
    assert (s["dropped"], s["throttled"]) == (3, True)
    assert fwd.flush(T0 + 3.5) == []  # nothing at all arrived: nothing is sent


def test_dropped_is_the_heartbeat_counter_increase_over_the_interval():
    fwd = make_forwarder("summary", 1.0, 0)

    def interval(k: int, dropped: list[int]) -> int:
        fwd.offer("det.cam0", result("cam0", k), T0 + k + 0.1)
        for i, d in enumerate(dropped):
            fwd.offer("health", heartbeat("cam0", d), T0 + k + 0.2 + 0.3 * i)
        (msg,) = fwd.flush(T0 + k + 1.15)  # the intervals begin at the first result, T0 + 0.1
        return msg[1]["dropped"]

    assert interval(0, [5]) == 0  # a single heartbeat: no increase known yet
    assert interval(1, [6, 8]) == 3  # latest in this interval minus latest before it
    assert interval(2, []) == 0  # no heartbeat: nothing reported ...
    assert interval(3, [12]) == 4  # ... and nothing lost: measured from the last one seen
    assert interval(4, [12]) == 0
    assert interval(5, [2]) == 2  # the agent restarted: its counter begins again from 0


def test_dropped_counts_from_the_first_heartbeat_within_the_first_interval():
    fwd = make_forwarder("summary", 5.0, 0)
    for i, d in enumerate([3, 4, 9]):
        fwd.offer("health", heartbeat("cam0", d), T0 + i)
    (msg,) = fwd.flush(T0 + 5)
    assert msg[1]["dropped"] == 6
    fwd.offer("health", heartbeat("cam0", 10), T0 + 6)
    (msg,) = fwd.flush(T0 + 10)
    assert msg[1]["dropped"] == 1


def test_the_final_flush_emits_the_partial_interval():
    fwd = make_forwarder("summary", 1.0, 0)
    fwd.offer("det.cam0", result("cam0", 0, labels=("dog",)), T0)
    fwd.offer("det.cam1", result("cam1", 0), T0 + 0.1)
    (closed,) = fwd.offer("det.cam0", result("cam0", 1, missed=True), T0 + 1.2)  # closes [T0, T0 + 1)
    assert closed[1]["frames"] == 1
    (closed,) = fwd.flush(T0 + 1.25)  # cam1's first interval began at its first result
    assert closed[0] == "summary/cam1" and closed[1]["end_unix_s"] == T0 + 0.1 + 1.0
    fwd.offer("health", heartbeat("cam1", 0), T0 + 1.3)
    assert fwd.flush(T0 + 1.5) == []
    sent = fwd.flush(T0 + 1.5, final=True)
    (cam0,), (cam1,) = summaries(sent, "cam0"), summaries(sent, "cam1")
    assert (cam0["seq"], cam0["start_unix_s"], cam0["end_unix_s"]) == (1, T0 + 1.0, T0 + 1.5)
    assert (cam0["frames"], cam0["first_seq"], cam0["deadline_missed"]) == (1, 1, 1)
    assert cam0["fps"] == pytest.approx(2.0)  # over the half interval it covers
    assert (cam1["frames"], cam1["start_unix_s"], cam1["end_unix_s"]) == (0, T0 + 1.1, T0 + 1.5)
    # everything was sent: another final flush has nothing, a later result starts afresh
    assert fwd.flush(T0 + 1.5, final=True) == []
    fwd.offer("det.cam0", result("cam0", 2), T0 + 1.7)
    (msg,) = fwd.flush(T0 + 2.0)
    assert (msg[1]["seq"], msg[1]["start_unix_s"], msg[1]["first_seq"]) == (2, T0 + 1.5, 2)


def test_summary_ignores_other_topics_and_sourceless_heartbeats():
    fwd = make_forwarder("summary", 1.0, 0)
    assert fwd.offer("status", {"source": "cam0"}, T0) == []
    assert fwd.offer("health", {"type": "health"}, T0) == []
    assert fwd.flush(T0 + 5, final=True) == []


# --- the rate cap ------------------------------------------------------------------------


def test_the_rate_cap_drops_and_counts_per_subtopic():
    fwd = make_forwarder("all", 1.0, 10.0)  # at most one message per 0.1 s per subtopic
    sent = []
    for i in range(11):  # every 0.05 s for 0.5 s
        sent += fwd.offer("det.cam0", result("cam0", i), T0 + 0.05 * i)
        sent += fwd.offer("det.cam1", result("cam1", i), T0 + 0.05 * i + 0.01)
    sent += fwd.offer("det.cam1", result("cam1", 11), T0 + 0.53)  # 0.02 s after the last sent
    assert [b["seq"] for t, b in sent if t == "det/cam0"] == [0, 2, 4, 6, 8, 10]
    assert [b["seq"] for t, b in sent if t == "det/cam1"] == [0, 2, 4, 6, 8, 10]
    assert fwd.rate_limited == {"det/cam0": 5, "det/cam1": 6}
    assert fwd.rate_limited.total == 11
    # a message refused does not push the next allowed time back
    assert fwd.offer("det.cam0", result("cam0", 11), T0 + 0.6) != []


def test_the_rate_cap_applies_to_the_filtered_policy_too():
    fwd = make_forwarder("with_detections", 1.0, 1.0)
    assert len(fwd.offer("det.cam0", result("cam0", 0, labels=("car",)), T0)) == 1
    assert fwd.offer("det.cam0", result("cam0", 1), T0 + 0.2) == []  # filtered, not capped
    assert fwd.offer("det.cam0", result("cam0", 2, labels=("car",)), T0 + 0.5) == []
    assert dict(fwd.rate_limited) == {"det/cam0": 1}
    assert len(fwd.offer("det.cam0", result("cam0", 3, labels=("car",)), T0 + 1.0)) == 1


def test_the_rate_cap_never_drops_a_summary_and_a_run_id_tells_runs_apart():
    """The interval is a summary's cap: dropping one would lose its frames from the count."""
    fwd = make_forwarder("summary", 0.1, 4.0, run="r2")  # a summary each 0.1 s; the cap not applied
    sent = []
    for i in range(20):
        sent += fwd.offer("det.cam0", result("cam0", i), T0 + 0.1 * i + 0.01)
        sent += fwd.flush(T0 + 0.1 * i + 0.05)
    sent += fwd.flush(T0 + 2.05)
    assert [s["seq"] for s in summaries(sent, "cam0")] == list(range(len(sent)))
    assert sum(s["frames"] for _, s in sent) == 20 and fwd.rate_limited.total == 0
    assert {s["run"] for _, s in sent} == {"r2"}


def test_results_on_another_publish_topic_are_forwarded():
    fwd = make_forwarder("all", 1.0, 0, result_topic="vision")
    assert fwd.offer("det.cam0", result("cam0", 0), T0) == []
    assert [sub for sub, _ in fwd.offer("vision.cam0", result("cam0", 1), T0)] == ["det/cam0"]


def test_flush_jitter_never_trips_a_cap_equal_to_the_interval():
    fwd = make_forwarder("summary", 1.0, 1.0)
    rng = random.Random(5)
    sent, t, n = [], T0, 0
    while t < T0 + 30:
        sent += fwd.offer("det.cam0", result("cam0", n), t)
        n += 1
        t += rng.uniform(0.02, 0.2)  # flushes late and early around each interval end
        sent += fwd.flush(t)
    sent += fwd.flush(t + 0.01, final=True)  # right after the last summary: still sent
    assert fwd.rate_limited.total == 0
    assert sum(s["frames"] for _, s in sent) == n
    assert [s["seq"] for _, s in sent] == list(range(len(sent)))


# --- the registry ----------------------------------------------------------------------------


def test_the_registry_names_the_policies():
    assert set(FORWARDERS) == {"all", "with_detections", "summary", "none"}
    for kind in FORWARDERS:
        assert isinstance(make_forwarder(kind, 1.0, 0), Forwarder)


def test_make_forwarder_rejects_an_unknown_kind_naming_the_known_ones():
    with pytest.raises(ValueError, match="'every'") as err:
        make_forwarder("every", 1.0, 0)
    assert all(kind in str(err.value) for kind in FORWARDERS)


@pytest.mark.parametrize(("kind", "interval_s", "max_rate_hz"), [("summary", 0, 0), ("all", 1.0, -1)])
def test_make_forwarder_rejects_bad_settings(kind, interval_s, max_rate_hz):
    with pytest.raises(ValueError):
        make_forwarder(kind, interval_s, max_rate_hz)
