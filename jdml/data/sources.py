"""Named data sources: each loads a dataset into :class:`ImageArrays`.

Every loader in :data:`DATASETS` is called with keyword arguments only::

    DATASETS.get(name)(path=..., image_size=..., cache_dir=..., channels=1, skip_unreadable=False)

and with its own options, the config's ``data.<name>_<option>`` keys as ``option=...``
(``data.tfds_name`` -> ``name=`` for ``tfds``, :mod:`jdml.data.tfds_datasets`).

``glyphs``
  The embedded default dataset (see :mod:`jdml.data.glyphs`); ``path`` is ignored and the
  images are always grayscale (``channels=1``).
``folder``
  An image folder ``path/<class name>/<image files>``: the classes are the subfolder names
  in sorted order, the images every non-hidden file with an image suffix (sorted by name).
  Symbolic links are followed, both for class folders and for image files (a tree of links
  into another copy of the images works); a link whose target is missing is reported as an
  unreadable image. ``skip_unreadable`` skips undecodable files with a warning.
``npz``
  An ``.npz`` file with ``images`` (N, H, W) or (N, H, W, C) uint8, ``labels`` (N,) int and
  optionally ``class_names`` (K,) strings.
``tfds``
  Any tensorflow-datasets image dataset with class labels prepared in ``path``
  (:mod:`jdml.data.tfds_datasets`, which registers it).

Images are converted to ``channels`` (1: grayscale, 3: RGB) and brought to
``image_size x image_size`` by resizing the short side and cropping the centre. Bad input
raises :class:`DataError` with a message naming the problem and the fix.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
from PIL import Image, ImageOps

from jdml.data.arrays import ImageArrays
from jdml.data.glyphs import MAX_IMAGE_SIZE, MIN_IMAGE_SIZE, load_glyphs
from jdml.data.pixels import DECODE_ERRORS, to_8bit
from jdml.errors import DataError, MissingFontsError
from jdml.registry import Registry

Loader = Callable[..., ImageArrays]

#: Dataset loaders by name. Facts of a registration: ``source`` (the ``data.source`` that reads
#: it, if not ``files``), ``keys`` (the loader's own ``data.<name>_<option>`` keys with their
#: defaults, added to the base config), ``ranges`` of those keys and ``check(config)`` (raising
#: ``ConfigError``), both applied by ``jdml.config.validate`` when the dataset is selected.
DATASETS: Registry[Loader] = Registry("dataset")

#: File suffixes (lower case) that the folder source reads as images.
IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}
)
FOLDER_LAYOUT = "<path>/<class name>/<image files> (one subfolder per class)"
NPZ_LAYOUT = (
    "an .npz with 'images' (N, H, W) or (N, H, W, C) uint8, 'labels' (N,) int and "
    "optionally 'class_names' (K,) str"
)


def load_dataset(name: str, **kwargs: object) -> ImageArrays:
    """Looks ``name`` up in :data:`DATASETS` and calls it with ``kwargs``."""
    return DATASETS.get(name)(**kwargs)


# --------------------------------------------------------------------------- images


def _check_channels(channels: int) -> None:
    if channels not in (1, 3):
        raise DataError(f"channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")


def _check_image_size(image_size: int) -> None:
    if not isinstance(image_size, int) or image_size < 1:
        raise DataError(f"image_size must be a positive integer, got {image_size!r}")


def fit_square(image: Image.Image, size: int) -> Image.Image:
    """Resizes the short side to ``size`` (aspect kept), then crops the centre square."""
    width, height = image.size
    if (width, height) == (size, size):
        return image
    scale = size / min(width, height)
    new_w, new_h = max(size, round(width * scale)), max(size, round(height * scale))
    resized = image.resize((new_w, new_h), Image.Resampling.BICUBIC)
    left, top = (new_w - size) // 2, (new_h - size) // 2
    return resized.crop((left, top, left + size, top + size))


def to_array(image: Image.Image, size: int, channels: int) -> np.ndarray:
    """A Pillow image of any mode as a (size, size, channels) uint8 array: high bit depths are
    scaled to 8 bits and transparent pixels composited onto white (see ``jdml.data.pixels``)."""
    mode = "L" if channels == 1 else "RGB"
    array = np.asarray(fit_square(to_8bit(image).convert(mode), size), dtype=np.uint8)
    return array.reshape(size, size, channels)


def resize_images(images: np.ndarray, size: int, channels: int) -> np.ndarray:
    """Converts (N, H, W, C) uint8 images (C in 1, 3) to (N, size, size, channels)."""
    n, height, width, have = images.shape
    if (height, width, have) == (size, size, channels):
        return images
    if (height, width) == (size, size) and have == 1:  # gray -> RGB needs no resampling
        return np.repeat(images, channels, axis=-1)
    out = np.empty((n, size, size, channels), np.uint8)
    for i in range(n):
        pil = Image.fromarray(images[i, :, :, 0] if have == 1 else images[i])  # L or RGB
        out[i] = to_array(pil, size, channels)
    return out


# --------------------------------------------------------------------------- glyphs


@DATASETS.register("glyphs")
def load_glyphs_source(
    *,
    path: str = "",
    image_size: int = 32,
    cache_dir: str | None = None,
    channels: int = 1,
    skip_unreadable: bool = False,
) -> ImageArrays:
    """The embedded glyph dataset (``path`` is ignored). The glyphs are grayscale; with
    ``channels=3`` the gray value is repeated over R, G and B (for RGB-pretrained backbones).

    Missing font packages and a bad ``image_size`` are reported as :class:`DataError`.
    """
    del path, skip_unreadable  # rendered here: nothing to skip
    _check_channels(channels)
    if not isinstance(image_size, int) or not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise DataError(
            f"the glyphs dataset renders {MIN_IMAGE_SIZE} to {MAX_IMAGE_SIZE} px images; "
            f"image_size {image_size!r} is outside that range"
        )
    try:
        data = load_glyphs(image_size, cache_dir or None)
    except MissingFontsError as err:
        raise DataError(str(err)) from err
    if channels == 1:
        return data
    return dataclasses.replace(data, images=np.repeat(data.images, channels, axis=-1))


# --------------------------------------------------------------------------- folder


def _existing_path(path: str, layout: str, source: str) -> Path:
    """``path`` as a Path, or a DataError saying it does not exist and what is expected."""
    if not path:
        raise DataError(f"the {source} dataset needs a path: {layout}")
    resolved = Path(path).expanduser()
    if not resolved.exists():
        raise DataError(
            f"dataset path {resolved} does not exist; the {source} source expects {layout}"
        )
    return resolved


def _visible(entry: Path) -> bool:
    return not entry.name.startswith(".")


def _class_folders(root: Path) -> list[Path]:
    """The non-hidden subfolders of ``root``, sorted by name."""
    if not root.is_dir():
        raise DataError(
            f"dataset path {root} is not a folder; the folder source expects {FOLDER_LAYOUT}"
        )
    folders = sorted(
        (d for d in root.iterdir() if d.is_dir() and _visible(d)), key=lambda d: d.name
    )
    if not folders:
        loose = [f for f in root.iterdir() if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES]
        hint = (
            " (the images lie directly in it: move them into one subfolder per class)"
            if loose
            else ""
        )
        raise DataError(f"no class folders in {root}{hint}; expected {FOLDER_LAYOUT}")
    return folders


def image_files(folder: Path) -> list[Path]:
    """The non-hidden image files directly in ``folder``, sorted by name (maybe none)."""
    return sorted(
        (
            f
            for f in folder.iterdir()
            if (f.is_file() or f.is_symlink())
            and _visible(f)
            and f.suffix.lower() in IMAGE_SUFFIXES
        ),
        key=lambda f: f.name,
    )


def _image_files(folder: Path) -> list[Path]:
    """The image files of a class folder, which must hold some."""
    files = image_files(folder)
    if not files:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise DataError(
            f"class folder {folder} has no image files ({suffixes}); "
            "add images or remove the folder"
        )
    return files


def square_image(file: Path | str | BinaryIO, size: int, channels: int) -> np.ndarray:
    """Decodes one image (a file or a binary file object; EXIF orientation applied) into the
    (size, size, channels) square. Raises what Pillow raises for a bad image (``DECODE_ERRORS``).
    """
    with Image.open(file) as image:
        image.load()
        return to_array(ImageOps.exif_transpose(image), size, channels)


def read_image(file: Path | str, size: int, channels: int, hint: str = "") -> np.ndarray:
    """Decodes one image file (EXIF orientation applied) into the (size, size, channels) square;
    errors name the file (and end with ``hint``); a folder is named as one."""
    if isinstance(file, str | Path) and os.path.isdir(file):
        raise DataError(
            f"{file} is a folder, not an image file: give the image files in it, e.g. "
            f"{os.path.join(file, '*.jpg')}"
        )
    try:
        return square_image(file, size, channels)
    except DECODE_ERRORS as err:
        raise DataError(f"cannot read image {file}: {err}; fix or delete the file{hint}") from err


SKIP_HINT = " (or set --config.data.skip_unreadable=True to skip unreadable files with a warning)"


@DATASETS.register("folder")
def load_folder(
    *,
    path: str = "",
    image_size: int = 32,
    cache_dir: str | None = None,
    channels: int = 1,
    skip_unreadable: bool = False,
) -> ImageArrays:
    """An image folder ``path/<class>/<images>`` (see the module docstring).

    Args:
      skip_unreadable: skip files that cannot be decoded (with a warning) instead of raising.
    """
    del cache_dir
    _check_channels(channels)
    _check_image_size(image_size)
    root = _existing_path(path, FOLDER_LAYOUT, "folder")
    images, labels, names = [], [], []
    for folder in _class_folders(root):
        count = 0
        for file in _image_files(folder):
            try:
                images.append(read_image(file, image_size, channels, SKIP_HINT))
            except DataError as err:
                if not skip_unreadable:
                    raise
                warnings.warn(f"skipping {file}: {err.__cause__}", stacklevel=2)
                continue
            labels.append(len(names))
            count += 1
        if count == 0:
            raise DataError(
                f"class folder {folder} has no readable images; add images or remove it"
            )
        names.append(folder.name)
    return ImageArrays(
        images=np.stack(images),
        labels=np.asarray(labels, np.int32),
        class_names=tuple(names),
        source=f"folder {root}",
    )


# --------------------------------------------------------------------------- npz


def npz_arrays(file: Path) -> dict[str, np.ndarray]:
    """The arrays of an npz file (no pickles)."""
    try:
        loaded = np.load(file, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise DataError(
            f"cannot read {file} as an npz file ({err}); expected {NPZ_LAYOUT}"
        ) from err
    if not isinstance(loaded, np.lib.npyio.NpzFile):
        raise DataError(
            f"{file} holds a single array, not an npz archive; write it with "
            "np.savez(path, images=..., labels=...)"
        )
    arrays = {}
    with loaded as npz:
        for key in npz.files:
            try:
                arrays[key] = npz[key]
            except ValueError as err:
                raise DataError(
                    f"{file}: {key!r} is an object array ({err}); store class_names as a string "
                    "array (np.array(names, dtype=str)) and numbers as numeric arrays"
                ) from err
            except (OSError, EOFError, zipfile.BadZipFile) as err:
                raise DataError(f"{file}: {key!r} is unreadable ({err}); rewrite the file") from err
    return arrays


def npz_images(images: np.ndarray, file: Path) -> np.ndarray:
    """Checks the ``images`` array and returns it as (N, H, W, C)."""
    if images.dtype != np.uint8:
        raise DataError(
            f"'images' in {file} is {images.dtype}; convert it to uint8 0..255 "
            "(e.g. (x * 255).round().astype(np.uint8) for floats in [0, 1])"
        )
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise DataError(
            f"'images' in {file} has shape {images.shape}; expected (N, H, W) or (N, H, W, C) "
            "with C = 1 or 3"
        )
    return images


def npz_labels(labels: np.ndarray, n: int, file: Path) -> np.ndarray:
    """Checks the ``labels`` array against ``n`` images and returns it as int32."""
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataError(
            f"'labels' in {file} is {labels.dtype} {labels.shape}; expected a 1-D integer array"
        )
    if len(labels) != n:
        raise DataError(
            f"{file} has {n} images but {len(labels)} labels; they must have one label per image"
        )
    if n and labels.min() < 0:
        raise DataError(f"'labels' in {file} has negative values; use class indices 0..K-1")
    return labels.astype(np.int32)


def _npz_class_names(
    arrays: dict[str, np.ndarray], labels: np.ndarray, file: Path
) -> tuple[str, ...]:
    """The class names stored in the file, or the label numbers as names."""
    needed = int(labels.max()) + 1 if len(labels) else 0
    if "class_names" not in arrays:
        return tuple(str(i) for i in range(needed))
    names = tuple(str(x) for x in np.asarray(arrays["class_names"]).reshape(-1))
    if len(names) < needed:
        raise DataError(
            f"{file} has {len(names)} class_names but labels up to {needed - 1}; "
            "give one name per class index"
        )
    return names


@DATASETS.register("npz")
def load_npz(
    *,
    path: str = "",
    image_size: int = 32,
    cache_dir: str | None = None,
    channels: int = 1,
    skip_unreadable: bool = False,
) -> ImageArrays:
    """Labelled images from an ``.npz`` file (see the module docstring)."""
    del cache_dir, skip_unreadable  # arrays: a damaged file is refused as a whole
    _check_channels(channels)
    _check_image_size(image_size)
    file = _existing_path(path, NPZ_LAYOUT, "npz")
    arrays = npz_arrays(file)
    missing = [key for key in ("images", "labels") if key not in arrays]
    if missing:
        found = ", ".join(sorted(arrays)) or "none"
        raise DataError(
            f"{file} lacks {', '.join(repr(k) for k in missing)} (keys found: {found}); "
            f"expected {NPZ_LAYOUT}"
        )
    images = npz_images(arrays["images"], file)
    labels = npz_labels(arrays["labels"], len(images), file)
    if len(images) == 0:
        raise DataError(f"{file} holds no images")
    return ImageArrays(
        images=resize_images(images, image_size, channels),
        labels=labels,
        class_names=_npz_class_names(arrays, labels, file),
        source=f"npz {file}",
    )
