"""Untrusted images (pipelines/images.py): the header read before decoding, per format; an
image over ``max_pixels`` refused unread, naming the file and its size; formats whose header
is not read refused by name; and OpenCV's own cap in place once edge_agent is imported."""

from __future__ import annotations

import os
import re
import struct
import sys
import time
import tracemalloc
import zlib

import cv2
import numpy as np
import pytest
from conftest import run_process
from test_watch_source import png_bomb

from edge_agent.core.source_config import IMAGE_MAX_PIXELS_LIMIT
from edge_agent.pipelines.images import (
    MAX_JPEG_SCANS,
    ImageError,
    decode_image,
    image_header,
    read_image_file,
)


def encoded(ext: str, width: int = 30, height: int = 20) -> bytes:
    rng = np.random.default_rng(7)
    image = rng.integers(0, 255, (height, width, 3), np.uint8)
    if ext in (".pgm", ".pbm"):
        image = image[:, :, 0].copy()
    ok, data = cv2.imencode(ext, image)
    assert ok, ext
    return data.tobytes()


FORMATS = [
    (".png", "PNG"),
    (".jpg", "JPEG"),
    (".bmp", "BMP"),
    (".webp", "WebP"),
    (".tif", "TIFF"),
    (".ppm", "PNM"),
    (".pgm", "PNM"),
    (".pbm", "PNM"),
    (".gif", "GIF"),
]


@pytest.mark.parametrize(("ext", "fmt"), FORMATS)
def test_each_format_s_header_gives_its_size_and_the_image_decodes(ext, fmt):
    data = encoded(ext)
    header = image_header(data)
    assert (header.format, header.width, header.height) == (fmt, 30, 20)
    assert decode_image(data).shape == (20, 30, 3)


def test_webp_lossy_and_lossless_and_extended_headers():
    image = np.random.default_rng(1).integers(0, 255, (20, 30, 3), np.uint8)
    lossy = cv2.imencode(".webp", image, [cv2.IMWRITE_WEBP_QUALITY, 50])[1].tobytes()
    lossless = cv2.imencode(".webp", image, [cv2.IMWRITE_WEBP_QUALITY, 101])[1].tobytes()
    assert {lossy[12:16], lossless[12:16]} == {b"VP8 ", b"VP8L"}
    for data in (lossy, lossless):
        assert (image_header(data).width, image_header(data).height) == (30, 20)
    # VP8X: the canvas (flags, then width - 1 and height - 1 in 24 bits each)
    vp8x = b"RIFF\0\0\0\0WEBPVP8X" + struct.pack("<I", 10) + bytes(4) + (29).to_bytes(3, "little")
    assert image_header(vp8x + (19).to_bytes(3, "little")).pixels == 600


def _with_size(ext: str, width: int, height: int) -> bytes:
    """A real encoded image whose header is rewritten to declare ``width`` x ``height``."""
    data = bytearray(encoded(ext))
    if ext == ".png":
        data[16:24] = struct.pack(">II", width, height)
    elif ext == ".jpg":
        sof = data.index(b"\xff\xc0")
        data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    elif ext == ".bmp":
        data[18:26] = struct.pack("<ii", width, height)
    elif ext == ".gif":
        data[6:10] = struct.pack("<HH", width, height)
    elif ext == ".ppm":
        return b"P6\n%d %d\n255\n" % (width, height) + bytes(data[data.index(b"255\n") + 4 :])
    elif ext == ".tif":
        ifd = struct.unpack_from("<I", data, 4)[0]
        for i in range(struct.unpack_from("<H", data, ifd)[0]):
            at = ifd + 2 + 12 * i
            tag = struct.unpack_from("<H", data, at)[0]
            if tag in (256, 257, 278):
                value = {256: width, 257: height, 278: height}[tag]
                data[at + 2 : at + 12] = struct.pack("<HII", 4, 1, value)
    return bytes(data)


@pytest.mark.parametrize("ext", [".png", ".jpg", ".bmp", ".gif", ".ppm", ".tif"])
def test_an_image_declaring_more_than_max_pixels_is_refused_before_decoding(ext):
    data = _with_size(ext, 30_000, 30_000 if ext not in (".jpg", ".bmp", ".gif") else 20_000)
    with pytest.raises(
        ImageError, match=r"^drop/x: \w+ of 30000x\d+ pixels \(\d+\.\d MP\) is over max_pixels, 40\.0 MP"
    ):
        decode_image(data, name="drop/x")
    # Declared small enough, the same header is decoded (and fails or not on its data).
    assert image_header(data).width == 30_000


def test_a_png_bomb_is_refused_by_its_header_without_allocating_it():
    """Trial 6's file: 30000x30000 pixels in a ~110 kB PNG."""
    bomb = png_bomb()
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        with pytest.raises(ImageError, match=r"PNG of 30000x30000 pixels \(900\.0 MP\) is over max_pixels"):
            decode_image(bomb, name="bomb.png")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak / 2**20:.0f} MiB allocated refusing it"


def test_a_tiff_with_tiles_larger_than_the_cap_is_refused():
    data = bytearray(encoded(".tif"))
    ifd = struct.unpack_from("<I", data, 4)[0]
    n = struct.unpack_from("<H", data, ifd)[0]
    for i in range(n):  # RowsPerStrip declares a strip of 30 x 2**21 pixels
        at = ifd + 2 + 12 * i
        if struct.unpack_from("<H", data, at)[0] == 278:
            data[at + 2 : at + 12] = struct.pack("<HII", 4, 1, 1 << 21)
    with pytest.raises(ImageError, match=r"TIFF of 30x20 pixels in tiles of 62914560 pixels"):
        decode_image(bytes(data), name="t.tif")


def _ifd(entries: list[tuple[int, int, int, bytes]], next_ifd: int = 0) -> bytes:
    """An IFD of ``entries`` (tag, type, count, 4 bytes of value or offset) in the order given."""
    body = b"".join(struct.pack("<HHI", tag, kind, n) + value for tag, kind, n, value in entries)
    return struct.pack("<H", len(entries)) + body + struct.pack("<I", next_ifd)


def _tiff(entries: list[tuple[int, int, int, bytes]], data: bytes, next_ifd: int = 0) -> bytes:
    """A little-endian TIFF: ``data`` from byte 8, then its first IFD."""
    data += bytes(len(data) % 2)
    return b"II*\x00" + struct.pack("<I", 8 + len(data)) + data + _ifd(entries, next_ifd)


def _long(value: int) -> bytes:
    return struct.pack("<I", value)


def _short(value: int) -> bytes:
    return struct.pack("<HH", value, 0)


def _page(width: int, height: int, strip_at: int, strip: bytes) -> list[tuple[int, int, int, bytes]]:
    """The entries of a greyscale page of one deflated strip (ImageWidth and ImageLength first)."""
    return [
        (256, 4, 1, _long(width)),
        (257, 4, 1, _long(height)),
        (258, 3, 1, _short(8)),
        (259, 3, 1, _short(8)),  # deflate
        (262, 3, 1, _short(1)),
        (273, 4, 1, _long(strip_at)),
        (277, 3, 1, _short(1)),
        (278, 4, 1, _long(height)),
        (279, 4, 1, _long(len(strip))),
    ]


def _lying_tiff(big: int, sizes: str) -> bytes:
    """The tester's F2: a TIFF whose one deflated strip holds ``big`` x ``big`` zeros, and whose
    ImageWidth and ImageLength are each given twice: as LONG8 (a BigTIFF type, which libtiff
    reads in a classic TIFF too) saying ``big`` and as LONG saying 10; or twice as LONG.
    libtiff takes the first of a duplicated tag."""
    strip = zlib.compress(bytes(big * big), 9)
    entries = _page(big, big, 24, strip)  # after the LONG8s, at bytes 8 and 16
    wide, tall = (256, 16, 1, _long(8)), (257, 16, 1, _long(16))
    small = (256, 4, 1, _long(10)), (257, 4, 1, _long(10))
    first = {
        "long8 first": [wide, small[0], tall, small[1]],
        "long first": [small[0], wide, small[1], tall],
        "long twice": [entries[0], small[0], entries[1], small[1]],
    }[sizes]
    return _tiff(first + entries[2:], struct.pack("<QQ", big, big) + strip)


@pytest.mark.parametrize(
    ("sizes", "reason"),
    [
        ("long8 first", r"TIFF tag 256 \(ImageWidth\) is of type 16, not SHORT or LONG"),
        ("long first", r"TIFF tag 256 \(ImageWidth\) appears twice in the first IFD"),
        ("long twice", r"TIFF tag 256 \(ImageWidth\) appears twice in the first IFD"),
    ],
)
def test_a_tiff_that_gives_its_size_twice_is_refused_before_decoding(sizes, reason):
    """F2: the header read here took the LONG (10x10) and skipped the LONG8, whose type it
    did not know, while libtiff decoded 9000x9000 (584 MB) from 79 kB before the decoded
    size was refused. A size tag of a type not read here, or any tag twice, is refused by
    the header: nothing is decoded (3000x3000 here: 27 MB had it been)."""
    data = _lying_tiff(3000, sizes)
    assert len(data) < 64 << 10
    tracemalloc.start()
    try:
        with pytest.raises(ImageError, match=f"^t.tif: {reason}$"):
            decode_image(data, max_pixels=1_000_000, name="t.tif")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak / 2**20:.0f} MiB allocated refusing it"
    with pytest.raises(ImageError, match=f"^{reason}$"):
        image_header(data)  # the header's own refusal: OpenCV is never asked


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ((257, 0, 1, _long(10)), r"tag 257 \(ImageLength\) is of type 0, not SHORT or LONG"),
        ((277, 99, 1, _short(1)), r"tag 277 \(SamplesPerPixel\) is of type 99, not SHORT or LONG"),
        ((278, 17, 1, _long(8)), r"tag 278 \(RowsPerStrip\) is of type 17, not SHORT or LONG"),
        ((322, 12, 1, _long(8)), r"tag 322 \(TileWidth\) is of type 12, not SHORT or LONG"),
        ((258, 3, 1, _short(8)), r"tag 258 \(BitsPerSample\) appears twice"),
        ((279, 4, 1, _long(5)), "tag 279 appears twice"),  # StripByteCounts: any tag, once
        ((32997, 4, 1, _long(9)), r"3-D TIFF \(ImageDepth 9\) is not read"),
        ((32998, 3, 1, _short(4)), r"3-D TIFF \(TileDepth 4\) is not read"),
        ((32997, 16, 1, _long(8)), r"tag 32997 \(ImageDepth\) is of type 16"),
    ],
)
def test_a_tiff_size_tag_of_a_type_not_read_or_given_twice_is_refused(entry, reason):
    strip = zlib.compress(bytes(100))
    page = _page(10, 10, 8, strip)
    assert decode_image(_tiff(page, strip)).shape == (10, 10, 3)
    with pytest.raises(ImageError, match=reason):
        image_header(_tiff([entry, *page], strip))  # the entry first: its type is met first


@pytest.mark.parametrize("pointer", ["next page", "SubIFD"])
def test_a_tiff_s_later_pages_and_sub_ifds_are_not_decoded(pointer):
    """Why only the first IFD is read here: imdecode decodes the first page, and does not
    descend into SubIFDs (tag 330). A 3000x3000 second page or SubIFD is never decoded."""
    small, big = zlib.compress(bytes(100)), zlib.compress(bytes(3000 * 3000), 9)
    second = _ifd(_page(3000, 3000, 122 + len(small), big))  # at byte 8, 114 bytes long
    data = second + small + big  # the first page's strip at byte 122
    first = _page(10, 10, 122, small)
    if pointer == "next page":
        data = _tiff(first, data, next_ifd=8)
    else:
        data = _tiff([*first, (330, 4, 1, _long(8))], data)
    tracemalloc.start()
    try:
        assert decode_image(data, max_pixels=1_000).shape == (10, 10, 3)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"{peak / 2**20:.0f} MiB allocated decoding 10x10 pixels"


def _progressive(width: int = 64, height: int = 48) -> bytes:
    image = np.random.default_rng(5).integers(0, 255, (height, width, 3), np.uint8)
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    return data.tobytes()


def _scan_bomb(copies: int) -> bytes:
    """The tester's F4, small: a progressive JPEG with its last scan (header and data) repeated
    ``copies`` times more. libjpeg warns and decodes every scan, each over the whole image."""
    data = _progressive()
    assert data.count(b"\xff\xda") == 10 and data[-2:] == b"\xff\xd9"  # libjpeg's progression
    last = data.rindex(b"\xff\xda")  # no FF DA within a scan's data: FF there is FF 00 or a restart
    return data[:-2] + data[last:-2] * copies + data[-2:]


def test_a_jpeg_with_more_scans_than_the_cap_is_refused_unread():
    """F4: a 672 kB 6000x6000 progressive JPEG whose one 23-byte scan was repeated 20,000
    times decoded in 26 s (0.4 s clean), linear in its scans. Its markers are walked here,
    and more than MAX_JPEG_SCANS scans are refused before the decoder sees them."""
    assert MAX_JPEG_SCANS == 100
    assert decode_image(_progressive()).shape == (48, 64, 3)
    assert decode_image(_scan_bomb(MAX_JPEG_SCANS - 10)).shape == (48, 64, 3)
    reason = r"JPEG has more than 100 scans \(a progressive JPEG has about 10\)"
    for copies in (MAX_JPEG_SCANS - 9, 1000):
        bomb = _scan_bomb(copies)
        with pytest.raises(ImageError, match=reason):
            image_header(bomb)  # the header: OpenCV is never asked
        with pytest.raises(ImageError, match=f"^b.jpg: {reason}$"):
            decode_image(bomb, name="b.jpg")


def test_a_jpeg_with_a_second_frame_header_is_refused():
    """One frame per JPEG: libjpeg fails at a second SOF, but only once it has decoded the
    scans before it. After the end of image (a second JPEG appended, as an MPO camera
    writes) nothing is read, by libjpeg or here."""
    for data in (encoded(".jpg"), _progressive(30, 20)):
        sof = re.search(b"\xff[\xc0\xc2]", data).start()
        segment = data[sof : sof + 2 + struct.unpack_from(">H", data, sof + 2)[0]]
        with pytest.raises(ImageError, match="JPEG has a second frame header"):
            decode_image(data[:-2] + segment + data[-2:], name="x")
        with pytest.raises(ImageError, match="JPEG has a second start of image"):
            image_header(data[:-2] + data)  # a JPEG within a JPEG, not after its end
        assert decode_image(data + data).shape == (20, 30, 3)


def test_a_jpeg_s_marker_walk_is_linear_in_the_file():
    """The walk searches a scan's data for its end (FF, then a byte not 00, FF or a restart
    marker) with one regular expression: stuffed bytes, fill and restart markers cost no
    Python step, so 8 MB of them take milliseconds, not seconds."""
    data = encoded(".jpg")
    body = (b"\xff\x00" * 1000 + b"\xff\xff\xff\xd3") * 4000
    bloated = data[:-2] + body + data[-2:]
    assert len(bloated) > 8_000_000
    start = time.perf_counter()
    assert image_header(bloated).pixels == 600
    assert time.perf_counter() - start < 1.0
    with pytest.raises(ImageError, match="JPEG has more than 1024 segments"):
        image_header(data[:-2] + b"\xff\xfe\x00\x02" * 1100 + data[-2:])


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "too short"),
        (b"\x00\x00\x00\x1cftypavif" + bytes(20), "AVIF/HEIF images are not read"),
        (b"#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n", "Radiance HDR"),
        (b"\x59\xa6\x6a\x95" + bytes(28), "Sun raster"),
        (b"P7\nWIDTH 3\nHEIGHT 2\n", "PAM and PFM"),
        (b"PF\n3 2\n-1\n" + bytes(72), "PAM and PFM"),
        (b"II+\x00\x08\x00\x00\x00" + bytes(16), "BigTIFF"),
        (b"hello, world, not an image", "not an image format read here"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00\x00\x00\x0dtEXt" + b"a" * 17, "does not start with its IHDR"),
        (b"\xff\xd8\xff\xda\x00\x08" + bytes(20), "a scan before its frame header"),
        (b"\xff\xd8\xff\xe0\x00\x01" + bytes(20), "has length 1"),
        (b"\xff\xd8\xff\xe0\x00\x10" + bytes(10), "truncated before its frame header"),
        (b"\xff\xd8" + b"\xff\xfe\x00\x02" * 2000, "no frame header in its first 1024 segments"),
        (b"GIF88a" + bytes(10), "GIF version"),
        (b"BM" + bytes(12) + struct.pack("<I", 20) + bytes(16), "BMP info header of 20 bytes"),
        (b"BM" + bytes(12) + struct.pack("<Iii", 40, 0, 5) + bytes(8), "declares 0x5 pixels"),
        (b"P6\n30#99\n20 255\n", "not numbers separated by whitespace"),
        (b"P5\n3 2\n70000\n" + bytes(12), "maximum value 70000"),
        (b"II*\x00" + struct.pack("<I", 1 << 30), "outside the file"),
        (
            b"II*\x00\x08\x00\x00\x00" + struct.pack("<HHHII", 1, 273, 4, 1 << 28, 8),
            "declares 1073741824 bytes",
        ),
        (b"RIFF\0\0\0\0WEBPVP8 " + bytes(14), "not a key frame"),
        (b"RIFF\0\0\0\0WEBPALPH" + bytes(14), "is not VP8, VP8L or VP8X"),
    ],
)
def test_a_header_that_is_not_read_is_refused_with_its_reason(data, reason):
    with pytest.raises(ImageError, match=reason):
        decode_image(data, name="x")


def test_a_png_whose_header_was_rewritten_does_not_decode():
    """libpng checks the header's checksum: a size patched in is refused, not guessed at."""
    data = _with_size(".png", 60, 10)  # 600 pixels too, another shape
    with pytest.raises(ImageError, match="does not decode"):
        decode_image(data, name="x")


def test_a_file_is_read_only_when_regular_and_within_its_byte_cap(tmp_path):
    good = tmp_path / "a.png"
    good.write_bytes(encoded(".png"))
    assert read_image_file(str(good)).shape == (20, 30, 3)
    with pytest.raises(ImageError, match=r"a\.png: \d+ bytes, over 100"):
        read_image_file(str(good), max_bytes=100)
    os.mkfifo(tmp_path / "b.png")
    with pytest.raises(ImageError, match=r"b\.png: not a regular file"):
        read_image_file(str(tmp_path / "b.png"))
    with pytest.raises(ImageError, match=r"nope\.png: No such file"):
        read_image_file(str(tmp_path / "nope.png"))
    with pytest.raises(
        ImageError, match=r"a\.png: PNG of 30x20 pixels \(0\.0 MP\) is over max_pixels, 0\.0 MP"
    ):
        read_image_file(str(good), max_pixels=599)


def test_opencv_own_cap_is_set_once_edge_agent_is_imported(tmp_path):
    """Belt and braces: a caller that decodes with OpenCV directly is capped too, because
    the package root sets OPENCV_IO_MAX_IMAGE_PIXELS before cv2 is imported; an
    operator's own value wins."""
    probe = (
        "import edge_agent, os, sys, cv2, numpy as np\n"
        "print(os.environ['OPENCV_IO_MAX_IMAGE_PIXELS'])\n"
        "data = np.fromfile(sys.argv[1], np.uint8)\n"
        "try:\n"
        "    print('decoded' if cv2.imdecode(data, cv2.IMREAD_COLOR) is not None else 'refused')\n"
        "except cv2.error as e:\n"
        "    print('refused', 'CV_IO_MAX_IMAGE_PIXELS' in str(e))\n"
    )
    header = tmp_path / "bomb.png"  # 144 MP: OpenCV's cap refuses it before allocating it
    header.write_bytes(png_bomb(12_000, 12_000))
    small = tmp_path / "small.png"
    small.write_bytes(encoded(".png"))
    env = {k: v for k, v in os.environ.items() if k != "OPENCV_IO_MAX_IMAGE_PIXELS"}
    out = run_process([sys.executable, "-c", probe, str(header)], 60, env=env)
    assert out.stdout.split("\n")[:2] == [str(IMAGE_MAX_PIXELS_LIMIT), "refused True"], (
        out.stdout + out.stderr
    )
    out = run_process([sys.executable, "-c", probe, str(small)], 60, env=env)
    assert out.stdout.split("\n")[1] == "decoded", out.stderr
    operator = {**env, "OPENCV_IO_MAX_IMAGE_PIXELS": "100"}
    out = run_process([sys.executable, "-c", probe, str(small)], 60, env=operator)
    assert out.stdout.split("\n")[:2] == ["100", "refused True"], out.stdout + out.stderr


def test_the_package_root_cap_is_the_largest_max_pixels():
    """The package root cannot import the config (it runs before everything): the number
    is written there, and must stay the key's ceiling."""
    import edge_agent

    with open(edge_agent.__file__) as f:
        assert f'"OPENCV_IO_MAX_IMAGE_PIXELS", "{IMAGE_MAX_PIXELS_LIMIT}"' in f.read()


def test_int8_calibration_skips_an_image_over_the_cap(const_model, tmp_path, caplog):
    """Calibration images are a folder from outside too (TensorRT on its fakes here)."""
    from fakes.trt_kit import loaded

    calib = tmp_path / "calib"
    calib.mkdir()
    (calib / "0_bomb.png").write_bytes(png_bomb())
    for i in (1, 2):
        cv2.imwrite(str(calib / f"{i}.png"), np.full((240, 320, 3), 40 * i, np.uint8))
    _be, fakes = loaded(const_model, tmp_path / "cache", precision="int8", calibration_images=str(calib))
    assert fakes.names().count("memcpy_htod") == 2, "one calibration batch per readable image"
    assert "0_bomb.png: PNG of 30000x30000 pixels (900.0 MP) is over max_pixels" in caplog.text


def test_tune_frames_that_are_all_over_the_cap_are_refused(tmp_path):
    from edge_agent.tune.workload import FramesError, image_files

    (tmp_path / "bomb.png").write_bytes(png_bomb())
    with pytest.raises(FramesError, match="none of its 1 images can be read"):
        image_files(str(tmp_path))
    cv2.imwrite(str(tmp_path / "ok.png"), np.zeros((8, 8, 3), np.uint8))
    assert len(image_files(str(tmp_path))) == 2
