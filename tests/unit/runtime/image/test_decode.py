"""Encoded images to RGB pictures (runtime/image/decode.py): the formats Pillow decodes, modes
converted to RGB, EXIF orientation applied, and each bad row a 400 naming it."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from image_models import encoded, picture, rotated_jpeg

from snoozeml.errors import InvalidInput
from snoozeml.runtime.image.decode import check_elements, decode_image, decode_images

LIMIT = 40_000_000


@pytest.mark.parametrize(("fmt", "mode"), [
    ("PNG", "RGB"), ("PNG", "L"), ("PNG", "RGBA"), ("PNG", "P"), ("PNG", "LA"),
    ("JPEG", "RGB"), ("JPEG", "L"), ("JPEG", "CMYK"), ("WEBP", "RGB"), ("BMP", "RGB"),
    ("GIF", "P"),
])
def test_every_format_and_mode_decodes_to_rgb_of_its_size(fmt: str, mode: str) -> None:
    source = picture(37, 23, seed=1, mode=mode)
    image = decode_image(encoded(source, fmt), 0, LIMIT)
    assert image.mode == "RGB"
    assert image.size == (37, 23)
    if fmt in ("PNG", "BMP") and mode in ("RGB", "L", "RGBA"):  # lossless: the very pixels
        assert np.array_equal(np.asarray(image), np.asarray(source.convert("RGB")))


def test_a_gif_gives_its_first_frame() -> None:
    frames = [picture(16, 12, seed=s).convert("P") for s in (1, 2)]
    data = encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])
    image = decode_image(data, 0, LIMIT)
    assert np.array_equal(np.asarray(image), np.asarray(frames[0].convert("RGB")))


def test_exif_orientation_turns_the_picture_upright() -> None:
    source = picture(40, 24, seed=3)
    image = decode_image(rotated_jpeg(source), 0, LIMIT)
    assert image.size == (40, 24)  # stored 24x40, sideways
    difference = np.abs(np.asarray(image, np.int16) - np.asarray(source, np.int16))
    assert difference.mean() < 3  # JPEG's loss only


def test_bad_rows_are_400s_naming_the_row() -> None:
    good = encoded(picture(8, 8, seed=1), "PNG")
    jpeg = encoded(picture(640, 480, seed=1), "JPEG")
    cases = {
        b"not an image at all": "row 1 is not an image Pillow can decode",
        jpeg[: len(jpeg) // 2]: r"row 1 \(JPEG 640x480\) cannot be decoded: image file is trunc",
        good[:20]: "row 1 cannot be decoded",
    }
    for bad, said in cases.items():
        with pytest.raises(InvalidInput, match=said):
            decode_images(np.array([good, bad], dtype=object), LIMIT)


def test_an_image_over_the_pixel_limit_is_refused_from_its_header() -> None:
    data = encoded(picture(300, 200, seed=2), "PNG")
    with pytest.raises(InvalidInput, match=r"row 0 is 300x200, 60000 pixels, over the model's "
                                           r"max_image_pixels \(59999\)"):
        decode_image(data, 0, 59_999)
    assert decode_image(data, 0, 60_000).size == (300, 200)


def test_a_decompression_bomb_is_refused_from_its_header() -> None:
    """A PNG whose header says 20,000 x 20,000 (1.2 GB decoded), refused before any of its
    data is read: the data here is not even there."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return (len(body).to_bytes(4, "big") + kind + body
                + zlib.crc32(kind + body).to_bytes(4, "big"))

    header = (20_000).to_bytes(4, "big") * 2 + bytes([8, 2, 0, 0, 0])
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"\0" * 16)
    with pytest.raises(InvalidInput, match="row 0 is 20000x20000, 400000000 pixels, over"):
        decode_image(data, 0, LIMIT)


def test_element_checks_before_decoding() -> None:
    with pytest.raises(InvalidInput, match="row 1 is empty"):
        check_elements(np.array([b"x", b""], dtype=object))
    with pytest.raises(InvalidInput, match="has no rows"):
        check_elements(np.empty(0, dtype=object))
    with pytest.raises(InvalidInput, match=r"shape \[N\]"):
        check_elements(np.array([[b"x"]], dtype=object))
