"""A source's zones and lines in source pixels: as shapes (what the live view and the event
snapshots draw) and as arrays for the tests over every tracked detection at once (which
anchors are inside which polygons, by crossing number over all edges; on which side of
which segment, if alongside it)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from edge_agent.core.analytics_config import ANCHORS, AnalyticsConfig, Point


class ZoneShape(NamedTuple):
    name: str
    points: np.ndarray  # (n, 2) float, source pixels, the polygon's corners in order


class LineShape(NamedTuple):
    name: str
    points: np.ndarray  # (2, 2) float, source pixels: from, to
    in_side: str  # "left" or "right", facing from the first point to the second


class Shapes(NamedTuple):
    """A source's zones and lines in its frames' pixels (read-only arrays: the view's
    thread draws them)."""

    zones: tuple[ZoneShape, ...]
    lines: tuple[LineShape, ...]


def shapes_of(config: AnalyticsConfig, width: int, height: int) -> Shapes:
    """``config``'s zones and lines in the pixels of a ``width`` x ``height`` frame:
    fractions scaled, pixels as they are (as the counter's geometry takes them)."""
    k = (float(width), float(height)) if config.units == "fraction" else (1.0, 1.0)

    def px(points: tuple[Point, ...]) -> np.ndarray:
        a = np.array(points, float) * k
        a.setflags(write=False)  # shared with the view's thread
        return a

    zones = tuple(ZoneShape(z.name, px(z.points)) for z in config.zones)
    lines = tuple(LineShape(ln.name, px(ln.points), ln.in_side) for ln in config.lines)
    return Shapes(zones, lines)


class Geometry:
    """``config``'s zones and lines for a ``width`` x ``height`` frame, and which of the
    model's ``labels`` each counts."""

    def __init__(self, config: AnalyticsConfig, width: int, height: int, labels: tuple[str, ...]) -> None:
        self.width, self.height = width, height
        self.shapes = shapes_of(config, width, height)
        zones, lines = config.zones, config.lines
        n_cls = max(len(labels), 1)
        # zones: every edge (i -> i+1) of every polygon, with the zone it belongs to and that
        # zone's anchor, so one pass over (boxes, edges) and a product with the edge-zone
        # incidence count each anchor's crossings per zone
        kinds = sorted({z.anchor for z in zones})
        self.kinds = np.array([ANCHORS[a] for a in kinds], float).reshape(-1, 2)
        self.kinds_m = _anchor_matrix(self.kinds)
        edges = []
        for k, (z, shape) in enumerate(zip(zones, self.shapes.zones)):
            pts = shape.points
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
        pts = np.array([shape.points for shape in self.shapes.lines], float).reshape(-1, 2, 2)
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
