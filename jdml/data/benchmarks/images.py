"""Decoding benchmark images to RGB arrays, and a pass that finds the unreadable ones."""

from __future__ import annotations

import io
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps

from jdml.data.pixels import DECODE_ERRORS, to_8bit
from jdml.errors import DataError


def _to_rgb(image: Image.Image) -> np.ndarray:
    """An opened image as a (H, W, 3) uint8 RGB array with its EXIF orientation applied.

    High bit depths are scaled to 8 bits; alpha is dropped, as torchvision's PIL loader does
    (see ``jdml.data.pixels``).
    """
    image = to_8bit(ImageOps.exif_transpose(image), alpha="drop")
    return np.array(image.convert("RGB"), dtype=np.uint8)


def decode_file(file: str | BinaryIO, name: str) -> np.ndarray:
    """Decodes an image file or file object; errors name it as ``name``.

    Args:
      file: a path or a binary file object.
      name: how to name the image in error messages.

    Returns:
      uint8 (H, W, 3) RGB.

    Raises:
      DataError: for a missing, corrupt or truncated image.
    """
    try:
        with Image.open(file) as image:
            image.load()
            return _to_rgb(image)
    except FileNotFoundError as err:
        raise DataError(f"image {name} does not exist: {err}") from err
    except DECODE_ERRORS as err:
        raise DataError(
            f"cannot decode image {name}: {err}; re-extract it from the dataset archive"
        ) from err


def decode_image(path: str) -> np.ndarray:
    """Decodes a JPEG or PNG (or other Pillow-readable) file to RGB.

    Grayscale, CMYK and palette images are converted and the EXIF orientation is applied.

    Args:
      path: the image file.

    Returns:
      uint8 (H, W, 3) RGB.

    Raises:
      DataError: naming the file, if it is missing, corrupt or truncated.
    """
    return decode_file(path, path)


def decode_bytes(data: bytes, name: str) -> np.ndarray:
    """Decodes encoded image bytes (as stored in a prepared tfds dataset) to RGB.

    Raises:
      DataError: naming the record as ``name`` if the bytes are not a readable image.
    """
    return decode_file(io.BytesIO(data), name)
