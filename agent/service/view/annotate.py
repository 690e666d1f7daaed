"""Drawing a frame's detections and figures on it, with OpenCV, in place on the caller's
copy: the source's zones and lines with their counts, under the boxes in one colour per
class, label and score (and track id, with a trail of the track's recent centres), and a
corner stamp with the frame id, the end-to-end latency and whether the deadline was missed.

Beyond the box, by the model's task: a segmentation model's masks tinted in their box's
colour (under everything but the zones), a pose model's keypoints and, for COCO's 17, the
skeleton Ultralytics draws (under the boxes), an oriented box's four corners outlined
instead of its axis-aligned bounds (its label at its top-most corner)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from edge_agent.pipelines.analytics.geometry import Shapes, clip_polygon, clip_segment, clip_window
from edge_agent.pipelines.view_tap import ViewFrame

#: BGR, one per class id (cycled): saturated and far apart, readable on most scenes.
PALETTE = (
    (56, 56, 255),
    (151, 157, 255),
    (31, 112, 255),
    (29, 178, 255),
    (49, 210, 207),
    (10, 249, 72),
    (23, 204, 146),
    (134, 219, 61),
    (211, 188, 0),
    (255, 115, 100),
    (236, 24, 0),
    (255, 56, 132),
)
#: BGR, zones' and lines' (cycled, each their own): apart from the class colours above.
ZONE_COLOURS = ((0, 255, 255), (255, 0, 255), (255, 255, 0))
LINE_COLOURS = ((255, 255, 255), (160, 255, 160))
ZONE_FILL = 0.15  # a zone's fill's opacity: the scene stays visible under it
MASK_ALPHA = 0.4  # a mask's tint's opacity
KEYPOINT_CONF = 0.5  # a keypoint with a lower confidence is not drawn, nor its limbs
#: COCO-17's limbs as Ultralytics draws them (``Annotator.skeleton``, 0-based here), and
#: its colours (``Colors.pose_palette`` picks, given to OpenCV as Ultralytics does): limbs,
#: then keypoints.
SKELETON = np.array(
    [
        (15, 13), (13, 11), (16, 14), (14, 12), (11, 12), (5, 11), (6, 12), (5, 6), (5, 7), (6, 8),
        (7, 9), (8, 10), (1, 2), (0, 1), (0, 2), (1, 3), (2, 4), (3, 5), (4, 6),
    ]
)  # fmt: skip
_LEGS, _HIPS, _ARMS, _HEAD = (51, 153, 255), (255, 51, 255), (255, 128, 0), (0, 255, 0)
LIMB_COLOURS = (_LEGS,) * 4 + (_HIPS,) * 3 + (_ARMS,) * 5 + (_HEAD,) * 7
KEYPOINT_COLOURS = (_HEAD,) * 5 + (_ARMS,) * 6 + (_LEGS,) * 6
#: The limbs by colour: (colour, their indices in ``SKELETON``).
_LIMB_GROUPS = tuple(
    (c, np.array([j for j, lc in enumerate(LIMB_COLOURS) if lc == c])) for c in dict.fromkeys(LIMB_COLOURS)
)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


def colour(class_id: int) -> tuple[int, int, int]:
    return PALETTE[class_id % len(PALETTE)]


def annotate(
    image: np.ndarray,
    f: ViewFrame,
    scale: float = 1.0,
    trails: Mapping[int, Sequence[tuple[float, float]]] | None = None,
) -> np.ndarray:
    """Draw ``f``'s detections (source pixels, times ``scale`` for a resized image) and its
    stamp on ``image``; returns it. ``trails``: by track id, its recent centres (source
    pixels), drawn under the boxes, as are the zones and lines (``f.shapes``, if any), whose
    names and counts go over the boxes. No label sits under the stamp (see ``_label_top``)."""
    thick = max(1, round(2 * max(image.shape[:2]) / 960))
    stamp = f.caption or f"frame {f.frame_id}  e2e {f.e2e_ms:.1f} ms" + ("  MISSED" if f.missed else "")
    (sw, sh), sbase = cv2.getTextSize(stamp, _FONT, 0.55, 1)
    stamp_box = (0, 0, sw + 10, sh + sbase + 8)  # x1, y1, x2, y2 (inclusive, as cv2.rectangle fills)
    tags: Sequence[Tag] = ()
    if f.shapes is not None:
        tags = draw_analytics(image, f.shapes, f.counts or {}, scale, thick)
    if f.task == "segment":
        draw_masks(image, f, scale)
    for i in range(f.det_count if trails else 0):
        points = trails.get(int(f.det_track[i]))
        if points is not None and len(points) > 1:
            line = np.round(np.asarray(points, np.float64) * scale).astype(np.int32)
            cv2.polylines(image, [line], False, colour(int(f.det_class[i])), thick)
    if f.task == "pose" and f.keypoints and f.det_count:
        draw_keypoints(image, f, scale, thick)
    rotated = f.task == "obb" and f.det_extra.shape[1] >= 13
    for i in range(f.det_count):
        cls = int(f.det_class[i])
        x1, y1, x2, y2 = (round(float(v) * scale) for v in f.det_xyxy[i])
        c = colour(cls)
        if rotated:
            corners = np.round(f.det_extra[i, 5:13].reshape(4, 2) * scale).astype(np.int32)
            cv2.polylines(image, [corners], True, c, thick)
            x1, y1 = (int(v) for v in corners[np.argmin(corners[:, 1])])  # the label's anchor
        else:
            cv2.rectangle(image, (x1, y1), (x2, y2), c, thick)
        label = f.labels[cls] if 0 <= cls < len(f.labels) else str(cls)
        track = int(f.det_track[i])
        text = f"{label} #{track} {f.det_score[i]:.2f}" if track > 0 else f"{label} {f.det_score[i]:.2f}"
        (tw, th), base = cv2.getTextSize(text, _FONT, 0.5, 1)
        w, h = tw + 4, th + base + 2
        left = max(0, min(x1, image.shape[1] - w))  # a box at the right edge keeps its label whole
        top = _label_top(left, max(0, y1 - h), w, h, stamp_box)
        cv2.rectangle(image, (left, top), (left + w, top + h), c, -1)
        cv2.putText(image, text, (left + 2, top + th + 1), _FONT, 0.5, (255, 255, 255), 1, cv2.LINE_AA)
    for tag in tags:
        draw_tag(image, tag, stamp_box)
    cv2.rectangle(image, stamp_box[:2], (stamp_box[2], stamp_box[3]), (0, 0, 0), -1)
    ink = (0, 0, 255) if f.missed else (255, 255, 255)
    cv2.putText(image, stamp, (5, sh + 4), _FONT, 0.55, ink, 1, cv2.LINE_AA)
    return image


def _label_top(left: int, top: int, w: int, h: int, stamp: tuple[int, int, int, int]) -> int:
    """The label's top edge: above its box as usual, but just below the stamp when it would
    sit under it (a box at the top-left corner), since the stamp is drawn last, over it."""
    sx1, sy1, sx2, sy2 = stamp
    if left <= sx2 and left + w >= sx1 and top <= sy2 and top + h >= sy1:
        return sy2 + 1
    return top


def zone_colour(k: int) -> tuple[int, int, int]:
    return ZONE_COLOURS[k % len(ZONE_COLOURS)]


def line_colour(k: int) -> tuple[int, int, int]:
    return LINE_COLOURS[k % len(LINE_COLOURS)]


#: A zone's or line's name and counts, to be drawn: text, its box's top-left, colour.
Tag = tuple[str, tuple[int, int], tuple[int, int, int]]


def draw_analytics(
    image: np.ndarray, shapes: Shapes, counts: Mapping[str, Any], scale: float, thick: int
) -> list[Tag]:
    """Draw each zone (outline and a faint fill) and each line (segment and an arrow toward
    its ``in`` side) of ``shapes`` (source pixels, times ``scale``) on ``image``; returns
    their tags (name and counts: ``counts`` is the counter's block, a name missing is 0)
    for the caller to draw over the boxes with ``draw_tag``, so the counts stay readable."""
    tags: list[Tag] = []
    polys = [np.round(_on_image(z.points, scale, image, True)).astype(np.int32) for z in shapes.zones]
    for k, poly in enumerate(polys):
        if len(poly) >= 3:
            _fill(image, poly, zone_colour(k))  # every fill first: no tint over an outline
    for k, (z, poly) in enumerate(zip(shapes.zones, polys)):
        if len(poly) < 3:
            continue  # nowhere near the image
        c = zone_colour(k)
        cv2.polylines(image, [poly], True, c, thick + 1)  # thicker than a box's: told apart
        n = counts.get("zones", {}).get(z.name, {})
        text = f"{z.name} objects {n.get('objects', 0)} entered {n.get('entered', 0)}"
        text += f" exited {n.get('exited', 0)}"
        corner = poly[np.argmin(poly.sum(1))]  # the corner nearest the image's top-left
        tags.append((text, (int(corner[0]) + thick + 3, int(corner[1]) + thick + 3), c))
    for k, ln in enumerate(shapes.lines):
        ends = _on_image(ln.points, scale, image, False)
        if len(ends) != 2:
            continue  # nowhere near the image
        c = line_colour(k)
        a, b = ends
        cv2.line(image, _pt(a), _pt(b), c, thick + 1)
        d = (b - a) / max(float(np.hypot(*(b - a))), 1e-9)
        # facing a -> b with y down, the left side is (dy, -dx) (the counter's convention)
        normal = np.array((d[1], -d[0]) if ln.in_side == "left" else (-d[1], d[0]))
        mid, arrow = (a + b) / 2, 14 + 10 * thick
        cv2.arrowedLine(image, _pt(mid), _pt(mid + normal * arrow), c, thick + 1, tipLength=0.4)
        n = counts.get("lines", {}).get(ln.name, {})
        text = f"{ln.name} in {n.get('in', 0)} out {n.get('out', 0)}"
        w, h = _tag_size(text)
        # on the out side, clear of the arrow: its centre that far along the normal that its
        # nearer edge is a few pixels off the line
        centre = mid - normal * (6 + abs(normal[0]) * w / 2 + abs(normal[1]) * h / 2)
        tags.append((text, (round(centre[0] - w / 2), round(centre[1] - h / 2)), c))
    return tags


def _on_image(points: np.ndarray, scale: float, image: np.ndarray, closed: bool) -> np.ndarray:
    """A zone's (``closed``) or a line's ``points`` (source pixels) times ``scale``, clipped
    to ``image`` and a margin as ``shapes_of`` clips to the frame: whoever made the shape,
    OpenCV is handed no point it would wrap in int32 or crawl over. (0, 2) when none of it
    is near the image, or a coordinate is no number."""
    p = np.asarray(points, float).reshape(-1, 2) * scale
    if not np.isfinite(p).all() or (not closed and len(p) != 2):
        return np.zeros((0, 2))
    window = clip_window(image.shape[1], image.shape[0])
    return clip_polygon(p, window) if closed else clip_segment(p, window)


def _pt(p: np.ndarray) -> tuple[int, int]:
    return round(float(p[0])), round(float(p[1]))


def _fill(image: np.ndarray, poly: np.ndarray, c: tuple[int, int, int]) -> None:
    """Tint a zone: blended over the rectangle it spans only, not the whole frame (the
    blend is most of what drawing a zone costs)."""
    x1, y1 = np.maximum(poly.min(0), 0)
    x2, y2 = np.minimum(poly.max(0) + 1, image.shape[1::-1])
    if x2 <= x1 or y2 <= y1:
        return
    roi = image[y1:y2, x1:x2]
    tinted = roi.copy()
    cv2.fillPoly(tinted, [poly - (x1, y1)], c)
    cv2.addWeighted(tinted, ZONE_FILL, roi, 1 - ZONE_FILL, 0, dst=roi)


def _tag_size(text: str) -> tuple[int, int]:
    """The width and height of ``draw_tag``'s box around ``text``."""
    (tw, th), base = cv2.getTextSize(text, _FONT, 0.5, 1)
    return tw + 6, th + base + 4


def draw_tag(image: np.ndarray, tag: Tag, stamp: tuple[int, int, int, int]) -> None:
    """A tag's text in its colour on black (readable on any scene, and unlike a box's
    label), its box's top-left where the tag says, moved into the image where it would
    stick out and below the ``stamp`` where it would sit under it."""
    text, at, c = tag
    w, h = _tag_size(text)
    left = max(0, min(at[0], image.shape[1] - w))
    top = _label_top(left, max(0, min(at[1], image.shape[0] - h)), w, h, stamp)
    cv2.rectangle(image, (left, top), (left + w, top + h), (0, 0, 0), -1)
    cv2.putText(image, text, (left + 3, top + h - 5), _FONT, 0.5, c, 1, cv2.LINE_AA)


def draw_keypoints(image: np.ndarray, f: ViewFrame, scale: float, thick: int) -> None:
    """Each pose detection's keypoints (source pixels, times ``scale``) seen with a
    confidence of at least ``KEYPOINT_CONF`` (every one but those at (0, 0), Ultralytics'
    mark of a missing one, for a model without confidences) as dots; for COCO's 17
    keypoints, the limbs between two such, drawn first (one call per colour)."""
    n, k, d = f.det_count, f.keypoints, f.dims
    kp = f.det_extra[:n, : k * d].reshape(n, k, d)
    pts = np.round(kp[..., :2] * scale).astype(np.int32)
    seen = kp[..., 2] >= KEYPOINT_CONF if d >= 3 else kp[..., :2].any(axis=2)
    if k == 17:
        both = seen[:, SKELETON[:, 0]] & seen[:, SKELETON[:, 1]]  # (n, limbs)
        ends = np.stack((pts[:, SKELETON[:, 0]], pts[:, SKELETON[:, 1]]), axis=2)  # (n, limbs, 2, 2)
        for c, limbs in _LIMB_GROUPS:
            drawn = ends[:, limbs][both[:, limbs]]
            if len(drawn):
                cv2.polylines(image, list(drawn), False, c, thick, cv2.LINE_AA)
    radius = thick + 1
    for i, j in zip(*np.nonzero(seen)):
        c = KEYPOINT_COLOURS[j] if k == 17 else colour(int(f.det_class[i]))
        cv2.circle(image, (int(pts[i, j, 0]), int(pts[i, j, 1])), radius, c, -1, cv2.LINE_AA)


def draw_masks(image: np.ndarray, f: ViewFrame, scale: float) -> None:
    """Tint each detection's mask (source pixels; resized to ``scale`` with the nearest
    neighbour over its own crop) in its box's colour, at ``MASK_ALPHA``: only the mask's
    crop is read and written, never the whole frame."""
    h, w = image.shape[:2]
    for i in range(min(f.det_count, len(f.det_masks))):
        m = f.det_masks[i]
        if m is None or not m.bitmap.size:
            continue
        bitmap = m.bitmap
        mh, mw = bitmap.shape
        x0, y0 = round(m.x0), round(m.y0)
        if scale != 1.0 or m.scale != (1.0, 1.0):  # to the view's pixels (a mask of the input's: too)
            ex, ey = m.extent
            x0, y0 = round(m.x0 * scale), round(m.y0 * scale)
            sw, sh = round(ex * scale) - x0, round(ey * scale) - y0
            if sw <= 0 or sh <= 0:
                continue
            bitmap = cv2.resize(bitmap.view(np.uint8), (sw, sh), interpolation=cv2.INTER_NEAREST).view(bool)
            mh, mw = sh, sw
        a, b = max(0, -y0), max(0, -x0)  # the part inside the image
        y1, x1 = min(h, y0 + mh), min(w, x0 + mw)
        if y1 <= y0 + a or x1 <= x0 + b:
            continue
        roi = image[y0 + a : y1, x0 + b : x1]
        tinted = np.empty_like(roi)
        tinted[:] = colour(int(f.det_class[i]))
        cv2.addWeighted(roi, 1 - MASK_ALPHA, tinted, MASK_ALPHA, 0, dst=tinted)
        # written where the mask is set only (in place: ``roi`` is a view of the image)
        cv2.copyTo(tinted, bitmap[a : y1 - y0, b : x1 - x0].view(np.uint8), roi)
