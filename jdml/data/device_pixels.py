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

On a mesh of D devices each device holds one D-th of the set (a *shard*: a run of whole photos,
the shards balanced by rows), and a process builds only its own devices' shards. The step
gathers each photo's canvas on the device that holds it and sends it to the device whose rows
of the batch it fills (:func:`gather_sharded`: a reduce-scatter of the batch's canvases over
the data axis, summed over the member axis, every photo coming from exactly one device).
Streamed canvases are placed with the batch, so each device (and process) receives only its
own rows' photos.
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
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.data.arrays import ImageArrays
from jdml.data.augment import AUGMENTATIONS
from jdml.data.benchmarks.common import FileList
from jdml.data.benchmarks.decode_cache import CachedPhotos
from jdml.data.device_views import FIELDS, ViewShape, hsv_tables, render, view_arrays, view_shape
from jdml.errors import ConfigError
from jdml.mesh import AXIS, DATA

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
      shards: the devices the resident set is split over (1: one array).
      shard_rows: rows of one shard (its photos' rows padded to the longest shard's, plus one
        canvas of padding); the shard of the photo starting at row ``s`` is ``s // shard_rows``.
    """

    shapes: np.ndarray
    transposed: np.ndarray
    starts: np.ndarray
    rows: int
    cols: int
    shards: int = 1
    shard_rows: int = 0

    @classmethod
    def of(cls, shapes: np.ndarray, shards: int = 1) -> Frames:
        """The frames of photos of ``shapes``, their rows split into ``shards`` runs of whole
        photos (a photo goes to the shard its middle row falls in, in the unsplit set)."""
        shapes = np.asarray(shapes, np.int64)
        transposed = shapes[:, 1] > shapes[:, 0]
        long, short = shapes.max(axis=1), shapes.min(axis=1)
        rows = int(long.max())
        first_row = np.cumsum(long) - long  # in the unsplit set
        middle = (2 * first_row + long) * shards // (2 * int(long.sum()))
        shard = np.minimum(middle, shards - 1)  # non-decreasing
        first_photo = np.searchsorted(shard, np.arange(shards))
        offset = first_row - first_row[np.minimum(first_photo, len(long) - 1)][shard]
        used = np.bincount(shard, long, minlength=shards).astype(np.int64)
        shard_rows = int(used.max()) + rows
        starts = shard * shard_rows + offset
        return cls(shapes, transposed, starts, rows, int(short.max()), shards, shard_rows)

    @property
    def resident_bytes(self) -> int:
        """Bytes of one device's shard of the resident set (the whole set for one shard):
        its photos' rows at the widest short side, plus one canvas of padding."""
        return self.shard_rows * self.cols * 3

    def shard_of(self, index: np.ndarray) -> np.ndarray:
        """The shard holding each photo of ``index``."""
        return self.starts[index] // self.shard_rows


def stored(photo: np.ndarray) -> np.ndarray:
    """A uint8 (H, W, 3) photo as a canvas stores it: transposed if wider than tall."""
    return photo.transpose(1, 0, 2) if photo.shape[1] > photo.shape[0] else photo


def resident_shard(split: Any, frames: Frames, shard: int, chunk: int = 256) -> np.ndarray:
    """One shard of the resident set of ``split``: uint8 (shard rows, cols, 3), its photos'
    stored rows in order (zeros right of a narrower photo and after the last)."""
    out = np.zeros((frames.shard_rows, frames.cols, 3), np.uint8)
    mine = np.flatnonzero(frames.shard_of(np.arange(len(frames.shapes))) == shard)
    first = shard * frames.shard_rows
    for at in range(0, len(mine), chunk):
        index = mine[at : at + chunk]
        for i, photo in zip(index, split.load(index), strict=True):
            pixels = stored(np.asarray(photo))
            start = int(frames.starts[i]) - first
            out[start : start + pixels.shape[0], : pixels.shape[1]] = pixels
    return out


def resident_set(split: Any, frames: Frames) -> np.ndarray:
    """The whole resident set of ``split``: its shards one after the other."""
    return np.concatenate([resident_shard(split, frames, g) for g in range(frames.shards)])


def place_resident(split: Any, frames: Frames, mesh: Mesh | None) -> jax.Array:
    """The resident set on the devices: on the default device without a mesh, else split over
    every device of the mesh (``P((member, data))``), each process building only the shards
    of its own devices."""
    if mesh is None:
        return jnp.asarray(resident_set(split, frames))
    shape = (frames.shards * frames.shard_rows, frames.cols, 3)
    sharding = NamedSharding(mesh, P((AXIS, DATA)))
    first = lambda index: (index[0].start or 0) // frames.shard_rows  # noqa: E731
    return jax.make_array_from_callback(
        shape, sharding, lambda index: resident_shard(split, frames, first(index))
    )


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


def gather_sharded(
    pixels: jax.Array, starts: jax.Array, index: jax.Array, rows: int, frames: Frames, mesh: Mesh
) -> jax.Array:
    """The canvases (B, rows, cols, 3) of photos ``index`` from a resident set split over
    ``mesh`` (:func:`place_resident`), placed as a batch is (``P(data)``).

    Each device cuts the canvases of the batch's photos it holds (zeros for the others), and
    the canvases are summed over the mesh: a reduce-scatter over the data axis, so a device
    receives only its rows, then a sum over the member axis. Each photo comes from exactly one
    device, so the uint8 sums are exact.
    """
    data = mesh.shape[DATA]

    def local(pixels: jax.Array, starts: jax.Array, index: jax.Array) -> jax.Array:
        me = jax.lax.axis_index(AXIS) * data + jax.lax.axis_index(DATA)
        start = starts[index]
        mine = start // frames.shard_rows == me
        cut = gather_canvases(pixels, jnp.where(mine, start % frames.shard_rows, 0), rows)
        cut = jnp.where(mine[:, None, None, None], cut, jnp.zeros((), cut.dtype))
        cut = jax.lax.psum_scatter(cut, DATA, scatter_dimension=0, tiled=True)
        return jax.lax.psum(cut, AXIS)

    gathered = jax.shard_map(
        local,
        mesh=mesh,
        in_specs=(P((AXIS, DATA)), P(), P()),
        out_specs=P(DATA),
        check_vma=False,
    )
    return gathered(pixels, starts, index)


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


@dataclasses.dataclass(frozen=True)
class ViewSpec:
    """The static facts the step's view making reads: the views' shape, the photos' frames
    and the mesh the resident set is split over (None: one device)."""

    shape: ViewShape
    frames: Frames
    mesh: Mesh | None


@dataclasses.dataclass(frozen=True)
class DeviceViews:
    """A run's device views, as data: what the host pipeline sends (``host``), what the step's
    :func:`make_views` reads (``spec``) and the device-resident arrays it is passed
    (``resident``: the photos, unless streamed, and the colour tables)."""

    host: HostViews
    spec: ViewSpec
    resident: dict[str, jax.Array]


def device_views(data_cfg: Any, split: Any, mesh: Mesh | None = None) -> DeviceViews:
    """The device views of a run.

    Args:
      data_cfg: the ``data`` config section.
      split: the training split.
      mesh: the run's device mesh (None: one device). The resident set is split over its
        devices, and ``data.device_photos_gib`` bounds each device's shard.
    """
    shapes = photo_shapes(split)
    if shapes is None:  # views_place refuses such a run first
        raise ValueError(f"device views need photos of known sizes, not {type(split)}")
    name = data_cfg.augment
    meta = AUGMENTATIONS.meta(name)
    keywords = {arg: data_cfg[key] for arg, key in meta.get("config", {}).items()}
    on_mesh = mesh if mesh is not None and mesh.size > 1 else None
    devices = 1 if on_mesh is None else on_mesh.size
    frames = Frames.of(shapes, devices)
    colour = bool(meta.get("colour", False))
    shape = view_shape(
        keywords.get("size", data_cfg.image_size),
        frames.rows,
        frames.cols,
        resize=keywords.get("resize", 0),
        colour=colour,
        filter=meta.get("filter", "bilinear"),
    )
    budget = memory_budget(float(data_cfg.device_photos_gib))
    need = frames.resident_bytes
    each = "" if devices == 1 else f" on each of {devices} devices"
    stream = need > budget
    if stream:
        log.info(
            "Device views: the training photos take %.2f GiB%s, more than the %.2f GiB "
            "allowed (data.device_photos_gib); each batch's photos are streamed",
            need / 2**30,
            each,
            budget / 2**30,
        )
    small: dict[str, np.ndarray] = {}
    resident: dict[str, jax.Array] = {}
    if not stream:
        log.info("Device views: %.2f GiB of training photos held%s", need / 2**30, each)
        resident["pixels"] = place_resident(split, frames, mesh)
        small.update(starts=frames.starts.astype(np.int32), transposed=frames.transposed)
    if colour:
        small.update(zip(("to_hsv", "to_rgb"), hsv_tables(), strict=True))
    replicated = None if mesh is None else NamedSharding(mesh, P())
    place = functools.partial(jax.device_put, device=replicated)
    resident.update({k: place(v) for k, v in small.items()})
    host = HostViews(meta["views"], tuple(keywords.items()), shape, frames, stream)
    return DeviceViews(host, ViewSpec(shape, frames, on_mesh), resident)


def _canvases(
    spec: ViewSpec, batch: dict[str, Any], suffix: str, photo_set: dict[str, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """The canvases and transposed flags of the photos ``photos<suffix>`` (from the resident
    set) or ``canvas<suffix>`` (streamed)."""
    if f"canvas{suffix}" in batch:
        return batch[f"canvas{suffix}"], batch[f"transposed{suffix}"]
    index = batch[f"photos{suffix}"]
    pixels, starts = photo_set["pixels"], photo_set["starts"]
    if spec.mesh is None:
        canvases = gather_canvases(pixels, starts[index], spec.shape.rows)
    else:
        canvases = gather_sharded(pixels, starts, index, spec.shape.rows, spec.frames, spec.mesh)
    return canvases, photo_set["transposed"][index]


def make_views(
    spec: ViewSpec, batch: dict[str, Any], photo_set: dict[str, jax.Array]
) -> dict[str, Any]:
    """The batch with its views made (inside the jitted step, from the batch's view parameters
    and the resident ``photo_set``): ``images`` and the other views as float32 in [0, 1], with a
    member axis where the parameters have one."""
    out = {k: v for k, v in batch.items() if ":" not in k}
    tables = (photo_set["to_hsv"], photo_set["to_rgb"]) if spec.shape.colour else None
    sources: dict[str, tuple[jax.Array, jax.Array]] = {}  # views of one photo set share it
    for view, suffix in view_sources(batch).items():
        if suffix not in sources:
            sources[suffix] = _canvases(spec, batch, suffix, photo_set)
        canvases, transposed = sources[suffix]
        arrays = {f: batch[f"{view}:{f}"] for f in FIELDS}
        make = functools.partial(render, canvases, transposed, shape=spec.shape, tables=tables)
        if arrays["ystart"].ndim == 3:  # a member axis: every member's own view
            out[view] = jax.vmap(make)(arrays)
        else:
            out[view] = make(arrays)
    for key in [k for k in out if k.startswith(("photos", "canvas", "transposed"))]:
        del out[key]
    return out
