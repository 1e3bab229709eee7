"""Deterministic image transforms on decoded photos (Pillow and NumPy only, no JAX).

The evaluation transform of the ImageNet-pretrained protocol (Roth et al., ICML 2020, and the
papers built on it): resize the short side to 256 pixels (bilinear, aspect kept), then crop the
central 224 x 224 square. Kept free of JAX so that scripts recording reference outputs with other
frameworks preprocess images with exactly this code.
"""

from __future__ import annotations

import numpy as np
from PIL import Image


def resize_short_side(image: Image.Image, size: int) -> Image.Image:
    """Resizes so that the shorter side is ``size`` pixels (bilinear, aspect ratio kept)."""
    width, height = image.size
    if min(width, height) == size:
        return image
    scale = size / min(width, height)
    new = (max(size, round(width * scale)), max(size, round(height * scale)))
    return image.resize(new, Image.Resampling.BILINEAR)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """The central ``size`` x ``size`` square (the image must be at least that large)."""
    width, height = image.size
    if width < size or height < size:
        raise ValueError(f"cannot crop {size}x{size} from a {width}x{height} image")
    left, top = (width - size) // 2, (height - size) // 2
    return image.crop((left, top, left + size, top + size))


def eval_transform(image: Image.Image, resize: int = 256, crop: int = 224) -> np.ndarray:
    """Resizes the short side to ``resize``, crops the centre: uint8 (crop, crop, 3) RGB."""
    rgb = image.convert("RGB")
    return np.asarray(center_crop(resize_short_side(rgb, resize), crop), dtype=np.uint8)
