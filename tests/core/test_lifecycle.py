"""core.lifecycle: parts start in order and stop in reverse, every one, even past a failure."""

from __future__ import annotations

import pytest

from edge_agent.core.lifecycle import Component, Parts


class Part:
    def __init__(self, name: str, log: list[str], stop_ok: bool = True, stop_raises: bool = False) -> None:
        self.name, self.log, self.stop_ok, self.stop_raises = name, log, stop_ok, stop_raises

    def start(self) -> None:
        self.log.append(f"start {self.name}")

    def stop(self, timeout_s: float) -> bool:
        self.log.append(f"stop {self.name} {timeout_s}")
        if self.stop_raises:
            raise RuntimeError("stuck")
        return self.stop_ok


def test_parts_stop_in_reverse_order_with_the_timeout():
    log: list[str] = []
    parts = Parts()
    for name in "abc":
        parts.start(Part(name, log))
    assert parts.stop(0.5)
    assert log == ["start a", "start b", "start c", "stop c 0.5", "stop b 0.5", "stop a 0.5"]
    assert len(parts) == 0


def test_a_failing_or_unclean_part_does_not_keep_the_earlier_ones_running(caplog):
    log: list[str] = []
    parts = Parts()
    parts.start(Part("power", log))
    parts.start(Part("pipeline", log, stop_ok=False))
    parts.start(Part("metrics", log, stop_raises=True))
    assert not parts.stop(1.0)
    assert log[-3:] == ["stop metrics 1.0", "stop pipeline 1.0", "stop power 1.0"], "power last, whatever"
    assert "stopping Part failed" in caplog.text


def test_replace_remove_and_insert_keep_the_stop_order():
    log: list[str] = []
    parts = Parts()
    a, b, c = Part("a", log), Part("b", log), Part("c", log)
    parts.start(a)
    parts.start(b)
    new_b, s1, s2 = Part("b2", log), Part("s1", log), Part("s2", log)
    parts.replace(b, new_b)
    parts.insert_before(new_b, [s1, s2])
    parts.start(c)
    parts.remove(c)
    assert c not in parts and new_b in parts and b not in parts
    log.clear()
    parts.stop(0.1)
    assert [line.split()[1] for line in log] == ["b2", "s2", "s1", "a"]


def test_a_part_that_fails_to_start_is_not_stopped():
    class Broken(Part):
        def start(self) -> None:
            raise OSError("device busy")

    log: list[str] = []
    parts = Parts()
    parts.start(Part("a", log))
    with pytest.raises(OSError):
        parts.start(Broken("b", log))
    parts.stop(0.1)
    assert log == ["start a", "stop a 0.1"]


def test_the_agents_parts_are_components():
    from edge_agent.pipelines.publish import ZmqPublisher
    from edge_agent.pipelines.sources.base import Source
    from edge_agent.power.manager import PowerManager

    for cls in (ZmqPublisher, Source, PowerManager):
        assert all(callable(getattr(cls, m, None)) for m in ("start", "stop")), cls
    assert isinstance(Part("x", []), Component)
