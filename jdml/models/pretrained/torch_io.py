"""Reading PyTorch and safetensors weight files as numpy arrays, without running code from them.

The format is told from the content, never from the file name:

* PyTorch zip (``torch.save``'s default since 1.6): a zip archive holding ``<top>/data.pkl`` (the
  pickled object tree), one raw storage per ``<top>/data/<key>`` and an optional
  ``<top>/byteorder`` ("little" when absent).
* PyTorch legacy (``_use_new_zipfile_serialization=False``): five pickles in a row (magic number,
  protocol version, system info, the object tree, the storage keys), then per key an int64
  element count and the raw bytes.
* safetensors: a little-endian u64 header length, a JSON header, then the tensor bytes.

Pickles are read only through :mod:`jdml.models.pretrained.safe_pickle`, which resolves an
allow-list of torch names to inert stand-ins and never runs code from the file; this module
reads the containers around them, finds the state dict and names the file in every error.
"""

from __future__ import annotations

import io
import json
import math
import os
import struct
import zipfile
import zlib
from collections.abc import Mapping
from reprlib import repr as _short
from typing import Any, BinaryIO

import numpy as np

from jdml.errors import UnsafeWeightFileError, WeightFileError, WeightFileNotFoundError
from jdml.models.pretrained.safe_pickle import (
    DTYPES,
    Corrupt,
    Rejected,
    Storage,
    from_bytes,
    materialize,
    nonnegative_ints,
    np_dtype,
    unpickle,
)

__all__ = [
    "STATE_DICT_KEYS",
    "UnsafeWeightFileError",
    "WeightFileError",
    "WeightFileNotFoundError",
    "detect_format",
    "find_state_dict",
    "load_torch_object",
    "load_weights",
]

# Tried in this order by find_state_dict: the trained weights before EMA copies of them.
STATE_DICT_KEYS = (
    "state_dict",
    "model_state_dict",
    "model_state",
    "model",
    "module",
    "net",
    "network",
    "state_dict_ema",
    "model_ema",
    "ema",
)

_FIX = (
    "If you trust the file, load it with torch once and keep only the weights "
    "(`torch.save(model.state_dict(), path)`), or convert them to safetensors."
)
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_VERSION = 1001
_MAX_JSON_HEADER = 100 * 2**20  # safetensors' own limit; keeps a bogus length from allocating

_SAFETENSORS_DTYPES = {code: np_dtype(name) for name, _, code in DTYPES if code}


def _load_zip(f: BinaryIO) -> Any:
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise Corrupt(f"not a readable zip archive (truncated or damaged?): {e}") from None
    with archive:
        names = archive.namelist()
        pickles = [n for n in names if n.count("/") == 1 and n.endswith("/data.pkl")]
        if len(pickles) != 1:
            found = "no" if not pickles else f"{len(pickles)}"
            raise Corrupt(
                f"a zip archive with {found} '<folder>/data.pkl' entries, so not a PyTorch "
                f"checkpoint (an .npz or another zip?); its entries start with {names[:5]}"
            )
        top = pickles[0][: -len("data.pkl")]
        byteorder = "little"  # files written before torch recorded it were little-endian
        if f"{top}byteorder" in names:
            byteorder = archive.read(f"{top}byteorder").decode("ascii", "replace").strip()
            if byteorder not in ("little", "big"):
                raise Corrupt(f"unknown byte order {byteorder!r} in {top}byteorder")
        storages: dict[str, Storage] = {}
        tree = unpickle(io.BytesIO(archive.read(pickles[0])), storages)
        cache: dict[str, bytes] = {}

        def storage_bytes(s: Storage) -> bytes:
            if s.name not in cache:
                entry = f"{top}data/{s.name}"
                if entry not in names:
                    raise Corrupt(f"storage {entry} is missing from the archive")
                info = archive.getinfo(entry)
                with archive.open(info) as member:
                    # Read no more than declared: a size in a zip entry can lie.
                    cache[s.name] = member.read(s.nbytes) if info.file_size >= s.nbytes else b""
                if len(cache[s.name]) < s.nbytes:
                    raise Corrupt(
                        f"storage {entry} holds {info.file_size} bytes, "
                        f"fewer than the {s.nbytes} its tensors declare"
                    )
            return cache[s.name]

        return materialize(tree, storage_bytes, byteorder)


def _load_legacy(f: BinaryIO, size: int) -> Any:
    storages: dict[str, Storage] = {}
    magic = unpickle(f, storages)
    if type(magic) is not int or magic != _LEGACY_MAGIC:
        raise Corrupt("a pickle without PyTorch's magic number, so not a PyTorch file")
    version = unpickle(f, storages)
    if version != _LEGACY_VERSION:
        raise Corrupt(f"legacy format version {_short(version)} (only {_LEGACY_VERSION} is known)")
    info = unpickle(f, storages)
    if not isinstance(info, dict) or not isinstance(info.get("little_endian", True), bool):
        raise Corrupt(f"malformed system info {_short(info)}")
    byteorder = "little" if info.get("little_endian", True) else "big"
    tree = unpickle(f, storages)
    keys = unpickle(f, {})
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise Corrupt(f"malformed storage key list {_short(keys)}")
    raw: dict[str, bytes] = {}
    for key in keys:
        if key not in storages:
            raise Corrupt(f"storage {key!r} is listed but no tensor refers to it")
        storage, head = storages[key], f.read(8)
        if len(head) < 8:
            raise Corrupt(f"truncated before the size of storage {key!r}")
        nbytes = int.from_bytes(head, byteorder, signed=True) * storage.dtype.itemsize
        if nbytes < storage.nbytes:
            raise Corrupt(
                f"storage {key!r} holds {nbytes} bytes, fewer than the {storage.nbytes} "
                "its tensors declare"
            )
        if nbytes > size - f.tell():
            raise Corrupt(f"truncated: storage {key!r} needs {nbytes} bytes, the file ends first")
        raw[key] = f.read(nbytes)

    def storage_bytes(s: Storage) -> bytes:
        if s.name not in raw:
            raise Corrupt(f"storage {s.name!r} is missing from the file's key list")
        return raw[s.name]

    return materialize(tree, storage_bytes, byteorder)


def _load_safetensors(f: BinaryIO, size: int) -> dict[str, np.ndarray]:
    (length,) = struct.unpack("<Q", f.read(8))
    if length > min(size - 8, _MAX_JSON_HEADER):
        raise Corrupt(f"safetensors header length {length} exceeds the file (truncated?)")
    try:
        header = json.loads(f.read(length))
    except ValueError as e:
        raise Corrupt(f"safetensors header is not valid JSON: {e}") from None
    if not isinstance(header, dict):
        raise Corrupt("safetensors header is not a JSON object")
    start, out = 8 + length, {}
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise Corrupt("safetensors __metadata__ is not a map of strings")
            continue
        if not isinstance(entry, dict):
            raise Corrupt(f"tensor {name!r}: header entry is not an object")
        kind, shape, where = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(kind, str) or kind not in _SAFETENSORS_DTYPES:
            raise Corrupt(f"tensor {name!r}: unknown dtype {_short(kind)}")
        shape = nonnegative_ints(shape, f"{name!r} shape")
        dtype = np.dtype(_SAFETENSORS_DTYPES[kind])
        if not (isinstance(where, list) and len(where) == 2 and all(type(v) is int for v in where)):
            raise Corrupt(f"tensor {name!r}: malformed data_offsets {_short(where)}")
        begin, end = where
        if not 0 <= begin <= end <= size - start:
            raise Corrupt(
                f"tensor {name!r}: data_offsets {where} fall outside the "
                f"{size - start}-byte data section (truncated?)"
            )
        if end - begin != math.prod(shape) * dtype.itemsize:
            raise Corrupt(
                f"tensor {name!r}: {end - begin} bytes for {kind} of shape {list(shape)}, "
                f"which needs {math.prod(shape) * dtype.itemsize}"
            )
        f.seek(start + begin)
        out[name] = from_bytes(f.read(end - begin), dtype, "little").reshape(shape).copy()
    return out


def _open(path: str | os.PathLike[str]) -> tuple[BinaryIO, int, str]:
    name = os.fspath(path)
    try:
        f = open(name, "rb")  # noqa: SIM115 - the callers close it
    except FileNotFoundError:
        raise WeightFileNotFoundError(f"{name}: no such weight file") from None
    except IsADirectoryError:
        raise WeightFileError(f"{name}: is a directory, not a weight file") from None
    except OSError as e:
        raise WeightFileError(f"{name}: cannot be opened: {e.strerror}") from None
    return f, os.fstat(f.fileno()).st_size, name


def _sniff(f: BinaryIO, name: str) -> str:
    head = f.read(512)
    f.seek(0)
    if not head:
        raise WeightFileError(f"{name}: the file is empty")
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return "torch-zip"
    if head[8:9] == b"{":  # a JSON object; the loader checks the length before it
        return "safetensors"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "torch-legacy"
    if head[257:262] == b"ustar":
        return "torch-tar"
    raise WeightFileError(
        f"{name}: not a PyTorch (zip or legacy) or safetensors weight file "
        f"(it starts with {head[:8]!r})"
    )


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format of a weight file, told from its first bytes.

    Args:
      path: the weight file.

    Returns:
      ``"torch-zip"``, ``"torch-legacy"``, ``"safetensors"`` or ``"torch-tar"`` (the early
      PyTorch format that :func:`load_torch_object` refuses).

    Raises:
      WeightFileNotFoundError: if there is no such file.
      WeightFileError: if the file is empty, unreadable or of no known format.
    """
    f, _, name = _open(path)
    with f:
        return _sniff(f, name)


def load_torch_object(path: str | os.PathLike[str]) -> Any:
    """The object tree a weight file holds, with tensors as numpy arrays; no code is run.

    Args:
      path: a PyTorch zip or legacy file, or a safetensors file (whose tree is a flat dict).

    Returns:
      Dicts, OrderedDicts, lists, tuples, numbers, strings, None and independent contiguous
      numpy arrays (bfloat16 and float8 as ``ml_dtypes`` types).

    Raises:
      WeightFileNotFoundError: if there is no such file.
      UnsafeWeightFileError: if the file names a global outside the allow-list (such as
        ``os.system`` or ``argparse.Namespace``) or uses a refused pickle construct.
      WeightFileError: for an empty, truncated, damaged or unsupported file.
    """
    f, size, name = _open(path)
    with f:
        kind = _sniff(f, name)
        if kind == "torch-tar":
            raise WeightFileError(
                f"{name}: a tar archive, the format of early PyTorch versions, which this reader "
                f"does not support. {_FIX}"
            )
        try:
            if kind == "safetensors":
                return _load_safetensors(f, size)
            return _load_zip(f) if kind == "torch-zip" else _load_legacy(f, size)
        except Rejected as e:
            raise UnsafeWeightFileError(
                f"{name}: refusing {e}. This reader only loads tensors and plain containers "
                f"(dicts, lists, tuples, numbers, strings) and never runs code or builds other "
                f"Python objects from a file. {_FIX}"
            ) from None
        except Corrupt as e:
            raise WeightFileError(f"{name}: {e}") from None
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error, UnicodeDecodeError) as e:
            raise WeightFileError(f"{name}: damaged or unreadable: {e}") from None
        except (NotImplementedError, RuntimeError) as e:  # zip compression or encryption
            raise WeightFileError(f"{name}: unsupported zip archive: {e}") from None
        except MemoryError:  # a broadcast view (stride 0) can ask for far more than the file
            raise WeightFileError(f"{name}: a tensor does not fit in memory") from None


def _is_state_dict(obj: object) -> bool:
    return isinstance(obj, Mapping) and all(
        isinstance(k, str) and isinstance(v, np.ndarray) for k, v in obj.items()
    )


def _search(obj: object, depth: int) -> Mapping[str, np.ndarray] | None:
    if _is_state_dict(obj):
        return obj  # type: ignore[return-value]
    if depth and isinstance(obj, Mapping):
        for key in STATE_DICT_KEYS:
            if key in obj and (found := _search(obj[key], depth - 1)) is not None:
                return found
    return None


def find_state_dict(obj: Any, *, key: str | None = None) -> dict[str, np.ndarray]:
    """The name -> array mapping inside a loaded checkpoint.

    ``obj`` itself if it maps strings to arrays; otherwise the first of :data:`STATE_DICT_KEYS`
    that holds one (searched up to three levels deep). A ``module.`` prefix that every name
    carries (as ``DataParallel`` and ``DistributedDataParallel`` add) is removed.

    Args:
      obj: what :func:`load_torch_object` returned.
      key: look under ``obj[key]`` only (e.g. ``"state_dict_ema"`` for the EMA weights).

    Returns:
      A plain dict from parameter name to array, in the file's order.

    Raises:
      WeightFileError: if no state dict is found.
    """
    top = list(obj)[:12] if isinstance(obj, Mapping) else type(obj).__name__
    if key is not None and not (isinstance(obj, Mapping) and key in obj):
        raise WeightFileError(f"no entry {key!r} in the checkpoint; its top level is {top}")
    found = _search(obj[key] if key is not None else obj, depth=3)
    if found is None:
        raise WeightFileError(
            f"no state dict (a mapping from names to tensors) found; the checkpoint's top level "
            f"is {top}; pass key= to choose an entry"
        )
    prefix = 0
    while found and all(n.startswith("module.", prefix) for n in found):
        prefix += len("module.")
    return {n[prefix:]: v for n, v in found.items()}


def load_weights(path: str | os.PathLike[str], *, key: str | None = None) -> dict[str, np.ndarray]:
    """The state dict of a PyTorch or safetensors weight file, as numpy arrays; no code is run.

    Args:
      path: the weight file (any suffix: the format is told from the content).
      key: passed to :func:`find_state_dict`.

    Returns:
      Parameter and buffer name -> independent contiguous array.

    Raises:
      WeightFileNotFoundError: if there is no such file.
      UnsafeWeightFileError: if the file holds anything but tensors and plain containers.
      WeightFileError: for a damaged or unsupported file, or one without a state dict.
    """
    tree = load_torch_object(path)
    try:
        return find_state_dict(tree, key=key)
    except WeightFileError as e:
        raise WeightFileError(f"{os.fspath(path)}: {e}") from None
