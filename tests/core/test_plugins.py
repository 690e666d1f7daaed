"""``core.plugins.PackageRegistry``: plug-ins collected from a package's modules, and one
registered by hand, before or after the first lookup, alike."""

from __future__ import annotations

import pytest

from edge_agent.core.plugins import PackageRegistry


def registry(tmp_path, monkeypatch, name: str) -> PackageRegistry:
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("ITEMS = {'one': 1}\n")
    (pkg / "two.py").write_text("ITEMS = {'two': 2}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return PackageRegistry("thing", name, str(pkg), lambda m: getattr(m, "ITEMS", {}).items())


def test_a_name_registered_before_the_first_lookup_joins_the_collected_ones(tmp_path, monkeypatch):
    things = registry(tmp_path, monkeypatch, "plug_early")
    things.register("three", 3)
    assert things.names() == ["one", "three", "two"] and things.get("one") == 1


def test_a_declared_name_is_refused_by_hand_whenever_it_comes(tmp_path, monkeypatch):
    things = registry(tmp_path, monkeypatch, "plug_twice")
    with pytest.raises(ValueError, match="'two' is already registered"):
        things.register("two", 22)
    assert things.get("two") == 2
    with pytest.raises(LookupError, match="unknown thing 'four' \\(one of 'one', 'two'\\)"):
        things.get("four")
