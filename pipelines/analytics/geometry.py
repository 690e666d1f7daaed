"""A source's zones and lines in source pixels: as shapes (what the live view and the event
snapshots draw, clipped to the frame and a margin) and as arrays for the tests over every
tracked detection at once (which anchors are inside which polygons, by crossing number over
all edges; on which side of which segment, if alongside it)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from edge_agent.core.analytics_config import ANCHORS, AnalyticsConfig, Point

#: A shape is clipped this far beyond each edge of the frame (a fraction of its larger
#: side): a clipped edge, drawn thick, stays off the image, so the outline shows only the
#: zone's own edges.
CLIP_MARGIN = 0.125


class ZoneShape(NamedTuple):
    name: str
    # (n, 2) float, source pixels, the polygon's corners in order, clipped to the frame and
    # its margin ((0, 2): none of it is near the frame)
    points: np.ndarray


class LineShape(NamedTuple):
    name: str
    points: np.ndarray  # (2, 2) float, source pixels: from, to, clipped as a zone ((0, 2): none)
    in_side: str  # "left" or "right", facing from the first point to the second


class Shapes(NamedTuple):
    """A source's zones and lines in its frames' pixels, clipped to the frame and a margin
    (read-only arrays: the view's thread draws them)."""

    zones: tuple[ZoneShape, ...]
    lines: tuple[LineShape, ...]


def scaled(config: AnalyticsConfig, points: tuple[Point, ...], width: int, height: int) -> np.ndarray:
    """``points`` of ``config`` in the pixels of a ``width`` x ``height`` frame: fractions
    scaled, pixels as they are (each within ``MAX_COORDINATE``: checked at load)."""
    k = (float(width), float(height)) if config.units == "fraction" else (1.0, 1.0)
    return np.array(points, float).reshape(-1, 2) * k


def clip_window(width: float, height: float) -> tuple[float, float, float, float]:
    """(x0, y0, x1, y1): a ``width`` x ``height`` frame and ``CLIP_MARGIN`` beyond it."""
    m = CLIP_MARGIN * max(width, height, 1.0)
    return -m, -m, width + m, height + m


def shapes_of(config: AnalyticsConfig, width: int, height: int) -> Shapes:
    """``config``'s zones and lines in the pixels of a ``width`` x ``height`` frame (as the
    counter's geometry takes them), clipped to it and its margin: all of a shape that can
    show, and no coordinate larger than the frame's for drawing code to wrap or crawl over."""
    window = clip_window(width, height)

    def fixed(a: np.ndarray) -> np.ndarray:
        a.setflags(write=False)  # shared with the view's thread
        return a

    zones = tuple(
        ZoneShape(z.name, fixed(clip_polygon(scaled(config, z.points, width, height), window)))
        for z in config.zones
    )
    lines = tuple(
        LineShape(ln.name, fixed(clip_segment(scaled(config, ln.points, width, height), window)), ln.in_side)
        for ln in config.lines
    )
    return Shapes(zones, lines)


def _within(points: np.ndarray, window: tuple[float, float, float, float]) -> bool:
    x0, y0, x1, y1 = window
    x, y = points[:, 0], points[:, 1]
    return bool(((x >= x0) & (x <= x1) & (y >= y0) & (y <= y1)).all())


def clip_polygon(points: np.ndarray, window: tuple[float, float, float, float]) -> np.ndarray:
    """The part of the polygon ``points`` ((n, 2), corners in order) inside the rectangle
    ``window`` (x0, y0, x1, y1), as a polygon (Sutherland-Hodgman, exact for any simple
    polygon against a rectangle; the same array when it lies inside, (0, 2) when none of
    it does). A concave polygon cut in two parts comes back as one, joined along the
    window's edge, which lies outside the frame."""
    if _within(points, window):
        return points
    pts = [(float(x), float(y)) for x, y in points]
    for axis, bound, keep_above in (
        (0, window[0], True),
        (0, window[2], False),
        (1, window[1], True),
        (1, window[3], False),
    ):
        out: list[tuple[float, float]] = []
        for i, cur in enumerate(pts):
            prev = pts[i - 1]
            cur_in = cur[axis] >= bound if keep_above else cur[axis] <= bound
            prev_in = prev[axis] >= bound if keep_above else prev[axis] <= bound
            if cur_in != prev_in:  # the edge crosses the bound: where it does is a corner
                t = (bound - prev[axis]) / (cur[axis] - prev[axis])
                other = prev[1 - axis] + t * (cur[1 - axis] - prev[1 - axis])
                out.append((bound, other) if axis == 0 else (other, bound))
            if cur_in:
                out.append(cur)
        pts = out
        if not pts:
            break
    return np.array(pts, float).reshape(-1, 2)


def clip_segment(points: np.ndarray, window: tuple[float, float, float, float]) -> np.ndarray:
    """The part of the segment ``points`` ((2, 2): from, to) inside the rectangle ``window``
    (Liang-Barsky; its direction kept; the same array when it lies inside, (0, 2) when
    none of it does)."""
    if _within(points, window):
        return points
    (ax, ay), (bx, by) = points.tolist()
    dx, dy = bx - ax, by - ay
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, ax - window[0]), (dx, window[2] - ax), (-dy, ay - window[1]), (dy, window[3] - ay)):
        if p == 0:
            if q < 0:  # parallel to this edge and beyond it
                return np.zeros((0, 2))
            continue
        t = q / p
        if p < 0:
            t0 = max(t0, t)
        else:
            t1 = min(t1, t)
    if t0 > t1:
        return np.zeros((0, 2))
    return np.array([(ax + t0 * dx, ay + t0 * dy), (ax + t1 * dx, ay + t1 * dy)])


class Geometry:
    """``config``'s zones and lines for a ``width`` x ``height`` frame, and which of the
    model's ``labels`` each counts."""

    def __init__(self, config: AnalyticsConfig, width: int, height: int, labels: tuple[str, ...]) -> None:
        self.width, self.height = width, height
        self.shapes = shapes_of(config, width, height)
        zones, lines = config.zones, config.lines
        # counted on the points as given (bounded at load, so exact in float64), not on the
        # clipped shapes: clipping a line would shorten what an anchor is alongside
        n_cls = max(len(labels), 1)
        # zones: every edge (i -> i+1) of every polygon, with the zone it belongs to and that
        # zone's anchor, so one pass over (boxes, edges) and a product with the edge-zone
        # incidence count each anchor's crossings per zone
        kinds = sorted({z.anchor for z in zones})
        self.kinds = np.array([ANCHORS[a] for a in kinds], float).reshape(-1, 2)
        self.kinds_m = _anchor_matrix(self.kinds)
        edges = []
        for k, z in enumerate(zones):
            pts = scaled(config, z.points, width, height)
            for p0, p1 in zip(pts, np.roll(pts, -1, axis=0)):
                if p0[1] != p1[1]:  # a horizontal edge is never crossed by the ray
                    edges.append((k, *p0, *p1, kinds.index(z.anchor)))
        e = np.array(edges, float).reshape(-1, 6)
        self.e_x0, self.e_y0, self.e_y1 = e[:, 1].copy(), e[:, 2].copy(), e[:, 4].copy()
        self.e_slope = (e[:, 3] - e[:, 1]) / (e[:, 4] - e[:, 2])
        # each edge's anchor (a column of ``_anchor_xy``), None when all zones share one
        self.e_kind = e[:, 5].astype(np.intp) if len(kinds) > 1 else None
        self.e_zone = np.zeros((len(e), len(zones)))
        self.e_zone[np.arange(len(e)), e[:, 0].astype(int)] = 1.0
        self.z_labels = _label_mask(labels, [z.labels for z in zones], n_cls)
        self.z_min = np.array([z.min_frames for z in zones], np.int64)
        steps = max((len(z.dwell_s) for z in zones), default=0)
        self.z_dwell = np.full((len(zones), steps + 1), np.inf)
        for k, z in enumerate(zones):
            self.z_dwell[k, : len(z.dwell_s)] = z.dwell_s
        # lines: a -> b, the side "in" is +1
        pts = np.array([scaled(config, ln.points, width, height) for ln in lines], float).reshape(-1, 2, 2)
        self.la, self.lb = pts[:, 0], pts[:, 1]
        self.l_dir = self.lb - self.la
        self.l_len2 = (self.l_dir**2).sum(1)
        self.l_band = np.array([ln.band for ln in lines])
        # facing a -> b in image coordinates (y down), the left side has a negative cross product
        self.l_sign = np.array([-1.0 if ln.in_side == "left" else 1.0 for ln in lines])
        self.l_anchor_m = _anchor_matrix(np.array([ANCHORS[ln.anchor] for ln in lines], float).reshape(-1, 2))
        self.l_labels = _label_mask(labels, [ln.labels for ln in lines], n_cls)
        self.l_min = np.array([ln.min_frames for ln in lines], np.int64)

    def inside(self, xyxy: np.ndarray) -> np.ndarray:
        """(k, zones): each box's anchor inside each zone (a ray to its left crosses the
        zone's edges an odd number of times)."""
        a = xyxy @ self.kinds_m
        px, py = a[:, : len(self.kinds)], a[:, len(self.kinds) :]  # (k, anchors)
        if self.e_kind is not None:
            px, py = px[:, self.e_kind], py[:, self.e_kind]  # (k, edges)
        crosses = (self.e_y0 > py) != (self.e_y1 > py)
        x_at = py - self.e_y0
        x_at *= self.e_slope
        x_at += self.e_x0  # each edge's x at the anchor's height
        crosses &= px < x_at
        count = (crosses.astype(float) @ self.e_zone).astype(np.intp)
        count &= 1
        return count.astype(bool)

    def sides(self, xyxy: np.ndarray) -> np.ndarray:
        """(k, lines) int8: +1 on the line's ``in`` side, -1 on the other (an anchor exactly
        on a line without a band counts as on the ``out`` side: integer boxes land there,
        and a crossing must not be lost to it), 2 within the line's band (on neither), 0
        beyond its ends (the anchor's projection off the segment)."""
        a = xyxy @ self.l_anchor_m
        px, py = a[:, : len(self.l_sign)], a[:, len(self.l_sign) :]  # (k, L)
        rx, ry = px - self.la[:, 0], py - self.la[:, 1]
        # the signed distance from the line, times its length, in the in side's direction
        cross = self.l_dir[:, 0] * ry - self.l_dir[:, 1] * rx
        cross *= self.l_sign
        band = np.multiply.outer(xyxy[:, 3] - xyxy[:, 1], self.l_band * np.sqrt(self.l_len2))
        side = np.full(cross.shape, 2, np.int8)
        side[cross > band] = 1
        side[cross <= -band] = -1
        t = self.l_dir[:, 0] * rx + self.l_dir[:, 1] * ry
        side[(t < 0) | (t > self.l_len2)] = 0
        return side


def _anchor_matrix(frac: np.ndarray) -> np.ndarray:
    """(4, 2n): a box's (x0, y0, x1, y1) times it is the x of each of ``frac``'s n anchors,
    then the y of each (x = x0 + fx (x1 - x0) is linear in the corners)."""
    n = len(frac)
    m = np.zeros((4, 2 * n))
    m[0, :n], m[2, :n] = 1 - frac[:, 0], frac[:, 0]
    m[1, n:], m[3, n:] = 1 - frac[:, 1], frac[:, 1]
    return m


def _label_mask(labels: tuple[str, ...], chosen: list[tuple[str, ...]], n_cls: int) -> np.ndarray:
    """(classes, items): class c counts for item k."""
    mask = np.zeros((n_cls, len(chosen)), bool)
    for k, names in enumerate(chosen):
        if not names:
            mask[:, k] = True
        else:
            for name in names:
                mask[labels.index(name), k] = True
    return mask
