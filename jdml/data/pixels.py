"""Any image Pillow opens, as 8-bit grayscale or RGB pixels.

Pillow's own ``convert("L")``/``convert("RGB")`` clips high-bit-depth images instead of scaling
them (a 16-bit PNG comes out almost white) and drops transparency, showing whatever colour the
transparent pixels happen to hold. :func:`to_8bit` scales and composites instead:

* ``I;16``, ``I;16B``, ``I;16L``, ``I;16N`` (16-bit) and ``I`` (32-bit integer) images: values
  0..65535 are scaled to 0..255 (``round(v / 257)``); ``I`` images with values outside
  0..65535 are refused.
* ``F`` (32-bit float) images: values in [0, 1] are scaled by 255; values in [0, 255] are
  taken as they are; anything else (negative, larger, NaN) is refused.
* Images with transparency (``LA``, ``La``, ``PA``, ``RGBA``, ``RGBa``, and ``P``/``L``/``RGB``
  with a transparent colour): composited onto a white background (``alpha="white"``, the
  default), or the alpha dropped as torchvision's ``convert("RGB")`` does (``alpha="drop"``,
  the benchmark readers' reference-exact path).
* ``1`` (bilevel), ``L``, ``P``, ``RGB``, ``CMYK``, ``YCbCr``, ``LAB`` and ``HSV``: Pillow's own
  conversion, which is exact for them.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from jdml.errors import UnsupportedImageError

#: What Pillow (and :func:`to_8bit`) raise for an image that cannot be opened or decoded: an
#: unidentified format, truncated data and a missing file are OSErrors.
DECODE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)
BACKGROUND = (255, 255, 255)  # what transparent pixels are composited onto
_EXACT_MODES = frozenset({"1", "L", "P", "RGB", "CMYK", "YCbCr", "LAB", "HSV"})
_ALPHA_MODES = frozenset({"LA", "La", "PA", "RGBA", "RGBa"})


def _gray(values: np.ndarray) -> Image.Image:
    return Image.fromarray(np.clip(np.rint(values), 0, 255).astype(np.uint8))


def _high_bit_depth(image: Image.Image) -> Image.Image:
    values = np.asarray(image).astype(np.float64)
    if image.mode == "F":
        if not np.isfinite(values).all() or values.min() < 0 or values.max() > 255:
            raise UnsupportedImageError(
                "a floating-point (mode F) image with values outside [0, 1] and [0, 255]; "
                "save it as 8-bit, or scale it to [0, 1]"
            )
        return _gray(values * 255.0 if values.max() <= 1.0 else values)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise UnsupportedImageError(
            f"a 32-bit integer (mode {image.mode}) image with values outside 0..65535; save it "
            "as 8- or 16-bit"
        )
    return _gray(values / 257.0)


def to_8bit(image: Image.Image, alpha: str = "white") -> Image.Image:
    """``image`` as an 8-bit image in a mode whose ``convert("L")``/``convert("RGB")`` is exact.

    Args:
      image: a loaded Pillow image of any mode.
      alpha: ``"white"`` composites transparent pixels onto white; ``"drop"`` ignores alpha.

    Returns:
      An image of mode ``L``, ``RGB`` or one of the exactly convertible modes above.

    Raises:
      UnsupportedImageError: for ``I``/``F`` values without an 8-bit meaning or an unknown mode.
    """
    mode = image.mode
    if mode.startswith("I") or mode == "F":
        return _high_bit_depth(image)
    transparent = mode in _ALPHA_MODES or "transparency" in image.info
    if transparent:
        rgba = image.convert("RGBA")
        if alpha == "drop":
            return rgba.convert("RGB")
        background = Image.new("RGBA", rgba.size, (*BACKGROUND, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode in _EXACT_MODES:
        return image
    raise UnsupportedImageError(f"an image of the unsupported mode {mode}; save it as RGB")
