"""A source's zones and lines (``source.analytics``): what the analytics on its tracks
count (``pipelines/analytics``). Checked once at load: a polygon must be simple (no edge
crossing another, some area), a line must have a length, names must be unique, points must
lie in the frame (fractions within 0..1; pixels within the source's size where the config
states it, and within ``MAX_COORDINATE`` everywhere)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from edge_agent.core.configfields import check, path_field
from edge_agent.core.names import NAME_RULE, name_ok

Point = tuple[float, float]
Anchor = Literal[
    "bottom_center",
    "center",
    "top_center",
    "left_center",
    "right_center",
    "top_left",
    "top_right",
    "bottom_left",
    "bottom_right",
]
#: Each anchor as fractions of the box's width and height from its top-left corner.
ANCHORS: dict[str, tuple[float, float]] = {
    "bottom_center": (0.5, 1.0),
    "center": (0.5, 0.5),
    "top_center": (0.5, 0.0),
    "left_center": (0.0, 0.5),
    "right_center": (1.0, 0.5),
    "top_left": (0.0, 0.0),
    "top_right": (1.0, 0.0),
    "bottom_left": (0.0, 1.0),
    "bottom_right": (1.0, 1.0),
}
MAX_ITEMS = 32  # zones, and lines, per source
MAX_POINTS = 64  # per polygon
MAX_DWELL_STEPS = 16
#: Pixels, either way from 0: no camera's frame is this large (8K is 7680 wide), and below
#: it the geometry's products stay exact in float64 and no drawn point nears int32's range.
#: A camera states no size in its config, so only this bounds its pixels at load.
MAX_COORDINATE = 65_536.0


@dataclass(frozen=True)
class _Counted:
    """What zones and lines share: a name, the labels they count, the box's point that
    counts, and the frames an observation must hold before it does."""

    name: str = ""
    labels: tuple[str, ...] = ()  # the model's labels counted (empty: every label)
    anchor: Anchor = "bottom_center"  # the point of the box that counts (feet on the floor)
    # frames in a row on the new side (inside, outside) before a crossing, entry or exit
    # counts: a box jittering across a border is not counted back and forth
    min_frames: int = 3

    def __post_init__(self) -> None:
        check(name_ok(self.name), "name", f"a name is required: {NAME_RULE}")
        check(1 <= self.min_frames <= 1000, "min_frames", "must be within 1..1000")
        check(len(set(self.labels)) == len(self.labels), "labels", "a label is named twice")
        check(all(self.labels), "labels", "an empty label")


@dataclass(frozen=True)
class ZoneConfig(_Counted):
    """A polygon: who is inside, entries, exits, time inside."""

    points: tuple[Point, ...] = ()
    # dwell events when a track has been inside this long (seconds, ascending)
    dwell_s: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if _points_bounded(self.points):  # a polygon test on 1e308 overflows to nonsense
            problem = polygon_problem(self.points)
            check(problem is None, "points", problem or "")
        check(len(self.dwell_s) <= MAX_DWELL_STEPS, "dwell_s", f"at most {MAX_DWELL_STEPS} steps")
        check(all(0 < s <= 86_400 for s in self.dwell_s), "dwell_s", "each must be within (0, 86400] s")
        check(list(self.dwell_s) == sorted(set(self.dwell_s)), "dwell_s", "must be ascending, each once")


@dataclass(frozen=True)
class LineConfig(_Counted):
    """A segment from ``points[0]`` to ``points[1]``: crossings in each direction. Facing
    from the first point to the second, ``in_side`` is the side a crossing into counts as
    ``in``; the other way is ``out``."""

    points: tuple[Point, ...] = ()
    in_side: Literal["left", "right"] = "left"
    # a dead band each side of the line, as a fraction of the box's height: an anchor in it
    # is on neither side (a box swaying on the line never starts a run on the other side)
    band: float = 0.05

    def __post_init__(self) -> None:
        super().__post_init__()
        check(0 <= self.band <= 1, "band", "must be within 0..1 (a fraction of the box's height)")
        _points_bounded(self.points)
        pts = self.points
        check(len(pts) == 2, "points", f"a line is two points, got {len(pts)}")
        check(len(pts) != 2 or pts[0] != pts[1], "points", "a line of zero length (its two points are equal)")


@dataclass(frozen=True)
class SnapshotConfig:
    """The annotated frame of each event as a JPEG in ``dir`` (empty: off, and no cost),
    named by the event; the oldest files go when there are more than ``max_files`` or
    more than ``max_mib`` of them. While on, each frame of the source is copied once (the
    event is known only after inference, when the camera has moved on)."""

    dir: str = path_field("path")
    max_files: int = 500
    max_mib: float = 200.0
    jpeg_quality: int = 85

    def __post_init__(self) -> None:
        check(1 <= self.max_files <= 1_000_000, "max_files", "must be within 1..1000000")
        check(0.1 <= self.max_mib <= 1_000_000, "max_mib", "must be within 0.1..1000000")
        check(10 <= self.jpeg_quality <= 100, "jpeg_quality", "must be within 10..100")

    @property
    def enabled(self) -> bool:
        return bool(self.dir)


@dataclass(frozen=True)
class AnalyticsConfig:
    """A source's zones and lines; coordinates in ``units``: ``fraction`` of the frame's
    width and height, or source ``pixels``."""

    units: Literal["fraction", "pixels"] = "fraction"
    zones: tuple[ZoneConfig, ...] = ()
    lines: tuple[LineConfig, ...] = ()
    snapshots: SnapshotConfig = field(default_factory=SnapshotConfig)

    def __post_init__(self) -> None:
        check(len(self.zones) <= MAX_ITEMS, "zones", f"at most {MAX_ITEMS} zones")
        check(len(self.lines) <= MAX_ITEMS, "lines", f"at most {MAX_ITEMS} lines")
        names = [z.name for z in self.zones] + [ln.name for ln in self.lines]
        twice = sorted({n for n in names if names.count(n) > 1})
        check(
            not twice,
            "zones" if self.zones else "lines",
            f"names given twice: {', '.join(twice)} (zones and lines share one namespace)",
        )
        rule = "each coordinate within 0..1" if self.units == "fraction" else "no negative coordinate"
        low, high = (0.0, 1.0) if self.units == "fraction" else (0.0, MAX_COORDINATE)
        for key, items in (("zones", self.zones), ("lines", self.lines)):
            for i, item in enumerate(items):
                for j, p in enumerate(item.points):
                    bad = next((f"{a} = {v:g}" for a, v in zip("xy", p) if not low <= v <= high), None)
                    where = f"{key}[{i}].points[{j}]"
                    check(
                        bad is None,
                        where,
                        f"{bad} is outside the frame ({item.name}; units {self.units}: {rule})",
                    )

    @property
    def enabled(self) -> bool:
        return bool(self.zones or self.lines)

    def outside(self, width: int, height: int) -> str | None:
        """Why a point lies outside a ``width`` x ``height`` frame (None if none does)."""
        if self.units != "pixels":
            return None
        for item in (*self.zones, *self.lines):
            for x, y in item.points:
                if x > width or y > height:
                    return f"{item.name}: point ({x:g}, {y:g}) is outside the {width}x{height} frame"
        return None


def _points_bounded(points: tuple[Point, ...]) -> bool:
    """Whether every coordinate is a finite number within ``MAX_COORDINATE`` (whatever the
    units: a fraction's own rule is narrower); each one that is not is a problem at its point."""
    ok = True
    for j, p in enumerate(points):
        for axis, v in zip("xy", p):
            if not math.isfinite(v):
                check(False, f"points[{j}]", f"{axis} = {v!r} is not a finite number")
            elif abs(v) > MAX_COORDINATE:
                check(
                    False,
                    f"points[{j}]",
                    f"{axis} = {v:g} is beyond ±{MAX_COORDINATE:,.0f} pixels (no frame is that large)",
                )
            else:
                continue
            ok = False
    return ok


def polygon_problem(points: tuple[Point, ...]) -> str | None:
    """Why ``points`` is no simple polygon (None when it is one): too few or too many
    points, no area, or two edges that cross or touch other than at their shared corner."""
    n = len(points)
    if n < 3:
        return f"a zone needs at least 3 points, got {n}"
    if n > MAX_POINTS:
        return f"at most {MAX_POINTS} points, got {n}"
    if len(set(points)) != n:
        return "a point is given twice"
    for i in range(n):
        a, b = points[i], points[(i + 1) % n]
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):
                continue  # neighbours share a corner
            c, d = points[j], points[(j + 1) % n]
            if _segments_meet(a, b, c, d):
                return f"self-intersecting: edge {i}-{(i + 1) % n} meets edge {j}-{(j + 1) % n}"
    area = sum(
        points[i][0] * points[(i + 1) % n][1] - points[(i + 1) % n][0] * points[i][1] for i in range(n)
    )
    if abs(area) < 1e-12:
        return "degenerate: the points enclose no area"
    return None


def _orient(a: Point, b: Point, c: Point) -> float:
    return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])


def _on(a: Point, b: Point, p: Point) -> bool:
    """``p``, on the line through a and b, lies within the segment."""
    return min(a[0], b[0]) <= p[0] <= max(a[0], b[0]) and min(a[1], b[1]) <= p[1] <= max(a[1], b[1])


def _segments_meet(a: Point, b: Point, c: Point, d: Point) -> bool:
    o1, o2, o3, o4 = _orient(a, b, c), _orient(a, b, d), _orient(c, d, a), _orient(c, d, b)
    if (o1 > 0) != (o2 > 0) and (o3 > 0) != (o4 > 0) and o1 and o2 and o3 and o4:
        return True
    return (
        (o1 == 0 and _on(a, b, c))
        or (o2 == 0 and _on(a, b, d))
        or (o3 == 0 and _on(c, d, a))
        or (o4 == 0 and _on(c, d, b))
    )
