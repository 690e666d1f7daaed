"""``source.analytics`` (agent/core/analytics_config.py): a bad zone or line is refused at
load with an error that names the file, the line and the key path of what is wrong; a good
one loads as written."""

from __future__ import annotations

import textwrap

import pytest

from edge_agent.core.analytics_config import (
    MAX_COORDINATE,
    AnalyticsConfig,
    LineConfig,
    ZoneConfig,
    polygon_problem,
)
from edge_agent.core.config import AgentConfig
from edge_agent.core.configfields import FieldError
from edge_agent.core.configload import ConfigError, Problem, load

FILE = "agent.yaml"
TRI = "[[0.1, 0.1], [0.5, 0.1], [0.1, 0.5]]"  # a good zone
SEG = "[[0.1, 0.2], [0.9, 0.2]]"  # a good line


def doc(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def line_of(text: str, needle: str) -> int:
    """The 1-based line of ``text`` that holds ``needle`` (once)."""
    hits = [i for i, line in enumerate(text.splitlines(), 1) if needle in line]
    assert len(hits) == 1, f"{needle!r} on lines {hits}"
    return hits[0]


def only_problem(text: str) -> Problem:
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, text, FILE)
    problems = info.value.problems
    assert len(problems) == 1, "\n".join(map(str, problems))
    p = problems[0]
    assert p.file == FILE
    assert str(info.value).startswith(f"{FILE}:{p.line}:{p.column}: {p.path}: ")
    return p


def analytics(body: str, source_extra: str = "") -> str:
    """A synthetic source (``source_extra``: more of its keys) with ``body`` under ``analytics:``."""
    return "source:\n  type: synthetic\n" + source_extra + "  analytics:\n" + textwrap.indent(body, "    ")


def zone_doc(points: str, extra: str = "") -> str:
    return analytics(f"zones:\n  - name: door\n{extra}    points: {points}\n")


def assert_at(text: str, needle: str, path: str, words: str) -> Problem:
    p = only_problem(text)
    assert (p.path, p.line) == (path, line_of(text, needle)), str(p)
    assert words in p.message, p.message
    return p


# -- polygons ----------------------------------------------------------------------------------


def test_an_asymmetric_bow_tie_is_refused_as_self_intersecting():
    text = zone_doc("[[0.1, 0.1], [0.6, 0.1], [0.1, 0.5], [0.4, 0.6]]")
    p = assert_at(text, "points:", "source.analytics.zones[0].points", "self-intersecting")
    assert "edge 1-2 meets edge 3-0" in p.message


def test_a_symmetric_bow_tie_is_refused():
    text = zone_doc("[[0.1, 0.1], [0.5, 0.1], [0.1, 0.5], [0.5, 0.5]]")
    assert_at(text, "points:", "source.analytics.zones[0].points", "")


def test_a_symmetric_bow_tie_is_called_self_intersecting():
    text = zone_doc("[[0.1, 0.1], [0.5, 0.1], [0.1, 0.5], [0.5, 0.5]]")
    assert_at(text, "points:", "source.analytics.zones[0].points", "self-intersecting")


@pytest.mark.parametrize(
    "points, words",
    [
        ("[[0.1, 0.1], [0.3, 0.3], [0.5, 0.5]]", "degenerate"),
        ("[[0.1, 0.1], [0.5, 0.1]]", "at least 3 points, got 2"),
        ("[[0.1, 0.1], [0.5, 0.1], [0.5, 0.5], [0.1, 0.1]]", "a point is given twice"),
    ],
    ids=["collinear", "two-points", "repeated-point"],
)
def test_a_polygon_that_is_no_simple_polygon_is_refused_at_its_points(points, words):
    assert_at(zone_doc(points), "points:", "source.analytics.zones[0].points", words)


def test_the_second_zone_is_blamed_by_its_own_index_and_line():
    text = analytics(
        f"zones:\n  - name: a\n    points: {TRI}\n"
        "  - name: b\n    points: [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]\n"
    )
    assert_at(text, "[0.3, 0.3]", "source.analytics.zones[1].points", "degenerate")


def test_polygon_problem_takes_a_concave_simple_polygon():
    ell = ((0.1, 0.1), (0.3, 0.1), (0.3, 0.6), (0.8, 0.6), (0.8, 0.8), (0.1, 0.8))
    assert polygon_problem(ell) is None
    assert polygon_problem(tuple(reversed(ell))) is None  # either winding
    assert ZoneConfig(name="ell", points=ell).points == ell
    # the same corners in another order cross; a corner touching another edge is refused too
    assert "edge 2-3 meets edge 4-5" in polygon_problem((*ell[:3], ell[4], ell[3], ell[5]))
    assert "self-intersecting" in polygon_problem(((0, 0), (4, 0), (4, 4), (2, 0), (0, 4)))


# -- lines -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "points, words",
    [
        ("[[0.2, 0.2], [0.2, 0.2]]", "zero length"),
        ("[[0.1, 0.2], [0.5, 0.2], [0.9, 0.2]]", "a line is two points, got 3"),
    ],
    ids=["zero-length", "three-points"],
)
def test_a_line_that_is_no_segment_is_refused_at_its_points(points, words):
    text = analytics(f"lines:\n  - name: gate\n    points: {points}\n")
    assert_at(text, "points:", "source.analytics.lines[0].points", words)


# -- points in the frame -------------------------------------------------------------------------


def test_a_fraction_above_1_is_refused():
    text = zone_doc("[[0.1, 0.1], [1.5, 0.1], [0.1, 0.5]]")
    p = only_problem(text)
    assert p.path.startswith("source.analytics"), str(p)
    assert line_of(text, "analytics:") <= p.line <= line_of(text, "points:")
    assert "outside the frame" in p.message and "0..1" in p.message


def test_a_fraction_above_1_is_blamed_on_the_zone_that_has_it():
    text = zone_doc("[[0.1, 0.1], [1.5, 0.1], [0.1, 0.5]]")
    p = only_problem(text)
    assert p.path.startswith("source.analytics.zones"), str(p)
    assert "door" in p.message


def test_a_pixel_point_outside_a_synthetic_source_is_refused_naming_zone_and_point():
    text = analytics("units: pixels\nzones:\n  - name: door\n    points: [[10, 10], [700, 10], [10, 50]]\n")
    # blamed on the source's analytics key (the source knows its size): the section's first line
    p = assert_at(text, "units: pixels", "source.analytics", "door: point (700, 10)")
    assert "640x480" in p.message
    # the same points fit a wider source
    wide = text.replace("  type: synthetic\n", "  type: synthetic\n  width: 800\n")
    assert load(AgentConfig, wide, FILE).source.analytics.zones[0].points[1] == (700.0, 10.0)


def test_a_negative_pixel_coordinate_is_refused():
    text = analytics("units: pixels\nzones:\n  - name: door\n    points: [[10, 10], [-7, 10], [10, 50]]\n")
    p = assert_at(text, "[-7, 10]", "source.analytics.zones[0].points[1]", "x = -7 is outside the frame")
    assert "door" in p.message and "no negative" in p.message


def camera(body: str) -> str:
    """A camera (no size in its config: only the bound limits its pixels) with ``body`` under
    ``analytics:``."""
    return "source:\n  type: v4l2\n  analytics:\n" + textwrap.indent(body, "    ")


@pytest.mark.parametrize(
    "value, shown",
    [("3000000000", "3e+09"), ("3.0e+9", "3e+09"), ("1.0e+308", "1e+308"), ("65536.5", "65536.5")],
    ids=["3e9-int", "3e9-float", "1e308", "just-beyond"],
)
def test_a_pixel_coordinate_beyond_the_bound_is_refused_at_its_point(value, shown):
    """Issue 43, trial 5: 3e9 on a camera passed ``config validate`` and wrapped in int32
    when drawn (17.6 s per ``cv2.fillPoly``)."""
    text = camera(
        "units: pixels\nzones:\n  - name: door\n    points:\n"
        f"      - [10, 10]\n      - [{value}, 10]\n      - [10, 50]\n"
    )
    p = assert_at(text, f"[{value}, 10]", "source.analytics.zones[0].points[1]", f"x = {shown} is beyond")
    assert f"±{MAX_COORDINATE:,.0f} pixels" in p.message, p.message


def test_a_pixel_coordinate_at_the_bound_loads_on_a_camera():
    text = camera(f"units: pixels\nlines:\n  - name: gate\n    points: [[0, 10], [{MAX_COORDINATE}, 10]]\n")
    assert load(AgentConfig, text, FILE).source.analytics.lines[0].points[1] == (MAX_COORDINATE, 10.0)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -float("inf"), 1e308, -3e9],
    ids=["nan", "inf", "-inf", "1e308", "-3e9"],
)
def test_a_coordinate_not_finite_or_beyond_the_bound_is_refused_however_it_is_built(value):
    """Built in code (tools, tests) as from YAML: the bound holds in the dataclass."""
    for make in (
        lambda: ZoneConfig(name="z", points=((0.1, 0.1), (0.5, value), (0.1, 0.5))),
        lambda: LineConfig(name="l", points=((value, 0.1), (0.5, 0.5))),
    ):
        with pytest.raises(FieldError) as info:
            make()
        assert info.value.key in ("points[0]", "points[1]") and " = " in str(info.value), str(info.value)


def test_nan_and_inf_in_yaml_are_refused_at_the_coordinate():
    text = camera("units: pixels\nzones:\n  - name: door\n    points: [[10, 10], [.nan, 10], [10, .inf]]\n")
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, text, FILE)
    got = sorted(p.path for p in info.value.problems)
    assert got == ["source.analytics.zones[0].points[1][0]", "source.analytics.zones[0].points[2][1]"], got


# -- names ---------------------------------------------------------------------------------------


def test_two_zones_of_one_name_are_refused():
    text = analytics(f"zones:\n  - name: door\n    points: {TRI}\n  - name: door\n    points: {TRI}\n")
    p = only_problem(text)
    assert (p.path, p.line) == ("source.analytics.zones", line_of(text, "zones:") + 1), str(p)
    assert "names given twice: door" in p.message


def test_a_zone_and_a_line_of_one_name_are_refused():
    text = analytics(
        f"zones:\n  - name: door\n    points: {TRI}\nlines:\n  - name: door\n    points: {SEG}\n"
    )
    p = only_problem(text)
    assert (p.path, p.line) == ("source.analytics.zones", line_of(text, "zones:") + 1), str(p)
    assert "names given twice: door" in p.message and "one namespace" in p.message


@pytest.mark.parametrize("name", ['""', '"a/b"', '"a b"', "null"], ids=["empty", "slash", "space", "null"])
def test_a_bad_name_is_refused_at_the_name(name):
    text = analytics(f"zones:\n  - name: {name}\n    points: {TRI}\n")
    p = only_problem(text)
    assert (p.path, p.line) == ("source.analytics.zones[0].name", line_of(text, "name:")), str(p)


def test_a_missing_name_is_blamed_on_the_zone():
    text = analytics(f"lines:\n  - points: {SEG}\n")
    assert_at(text, "points:", "source.analytics.lines[0].name", "a name is required")


# -- the other keys ------------------------------------------------------------------------------


def test_an_unknown_anchor_is_refused():
    text = zone_doc(TRI, extra="    anchor: feet\n")
    assert_at(text, "anchor:", "source.analytics.zones[0].anchor", "got 'feet'")


def test_dwell_steps_must_ascend():
    text = zone_doc(TRI, extra="    dwell_s: [5, 2]\n")
    assert_at(text, "dwell_s:", "source.analytics.zones[0].dwell_s", "ascending")
    text = zone_doc(TRI, extra="    dwell_s: [2, 2]\n")
    assert_at(text, "dwell_s:", "source.analytics.zones[0].dwell_s", "each once")


def test_min_frames_0_is_refused():
    text = analytics(f"lines:\n  - name: gate\n    min_frames: 0\n    points: {SEG}\n")
    assert_at(text, "min_frames:", "source.analytics.lines[0].min_frames", "1..1000")


def test_analytics_needs_the_tracker():
    text = analytics(f"lines:\n  - name: gate\n    points: {SEG}\n", source_extra="  tracker: {type: none}\n")
    # the source's analytics key: its value starts on the line after it
    assert_at(text, "lines:", "source.analytics", "tracker is off")
    # no zones or lines: nothing to count, the tracker may be off
    assert load(AgentConfig, "source:\n  type: synthetic\n  tracker: {type: none}\n", FILE)


def test_every_problem_of_a_section_is_reported_at_once():
    text = analytics(
        "zones:\n  - name: door\n    min_frames: 0\n    points: [[0.1, 0.1], [0.2, 0.2], [0.3, 0.3]]\n"
        "lines:\n  - name: gate\n    points: [[0.2, 0.2], [0.2, 0.2]]\n"
    )
    with pytest.raises(ConfigError) as info:
        load(AgentConfig, text, FILE)
    got = sorted((p.path, p.line) for p in info.value.problems)
    assert got == [
        ("source.analytics.lines[0].points", line_of(text, "[0.2, 0.2], [0.2, 0.2]")),
        ("source.analytics.zones[0].min_frames", line_of(text, "min_frames")),
        ("source.analytics.zones[0].points", line_of(text, "[0.3, 0.3]")),
    ]


# -- a good config -------------------------------------------------------------------------------


def test_a_valid_config_loads_as_written():
    text = doc(
        """
        source:
          type: synthetic
          analytics:
            zones:
              - name: door
                labels: [person]
                anchor: center
                min_frames: 5
                dwell_s: [1, 2.5]
                points: [[0.1, 0.1], [0.3, 0.1], [0.3, 0.6], [0.8, 0.6], [0.8, 0.8], [0.1, 0.8]]
            lines:
              - name: gate
                in_side: right
                points: [[0, 0.5], [1, 0.5]]
        """
    )
    a = load(AgentConfig, text, FILE).source.analytics
    assert a.enabled and a.units == "fraction"
    assert a.zones == (
        ZoneConfig(
            name="door",
            labels=("person",),
            anchor="center",
            min_frames=5,
            dwell_s=(1.0, 2.5),
            points=((0.1, 0.1), (0.3, 0.1), (0.3, 0.6), (0.8, 0.6), (0.8, 0.8), (0.1, 0.8)),
        ),
    )
    assert a.lines == (LineConfig(name="gate", in_side="right", points=((0.0, 0.5), (1.0, 0.5))),)
    assert a.lines[0].anchor == "bottom_center" and a.lines[0].min_frames == 3 and a.lines[0].labels == ()
    assert all(isinstance(v, float) for p in a.lines[0].points for v in p)


def test_a_valid_pixel_config_loads_and_an_empty_one_is_off():
    text = analytics("units: pixels\nlines:\n  - name: gate\n    points: [[0, 240], [640, 240]]\n")
    a = load(AgentConfig, text, FILE).source.analytics
    assert a.units == "pixels" and a.lines[0].points == ((0.0, 240.0), (640.0, 240.0))
    assert a.outside(640, 480) is None and "gate" in a.outside(320, 480)
    assert not load(AgentConfig, "source:\n  type: synthetic\n", FILE).source.analytics.enabled
    assert AnalyticsConfig() == load(AgentConfig, "source:\n  analytics: {}\n", FILE).source.analytics
