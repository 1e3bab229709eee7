"""Embeddings handed to the evaluators, as float32 arrays that JAX on CPU can share.

One route for host (NumPy) arrays, used by the kNN search and by k-means: :func:`as_float32`
keeps a JAX array and makes a host array C-contiguous float32, 64-byte aligned (see
:func:`staged`); :func:`float32_on_device` then places it with ``jax.device_put``, which on CPU
shares an aligned array's memory instead of copying it (``jnp.asarray`` always copies: 0.3-0.8
ms for 20,000 x 128, a tenth of a 5-cluster k-means). A jitted function may also take the host
array itself: its arguments reach the device in the same step (one JAX call fewer, 0.2-0.5 ms on
a 2-core VM after an idle moment).

Either way the device array may share memory with the caller's array or with a staging buffer
that the next call reuses. A function that places a host array this way therefore waits for its
results before it returns, and none of its results may be an input as it is.
"""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np

from jdml.platform import platform

# Host arrays of at most this many bytes are staged in a buffer that is kept for the next call
# (see ``staged``); larger ones are copied into memory of their own. A thread keeps at most one
# buffer of this size per slot (two slots are used: queries and references), 16 MB in all.
STAGING_MAX_BYTES = 8 * 2**20
# JAX on CPU shares a host array's memory, instead of copying it, when it is this aligned.
_ALIGNMENT = 64
_staging = threading.local()


def _address(x: np.ndarray) -> int:
    """The address of ``x``'s first element (NumPy's array interface, no ``ctypes``)."""
    return x.__array_interface__["data"][0]


def staged(x: np.ndarray, slot: int) -> np.ndarray:
    """``x`` (C-contiguous float32) as JAX on CPU can share it: ``x`` itself if it is 64-byte
    aligned, else an aligned copy: up to ``STAGING_MAX_BYTES`` in a buffer of this thread that
    the next call with the same ``slot`` reuses, above it in memory of its own.

    JAX copies an unaligned host array itself, into freshly allocated memory whose pages the
    kernel must first map and clear: for 1,000 x 1,024 float32 (4 MB), 0.6-1 ms, a tenth of a
    search of that size, where a copy into memory touched before costs a third of that; and for
    20,000 x 512 (40 MB) 22 ms, where NumPy's copy into fresh memory takes 11 (as much as a
    5-cluster k-means of those points). Large NumPy arrays are rarely aligned: their memory comes
    from mmap behind a 16-byte header. A staged copy is the caller's for as long as it uses it:
    it must be done with every computation that reads it before the same thread stages
    something else in that slot.
    """
    if _address(x) % _ALIGNMENT == 0:
        return x
    if x.nbytes > STAGING_MAX_BYTES:
        buffer = np.empty(x.nbytes + _ALIGNMENT, np.uint8)
    else:
        buffers = _staging.__dict__.setdefault("buffers", {})
        buffer = buffers.get(slot)
        if buffer is None or buffer.nbytes < x.nbytes + _ALIGNMENT:
            buffer = buffers[slot] = np.empty(x.nbytes + _ALIGNMENT, np.uint8)
    start = -_address(buffer) % _ALIGNMENT
    copy = buffer[start : start + x.nbytes].view(np.float32).reshape(x.shape)
    np.copyto(copy, x)
    return copy


def as_float32(x: jax.Array | np.ndarray, slot: int) -> jax.Array | np.ndarray:
    """``x`` as float32: a JAX array stays one (cast if needed); a host array stays on the host,
    C-contiguous, and on the CPU backend staged in ``slot`` (see :func:`staged`), for a jitted
    call to share (other backends copy it to the device anyway)."""
    if isinstance(x, jax.Array):
        return x if x.dtype == jnp.float32 else x.astype(jnp.float32)
    x = np.ascontiguousarray(x, np.float32)
    return staged(x, slot) if platform() == "cpu" else x


def float32_on_device(x: jax.Array | np.ndarray, slot: int = 0) -> jax.Array:
    """``x`` as a float32 array on the default device (:func:`as_float32`, then
    ``jax.device_put``, which shares an aligned host array's memory)."""
    x = as_float32(x, slot)
    return x if isinstance(x, jax.Array) else jax.device_put(x)
