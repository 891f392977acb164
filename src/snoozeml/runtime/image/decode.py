"""Encoded images to RGB pictures: whatever Pillow decodes (JPEG, PNG, WebP, BMP, GIF's first
frame), turned by its EXIF orientation and converted to RGB (grayscale, palette, RGBA, CMYK).

Every failure is this request's 400 naming the row: empty elements, bytes Pillow does not
recognise, truncated or corrupt files, and images whose header says they are larger than the
model's `max_image_pixels` (refused before they are decoded: a decompression bomb costs
nothing). Pillow lets go of the GIL while it decodes, so several threads decode at once.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from snoozeml.errors import InvalidInput

IMAGE = "image"  # the BYTES input that takes encoded images
# Pillow's own bomb check (a warning past 89 megapixels, an error past twice that) is turned
# off: each model's max_image_pixels is checked from the header before any decoding.
Image.MAX_IMAGE_PIXELS = None
FORMATS = "JPEG, PNG, WebP, BMP, GIF"


def check_elements(array: np.ndarray, name: str = IMAGE) -> None:
    """The cheap checks, before any decoding: one image a row, none of them empty."""
    if array.ndim != 1:
        raise InvalidInput(f"input {name!r}: one encoded image a row, shape [N]; got "
                           f"{list(array.shape)}")
    if array.shape[0] == 0:
        raise InvalidInput(f"input {name!r} has no rows")
    for row, value in enumerate(array):
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidInput(f"input {name!r}: row {row} is not bytes")
        if len(value) == 0:
            raise InvalidInput(f"input {name!r}: row {row} is empty")


def decode_image(data: bytes | bytearray | memoryview, row: int, max_pixels: int,
                 name: str = IMAGE) -> Image.Image:
    """One encoded image as an RGB picture, upright. InvalidInput naming `row` when it cannot
    be, or when it has more than `max_pixels` pixels (checked from its header)."""
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise InvalidInput(f"input {name!r}: row {row} is not an image Pillow can decode "
                           f"({FORMATS}, ...)") from None
    except Exception as exc:  # corrupt headers raise anything: the row's 400
        raise InvalidInput(f"input {name!r}: row {row} cannot be decoded: {_said(exc)}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise InvalidInput(f"input {name!r}: row {row} is {width}x{height}, "
                           f"{width * height} pixels, over the model's max_image_pixels "
                           f"({max_pixels})")
    try:
        image.load()
        upright = ImageOps.exif_transpose(image) or image
        return _rgb(upright)
    except MemoryError:
        raise
    except Exception as exc:  # truncated or corrupt data: the row's 400
        raise InvalidInput(f"input {name!r}: row {row} ({image.format or 'image'} "
                           f"{width}x{height}) cannot be decoded: {_said(exc)}") from None


def decode_images(array: np.ndarray, max_pixels: int, name: str = IMAGE) -> list[Image.Image]:
    """Every row of a BYTES vector decoded (see decode_image)."""
    return [decode_image(value, row, max_pixels, name) for row, value in enumerate(array)]


def _rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")  # as Pillow asks, for a palette's transparent colour
    return image.convert("RGB")


def _said(exc: Exception) -> str:
    return str(exc) or type(exc).__name__
