"""A decode cache of benchmark photos: every photo decoded once, at a chosen resolution.

Decoding the JPEGs dominates the cost of a photo batch (``data.decode_cache=True`` turns the
cache on). The cache holds each photo of a :class:`FileList` decoded (EXIF orientation applied,
RGB) and, where its short side is longer than the cache's size (``data.cache_size``; 0, the
default, is the evaluation's ``data.resize``), resized to it with the evaluation view's resize
(torchvision's ``Resize``, Pillow's bilinear, or bicubic with ``data.eval_interpolation``);
smaller photos are kept as they are. The pixels lie
in one uint8 file, read through a memory map, so grain's worker processes share them through the
page cache (and device views copy them to the device once).

What changes, compared with decoding the original photo at every draw (what the reference code
does, and the default), with the cache at ``data.resize``:

* the evaluation view (``Resize(256)`` + ``CenterCrop(224)``) and the ``red`` augmentation
  (``Resize(256)`` + ``RandomCrop(224)``) are the same, bit for bit: their resize of a cached
  photo is the identity;
* the ``RandomResizedCrop`` augmentations (``base``, ``big``, ``adv``, ``realistic``) draw their
  boxes on the cached photo: the same fractions of the photo and aspect ratios, but read from
  (short side / resize)^2 fewer pixels (about 2.1x for CUB's typical 375 px short side), so the
  crops smaller than the output in the cached photo (areas below about 57 % of a 256 x 341
  photo) are upsampled from fewer pixels: slightly softer views, and other random boxes for the
  same seed (the box sizes are rounded in other pixel units).

A cache at a larger size keeps more of each photo: every photo whose short side is at most the
size is the original, so its crops and views are the reference's exactly (with 512, all of CUB's
photos, at most 500 px); a photo shrunk to the size gives the evaluation view and ``red`` from a
resize of the resized photo (within a level or two of the original's). ``bench/view_fidelity.py
--cache`` measures both against the original photos.

The file is ``<folder>/photos-<count>-<resize>px-<key>.jdml-decoded`` in ``data.cache_dir``
(default: ``$JDML_CACHE/decoded`` or ``~/.cache/jdml/decoded``). The key hashes the resize, the
Pillow version and every photo's path, size in bytes and modification time, so a changed or
replaced photo builds a new cache instead of reusing a stale one. The file is written to a
temporary name and renamed when complete (:func:`jdml.fileio.atomic_path`): a killed build
leaves no cache (its temporary is removed by a later build once it is stale), and two processes
building the same cache both end with a complete one. A file at the cache's name that this module
did not write is never replaced.

Layout (version 2): a 128-byte header (magic, version, count, resize, key, pixel bytes, pixel
digest, and at its end the header digest), the (count, 2) int32 heights and widths, then, from
the next 4096-byte boundary, every photo's (H, W, 3) pixels in order.

Checksums: the header digest (BLAKE2b, 16 bytes) covers the header before it and the shape
table, and is checked at every open; the pixel digest is a BLAKE2b of every photo's CRC-32,
computed by the decoding threads of a build and checked once at every open (the CRC-32s in
``threads`` threads; a cache this process has just built is not hashed again), not per photo
as it is read: a photo's CRC-32 costs about as much as a ``red`` view of it on the host, and one
pass at the open is what checking per read would cost every epoch (``python
bench/bench_decode_cache.py``; ``bench/results/cpu/decode-cache-checksum.txt``).
A cache of ours (its magic) that is incomplete, fails either digest or is of version 1 (no
checksums) is rebuilt in its place, with a warning naming why; a file whose magic is not ours
is refused, never replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import struct
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import PIL

from jdml.data.benchmarks.common import FileList, Photos
from jdml.data.benchmarks.images import decode_image
from jdml.data.transforms import resize_hw, short_side_shape
from jdml.errors import DataError
from jdml.fileio import atomic_path, cache_root

log = logging.getLogger("jdml")

MAGIC = b"JDMLDEC2"
VERSION = 2
#: The magic every version of the cache starts with (version 1's is ``JDMLDEC1``): a file with it
#: is ours, to rebuild when it is stale or damaged.
_OURS = b"JDMLDEC"
#: The version the keys (file names) hash: version 1's, so a version-1 cache is found and replaced.
_KEY_VERSION = 1
SUFFIX = ".jdml-decoded"
# magic, version, count, resize, key (32 hex digits), pixel bytes, pixel digest: 80 bytes; the
# header digest fills the header's last 16 of 128 bytes.
_HEADER = struct.Struct("<8sIQI32sQ16s")
_HEADER_BYTES = 128
_DIGEST_BYTES = 16
_ALIGN = 4096
#: Photos decoded per batch of the build (per decoding thread).
_CHUNK = 32
#: A temporary of a killed build is removed once it has not changed for this long (seconds).
STALE_SECONDS = 600.0


def default_folder() -> Path:
    """``$JDML_CACHE/decoded`` or ``~/.cache/jdml/decoded``."""
    return cache_root("decoded")


def cache_key(files: FileList, resize: int) -> str:
    """32 hex digits that change with the resize and its filter, the Pillow version, or any
    photo's path, size in bytes or modification time.

    Raises:
      DataError: naming a listed photo that does not exist.
    """
    # The bilinear caches keep the keys they had before the filter was a choice.
    filter = "" if files.filter == "bilinear" else f" {files.filter}"
    header = f"v{_KEY_VERSION} resize {resize}{filter} Pillow {PIL.__version__}\n"
    digest = hashlib.sha256(header.encode())
    for path in files.paths:
        try:
            stat = os.stat(path)
        except FileNotFoundError as err:
            raise DataError(f"image {path} does not exist: {err}") from err
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:32]


def cache_file(files: FileList, resize: int, key: str, folder: str | os.PathLike[str] = "") -> Path:
    """Where the cache of ``files`` at ``resize`` with ``key`` lies (``folder`` "":
    :func:`default_folder`)."""
    base = Path(folder).expanduser() if folder else default_folder()
    return base / f"photos-{len(files)}-{resize}px-{key}{SUFFIX}"


def shrink(photo: np.ndarray, resize: int, filter: str = "bilinear") -> np.ndarray:
    """A decoded photo as the cache stores it: the short side brought down to ``resize`` with
    the evaluation view's resize (``filter``), or the photo itself if its short side is at most
    ``resize``."""
    height, width = photo.shape[:2]
    if min(height, width) <= resize:
        return photo
    return resize_hw(photo, short_side_shape(height, width, resize), filter)


def _pixels_offset(count: int) -> int:
    end = _HEADER_BYTES + 8 * count
    return -(-end // _ALIGN) * _ALIGN


def _digest(*parts: bytes | memoryview) -> bytes:
    """A 16-byte BLAKE2b of ``parts`` in order."""
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    for part in parts:
        digest.update(part)
    return digest.digest()


def _header_digest(head: bytes, shapes: bytes) -> bytes:
    """The digest of a header (all but its last 16 bytes, where the digest lies) and the shape
    table."""
    return _digest(head[: _HEADER_BYTES - _DIGEST_BYTES], shapes)


def _crc(photo: np.ndarray | memoryview) -> int:
    """The CRC-32 of a photo's pixels (zlib releases the GIL, so threads hash in parallel)."""
    return zlib.crc32(photo)


def _pixel_digest(crcs: np.ndarray) -> bytes:
    """The pixel digest of a cache: a digest of its photos' CRC-32s in order."""
    return _digest(np.asarray(crcs, "<u4").tobytes())


def _stored_crcs(
    pixels: np.ndarray, offsets: np.ndarray, sizes: np.ndarray, threads: int
) -> np.ndarray:
    """Each stored photo's CRC-32 (uint32), hashed in ``threads`` threads, :data:`_CHUNK`
    photos a task."""
    view = memoryview(pixels)
    spans = np.stack([offsets, offsets + sizes], axis=1).tolist()

    def crcs(first: int) -> list[int]:
        return [_crc(view[a:b]) for a, b in spans[first : first + _CHUNK]]

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        chunks = pool.map(crcs, range(0, len(spans), _CHUNK))
        return np.array([crc for chunk in chunks for crc in chunk], np.uint32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CachedPhotos(Photos):
    """The photos of a :class:`FileList` read from its decode cache (same labels and order).

    Attributes:
      file: the cache file.
      shapes: int64 (N, 2) height and width of each cached photo.
      offsets: int64 (N,) where each photo's pixels start in the file.
    """

    file: str
    shapes: np.ndarray
    offsets: np.ndarray
    #: Photos here are read, not decoded: the input pipeline sizes itself for in-memory data.
    decodes: ClassVar[bool] = False

    def count(self) -> int:
        return len(self.offsets)

    def _pixels(self) -> np.ndarray:
        pixels = self.__dict__.get("_map")
        if pixels is None:  # opened on first use, in every process (memory maps do not pickle)
            pixels = np.memmap(self.file, np.uint8, mode="r")
            object.__setattr__(self, "_map", pixels)
        return pixels

    def decode(self, i: int) -> np.ndarray:
        height, width = (int(v) for v in self.shapes[i])
        start = int(self.offsets[i])
        return self._pixels()[start : start + height * width * 3].reshape(height, width, 3)

    def select(self, chosen: np.ndarray) -> CachedPhotos:
        return dataclasses.replace(
            self,
            shapes=self.shapes[chosen],
            offsets=self.offsets[chosen],
            labels=self.labels[chosen],
        )

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_map"}


def read_cache(
    path: Path, key: str, files: FileList, resize: int, threads: int = 1, *, pixels: bool = True
) -> CachedPhotos | None:
    """The cache at ``path`` of ``files`` (with ``key``), or None if there is none, or it is
    incomplete, damaged or of an older version (logged: it is to be rebuilt).

    Args:
      path: the cache file.
      key: its key (:func:`cache_key`).
      files: the photos it holds.
      resize: their short side.
      threads: threads that check the pixel digest.
      pixels: check the pixel digest (the header digest is always checked); False only for a
        cache this process has just built, whose digest it computed from the decoded photos.

    Raises:
      DataError: if ``path`` exists but this module did not write it.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(_HEADER_BYTES)
            if not head.startswith(_OURS):
                raise DataError(
                    f"{path} exists but is not a jdml decode cache; move it away or set "
                    "--config.data.cache_dir to another folder"
                )
            table = f.read(8 * len(files))
    except FileNotFoundError:
        return None
    damage = _damage(head, table, key, files, resize)
    if damage:
        log.warning("The decode cache %s %s; building it again", path, damage)
        return None
    shapes = np.frombuffer(table, np.int32).reshape(-1, 2).astype(np.int64)
    sizes = shapes[:, 0] * shapes[:, 1] * 3
    offsets = _pixels_offset(len(files)) + np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pixel_bytes, pixel_digest = _HEADER.unpack_from(head)[5:]
    if _pixels_offset(len(files)) + pixel_bytes != path.stat().st_size:
        log.warning("The decode cache %s is incomplete; building it again", path)
        return None
    cached = CachedPhotos(
        labels=files.labels,
        class_names=files.class_names,
        source=f"{files.source} (decode cache {path})",
        resize=files.resize,
        crop=files.crop,
        filter=files.filter,
        file=str(path),
        shapes=shapes,
        offsets=offsets.astype(np.int64),
    )
    if pixels and _pixel_digest(_stored_crcs(cached._pixels(), offsets, sizes, threads)) != (
        pixel_digest
    ):
        log.warning("The decode cache %s fails its pixel checksum; building it again", path)
        return None
    return cached


def _damage(head: bytes, table: bytes, key: str, files: FileList, resize: int) -> str:
    """Why a cache whose header is ``head`` and shape table ``table`` cannot be read as the
    cache of ``files`` at ``resize`` with ``key`` ("" if it can, up to its pixels)."""
    if len(head) < _HEADER_BYTES or len(table) < 8 * len(files):
        return "is incomplete"
    magic, version, count, size, stored_key, pixel_bytes, _ = _HEADER.unpack_from(head)
    if magic != MAGIC or version != VERSION:
        return f"is of an older version ({magic.decode('ascii', 'replace')}, without checksums)"
    if _header_digest(head, table) != head[-_DIGEST_BYTES:]:
        return "fails its header checksum (header or shape table)"
    if (count, size, stored_key.decode("ascii", "replace")) != (len(files), resize, key):
        return "is of other photos"  # a key collision of 128 bits, or a renamed file
    shapes = np.frombuffer(table, np.int32).reshape(-1, 2).astype(np.int64)
    if np.any(shapes <= 0) or int((shapes[:, 0] * shapes[:, 1] * 3).sum()) != pixel_bytes:
        return "has a shape table that does not add up to its pixels"
    return ""


def _remove_stale_temporaries(path: Path) -> None:
    """Removes temporaries of ``path`` left by killed builds on this host: their process is gone
    and they have not changed for :data:`STALE_SECONDS`."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        try:
            pid = int(tmp.name.removeprefix(f".{path.name}.").split(".")[0])
            if time.time() - tmp.stat().st_mtime < STALE_SECONDS or _alive(pid):
                continue
            tmp.unlink()
        except (ValueError, OSError):
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _check_space(folder: Path, files: FileList, resize: int) -> None:
    """Refuses to start a build that would not fit (4:3 photos at ``resize``, the upper bound
    for typical photos)."""
    folder.mkdir(parents=True, exist_ok=True)
    need = len(files) * resize * resize * 4 // 3 * 3
    free = shutil.disk_usage(folder).free
    if need > free:
        raise DataError(
            f"the decode cache of {len(files):,} photos needs about {need / 2**30:.1f} GiB in "
            f"{folder}, which has {free / 2**30:.1f} GiB free; free space, set "
            "--config.data.cache_dir to a larger disk, or --config.data.decode_cache=False"
        )


def _decoded(path: str, resize: int, filter: str) -> tuple[np.ndarray, int]:
    """A photo as the cache stores it, and its CRC-32."""
    photo = np.ascontiguousarray(shrink(decode_image(path), resize, filter))
    return photo, _crc(photo)


def build_cache(path: Path, key: str, files: FileList, resize: int, threads: int) -> None:
    """Decodes every photo of ``files`` into the cache file ``path`` (atomically), with ``key``
    in its header, decoding with ``threads`` threads (Pillow decodes without the GIL).

    Raises:
      DataError: naming a photo that cannot be decoded (nothing is written), or for a full disk.
    """
    _remove_stale_temporaries(path)
    _check_space(path.parent, files, resize)
    start = _pixels_offset(len(files))
    shapes = np.zeros((len(files), 2), np.int32)
    crcs = np.zeros(len(files), np.uint32)
    try:
        with atomic_path(path) as tmp, open(tmp, "r+b") as out:
            out.seek(start)
            with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
                step = _CHUNK * max(1, threads)
                for first in range(0, len(files), step):
                    chunk = files.paths[first : first + step]
                    decoded = pool.map(
                        _decoded, chunk, [resize] * len(chunk), [files.filter] * len(chunk)
                    )
                    for k, (photo, crc) in enumerate(decoded):
                        shapes[first + k], crcs[first + k] = photo.shape[:2], crc
                        out.write(photo.tobytes())
            pixel_bytes = out.tell() - start
            fields = (MAGIC, VERSION, len(files), resize, key.encode("ascii"), pixel_bytes)
            head = _HEADER.pack(*fields, _pixel_digest(crcs)).ljust(_HEADER_BYTES, b"\0")
            table = shapes.tobytes()
            out.seek(0)
            out.write(head[:-_DIGEST_BYTES] + _header_digest(head, table) + table)
    except OSError as err:
        raise DataError(
            f"cannot write the decode cache {path}: {err}; free space or set "
            "--config.data.cache_dir to a writable folder"
        ) from err


def open_cache(
    files: FileList, resize: int, folder: str | os.PathLike[str] = "", threads: int = 1
) -> CachedPhotos:
    """The decode cache of ``files`` at ``resize``: read if it exists, is complete and passes its
    checksums, else built (decoding with ``threads`` threads) and read.

    Args:
      files: the photos.
      resize: the short side the photos are brought down to (``data.resize``).
      folder: the cache folder ("": :func:`default_folder`).
      threads: decoding threads of a build, hashing threads of the pixel check.

    Returns:
      The photos of ``files``, read from the cache.

    Raises:
      DataError: for a photo that is missing or cannot be decoded, a full disk, or a file at the
        cache's name that is not a decode cache.
    """
    key = cache_key(files, resize)
    path = cache_file(files, resize, key, folder)
    cached = read_cache(path, key, files, resize, threads)
    if cached is not None:
        return cached
    log.info("Decoding %d photos once into the decode cache %s", len(files), path)
    begin = time.perf_counter()
    build_cache(path, key, files, resize, threads)
    log.info("Decode cache written in %.1f s", time.perf_counter() - begin)
    cached = read_cache(path, key, files, resize, pixels=False)  # their digest is the build's
    if cached is None:  # replaced by an incomplete file between the rename and the read
        raise DataError(f"the decode cache {path} changed while it was read; run again")
    return cached
