"""Unpickling PyTorch's object trees without running code from them, and turning tensors to arrays.

A pickle is a program that may call any importable function, so no weight file ever reaches a
plain ``pickle.load``. :func:`unpickle` first scans a pickle opcode by opcode, refusing those that
create objects outside REDUCE, then unpickles it with an unpickler that resolves only an
allow-list of names (torch's tensor and parameter rebuild functions, its storage classes and
dtypes, ``collections.OrderedDict``) to inert stand-ins defined here; the stand-ins refuse BUILD.
Tensors are placeholders until the whole tree is read (legacy files keep their bytes after the
tree), then :func:`materialize` makes them independent contiguous arrays.

Problems are raised as :class:`Rejected` (a disallowed construct) or :class:`Corrupt` (a
malformed structure), which the caller turns into errors that name the file.
"""

from __future__ import annotations

import collections
import io
import math
import pickle
import pickletools
import struct
import sys
from collections.abc import Callable
from reprlib import repr as _short
from typing import Any, BinaryIO

import ml_dtypes
import numpy as np

__all__ = [
    "DTYPES",
    "Corrupt",
    "Rejected",
    "Storage",
    "from_bytes",
    "materialize",
    "nonnegative_ints",
    "np_dtype",
    "unpickle",
]

# torch dtype (also its numpy or ml_dtypes name), its typed storage class, its safetensors code.
# torch writes a dtype by name only for _rebuild_tensor_v3, i.e. for dtypes without a storage.
DTYPES: tuple[tuple[str, str | None, str | None], ...] = (
    ("float64", "DoubleStorage", "F64"),
    ("float32", "FloatStorage", "F32"),
    ("float16", "HalfStorage", "F16"),
    ("bfloat16", "BFloat16Storage", "BF16"),
    ("int64", "LongStorage", "I64"),
    ("int32", "IntStorage", "I32"),
    ("int16", "ShortStorage", "I16"),
    ("int8", "CharStorage", "I8"),
    ("uint8", "ByteStorage", "U8"),
    ("bool", "BoolStorage", "BOOL"),
    ("complex64", "ComplexFloatStorage", "C64"),
    ("complex128", "ComplexDoubleStorage", None),
    ("uint16", None, "U16"),
    ("uint32", None, "U32"),
    ("uint64", None, "U64"),
    ("float8_e4m3fn", None, "F8_E4M3"),
    ("float8_e5m2", None, "F8_E5M2"),
    ("float8_e4m3fnuz", None, None),
    ("float8_e5m2fnuz", None, None),
    ("float8_e8m0fnu", None, None),
)


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a torch dtype name of :data:`DTYPES` (bfloat16, float8 from ml_dtypes)."""
    return np.dtype(getattr(ml_dtypes, name) if name.startswith(("bfloat", "float8")) else name)


# Opcodes that instantiate classes or reach the copyreg registry without going through REDUCE,
# the text persistent id and out-of-band buffers: torch writes none of them.
_REFUSED_OPCODES = frozenset(
    ("INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4", "PERSID", "NEXT_BUFFER")
)


class Rejected(Exception):
    """A disallowed construct met while unpickling; torch_io raises UnsafeWeightFileError for it."""


class Corrupt(Exception):
    """A malformed structure met while reading; torch_io raises WeightFileError for it."""


class _Inert:
    """Base of every object of ours that a pickle can reach: neither callable nor settable."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name

    def __call__(self, *args: object) -> Any:
        raise Rejected(f"a call of {self.name}")

    def __setstate__(self, state: object) -> None:
        # BUILD would otherwise let a pickle set attributes on our allow-listed objects.
        raise Rejected(f"setting the state of {self.name} (BUILD)")


class _Function(_Inert):
    """An allow-listed callable; bad arguments are a corrupt file, not a crash."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[..., Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def __call__(self, *args: object) -> Any:
        try:
            return self.fn(*args)
        except (TypeError, ValueError) as e:
            raise Corrupt(f"bad arguments to {self.name}: {e}") from None


class _TypeRef(_Inert):
    """A torch storage class or dtype: only its numpy dtype matters."""

    __slots__ = ("dtype", "is_storage")

    def __init__(self, name: str, dtype: Any, is_storage: bool) -> None:
        super().__init__(name)
        self.dtype, self.is_storage = np.dtype(dtype), is_storage


class Storage(_Inert):
    """A storage referenced by persistent id; its bytes are read when the tree is done."""

    __slots__ = ("dtype", "nbytes")

    def __init__(self, key: str, dtype: np.dtype, nbytes: int) -> None:
        super().__init__(key)
        self.dtype, self.nbytes = dtype, nbytes


class _Tensor(_Inert):
    """A validated view (dtype, element offset, shape, element strides) into a storage."""

    __slots__ = ("dtype", "offset", "shape", "storage", "strides")

    def __init__(
        self,
        storage: Storage,
        offset: int,
        shape: tuple[int, ...],
        strides: tuple[int, ...],
        dtype: np.dtype,
    ) -> None:
        super().__init__(f"tensor{shape}")
        self.storage, self.offset, self.shape, self.strides = storage, offset, shape, strides
        self.dtype = dtype


def nonnegative_ints(value: object, what: str) -> tuple[int, ...]:
    """``value`` as a tuple if it is a list or tuple of non-negative ints (a tensor's ``what``)."""
    if not isinstance(value, tuple | list) or not all(type(v) is int and v >= 0 for v in value):
        raise Corrupt(f"tensor {what} must be non-negative ints, got {_short(value)}")
    return tuple(value)


def _tensor(
    storage: object, offset: object, size: object, stride: object, dtype: np.dtype | None = None
) -> _Tensor:
    if not isinstance(storage, Storage):
        raise Corrupt(f"a tensor refers to {_short(storage)} instead of a storage")
    if type(offset) is not int or offset < 0:
        raise Corrupt(f"tensor storage offset must be a non-negative int, got {_short(offset)}")
    shape, strides = nonnegative_ints(size, "size"), nonnegative_ints(stride, "stride")
    dtype = storage.dtype if dtype is None else dtype
    if len(shape) != len(strides):
        raise Corrupt(f"tensor size {shape} and stride {strides} differ in length")
    last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
    if math.prod(shape) and (last + 1) * dtype.itemsize > storage.nbytes:
        raise Corrupt(
            f"a tensor of size {shape}, stride {strides}, offset {offset} reaches past the end "
            f"of storage {storage.name!r} ({storage.nbytes} bytes)"
        )
    return _Tensor(storage, offset, shape, strides, dtype)


def _rebuild_tensor_v2(
    storage: object, offset: object, size: object, stride: object, *grad_hooks_meta: object
) -> _Tensor:
    if len(grad_hooks_meta) not in (2, 3):  # requires_grad, backward hooks, optional metadata
        raise Corrupt(f"_rebuild_tensor_v2 got {4 + len(grad_hooks_meta)} arguments")
    return _tensor(storage, offset, size, stride)


def _rebuild_tensor_v3(
    storage: object, offset: object, size: object, stride: object, *rest: object
) -> _Tensor:
    if len(rest) not in (3, 4):  # requires_grad, backward hooks, dtype, optional metadata
        raise Corrupt(f"_rebuild_tensor_v3 got {4 + len(rest)} arguments")
    dtype = rest[2]
    if not isinstance(dtype, _TypeRef) or dtype.is_storage:
        raise Corrupt(f"expected a torch dtype, got {_short(dtype)}")
    return _tensor(storage, offset, size, stride, dtype.dtype)


def _rebuild_tensor(storage: object, offset: object, size: object, stride: object) -> _Tensor:
    return _tensor(storage, offset, size, stride)


def _rebuild_parameter(data: object, *grad_hooks_state: object) -> _Tensor:
    if len(grad_hooks_state) not in (2, 3):  # requires_grad, backward hooks, optional state
        raise Corrupt(f"a parameter rebuilt from {1 + len(grad_hooks_state)} arguments")
    if not isinstance(data, _Tensor):
        raise Corrupt(f"a parameter wraps {_short(data)} instead of a tensor")
    return data


class _OrderedDict(collections.OrderedDict):
    """An OrderedDict being unpickled; :func:`materialize` swaps it for a plain one."""

    __slots__ = ()  # no attributes for BUILD to set

    def __setstate__(self, state: object) -> None:
        # torch pickles a state dict's ``_metadata`` (per-module versions) this way; not needed.
        if not isinstance(state, dict):
            raise Corrupt(f"OrderedDict state {_short(state)}")


def _ordered_dict(*items: object) -> _OrderedDict:
    # A list or dict argument only: OrderedDict would drain any iterator a pickle could hand it.
    if len(items) > 1 or (items and not isinstance(items[0], list | dict)):
        raise Corrupt(f"collections.OrderedDict called with {_short(items)}")
    return _OrderedDict(*items)


_REBUILD = {
    "_rebuild_tensor": _rebuild_tensor,
    "_rebuild_tensor_v2": _rebuild_tensor_v2,
    "_rebuild_tensor_v3": _rebuild_tensor_v3,
    "_rebuild_parameter": _rebuild_parameter,
    "_rebuild_parameter_with_state": _rebuild_parameter,
}
_ALLOWED: dict[tuple[str, str], _Inert] = {
    ("torch._utils", n): _Function(f"torch._utils.{n}", fn) for n, fn in _REBUILD.items()
}
_ALLOWED["collections", "OrderedDict"] = _Function("collections.OrderedDict", _ordered_dict)
_ALLOWED["torch.storage", "UntypedStorage"] = _TypeRef("torch.storage.UntypedStorage", "u1", True)
for _name, _storage, _ in DTYPES:
    _ALLOWED["torch", _name] = _TypeRef(f"torch.{_name}", np_dtype(_name), False)
    if _storage:
        _ALLOWED["torch", _storage] = _TypeRef(f"torch.{_storage}", np_dtype(_name), True)
del _name, _storage


class _SafeUnpickler(pickle.Unpickler):
    """Resolves globals from the allow-list only and storages from ('storage', ...) ids only."""

    def __init__(self, file: BinaryIO, storages: dict[str, Storage]) -> None:
        super().__init__(file, encoding="utf-8")
        self.storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise Rejected(f"the global {module}.{name}")
        return _ALLOWED[module, name]

    def persistent_load(self, pid: Any) -> Storage:
        if not (isinstance(pid, tuple) and len(pid) in (5, 6) and pid[0] == "storage"):
            raise Rejected(f"the persistent id {_short(pid)} (only storages are allowed)")
        _, kind, key, location, numel, *view = pid
        if not (isinstance(kind, _TypeRef) and kind.is_storage):
            raise Corrupt(f"storage {_short(key)} has type {_short(kind)}, not a storage class")
        if not isinstance(key, str) or not isinstance(location, str) or type(numel) is not int:
            raise Corrupt(f"malformed storage reference {_short(pid)}")
        if numel < 0 or (view and view[0] is not None):
            # view metadata: storage views of old PyTorch versions, which torch no longer writes
            raise Corrupt(f"unsupported storage reference {_short(pid)}")
        storage = self.storages.setdefault(
            key, Storage(key, kind.dtype, numel * kind.dtype.itemsize)
        )
        if (storage.dtype, storage.nbytes) != (kind.dtype, numel * kind.dtype.itemsize):
            raise Corrupt(f"storage {key!r} is declared with two different types or sizes")
        return storage


def unpickle(f: BinaryIO, storages: dict[str, Storage]) -> Any:
    """One pickle from ``f``'s position, scanned opcode by opcode before it is unpickled."""
    start = f.tell()
    try:
        for opcode, arg, _ in pickletools.genops(f):
            if opcode.name in ("GLOBAL", "INST"):
                module, _, name = arg.partition(" ")
                if (module, name) not in _ALLOWED:
                    raise Rejected(f"the global {module}.{name}")
            if opcode.name in _REFUSED_OPCODES:
                raise Rejected(f"the pickle opcode {opcode.name} (it builds arbitrary objects)")
        end = f.tell()
        f.seek(start)
        return _SafeUnpickler(io.BytesIO(f.read(end - start)), storages).load()
    except (Rejected, Corrupt):
        raise
    except (pickle.UnpicklingError, ValueError, TypeError, AttributeError, LookupError) as e:
        raise Corrupt(f"damaged or truncated pickle: {e}") from None
    except (EOFError, struct.error, RecursionError, MemoryError) as e:
        raise Corrupt(f"damaged or truncated pickle: {e!r}") from None


def from_bytes(raw: bytes, dtype: np.dtype, byteorder: str) -> np.ndarray:
    """The whole elements of ``raw`` (``"little"`` or ``"big"`` endian) as a flat array."""
    if byteorder == sys.byteorder or dtype.itemsize == 1:
        return np.frombuffer(raw, dtype, len(raw) // dtype.itemsize)
    # Swap as unsigned words of the scalar's size (each half of a complex on its own), which
    # also works for ml_dtypes types.
    unit = dtype.itemsize // 2 if dtype.kind == "c" else dtype.itemsize
    words = np.frombuffer(raw, f"u{unit}", len(raw) // dtype.itemsize * (dtype.itemsize // unit))
    return words.byteswap().view(dtype)


def _array(t: _Tensor, raw: bytes, byteorder: str) -> np.ndarray:
    if not math.prod(t.shape):
        return np.zeros(t.shape, t.dtype)
    base = from_bytes(raw, t.dtype, byteorder)[t.offset :]
    strides = tuple(s * t.dtype.itemsize for s in t.strides)
    view = np.lib.stride_tricks.as_strided(base, t.shape, strides, writeable=False)
    return view.copy()  # contiguous and owned: views sharing a storage stay independent


def materialize(obj: Any, storage_bytes: Callable[[Storage], bytes], byteorder: str) -> Any:
    """``obj`` with every tensor placeholder replaced by its array (containers are ours to edit).

    ``storage_bytes`` gives the raw bytes of a storage (at least its ``nbytes``), stored in
    ``byteorder``; each array is an independent contiguous copy.
    """

    def to_array(t: _Tensor) -> np.ndarray:
        return _array(t, storage_bytes(t.storage), byteorder)

    # By id, holding the original too so that its id cannot be reused by a new object.
    done: dict[int, tuple[Any, Any]] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, Storage):  # a bare storage, as torch.save(tensor.storage()) writes
            return to_array(_Tensor(x, 0, (x.nbytes // x.dtype.itemsize,), (1,), x.dtype))
        if isinstance(x, _Tensor):
            return to_array(x)
        if isinstance(x, _Inert):
            raise Rejected(f"{x.name} as a value")
        if not isinstance(x, list | tuple | dict | set | frozenset):
            return x
        if id(x) in done:
            if done[id(x)][1] is None:  # only a tuple is pending; it would hold placeholders
                raise Corrupt("a tuple that contains itself")
            return done[id(x)][1]
        # Lists and dicts are filled after they are recorded, so a cycle through them ends here.
        out = collections.OrderedDict() if isinstance(x, _OrderedDict) else x
        done[id(x)] = (x, None if isinstance(x, tuple) else out)
        if isinstance(x, list):
            x[:] = [walk(v) for v in x]
        elif isinstance(x, dict):
            for k, v in list(x.items()):
                if isinstance(k, _Inert):
                    raise Corrupt(f"a dict keyed by {k.name}")
                out[k] = walk(v)
        elif isinstance(x, tuple):
            done[id(x)] = (x, tuple(walk(v) for v in x))
        elif any(isinstance(v, _Inert) for v in x):
            raise Corrupt("a set holding tensors")
        return done[id(x)][1]

    try:
        return walk(obj)
    except RecursionError:
        raise Corrupt("containers nested too deeply") from None
