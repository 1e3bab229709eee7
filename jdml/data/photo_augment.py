"""Training augmentations of the ImageNet-pretrained DML protocol on decoded photos (host side).

The protocol of Roth et al. (ICML 2020) and DiVA (Milbich et al., ECCV 2020) builds its views with
torchvision transforms applied to PIL images, so every operation here follows torchvision's PIL
path, i.e. Pillow's arithmetic (bilinear resampling, ``convert("L")``, ``blend``, 8-bit HSV):

* ``base``: RandomResizedCrop(224) (scale (0.08, 1), ratio (3/4, 4/3), bilinear) + flip(0.5);
* ``big``: the same with a 256 crop;
* ``red``: Resize(256) of the short side + RandomCrop(224) + flip(0.5);
* ``adv``: RandomResizedCrop(224) + RandomGrayscale(0.2) + ColorJitter(0.2, 0.2, 0.2, 0.2) + flip;
* ``realistic``: DiVA's key view, as ``adv`` with ColorJitter(0.4, 0.4, 0.4, 0.4);
* ``vit``: RandomResizedCrop(224, scale (0.2, 1), bicubic) + flip(0.5), the view of the ViT
  metric-learning recipes (Hyp-ViT's code).

Randomness comes only from the ``np.random.Generator`` passed in, drawn in torchvision's order and
with its rules (one ``uniform``/``integers``/``random``/``permutation`` call where torchvision
makes the matching torch call), so a batch is a pure function of its photos and the generator.
Given the same random draws, the pixels equal torchvision's (tests replay recorded torch draws).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from jdml.data.augment import AUGMENTATIONS
from jdml.data.transforms import (
    Box,
    center_crop_params,
    crop_box,
    eval_view,
    resize_hw,
    short_side_shape,
)

Photos = Sequence[np.ndarray] | np.ndarray
# Every augmentation here registers as one of photos of any size (RGB, ``photo=True``) whose
# keywords come from the ``data`` config: the crop size from ``data.image_size`` (and ``red``'s
# resize from ``data.resize``).
_CROP = {"size": "image_size"}


def as_rgb(image: np.ndarray) -> np.ndarray:
    """A photo as uint8 (H, W, 3): grey (H, W) or (H, W, 1) photos get three equal channels."""
    image = np.asarray(image)
    if image.dtype != np.uint8:
        raise TypeError(f"photos must be uint8, got {image.dtype}")
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"expected a (H, W), (H, W, 1) or (H, W, 3) photo, got {image.shape}")
    return np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image


def rrc_params(
    height: int,
    width: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Box:
    """The crop box of RandomResizedCrop (torchvision's ``RandomResizedCrop.get_params``).

    Up to 10 attempts draw an area fraction uniformly in ``scale`` and a log aspect ratio
    uniformly in ``log(ratio)``; the first box that fits gets a uniform position. If none fits,
    the central crop of the whole image with its aspect ratio clamped into ``ratio``.

    Args:
      height: photo height.
      width: photo width.
      rng: the generator; per attempt ``uniform`` twice, on success ``integers`` twice.
      scale: range of the crop area as a fraction of the photo's.
      ratio: range of the crop's width / height.

    Returns:
      (top, left, height, width) of the crop.
    """
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * float(rng.uniform(scale[0], scale[1]))
        # torch exponentiates in float32: float64 here moves a side only when it falls within
        # ~1e-7 of a rounding boundary, which the replay tests never meet.
        aspect = math.exp(float(rng.uniform(log_lo, log_hi)))
        w = round(math.sqrt(target_area * aspect))  # Python's round: half to even, as torchvision
        h = round(math.sqrt(target_area / aspect))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        w, h = round(height * max(ratio)), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def random_crop_params(height: int, width: int, size: int, rng: np.random.Generator) -> Box:
    """A uniformly placed ``size`` square (torchvision's ``RandomCrop.get_params``).

    Raises:
      ValueError: if the photo is smaller than the crop.
    """
    if height < size or width < size:
        raise ValueError(f"cannot crop {size}x{size} from a {width}x{height} photo")
    if height == size and width == size:
        return 0, 0, height, width  # torchvision draws nothing in this case
    top = int(rng.integers(0, height - size + 1))
    left = int(rng.integers(0, width - size + 1))
    return top, left, size, size


def resized_crop(image: np.ndarray, box: Box, size: int) -> np.ndarray:
    """Crops ``box`` then resizes it to ``size`` x ``size`` (bilinear).

    Equals torchvision's ``resized_crop`` on PIL images exactly: both crop first and resize the
    cut-out with Pillow, so the filter never reads pixels outside the box.
    """
    return resize_hw(crop_box(image, box), (size, size))


def hflip(image: np.ndarray) -> np.ndarray:
    """Mirrors left-right (Pillow's FLIP_LEFT_RIGHT)."""
    return np.ascontiguousarray(image[:, ::-1])


def _pil(image: np.ndarray) -> Image.Image:
    return Image.fromarray(np.ascontiguousarray(image))


def to_grayscale(image: np.ndarray) -> np.ndarray:
    """Pillow's ``convert("L")`` (ITU-R 601-2 luma, (299 R + 587 G + 114 B) / 1000 in fixed point,
    rounded) repeated to three channels, as torchvision's RandomGrayscale on RGB PIL images."""
    luma = np.asarray(_pil(image).convert("L"))
    return np.repeat(luma[..., None], 3, axis=-1)


def _blend(degenerate: Image.Image, image: Image.Image, factor: float) -> np.ndarray:
    # Pillow's blend: degenerate + factor * (image - degenerate) in float32, truncated towards
    # zero, and clipped to [0, 255] when factor > 1 extrapolates.
    return np.asarray(Image.blend(degenerate, image, factor))


def adjust_brightness(image: np.ndarray, factor: float) -> np.ndarray:
    """Blends with black (torchvision's PIL path, ImageEnhance.Brightness): ``trunc(f * x)``,
    clipped at 255."""
    pil = _pil(image)
    return _blend(Image.new("RGB", pil.size, 0), pil, factor)


def adjust_contrast(image: np.ndarray, factor: float) -> np.ndarray:
    """Blends with a flat grey at the mean luma (torchvision's PIL path, ImageEnhance.Contrast).

    The grey is ``int(mean(L) + 0.5)`` with L Pillow's integer luma, i.e. the mean is rounded to
    an integer before blending (the tensor path keeps it fractional).
    """
    pil = _pil(image)
    mean = int(np.asarray(pil.convert("L")).mean(dtype=np.float64) + 0.5)
    return _blend(Image.new("RGB", pil.size, (mean, mean, mean)), pil, factor)


def adjust_saturation(image: np.ndarray, factor: float) -> np.ndarray:
    """Blends with the photo's own grey version (torchvision's PIL path, ImageEnhance.Color)."""
    pil = _pil(image)
    return _blend(pil.convert("L").convert("RGB"), pil, factor)


def adjust_hue(image: np.ndarray, factor: float) -> np.ndarray:
    """Rotates the hue by ``factor`` turns in Pillow's 8-bit HSV (torchvision's PIL path).

    The hue byte is shifted by ``int(factor * 255)`` (truncated towards zero) modulo 256, and
    the photo converted back to RGB with Pillow.

    Raises:
      ValueError: if ``factor`` is outside [-0.5, 0.5].
    """
    if not -0.5 <= factor <= 0.5:
        raise ValueError(f"hue factor {factor} is not in [-0.5, 0.5]")
    hsv = np.array(_pil(image).convert("HSV"))
    hsv[..., 0] += np.uint8(int(factor * 255) % 256)  # uint8 addition wraps around, as intended
    size = (image.shape[1], image.shape[0])
    return np.asarray(Image.frombytes("HSV", size, hsv.tobytes()).convert("RGB"))


@dataclasses.dataclass(frozen=True)
class ViewParams:
    """Everything random about one view of one photo, drawn on the host in torchvision's order.

    The view is: crop ``box`` out of the photo, resize the crop to ``resized`` (Pillow's
    ``filter``, bilinear or bicubic; nothing when the sizes are equal), take the ``size`` square
    at ``window`` of the result, then (``gray``) Pillow's grayscale, the ``jitter`` operations in
    their drawn order, and (``flip``) a left-right mirror. The Pillow path (:func:`pillow_view`)
    and the device path (:mod:`jdml.data.device_views`) apply the same parameters, so one seed
    gives one view on both.

    Attributes:
      box: (top, left, height, width) of the crop, inside the photo.
      resized: (height, width) the crop is resized to.
      window: (top, left) of the output square in the resized crop.
      size: the output side.
      flip: whether the view is mirrored left-right.
      gray: whether RandomGrayscale fired (before the jitter).
      jitter: ``(operation, factor)`` pairs in the order ColorJitter applies them; operations
        0 brightness, 1 contrast, 2 saturation, 3 hue (the factor in turns); disabled ones are
        absent.
      filter: the resize's filter, "bilinear" or "bicubic" (``jdml.data.resample.FILTERS``).
    """

    box: Box
    resized: tuple[int, int]
    window: tuple[int, int]
    size: int
    flip: bool = False
    gray: bool = False
    jitter: tuple[tuple[int, float], ...] = ()
    filter: str = "bilinear"


#: ColorJitter's operations in the order of their indices (``ViewParams.jitter``).
JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)


def pillow_view(image: np.ndarray, params: ViewParams) -> np.ndarray:
    """The view ``params`` of a uint8 (H, W, 3) photo with Pillow: torchvision's PIL path.

    Returns:
      uint8 (size, size, 3).
    """
    out = resize_hw(crop_box(image, params.box), params.resized, params.filter)
    top, left = params.window
    out = crop_box(out, (top, left, params.size, params.size))
    if params.gray:
        out = to_grayscale(out)
    for op, factor in params.jitter:
        out = JITTER_OPS[op](out, factor)
    return hflip(out) if params.flip else np.ascontiguousarray(out)


def _flip_draw(rng: np.random.Generator) -> bool:
    # RandomHorizontalFlip(0.5): flips when a uniform draw falls below 0.5.
    return bool(rng.random() < 0.5)


def jitter_params(
    rng: np.random.Generator,
    brightness: float,
    contrast: float,
    saturation: float,
    hue: float,
) -> tuple[tuple[int, float], ...]:
    """torchvision's ColorJitter draws: a random order of the four operations
    (``rng.permutation(4)``), then each enabled factor uniformly, in the order brightness,
    contrast, saturation ([max(0, 1 - s), 1 + s]) and hue ([-h, h]). A zero strength disables
    its operation and its draw, as in torchvision.

    Returns:
      The enabled ``(operation, factor)`` pairs in the drawn order (see ``ViewParams.jitter``).

    Raises:
      ValueError: for a negative strength or a hue strength above 0.5.
    """
    if min(brightness, contrast, saturation, hue) < 0 or hue > 0.5:
        raise ValueError("jitter strengths must be >= 0, and hue's at most 0.5")
    order = rng.permutation(4)
    spans = [
        (max(0.0, 1.0 - v), 1.0 + v) if v else None for v in (brightness, contrast, saturation)
    ]
    spans.append((-hue, hue) if hue else None)
    factors = [None if r is None else float(rng.uniform(r[0], r[1])) for r in spans]
    return tuple((int(i), factors[i]) for i in order if factors[i] is not None)


def color_jitter(
    image: np.ndarray,
    rng: np.random.Generator,
    brightness: float,
    contrast: float,
    saturation: float,
    hue: float,
) -> np.ndarray:
    """torchvision's ColorJitter on a uint8 RGB photo (draws: :func:`jitter_params`).

    Returns:
      uint8 (H, W, 3).
    """
    for op, factor in jitter_params(rng, brightness, contrast, saturation, hue):
        image = JITTER_OPS[op](image, factor)
    return image


def rrc_view_params(
    height: int,
    width: int,
    rng: np.random.Generator,
    size: int,
    jitter: float = 0.0,
    scale: tuple[float, float] = (0.08, 1.0),
    filter: str = "bilinear",
) -> ViewParams:
    """RandomResizedCrop(size, scale, interpolation=filter), then (if ``jitter``)
    RandomGrayscale(0.2) and ColorJitter (``jitter`` for all four), then the flip: the draws of
    the reference's ``base``/``big``/``adv`` modes, DiVA's key view and the ``vit`` view, in
    their transform order."""
    box = rrc_params(height, width, rng, scale)
    gray, jitters = False, ()
    if jitter:
        gray = bool(rng.random() < 0.2)
        jitters = jitter_params(rng, jitter, jitter, jitter, jitter)
    flip = _flip_draw(rng)
    return ViewParams(box, (size, size), (0, 0), size, flip, gray, jitters, filter)


def red_view_params(
    height: int, width: int, rng: np.random.Generator, size: int, resize: int
) -> ViewParams:
    """Resize(resize) of the short side, RandomCrop(size), flip: the ``red`` mode's draws."""
    resized = short_side_shape(height, width, resize)
    top, left, _, _ = random_crop_params(*resized, size, rng)
    return ViewParams((0, 0, height, width), resized, (top, left), size, _flip_draw(rng))


def eval_view_params(
    height: int, width: int, resize: int = 256, crop: int = 224, filter: str = "bilinear"
) -> ViewParams:
    """The evaluation view (Resize(resize) of the short side, CenterCrop(crop)): no draws."""
    resized = short_side_shape(height, width, resize)
    top, left, _, _ = center_crop_params(*resized, crop)
    return ViewParams((0, 0, height, width), resized, (top, left), crop, filter=filter)


def _batch(images: Photos, view: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """Applies ``view`` to each photo in order: float32 (B, S, S, 3), ToTensor's x / 255.

    Each view is converted into its row of the output as it is made, and the division is done
    in place: one pass over the float batch instead of three, and no uint8 copy of it.
    """
    out = None
    for i, image in enumerate(images):
        pixels = view(as_rgb(image))
        if out is None:
            out = np.empty((len(images), *pixels.shape), np.float32)
        out[i] = pixels
    if out is None:
        raise ValueError("no photos to augment")
    return np.divide(out, 255.0, out=out)


def _drawn(draw: Callable[[int, int], ViewParams]) -> Callable[[np.ndarray], np.ndarray]:
    """The Pillow view of a photo whose parameters ``draw(height, width)`` draws."""
    return lambda image: pillow_view(image, draw(image.shape[0], image.shape[1]))


def _rrc_batch(
    images: Photos, rng: np.random.Generator, size: int, jitter: float, **crop: object
) -> np.ndarray:
    """The Pillow views of :func:`rrc_view_params` of each photo, in order (``crop``: its
    ``scale`` and ``filter``)."""
    return _batch(images, _drawn(lambda h, w: rrc_view_params(h, w, rng, size, jitter, **crop)))


#: What an augmentation registers as ``views=`` for the device path: draws one view's
#: parameters from the photo's height and width, the generator and the augmentation's keywords
#: (picklable: grain's worker processes draw them).
_BASE_VIEWS = functools.partial(rrc_view_params, jitter=0.0)


@AUGMENTATIONS.register("base", photo=True, config=_CROP, views=_BASE_VIEWS)
def base_augment(images: Photos, rng: np.random.Generator, *, size: int = 224) -> np.ndarray:
    """RandomResizedCrop(size) + RandomHorizontalFlip(0.5), the protocol's training view.

    Args:
      images: uint8 RGB photos of any sizes (a list, or a uniform (B, H, W, 3) array).
      rng: the batch's generator.
      size: the output side.

    Returns:
      float32 (B, size, size, 3) in [0, 1].
    """
    return _rrc_batch(images, rng, size, 0.0)


@AUGMENTATIONS.register("big", photo=True, config=_CROP, views=_BASE_VIEWS)
def big_augment(images: Photos, rng: np.random.Generator, *, size: int = 256) -> np.ndarray:
    """The reference's ``big`` mode: RandomResizedCrop(256) + flip (see :func:`base_augment`)."""
    return base_augment(images, rng, size=size)


@AUGMENTATIONS.register(
    "red", photo=True, config={**_CROP, "resize": "resize"}, views=red_view_params
)
def red_augment(
    images: Photos, rng: np.random.Generator, *, size: int = 224, resize: int = 256
) -> np.ndarray:
    """The reference's ``red`` mode: Resize(256) of the short side, RandomCrop(224), flip.

    Returns:
      float32 (B, size, size, 3) in [0, 1].
    """
    return _batch(images, _drawn(lambda h, w: red_view_params(h, w, rng, size, resize)))


@AUGMENTATIONS.register(
    "adv",
    photo=True,
    config=_CROP,
    colour=True,
    views=functools.partial(rrc_view_params, jitter=0.2),
)
def adv_augment(images: Photos, rng: np.random.Generator, *, size: int = 224) -> np.ndarray:
    """The reference's ``adv`` mode: RandomResizedCrop + RandomGrayscale(0.2) +
    ColorJitter(0.2, 0.2, 0.2, 0.2) + flip. Returns float32 (B, size, size, 3) in [0, 1]."""
    return _rrc_batch(images, rng, size, 0.2)


@AUGMENTATIONS.register(
    "realistic",
    photo=True,
    config=_CROP,
    colour=True,
    views=functools.partial(rrc_view_params, jitter=0.4),
)
def realistic_augment(images: Photos, rng: np.random.Generator, *, size: int = 224) -> np.ndarray:
    """DiVA's ``--realistic_augmentation`` key view: RandomResizedCrop + RandomGrayscale(0.2) +
    ColorJitter(0.4, 0.4, 0.4, 0.4) + flip. Returns float32 (B, size, size, 3) in [0, 1]."""
    return _rrc_batch(images, rng, size, 0.4)


#: The ``vit`` view's crop: RandomResizedCrop's area range and filter.
_VIT_CROP = {"scale": (0.2, 1.0), "filter": "bicubic"}


@AUGMENTATIONS.register(
    "vit",
    photo=True,
    config=_CROP,
    filter="bicubic",
    views=functools.partial(rrc_view_params, jitter=0.0, **_VIT_CROP),
)
def vit_augment(images: Photos, rng: np.random.Generator, *, size: int = 224) -> np.ndarray:
    """RandomResizedCrop(size, scale=(0.2, 1), interpolation=BICUBIC) + RandomHorizontalFlip:
    the training view of the ViT metric-learning recipes.

    Returns:
      float32 (B, size, size, 3) in [0, 1].

    References:
      Ermolov et al., "Hyperbolic Vision Transformers: Combining Improvements in Metric
      Learning", CVPR 2022 (its code's ``train_tr``).
    """
    return _rrc_batch(images, rng, size, 0.0, **_VIT_CROP)


def eval_photos(
    images: Photos, resize: int = 256, crop: int = 224, filter: str = "bilinear"
) -> np.ndarray:
    """The evaluation view: Resize(256) of the short side + CenterCrop(224), as torchvision.

    Args:
      images: uint8 RGB photos of any sizes.
      resize: the short side after resizing.
      crop: the side of the central square (at most ``resize``).
      filter: the resize's filter, "bilinear" or "bicubic".

    Returns:
      float32 (B, crop, crop, 3) in [0, 1].
    """

    return _batch(images, lambda image: eval_view(image, resize, crop, filter))
