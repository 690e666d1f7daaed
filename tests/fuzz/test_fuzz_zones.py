"""Fuzz target: a source's ``analytics`` section (zones and lines: points, names, labels,
anchors, dwell steps, bands) through the real config loader (``configload.load`` of an
``AgentConfig``, what ``config validate`` and ``run`` call), as near-valid structures and as
raw text. The property: a config or a ``ConfigError``, never another exception, never a
hang; and a config it takes, scaled to any frame size, gives the counter's geometry and
shapes within the frame and its clip margin, which ``annotate`` draws without an error.

Examples: issue 43's trial 5 (3e9 on a camera), and the defects these targets found while
written (each fixed): an integer too large for a float raised OverflowError from the loader;
one of over 4,300 digits, Python's ValueError; a control character in the text, PyYAML's
ReaderError (raised as the loader was built, outside the composer's handling)."""

from __future__ import annotations

import math

import numpy as np
import yaml
from fuzzing import bounded, examples
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_agent.core.analytics_config import ANCHORS, MAX_COORDINATE
from edge_agent.core.config import AgentConfig
from edge_agent.core.configload import ConfigError, load
from edge_agent.pipelines.analytics.geometry import Geometry, clip_window
from edge_agent.service.view.annotate import draw_analytics

FILE = "fuzz.yaml"

NUMBERS = st.one_of(
    st.floats(min_value=-1.5, max_value=1.5),  # fractions, near the frame
    st.floats(min_value=-2 * MAX_COORDINATE, max_value=2 * MAX_COORDINATE),  # pixels, near the bound
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**40), max_value=2**40),
    st.sampled_from([0, 1, 0.5, MAX_COORDINATE, -MAX_COORDINATE, 3e9, 1e308, -1e308, 10**400, 2**63]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12))
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
#: Any value where a key's own is due: the cheaper scalars mostly.
ODD = st.one_of(SCALARS, SCALARS, VALUES)
#: How far a section's shapes reach, in its units: a fraction's frame, pixels of a camera
#: or at (and beyond) the bound, where shapes reach far past any frame and are clipped.
SPANS = {
    "fraction": st.sampled_from([1.0]),
    "pixels": st.one_of(st.sampled_from([640.0, MAX_COORDINATE, 70_000.0]), st.floats(1, 2 * MAX_COORDINATE)),
}


@st.composite
def polygon(draw: st.DrawFn, span: float) -> list:
    """A simple polygon within 0..``span``: corners around a centre at increasing angles,
    each at its own radius (star-shaped, so concave too), 3 to 12 corners or 65 (one over
    the cap)."""
    n = draw(st.sampled_from([3, 3, 4, 4, 5, 6, 8, 12, 65]))
    angles = sorted(set(draw(st.lists(st.floats(0, 6.28), min_size=n, max_size=n))))
    cx, cy = draw(st.floats(0.25, 0.75)), draw(st.floats(0.25, 0.75))
    radii = draw(st.lists(st.floats(0.01, 0.25), min_size=len(angles), max_size=len(angles)))
    return [[span * (cx + r * math.cos(a)), span * (cy + r * math.sin(a))] for a, r in zip(angles, radii)]


def counted(draw: st.DrawFn, name: str, points: list) -> dict:
    item: dict = {"name": name, "points": points}
    optional = {
        "labels": st.lists(st.sampled_from(["person", "car"]), max_size=2, unique=True),
        "anchor": st.sampled_from(sorted(ANCHORS)),
        "min_frames": st.integers(1, 1000),
    }
    for key, values in optional.items():
        if draw(st.booleans()):
            item[key] = draw(values)
    return item


@st.composite
def section(draw: st.DrawFn) -> dict:
    """A valid analytics section (its units; up to 3 zones and lines, their shapes within
    a span that may be beyond the bound), then up to 3 faults: a key, a point or a
    coordinate replaced by any value (NaN, inf, huge, negative, garbage), a point repeated
    (a polygon that crosses itself or repeats a corner)."""
    units = draw(st.sampled_from(["fraction", "pixels"]))
    span = draw(SPANS[units])
    zones = []
    for i in range(draw(st.integers(0, 3))):
        z = counted(draw, f"z{i}", draw(polygon(span)))
        if draw(st.booleans()):
            z["dwell_s"] = sorted(set(draw(st.lists(st.floats(0.5, 600), max_size=4))))
        zones.append(z)
    lines = []
    for i in range(draw(st.integers(0, 3))):
        ends = [[span * draw(st.floats(0, 1)) for _ in "xy"] for _ in "ab"]
        ln = counted(draw, f"l{i}", ends)
        if draw(st.booleans()):
            ln["in_side"], ln["band"] = draw(st.sampled_from(["left", "right"])), draw(st.floats(0, 1))
        lines.append(ln)
    body: dict = {"units": units, "zones": zones, "lines": lines}
    for _ in range(draw(st.integers(0, 3))):
        items = zones + lines
        where = draw(st.sampled_from(["section", "item", "point", "coordinate", "repeat"]))
        if where == "section" or not items:
            body[draw(st.sampled_from(["units", "zones", "lines", "snapshots", "extra"]))] = draw(ODD)
            continue
        item = draw(st.sampled_from(items))
        points = item["points"]
        if where == "item" or not isinstance(points, list) or not points:
            key = draw(
                st.sampled_from(["name", "points", "labels", "anchor", "min_frames", "dwell_s", "band"])
            )
            item[key] = draw(ODD)
        elif where == "point":
            points[draw(st.integers(0, len(points) - 1))] = draw(ODD)
        elif where == "coordinate" and isinstance(points[0], list) and points[0]:
            points[0][draw(st.integers(0, len(points[0]) - 1))] = draw(NUMBERS)
        else:
            points.append(points[0])
    return body


def source(draw: st.DrawFn, analytics_yaml: str) -> str:
    """A camera (no size: only the bound limits its pixels) or a synthetic source of some size."""
    head = "source:\n  type: v4l2\n"
    if draw(st.booleans()):
        w, h = draw(st.integers(16, 8192)), draw(st.integers(16, 8192))
        head = f"source:\n  type: synthetic\n  width: {w}\n  height: {h}\n"
    indented = "".join(f"    {ln}\n" for ln in analytics_yaml.splitlines())
    return head + "  analytics:\n" + indented


@st.composite
def structured(draw: st.DrawFn) -> str:
    return source(draw, yaml.safe_dump(draw(section()), default_flow_style=None, width=10_000))


@st.composite
def raw(draw: st.DrawFn) -> str:
    """Any text, or bytes read as Latin-1, under ``analytics:``."""
    text = draw(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))))
    return source(draw, text)


def loaded(text: str) -> AgentConfig | None:
    return bounded(lambda: load(AgentConfig, text, FILE), ConfigError)


def drawn_within_the_frame(cfg: AgentConfig, width: int, height: int) -> None:
    """The counter's geometry for a ``width`` x ``height`` frame, and its shapes drawn on a
    small image scaled from it: within the frame's clip window, no error."""
    analytics = cfg.source.analytics
    labels = tuple(
        dict.fromkeys(label for item in (*analytics.zones, *analytics.lines) for label in item.labels)
    )
    geo = Geometry(analytics, width, height, labels)
    x0, y0, x1, y1 = clip_window(width, height)
    for shape in (*geo.shapes.zones, *geo.shapes.lines):
        p = shape.points
        assert np.isfinite(p).all(), (shape.name, p.tolist())
        assert ((p[:, 0] >= x0) & (p[:, 0] <= x1) & (p[:, 1] >= y0) & (p[:, 1] <= y1)).all(), p.tolist()
    scale = min(96 / width, 96 / height)
    image = np.zeros((max(1, round(height * scale)), max(1, round(width * scale)), 3), np.uint8)
    draw_analytics(image, geo.shapes, {}, scale, 1)


def check(text: str, width: int, height: int) -> None:
    cfg = loaded(text)
    if cfg is not None:
        bounded(lambda: drawn_within_the_frame(cfg, width, height), ())


SIZES = st.tuples(st.integers(1, 8192), st.integers(1, 8192))
V4L2 = "source:\n  type: v4l2\n  analytics:\n"


@settings(max_examples=examples(60))
@given(structured(), SIZES)
@example(  # issue 43, trial 5: it passed config validate
    V4L2 + "    units: pixels\n    zones:\n    - {name: z, points: [[10, 10], [3000000000, 10], [10, 50]]}\n",
    (640, 480),
)
# at the bound, on a 1x1 frame: clipped to it
@example(V4L2 + "    units: pixels\n    lines:\n    - {name: l, points: [[0, 0], [65536, 65536]]}\n", (1, 1))
@example(V4L2 + "    zones:\n    - {name: z, points: [[0, 0], [1, 0], [0, 1.0e+400]]}\n", (640, 480))
@example(  # one over the count cap
    V4L2
    + "    zones:\n"
    + "".join(f"    - {{name: z{i}, points: [[0, 0], [1, 0], [0, 1]]}}\n" for i in range(33)),
    (9, 9),
)
def test_fuzz_analytics_section(text: str, size: tuple[int, int]) -> None:
    check(text, *size)


@settings(max_examples=examples(60))
@given(raw(), SIZES)
# found: OverflowError (int to float, configload)
@example(V4L2 + "    zones: [{name: z, points: [[0, 0], [1, 0], [" + "9" * 400 + ", 1]]}]\n", (640, 480))
# probed beside it: ValueError (over 4,300 digits, where a float or a list is due; yamlnodes)
@example(V4L2 + "    zones: [{name: z, points: [[0, 0], [1, 0], [" + "9" * 5000 + ", 1]]}]\n", (640, 480))
@example(V4L2 + "    lines: " + "9" * 5000 + "\n", (640, 480))
# found: yaml.reader.ReaderError (a control character; yamlnodes)
@example(V4L2 + "    \x1b\n", (1, 1))
def test_fuzz_analytics_section_raw(text: str, size: tuple[int, int]) -> None:
    check(text, *size)
