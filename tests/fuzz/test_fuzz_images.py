"""Fuzz targets: image headers, through the one decoding function for untrusted images
(``pipelines/images.py``, ``decode_image``): raw bytes, and real images of each format read
here whose header fields (sizes, lengths, markers, offsets) are overwritten, truncated or
flipped. Property: an image comes back or ImageError is raised, within the time and memory
bound; a decode that allocates what the header did not declare fails the memory bound, and
one that decodes to another size than the header's fails too."""

from __future__ import annotations

import re
import struct
import zlib

import cv2
import numpy as np
from fuzzing import bounded
from hypothesis import example, given
from hypothesis import strategies as st

from edge_agent.pipelines.images import ImageError, decode_image

#: Small enough that every image the cap lets through decodes far inside the memory bound
#: (512x512 BGR is 0.75 MiB): a blow-up is the decoder's, not the declared size.
CAP = 512 * 512

#: Values a size, length or offset field gets (as 16 or 32 bits, either byte order).
EDGES = [
    0,
    1,
    2,
    7,
    8,
    255,
    256,
    0x3FFF,
    0x4000,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x10000,
    0xFFFFFF,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
]


def _encoded(ext: str, params: tuple[int, ...] = ()) -> bytes:
    image = np.random.default_rng(3).integers(0, 255, (24, 40, 3), np.uint8)
    if ext in (".pgm", ".pbm"):
        image = image[:, :, 0].copy()
    return cv2.imencode(ext, image, list(params))[1].tobytes()


def _fields(data: bytes) -> list[int]:
    """Offsets of the header fields worth overwriting in ``data`` (sizes, lengths, offsets,
    markers), found in the real file."""
    if data[:4] == b"\x89PNG":
        return [8, 16, 20, 24, 25, 28, 33]
    if data[:2] == b"\xff\xd8":
        sof = re.search(b"\xff[\xc0-\xc2]", data).start()  # type: ignore[union-attr]
        return [2, 4, sof, sof + 1, sof + 2, sof + 4, sof + 5, sof + 7, sof + 9]
    if data[:2] == b"BM":
        return [2, 10, 14, 18, 22, 26, 28, 30]
    if data[:3] == b"GIF":
        return [6, 8, 10, 13]
    if data[:4] == b"RIFF":
        return [4, 12, 16, 20, 21, 23, 24, 26, 27, 28]
    if data[:2] in (b"II", b"MM"):
        ifd = struct.unpack_from("<I", data, 4)[0]
        n = struct.unpack_from("<H", data, ifd)[0]
        return [4, ifd] + [ifd + 2 + 12 * i + k for i in range(n) for k in (0, 2, 4, 8)]
    return list(range(2, 16))  # PNM: text


SAMPLES = [
    _encoded(".png"),
    _encoded(".jpg"),
    _encoded(".jpg", (cv2.IMWRITE_JPEG_PROGRESSIVE, 1)),
    _encoded(".bmp"),
    _encoded(".gif"),
    _encoded(".webp", (cv2.IMWRITE_WEBP_QUALITY, 50)),
    _encoded(".webp", (cv2.IMWRITE_WEBP_QUALITY, 101)),
    _encoded(".tif"),
    _encoded(".ppm"),
    _encoded(".pgm"),
    _encoded(".pbm"),
]
FIELDS = [_fields(s) for s in SAMPLES]
SIGNATURES = [s[:4] for s in SAMPLES] + [
    b"\x89PNG\r\n\x1a\n",
    b"RIFF\0\0\0\0WEBPVP8X",
    b"P6\n",
    b"II*\0",
    b"MM\0*",
]


def _size_given_twice(big: int) -> bytes:
    """Tester's F2: a TIFF whose ImageWidth and ImageLength come twice, first as LONG8 (a
    BigTIFF type libtiff reads in a classic TIFF too, taking the first of a tag) saying
    ``big``, then as LONG saying 10, with a deflated strip of ``big`` x ``big`` zeros."""
    strip = zlib.compress(bytes(big * big), 9)
    entries = [(256, 16, 8), (256, 4, 10), (257, 16, 16), (257, 4, 10), (258, 3, 8), (259, 3, 8)]
    entries += [(262, 3, 1), (273, 4, 24), (277, 3, 1), (278, 4, big), (279, 4, len(strip))]
    ifd = struct.pack("<H", len(entries)) + b"".join(struct.pack("<HHII", t, k, 1, v) for t, k, v in entries)
    data = struct.pack("<QQ", big, big) + strip + bytes(len(strip) % 2)
    return b"II*\x00" + struct.pack("<I", 8 + len(data)) + data + ifd + bytes(4)


def _scans_repeated(copies: int) -> bytes:
    """Tester's F4, small: the progressive sample with its last scan repeated ``copies``
    times more (libjpeg decodes each, over the whole image)."""
    data = SAMPLES[2]
    last = data.rindex(b"\xff\xda")
    return data[:-2] + data[last:-2] * copies + data[-2:]


def _decode(data: bytes) -> np.ndarray:
    try:
        return decode_image(data, CAP, "fuzz")
    except ImageError as e:
        # The header read here and the decoder disagree on the size: the cap is not sound.
        assert "decoded to" not in str(e), str(e)
        raise


def decodes(data: bytes) -> None:
    image = bounded(lambda: _decode(data), ImageError)
    if image is not None:
        assert image.shape[2] == 3 and image.shape[0] * image.shape[1] <= CAP


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A real image of one format with a few header fields overwritten (16 or 32 bits, big
    or little endian), bytes flipped, and perhaps cut short."""
    index = draw(st.integers(0, len(SAMPLES) - 1))
    data, fields = bytearray(SAMPLES[index]), FIELDS[index]
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(fields) | st.integers(0, min(len(data), 64) - 1))
        code = draw(st.sampled_from([">H", "<H", ">I", "<I", "B"]))
        value = draw(st.sampled_from(EDGES) | st.integers(0, 0xFFFFFFFF))
        size = struct.calcsize(code)
        if at + size <= len(data):
            struct.pack_into(code, data, at, value & ((1 << (8 * size)) - 1))
    if draw(st.booleans()):
        at = draw(st.integers(0, len(data) - 1))
        data[at] ^= draw(st.integers(1, 255))
    if draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    return bytes(data)


@st.composite
def pnm(draw: st.DrawFn) -> bytes:
    """A PBM/PGM/PPM header with sizes that are edges, huge, zero, negative or not numbers,
    whitespace and comments between them."""
    kind = draw(st.sampled_from("123456"))
    gap = st.sampled_from([" ", "\n", "\t", "  ", "\n#c\n", "#x 9999\n", "", "\r\n"])
    number = st.sampled_from(
        ["0", "1", "-1", "40", "24", "65535", "65536", "99999999999", "1e3", "0x10"]
    ) | st.integers(0, 2**40).map(str)
    parts = [number, number] if kind in "14" else [number, number, number]
    head = f"P{kind}{draw(gap) or ' '}" + "".join(draw(p) + draw(gap) for p in parts) + "\n"
    return head.encode() + draw(st.binary(max_size=256))


@given(mutated())
@example(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00u0\x00\x00u0\x01\x00\x00\x00\x00" + bytes(8))
@example(_size_given_twice(1000))  # decoded 1000x1000 where the header read 10x10
@example(_scans_repeated(200))  # refused: more than 100 scans
def test_fuzz_image_headers_of_each_format(data: bytes) -> None:
    decodes(data)


@given(pnm())
def test_fuzz_pnm_headers(data: bytes) -> None:
    decodes(data)


@given(
    st.sampled_from(SIGNATURES).flatmap(lambda sig: st.binary(max_size=512).map(lambda rest: sig + rest))
    | st.binary(max_size=512)
)
def test_fuzz_raw_bytes_as_an_image(data: bytes) -> None:
    decodes(data)
