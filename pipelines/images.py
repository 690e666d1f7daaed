"""Decoding images that come from outside (a folder, a watched drop, calibration or tune
frames): the one place an untrusted image file becomes pixels.

A few hundred bytes of header can declare billions of pixels (a 875 kB PNG of 30000x30000
grey pixels, zeros that compress 1000:1, took an agent from 112 MB to 4.9 GB). So the
header is read here first, by the same signature OpenCV picks its decoder by, and an image
whose width x height (or whose decoder's working tile) is over ``max_pixels`` is refused
before anything is decoded. A file whose header is not read here is refused, never decoded
blind; so is one whose header could be read otherwise by its decoder (a TIFF tag that sizes
the image given twice, or in a type not read here; a JPEG with a second frame header), and a
JPEG of more than MAX_JPEG_SCANS scans (libjpeg decodes each over the whole image, so its
time grows with them, not with the pixels). OpenCV's own cap (``OPENCV_IO_MAX_IMAGE_PIXELS``,
set in the package root before cv2 is first imported) stands behind this one.

Read: PNG, JPEG, BMP, WebP (VP8, VP8L, VP8X), TIFF (its first IFD), PBM/PGM/PPM and GIF.
Refused by name: AVIF/HEIF, Radiance HDR, Sun raster, PAM, PFM, BigTIFF; anything else as
not an image format read here. Beside the decoded frame (3 bytes a pixel), a decoder's own
buffers take up to about 8 bytes a pixel more (a progressive JPEG's coefficients, a GIF's
canvas, a 16-bit TIFF's tile): at the default cap, about 450 MB at worst.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

import cv2
import numpy as np

from edge_agent.core.files import FileRefused, read_regular
from edge_agent.core.source_config import IMAGE_MAX_PIXELS

#: An image file larger than this is refused unread.
MAX_IMAGE_BYTES = 64 << 20

#: Default cap on an image's pixels (a source's ``max_pixels``; why 40 MP: there).
MAX_PIXELS = IMAGE_MAX_PIXELS

#: Segments (markers) walked in a JPEG, up to its end of image (a camera writes under 20; an
#: ICC profile split into 64 kB chunks a few hundred).
MAX_JPEG_SEGMENTS = 1024

#: Scans (SOS markers) in a JPEG. libjpeg decodes every scan a file holds, each over the
#: whole image, warning only at a progression that makes no sense: a 672 kB file of one
#: 23-byte scan 20,000 times took 26 s at 6000x6000 (0.4 s clean). libjpeg's progression
#: writes 10 scans for a colour image (6 for grey), a hand-made script (jpegtran -scans) a
#: few dozen at most; libtiff stops a JPEG inside a TIFF at 100 scans by default
#: (LIBTIFF_JPEG_MAX_ALLOWED_SCAN_NUMBER), and libjpeg-turbo's tools take a limit too
#: (djpeg/jpegtran -maxscans, no default). 100 bounds the scans' work at about 10 times a
#: normal progressive file's.
MAX_JPEG_SCANS = 100

#: The formats read here, as errors name them.
FORMATS = ("PNG", "JPEG", "BMP", "WebP", "TIFF", "PBM/PGM/PPM", "GIF")


class ImageError(ValueError):
    """An image that is refused: unreadable, too large, or not a format read here. The
    message names the file (when there is one) and why."""


@dataclass(frozen=True)
class ImageHeader:
    """What a file's header declares. ``channels`` and ``depth`` (bits per sample) as the
    file stores them; ``work_pixels``: the largest buffer its decoder fills at once, in
    pixels (a TIFF tile or strip; else the image)."""

    format: str
    width: int
    height: int
    channels: int = 3
    depth: int = 8
    work_pixels: int = 0

    @property
    def pixels(self) -> int:
        return self.width * self.height


def _u16be(b: bytes, at: int) -> int:
    return int.from_bytes(b[at : at + 2], "big")


def _u32be(b: bytes, at: int) -> int:
    return int.from_bytes(b[at : at + 4], "big")


def _need(data: bytes, size: int, fmt: str) -> None:
    if len(data) < size:
        raise ImageError(f"{fmt} header truncated ({len(data)} bytes)")


def _dims(fmt: str, width: int, height: int, **rest: int) -> ImageHeader:
    if width <= 0 or height <= 0:
        raise ImageError(f"{fmt} header declares {width}x{height} pixels")
    return ImageHeader(fmt, width, height, **rest)


def _png(data: bytes) -> ImageHeader:
    # libpng takes IHDR only as the first chunk, and only 13 bytes long.
    _need(data, 33, "PNG")
    if _u32be(data, 8) != 13 or data[12:16] != b"IHDR":
        raise ImageError("PNG does not start with its IHDR chunk")
    width, height = _u32be(data, 16), _u32be(data, 20)
    depth, colour = data[24], data[25]
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}.get(colour)
    if channels is None or depth not in (1, 2, 4, 8, 16):
        raise ImageError(f"PNG colour type {colour} with bit depth {depth} is not valid")
    return _dims("PNG", width, height, channels=channels, depth=depth)


# Frame headers (SOF0..SOF15 but DHT C4, JPG C8, DAC CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# The segments libjpeg reads by their length and goes on from: SOFn, DHT, DAC, SOS, DQT, DNL,
# DRI, APPn, COM. At any other marker libjpeg fails, or (met in a scan's data where a restart
# marker is due) discards the two bytes and reads on: the walk searches on from it too, so
# it skips no byte libjpeg reads, and never jumps by a length libjpeg does not read.
_LENGTH = _SOF | {0xC4, 0xCC, 0xDA, 0xDB, 0xDC, 0xDD, 0xFE, *range(0xE0, 0xF0)}
# The next marker: FF and a byte other than 00 (a stuffed FF in a scan's data, or bytes
# libjpeg discards between segments), FF (fill), 01 (TEM) or D0..D7 (RSTn), which libjpeg
# reads past. One search in C across a scan's data: linear in the file, whatever it holds.
_MARKER = re.compile(rb"\xff[^\x00\x01\xd0-\xd7\xff]")


def _jpeg(data: bytes) -> ImageHeader:
    """The frame header, once every marker up to the end of image is walked as libjpeg reads
    them (it reads to the end of image, whatever it decodes): one frame header (libjpeg fails
    at a second, but only after the scans before it), at most MAX_JPEG_SCANS scans, and at
    most MAX_JPEG_SEGMENTS markers. Bytes after the end of image (a second JPEG appended, as
    an MPO camera writes) are not read, by libjpeg or here. Cost: at most MAX_JPEG_SEGMENTS
    steps, each a regular expression search (in C) to the next marker, so linear in the file:
    a 35 MB photo takes 25 ms, and the worst, 64 MB of fill bytes, under 1 s (libjpeg 0.1 s)."""
    pos, size = 2, len(data)
    header: ImageHeader | None = None
    scans = 0
    for _ in range(MAX_JPEG_SEGMENTS):
        found = _MARKER.search(data, pos)
        if found is None:
            break  # truncated: libjpeg makes up the rest
        marker, pos = data[found.start() + 1], found.end()
        if marker in (0xD8, 0xD9, 0xDA) and header is None:
            name = {0xD8: "a second start of image", 0xD9: "the end of image", 0xDA: "a scan"}[marker]
            raise ImageError(f"JPEG has {name} before its frame header")
        if marker == 0xD9:
            return header
        if marker == 0xD8:
            raise ImageError("JPEG has a second start of image")
        if marker not in _LENGTH:
            continue
        if pos + 2 > size:
            break
        length = _u16be(data, pos)
        if length < 2:
            raise ImageError(f"JPEG segment {marker:#04x} at byte {pos - 2} has length {length}")
        if marker in _SOF:
            if header is not None:
                raise ImageError("JPEG has a second frame header")
            if length < 8 or pos + 8 > size:
                break
            depth, height, width, channels = (
                data[pos + 2],
                _u16be(data, pos + 3),
                _u16be(data, pos + 5),
                data[pos + 7],
            )
            if not 1 <= channels <= 4:
                raise ImageError(f"JPEG frame header declares {channels} components")
            header = _dims("JPEG", width, height, channels=channels, depth=depth)
        elif marker == 0xDA:
            scans += 1
            if scans > MAX_JPEG_SCANS:
                raise ImageError(
                    f"JPEG has more than {MAX_JPEG_SCANS} scans (a progressive JPEG has about 10)"
                )
        pos += length
    else:
        if header is None:
            raise ImageError(f"JPEG has no frame header in its first {MAX_JPEG_SEGMENTS} segments")
        raise ImageError(f"JPEG has more than {MAX_JPEG_SEGMENTS} segments before its end of image")
    if header is None:
        raise ImageError("JPEG header truncated before its frame header")
    return header


def _bmp(data: bytes) -> ImageHeader:
    _need(data, 26, "BMP")
    info = int.from_bytes(data[14:18], "little")
    if info == 12:  # OS/2 core header: 16-bit sizes
        width, height = struct.unpack_from("<HH", data, 18)
        bits = int.from_bytes(data[24:26], "little")
    elif info >= 36:  # what OpenCV reads as a BITMAPINFOHEADER and its successors
        _need(data, 30, "BMP")
        width, height, _, bits = struct.unpack_from("<iiHH", data, 18)
        height = abs(height)  # negative: stored top-down
    else:
        raise ImageError(f"BMP info header of {info} bytes is not read")
    return _dims("BMP", width, height, channels=4 if bits == 32 else 3)


def _webp(data: bytes) -> ImageHeader:
    _need(data, 30, "WebP")
    chunk = data[12:16]
    if chunk == b"VP8X":  # the canvas, which every frame lies in
        width = 1 + int.from_bytes(data[24:27], "little")
        height = 1 + int.from_bytes(data[27:30], "little")
        return _dims("WebP", width, height, channels=4)
    if chunk == b"VP8L":
        bits = int.from_bytes(data[21:25], "little")
        if data[20] != 0x2F or bits >> 29:
            raise ImageError("WebP lossless header is not valid")
        return _dims("WebP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1, channels=4)
    if chunk == b"VP8 ":
        if data[23:26] != b"\x9d\x01\x2a" or data[20] & 1:
            raise ImageError("WebP lossy header is not a key frame")
        width, height = struct.unpack_from("<HH", data, 26)
        return _dims("WebP", width & 0x3FFF, height & 0x3FFF)
    raise ImageError(f"WebP's first chunk {chunk!r} is not VP8, VP8L or VP8X")


# Bytes a value of each TIFF type takes: libtiff reads 16 (LONG8), 17 (SLONG8) and 18 (IFD8),
# BigTIFF's, in a classic TIFF too; an entry of another type it skips.
_TIFF_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}
_TIFF_SIZES |= {16: 8, 17: 8, 18: 8}
# The tags that size the image and what libtiff and OpenCV allocate to decode it (a strip
# or tile: its pixels, samples and bits; the tile count is depth too). Each must be a SHORT
# or LONG, as read here: libtiff also takes other integer types (a LONG8 width beside a LONG
# one was a 9000x9000 image read here as 10x10).
_TIFF_SIZE_TAGS = {
    256: "ImageWidth",
    257: "ImageLength",
    258: "BitsPerSample",
    277: "SamplesPerPixel",
    278: "RowsPerStrip",
    322: "TileWidth",
    323: "TileLength",
    32997: "ImageDepth",
    32998: "TileDepth",
}


def _tiff(data: bytes) -> ImageHeader:
    """The first IFD: the page imdecode decodes (it reads no later page, and no SubIFD).
    Each entry's data must lie within the file (libtiff allocates what a tag's count
    declares before reading it); no tag may appear twice (libtiff takes the first, a reader
    may take the last); a tag that sizes the image must be of a type read here."""
    order = "<" if data[:2] == b"II" else ">"
    if struct.unpack_from(order + "H", data, 2)[0] == 43:
        raise ImageError("BigTIFF is not read")
    ifd = struct.unpack_from(order + "I", data, 4)[0]
    if not 8 <= ifd <= len(data) - 2:
        raise ImageError(f"TIFF's first IFD at byte {ifd} is outside the file ({len(data)} bytes)")
    (count,) = struct.unpack_from(order + "H", data, ifd)
    if count == 0 or ifd + 2 + 12 * count > len(data):
        raise ImageError(f"TIFF's first IFD of {count} entries does not fit in the file")
    seen: set[int] = set()
    tags: dict[int, list[int]] = {}
    for i in range(count):
        tag, kind, n, raw = struct.unpack_from(order + "HHI4s", data, ifd + 2 + 12 * i)
        name = f"TIFF tag {tag}" + (f" ({_TIFF_SIZE_TAGS[tag]})" if tag in _TIFF_SIZE_TAGS else "")
        if tag in seen:
            raise ImageError(f"{name} appears twice in the first IFD")
        seen.add(tag)
        if tag in _TIFF_SIZE_TAGS and (kind not in (3, 4) or n == 0):
            what = f"of type {kind}" if kind not in (3, 4) else "empty"
            raise ImageError(f"{name} is {what}, not SHORT or LONG")
        size = _TIFF_SIZES.get(kind)
        if size is None:
            continue  # libtiff skips a tag of an unknown type
        if n * size > len(data):
            raise ImageError(f"TIFF tag {tag} declares {n * size} bytes, over the file's {len(data)}")
        if tag not in _TIFF_SIZE_TAGS:
            continue
        if n * size <= 4:
            values = raw
        else:
            (at,) = struct.unpack_from(order + "I", raw)
            if at + n * size > len(data):
                raise ImageError(f"TIFF tag {tag}'s values lie outside the file")
            values = data[at : at + min(n, 8) * size]
        fmt = order + ("H" if kind == 3 else "I") * min(n, len(values) // size, 8)
        tags[tag] = list(struct.unpack_from(fmt, values))
    if 256 not in tags or 257 not in tags:
        raise ImageError("TIFF's first IFD has no width or no height")
    for tag in (32997, 32998):
        if tags.get(tag, [1])[0] != 1:
            raise ImageError(f"3-D TIFF ({_TIFF_SIZE_TAGS[tag]} {tags[tag][0]}) is not read")
    width, height = tags[256][0], tags[257][0]
    channels = tags.get(277, [1])[0]
    depth = max(tags.get(258, [1]))
    if not 1 <= channels <= 4 or depth > 16:
        raise ImageError(f"TIFF of {channels} samples of {depth} bits per pixel is not read")
    # OpenCV decodes a tile, or a strip of as many rows as declared, at a time into a buffer
    # of that size (a size of 0, or rows 2**32 - 1, mean the image's own).
    if 322 in tags or 323 in tags:
        tile_w, tile_h = tags.get(322, [0])[0] or width, tags.get(323, [0])[0] or height
    else:
        rows = tags.get(278, [0])[0]
        tile_w, tile_h = width, height if rows in (0, 0xFFFFFFFF) else rows
    return _dims("TIFF", width, height, channels=channels, depth=depth, work_pixels=tile_w * tile_h)


def _pnm(data: bytes) -> ImageHeader:
    """P1..P6: numbers separated by whitespace and ``#`` comments. A number must end in
    whitespace: OpenCV ends it at any other byte, which would read a comment's digits."""
    kind = data[1] - ord("0")
    wanted = 2 if kind in (1, 4) else 3
    pos, numbers, head = 2, [], data[:4096]
    while len(numbers) < wanted:
        while pos < len(head) and (head[pos] in b" \t\r\n\v\f" or head[pos] == ord("#")):
            if head[pos] == ord("#"):
                end = head.find(b"\n", pos)
                pos = len(head) if end < 0 else end
            pos += 1
        start = pos
        while pos < len(head) and pos - start < 10 and head[pos] in b"0123456789":
            pos += 1
        if pos == start or pos >= len(head) or head[pos] not in b" \t\r\n\v\f":
            raise ImageError("PNM header is not numbers separated by whitespace (in its first 4096 bytes)")
        numbers.append(int(head[start:pos]))
    if wanted == 3 and not 0 < numbers[2] < 65536:
        raise ImageError(f"PNM maximum value {numbers[2]} is not within 1..65535")
    channels = 3 if kind in (3, 6) else 1
    return _dims(
        "PNM", numbers[0], numbers[1], channels=channels, depth=16 if wanted == 3 and numbers[2] > 255 else 8
    )


def _gif(data: bytes) -> ImageHeader:
    # Every frame must lie in the logical screen (OpenCV checks), so the screen bounds all.
    _need(data, 10, "GIF")
    width, height = struct.unpack_from("<HH", data, 6)
    return _dims("GIF", width, height)


def image_header(data: bytes) -> ImageHeader:
    """What ``data``'s header declares, read by the signature OpenCV would pick its decoder
    by (in its order). Raises ImageError for a header that is truncated or not valid, and
    for a format not read here."""
    if len(data) < 8:
        raise ImageError(f"too short for an image ({len(data)} bytes)")
    head = bytes(data[:16])
    if head[4:8] == b"ftyp":  # OpenCV's AVIF decoder is asked before JPEG, WebP and TIFF
        raise ImageError("AVIF/HEIF images are not read")
    if head[:2] == b"BM":
        return _bmp(data)
    if head[:3] == b"GIF":
        if head[:6] not in (b"GIF87a", b"GIF89a"):
            raise ImageError("GIF version is not 87a or 89a")
        return _gif(data)
    if head[:2] == b"#?":
        raise ImageError("Radiance HDR images are not read")
    if head[:3] == b"\xff\xd8\xff":
        return _jpeg(data)
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return _webp(data)
    if head[:4] == b"\x59\xa6\x6a\x95":
        raise ImageError("Sun raster images are not read")
    if head[0] == ord("P") and head[2] in b" \t\r\n\v\f":
        if ord("1") <= head[1] <= ord("6"):
            return _pnm(data)
        if head[1] in b"7fF":
            raise ImageError("PAM and PFM images are not read")
    if head[:4] in (b"II*\0", b"MM\0*", b"II+\0", b"MM\0+"):
        return _tiff(data)
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data)
    raise ImageError(f"not an image format read here ({', '.join(FORMATS)})")


def decode_image(data: bytes, max_pixels: int = MAX_PIXELS, name: str = "image") -> np.ndarray:
    """``data`` decoded to a BGR uint8 image, once its header declares at most ``max_pixels``
    pixels (and no larger working buffer). Raises ImageError naming ``name``: the header's
    reason, the size against the cap, or a decode that failed."""
    try:
        header = image_header(data)
    except ImageError as e:
        raise ImageError(f"{name}: {e}") from None
    need = max(header.pixels, header.work_pixels)
    if need > max_pixels:
        what = f"{header.format} of {header.width}x{header.height} pixels"
        if header.work_pixels > header.pixels:
            what += f" in tiles of {header.work_pixels} pixels"
        raise ImageError(
            f"{name}: {what} ({need / 1e6:.1f} MP) is over max_pixels, {max_pixels / 1e6:.1f} MP"
        )
    try:
        img = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error as e:
        raise ImageError(
            f"{name}: {header.format} does not decode ({str(e).strip().splitlines()[-1]})"
        ) from None
    if img is None:
        raise ImageError(f"{name}: {header.format} does not decode (damaged or truncated)")
    if img.shape[0] * img.shape[1] != header.pixels:
        # The decoder read other dimensions than the header here: never trust that file.
        decoded = f"{img.shape[1]}x{img.shape[0]}"
        raise ImageError(f"{name}: decoded to {decoded}, its header says {header.width}x{header.height}")
    return img


def read_image_file(path: str, max_pixels: int = MAX_PIXELS, max_bytes: int = MAX_IMAGE_BYTES) -> np.ndarray:
    """The image in ``path`` decoded (``decode_image``). The file is opened without waiting
    and checked on the open descriptor: a FIFO or a device put in the image's place is
    refused, never waited on or read for ever; over ``max_bytes`` it is refused unread.
    Raises ImageError naming ``path``."""
    try:
        data = read_regular(path, max_bytes)
    except FileRefused as e:
        raise ImageError(f"{path}: {e}") from None
    return decode_image(data, max_pixels, path)
