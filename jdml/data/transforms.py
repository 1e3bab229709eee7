"""Deterministic image transforms on decoded photos (Pillow and NumPy only, no JAX).

The evaluation view of the ImageNet-pretrained protocol (Roth et al., ICML 2020, and the papers
built on it): resize the short side to 256 pixels (bilinear), then crop the central 224 x 224
square, with torchvision's exact sizing (the long side truncated) and placement (offsets rounded
half to even) rules, so that crops match the reference code's pixel for pixel. Kept free of JAX
so that scripts recording reference outputs with other frameworks preprocess images with exactly
this code.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

# (top, left, height, width), torchvision's order of crop parameters.
Box = tuple[int, int, int, int]


def short_side_shape(height: int, width: int, size: int) -> tuple[int, int]:
    """(height, width) after torchvision's Resize(size): the short side becomes ``size`` and the
    long one ``int(size * long / short)``, truncated (not rounded)."""
    short, long = min(height, width), max(height, width)
    new_long = int(size * long / short)
    return (new_long, size) if height > width else (size, new_long)


def center_crop_params(height: int, width: int, size: int) -> Box:
    """The central ``size`` square where torchvision's CenterCrop puts it: offsets rounded half
    to even (135 spare rows put 68 above, not 67).

    Raises:
      ValueError: if the image is smaller than the crop (torchvision would pad with zeros).
    """
    if height < size or width < size:
        raise ValueError(f"cannot crop {size}x{size} from a {width}x{height} image")
    return round((height - size) / 2.0), round((width - size) / 2.0), size, size


#: torchvision's interpolation names and Pillow's filters.
PIL_FILTERS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC}


def resize_hw(image: np.ndarray, shape: tuple[int, int], filter: str = "bilinear") -> np.ndarray:
    """Pillow resize of a uint8 (H, W, C) array to ``shape`` = (height, width), with the
    ``filter`` "bilinear" (the papers' protocol) or "bicubic" (the ViT recipes').

    This is torchvision's PIL path (``Image.resize(..., BILINEAR)``); Pillow widens the filter
    when shrinking, so it antialiases like torchvision's tensor path with ``antialias=True`` but
    its rounding differs from it.
    """
    if filter not in PIL_FILTERS:
        raise ValueError(f"unknown interpolation {filter!r}; known: {', '.join(PIL_FILTERS)}")
    if image.shape[:2] == tuple(shape):
        return image  # torchvision returns the image untouched too
    pil = Image.fromarray(np.ascontiguousarray(image))
    return np.asarray(pil.resize((shape[1], shape[0]), PIL_FILTERS[filter]))


def crop_box(image: np.ndarray, box: Box) -> np.ndarray:
    """The pixels of ``box`` = (top, left, height, width), which must lie inside the image."""
    top, left, h, w = box
    if top < 0 or left < 0 or top + h > image.shape[0] or left + w > image.shape[1]:
        raise ValueError(f"box {box} is outside the {image.shape[1]}x{image.shape[0]} image")
    return image[top : top + h, left : left + w]


def eval_view(
    image: np.ndarray, resize: int = 256, crop: int = 224, filter: str = "bilinear"
) -> np.ndarray:
    """The evaluation view of one uint8 (H, W, 3) photo: torchvision's Resize(``resize``) of the
    short side (``filter``, PIL path) then CenterCrop(``crop``), as uint8 (crop, crop, 3)."""
    shape = short_side_shape(image.shape[0], image.shape[1], resize)
    image = resize_hw(image, shape, filter)
    return crop_box(image, center_crop_params(image.shape[0], image.shape[1], crop))
