"""Where a run's photos live when its views are made on the device (``data.views=device``).

With device views the host sends each batch's photo indices and view parameters; the photos'
uint8 pixels either stay in device memory for the whole run (the *resident* set: the host then
sends no pixels at all), or, for a set larger than ``data.device_photos_gib``, the host streams
each batch's photos as fixed-size canvases (copied from the decode cache or the in-memory array).

Every photo is stored with its long side along the rows: a landscape photo is transposed, so the
canvases of a set whose short sides are all ``data.resize`` (a decode cache) are (long, resize)
and no memory is spent on orientation. The resident set is one (rows, cols, 3) array of every
photo's rows one after the other, padded to the widest short side; a photo's canvas is the
``canvas_rows`` rows from its first (:func:`gather_canvases`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jdml.data.arrays import ImageArrays
from jdml.data.augment import AUGMENTATIONS
from jdml.data.benchmarks.common import FileList
from jdml.data.benchmarks.decode_cache import CachedPhotos
from jdml.data.device_views import FIELDS, ViewShape, hsv_tables, render, view_arrays, view_shape
from jdml.errors import ConfigError

log = logging.getLogger("jdml")

#: ``data.views``: where the training views are made.
VIEW_PLACES = ("auto", "host", "device")
#: The share of the device's memory a resident photo set may take when
#: ``data.device_photos_gib`` is -1 (on the CPU backend: of the host's memory).
AUTO_SHARE = 0.25


def photo_shapes(split: Any) -> np.ndarray | None:
    """(N, 2) int64 height and width of every photo of ``split``, or None where they are not
    known without decoding (photo files read without the decode cache)."""
    if isinstance(split, CachedPhotos):
        return np.asarray(split.shapes, np.int64)
    if isinstance(split, ImageArrays):
        return np.tile(np.asarray(split.images.shape[1:3], np.int64), (len(split), 1))
    return None


def views_place(data_cfg: Any, split: Any, backend: str) -> str:
    """Where a run's training views are made, ``"host"`` or ``"device"``: ``data.views``, with
    ``auto`` the device on accelerators for a photo augmentation of photos whose sizes are
    known (in memory, or photo files read from the decode cache)."""
    known = photo_shapes(split) is not None or (
        data_cfg.decode_cache and isinstance(split, FileList)
    )
    if data_cfg.views == "device" and not known:
        raise ConfigError(
            "data.views=device needs the photos' sizes before they are drawn: set "
            "--config.data.decode_cache=True (or use data.views=host)"
        )
    if data_cfg.views != "auto":
        return data_cfg.views
    if backend == "cpu" or "views" not in AUGMENTATIONS.meta(data_cfg.augment):
        return "host"
    if not known:
        log.info(
            "Views are made on the host: the photos are decoded per draw, and device views "
            "need their sizes first (--config.data.decode_cache=True)"
        )
        return "host"
    return "device"


@dataclasses.dataclass(frozen=True)
class Frames:
    """The photos of a split as canvases: each one's stored size and where it starts.

    Attributes:
      shapes: int64 (N, 2) each photo's height and width.
      transposed: bool (N,): stored transposed (wider than tall).
      starts: int64 (N,) its first row in the resident set.
      rows: canvas rows (the longest long side).
      cols: canvas columns (the longest short side).
    """

    shapes: np.ndarray
    transposed: np.ndarray
    starts: np.ndarray
    rows: int
    cols: int

    @classmethod
    def of(cls, shapes: np.ndarray) -> Frames:
        shapes = np.asarray(shapes, np.int64)
        transposed = shapes[:, 1] > shapes[:, 0]
        long, short = shapes.max(axis=1), shapes.min(axis=1)
        starts = np.concatenate([[0], np.cumsum(long)[:-1]])
        return cls(shapes, transposed, starts, int(long.max()), int(short.max()))

    @property
    def resident_bytes(self) -> int:
        """Bytes of the resident set: every photo's rows at the widest short side, plus one
        canvas of padding."""
        return int(self.shapes.max(axis=1).sum() + self.rows) * self.cols * 3


def stored(photo: np.ndarray) -> np.ndarray:
    """A uint8 (H, W, 3) photo as a canvas stores it: transposed if wider than tall."""
    return photo.transpose(1, 0, 2) if photo.shape[1] > photo.shape[0] else photo


def resident_set(split: Any, frames: Frames, chunk: int = 256) -> np.ndarray:
    """The resident set of ``split``: uint8 (total rows + canvas rows, cols, 3), every photo's
    stored rows in order (zeros right of a narrower photo and after the last)."""
    total = int(frames.shapes.max(axis=1).sum())
    out = np.zeros((total + frames.rows, frames.cols, 3), np.uint8)
    for first in range(0, len(frames.shapes), chunk):
        index = np.arange(first, min(first + chunk, len(frames.shapes)))
        for i, photo in zip(index, split.load(index), strict=True):
            pixels = stored(np.asarray(photo))
            start = int(frames.starts[i])
            out[start : start + pixels.shape[0], : pixels.shape[1]] = pixels
    return out


def host_canvases(photos: Sequence[np.ndarray], rows: int, cols: int) -> np.ndarray:
    """A streamed batch: uint8 (B, rows, cols, 3), each photo stored at the top left."""
    out = np.zeros((len(photos), rows, cols, 3), np.uint8)
    for i, photo in enumerate(photos):
        pixels = stored(np.asarray(photo))
        out[i, : pixels.shape[0], : pixels.shape[1]] = pixels
    return out


def gather_canvases(pixels: jax.Array, starts: jax.Array, rows: int) -> jax.Array:
    """The canvases (B, rows, cols, 3) of the resident set's photos starting at ``starts``."""
    take = lambda s: jax.lax.dynamic_slice_in_dim(pixels, s, rows, axis=0)  # noqa: E731
    return jax.vmap(take)(starts)


def memory_budget(gib: float) -> int:
    """``data.device_photos_gib`` in bytes: -1 is :data:`AUTO_SHARE` of the first device's
    memory (of the host's on the CPU backend)."""
    if gib >= 0:
        return int(gib * 2**30)
    stats = jax.devices()[0].memory_stats() or {}
    limit = stats.get("bytes_limit")
    if not limit:
        limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(AUTO_SHARE * limit)


@dataclasses.dataclass(frozen=True)
class HostViews:
    """What the host pipeline needs to send a batch's device views (picklable for grain's
    worker processes): the augmentation's parameter draw, the static shape, and the photos'
    canvases (``stream``: pixels are sent with every batch)."""

    draw: Any
    keywords: tuple[tuple[str, Any], ...]
    shape: ViewShape
    frames: Frames
    stream: bool

    def arrays(self, index: np.ndarray, rngs: Sequence[np.random.Generator]) -> dict:
        """The view arrays of the photos ``index``, one generator each."""
        keywords = dict(self.keywords)
        shapes = self.frames.shapes[index]
        params = [
            self.draw(int(h), int(w), rng, **keywords)
            for (h, w), rng in zip(shapes, rngs, strict=True)
        ]
        return view_arrays(params, self.shape)

    def photos(self, data: Any, index: np.ndarray) -> dict[str, np.ndarray]:
        """The batch's photo entries: their canvases (streamed) or their indices."""
        if self.stream:
            canvases = host_canvases(data.load(index), self.frames.rows, self.frames.cols)
            return {"canvas": canvases, "transposed": self.frames.transposed[index]}
        return {"photos": np.asarray(index, np.int32)}


def view_sources(batch: dict[str, Any]) -> dict[str, str]:
    """Each device view of a batch and the suffix of its photo entries: ``images`` and
    ``images_b`` read ``photos``/``canvas``, a stream's ``images_<s>`` its ``_<s>``."""
    views = {key.split(":")[0] for key in batch if ":" in key}
    return {v: v.removeprefix("images").removeprefix("_b") for v in sorted(views)}


class DeviceViews:
    """A run's device views: the host side (:class:`HostViews`), the device-resident set (or
    none: streamed), and :meth:`realize`, which the jitted step calls first.

    Args:
      data_cfg: the ``data`` config section.
      split: the training split.
    """

    def __init__(self, data_cfg: Any, split: Any) -> None:
        shapes = photo_shapes(split)
        if shapes is None:  # views_place refuses such a run first
            raise ValueError(f"device views need photos of known sizes, not {type(split)}")
        name = data_cfg.augment
        meta = AUGMENTATIONS.meta(name)
        keywords = {arg: data_cfg[key] for arg, key in meta.get("config", {}).items()}
        frames = Frames.of(shapes)
        colour = bool(meta.get("colour", False))
        shape = view_shape(
            keywords.get("size", data_cfg.image_size),
            frames.rows,
            frames.cols,
            resize=keywords.get("resize", 0),
            colour=colour,
        )
        budget = memory_budget(float(data_cfg.device_photos_gib))
        need = frames.resident_bytes
        stream = need > budget
        if stream:
            log.info(
                "Device views: the training photos take %.2f GiB, more than the %.2f GiB "
                "allowed (data.device_photos_gib); each batch's photos are streamed",
                need / 2**30,
                budget / 2**30,
            )
        self.host = HostViews(meta["views"], tuple(keywords.items()), shape, frames, stream)
        self.shape = shape
        self.resident: dict[str, jax.Array] = {}
        if not stream:
            log.info("Device views: %.2f GiB of training photos held on the device", need / 2**30)
            self.resident = {
                "pixels": jnp.asarray(resident_set(split, frames)),
                "starts": jnp.asarray(frames.starts.astype(np.int32)),
                "transposed": jnp.asarray(frames.transposed),
            }
        if colour:
            to_hsv, to_rgb = hsv_tables()
            self.resident.update(to_hsv=jnp.asarray(to_hsv), to_rgb=jnp.asarray(to_rgb))

    def _canvases(self, batch: dict[str, Any], suffix: str, photo_set: dict[str, jax.Array]):
        """The canvases and transposed flags of the photos ``photos<suffix>`` (from the
        resident set) or ``canvas<suffix>`` (streamed)."""
        if f"canvas{suffix}" in batch:
            return batch[f"canvas{suffix}"], batch[f"transposed{suffix}"]
        index = batch[f"photos{suffix}"]
        starts = photo_set["starts"][index]
        canvases = gather_canvases(photo_set["pixels"], starts, self.shape.rows)
        return canvases, photo_set["transposed"][index]

    def realize(self, batch: dict[str, Any], photo_set: dict[str, jax.Array]) -> dict[str, Any]:
        """The batch with its views made (inside the jitted step): ``images`` and the other
        views as float32 in [0, 1], with a member axis where the parameters have one."""
        out = {k: v for k, v in batch.items() if ":" not in k}
        tables = (photo_set["to_hsv"], photo_set["to_rgb"]) if self.shape.colour else None
        sources: dict[str, tuple[jax.Array, jax.Array]] = {}  # views of one photo set share it
        for view, suffix in view_sources(batch).items():
            if suffix not in sources:
                sources[suffix] = self._canvases(batch, suffix, photo_set)
            canvases, transposed = sources[suffix]
            arrays = {f: batch[f"{view}:{f}"] for f in FIELDS}
            make = functools.partial(render, canvases, transposed, shape=self.shape, tables=tables)
            if arrays["ystart"].ndim == 3:  # a member axis: every member's own view
                out[view] = jax.vmap(make)(arrays)
            else:
                out[view] = make(arrays)
        for key in [k for k in out if k.startswith(("photos", "canvas", "transposed"))]:
            del out[key]
        return out
