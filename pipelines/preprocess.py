"""Letterbox preprocessing into preallocated model inputs, and the inverse box mapping.

Letterboxing keeps the aspect ratio: the frame is scaled to fit the model input and the
rest is filled with a constant. The exact scale and padding are recorded per frame so
boxes map back to source pixels without rounding drift.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

from edge_agent.models.manifest import InputFormat


@dataclass
class Letterbox:
    """Where a source frame landed inside the model input (mutable, reused per slot)."""

    src_w: int = 0
    src_h: int = 0
    scale_x: float = 1.0  # resized width / source width
    scale_y: float = 1.0
    pad_x: int = 0  # left padding, model-input pixels
    pad_y: int = 0  # top padding
    new_w: int = 0
    new_h: int = 0


def letterbox_geometry(
    src_w: int, src_h: int, dst_w: int, dst_h: int, out: Letterbox, stretch: bool = False
) -> Letterbox:
    """Fill ``out`` with the placement of a ``src_w``x``src_h`` frame in ``dst_w``x``dst_h``;
    ``stretch``: the whole input, each axis scaled on its own (RT-DETR's training resize)."""
    if src_w <= 0 or src_h <= 0:
        raise ValueError(f"empty frame {src_w}x{src_h}")
    if stretch:
        new_w, new_h = dst_w, dst_h
    else:
        r = min(dst_w / src_w, dst_h / src_h)
        new_w = min(dst_w, max(1, round(src_w * r)))
        new_h = min(dst_h, max(1, round(src_h * r)))
    out.src_w, out.src_h = src_w, src_h
    out.new_w, out.new_h = new_w, new_h
    out.scale_x, out.scale_y = new_w / src_w, new_h / src_h
    out.pad_x, out.pad_y = (dst_w - new_w) // 2, (dst_h - new_h) // 2
    return out


def letterbox_into(
    src: np.ndarray,
    dst: np.ndarray,
    pad_value: int,
    geo: Letterbox,
    stretch: bool = False,
    area: bool = False,
) -> Letterbox:
    """Resize ``src`` (H, W, 3) into ``dst`` (h, w, 3) with constant borders, in place
    (``stretch``: no borders, the aspect ratio is not kept). Bilinear, as Ultralytics'
    predict resizes; ``area``: pixel-area averaging when shrinking (smoother, slower).

    Only the border strips are filled and the resize writes straight into the view of
    ``dst``, so nothing is allocated and no pixel is written twice.
    """
    dh, dw = dst.shape[:2]
    letterbox_geometry(src.shape[1], src.shape[0], dw, dh, geo, stretch)
    x0, y0 = geo.pad_x, geo.pad_y
    x1, y1 = x0 + geo.new_w, y0 + geo.new_h
    if y0:
        dst[:y0].fill(pad_value)
    if y1 < dh:
        dst[y1:].fill(pad_value)
    if x0:
        dst[y0:y1, :x0].fill(pad_value)
    if x1 < dw:
        dst[y0:y1, x1:].fill(pad_value)
    view = dst[y0:y1, x0:x1]
    interp = cv2.INTER_AREA if area and min(geo.scale_x, geo.scale_y) < 1.0 else cv2.INTER_LINEAR
    cv2.resize(src, (geo.new_w, geo.new_h), dst=view, interpolation=interp)
    return geo


def boxes_to_source(xyxy: np.ndarray, geo: Letterbox) -> np.ndarray:
    """Map boxes (N, 4) from model-input pixels to source pixels, in place, clipped."""
    xyxy -= (geo.pad_x, geo.pad_y, geo.pad_x, geo.pad_y)
    xyxy /= (geo.scale_x, geo.scale_y, geo.scale_x, geo.scale_y)
    np.clip(xyxy, 0, (geo.src_w, geo.src_h, geo.src_w, geo.src_h), out=xyxy)
    return xyxy


def boxes_to_input(xyxy: np.ndarray, geo: Letterbox) -> np.ndarray:
    """Map boxes (N, 4) from source pixels to model-input pixels, in place."""
    xyxy[:, 0::2] *= geo.scale_x
    xyxy[:, 1::2] *= geo.scale_y
    xyxy[:, 0::2] += geo.pad_x
    xyxy[:, 1::2] += geo.pad_y
    return xyxy


class Preprocessor:
    """Writes a BGR frame into a model input tensor as the model's format says.

    The scratch buffers are owned by the preprocessor, so one instance serves one thread.
    A uint8 NHWC BGR model (normalisation folded into the graph) takes the letterboxed
    frame directly: one resize, no other pass over the pixels. For NCHW (Ultralytics'
    float RGB exports) the letterboxed frame is split into its three planes (one pass,
    contiguous writes), and each plane is scaled straight into its channel of the tensor
    in the model's colour order: no colour conversion, no float scratch image, and no
    strided write into the tensor, twice as fast as converting then transposing.
    """

    def __init__(self, fmt: InputFormat) -> None:
        self.fmt = fmt
        h, w = fmt.height, fmt.width
        self.direct = fmt.dtype == "uint8" and fmt.layout == "NHWC" and fmt.color == "bgr"
        self._stretch = fmt.resize == "stretch"
        self._area = fmt.interpolation == "area"
        self._canvas = np.empty((h, w, 3), np.uint8)
        self._planes = [np.empty((h, w), np.uint8) for _ in range(3)]  # B, G, R
        self._rgb = np.empty((h, w, 3), np.uint8) if fmt.color == "rgb" and fmt.layout == "NHWC" else None
        # Model channel c comes from plane _order[c] of the BGR frame.
        self._order = (2, 1, 0) if fmt.color == "rgb" else (0, 1, 2)
        # Per model channel: value = pixel * mul + add.
        std = np.asarray(fmt.std, np.float32)
        self._mul = np.broadcast_to(np.float32(fmt.scale) / std, 3).astype(np.float32)
        self._add = np.broadcast_to(-np.asarray(fmt.mean, np.float32) / std, 3).astype(np.float32)
        self._affine = bool(np.any(self._add != 0))

    def input_shape(self) -> tuple[int, ...]:
        h, w = self.fmt.height, self.fmt.width
        return (1, h, w, 3) if self.fmt.layout == "NHWC" else (1, 3, h, w)

    def __call__(self, frame_bgr: np.ndarray, tensor: np.ndarray, geo: Letterbox) -> Letterbox:
        """Letterbox ``frame_bgr`` into ``tensor`` (the model input, batch 1)."""
        fmt = self.fmt
        if self.direct:
            return letterbox_into(frame_bgr, tensor[0], fmt.pad_value, geo, self._stretch, self._area)
        letterbox_into(frame_bgr, self._canvas, fmt.pad_value, geo, self._stretch, self._area)
        if fmt.layout == "NCHW":
            cv2.split(self._canvas, self._planes)
            for c, p in enumerate(self._order):
                self._to_channel(self._planes[p], tensor[0, c], c)
            return geo
        img = self._canvas
        if self._rgb is not None:
            cv2.cvtColor(img, cv2.COLOR_BGR2RGB, dst=self._rgb)
            img = self._rgb
        if fmt.dtype == "uint8":  # normalisation is the model's own business
            np.copyto(tensor[0], img)
        else:
            np.multiply(img, self._mul, out=tensor[0], casting="unsafe")
            if self._affine:
                np.add(tensor[0], self._add, out=tensor[0], casting="unsafe")
        return geo

    def _to_channel(self, plane: np.ndarray, out: np.ndarray, c: int) -> None:
        if self.fmt.dtype == "uint8":
            np.copyto(out, plane)
            return
        np.multiply(plane, self._mul[c], out=out, casting="unsafe")
        if self._affine:
            np.add(out, self._add[c], out=out, casting="unsafe")
