"""Decoding benchmark images to RGB arrays, and a quick pass that finds files cut short."""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
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


#: The end of a complete file of each format that has one: a JPEG's end-of-image marker (some
#: writers pad after it, so it is looked for in the last bytes) and a PNG's IEND chunk.
_ENDINGS = ((b"\xff\xd8", b"\xff\xd9"), (b"\x89PNG", b"IEND\xaeB`\x82"))
_TAIL = 64


def looks_complete(path: str) -> bool:
    """Whether the image file at ``path`` ends as a complete file of its format does (True for
    formats without such an ending): reads its first and last bytes only."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - _TAIL))
            tail = f.read()
    except OSError:
        return False  # missing or unreadable: the decode names why
    for start, end in _ENDINGS:
        if head.startswith(start):
            return end in tail
    return True


def check_complete(paths: Sequence[str], threads: int = 8) -> None:
    """Refuses a split whose image files are cut short (a truncated download or copy) before
    anything is trained: each file's ends are read (:func:`looks_complete`), and one that does
    not end as its format does is decoded in full, which names it if it really is broken.

    Raises:
      DataError: naming the first file that is missing, corrupt or truncated.
    """
    with ThreadPoolExecutor(max(1, threads)) as pool:
        suspects = [
            p for p, ok in zip(paths, pool.map(looks_complete, paths), strict=True) if not ok
        ]
    for path in suspects:
        decode_image(path)  # raises DataError naming it; a padded but whole file passes
