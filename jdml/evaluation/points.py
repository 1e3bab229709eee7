"""Embeddings handed to the evaluators, placed on the default device."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np


def float32_on_device(x: jax.Array | np.ndarray) -> jax.Array:
    """``x`` as a float32 array on the default device.

    A host array goes through ``jax.device_put``, which on CPU shares a float32 array's memory
    when it is 64-byte aligned instead of copying it (``jnp.asarray`` always copies: 0.3-0.8 ms
    for 20,000 x 128, a tenth of a 5-cluster k-means; 0.3-0.5 ms for 1,000 x 128, a fifth of a
    search). The result may therefore share the caller's memory: a function that places a host
    array this way waits for its results before it returns, so the caller may change the array
    afterwards.
    """
    if isinstance(x, jax.Array):
        return x if x.dtype == jnp.float32 else x.astype(jnp.float32)
    return jax.device_put(np.asarray(x, np.float32))


# Host arrays of at most this many bytes are staged (see ``staged``); larger ones go to JAX as
# they are.
STAGING_MAX_BYTES = 64 * 2**20
# JAX on CPU shares a host array's memory, instead of copying it, when it is this aligned.
_ALIGNMENT = 64
_staging = threading.local()


def staged(x: np.ndarray, slot: int) -> np.ndarray:
    """``x`` (C-contiguous float32) as JAX on CPU can share it: ``x`` itself if it is 64-byte
    aligned or larger than ``STAGING_MAX_BYTES``, else a copy in an aligned buffer of this
    thread that the next call with the same ``slot`` reuses.

    JAX copies an unaligned host array into freshly allocated memory, whose pages the kernel
    must first map and clear: for 1,000 x 1,024 float32 (4 MB), 0.6-1 ms, a tenth of a search
    of that size; a copy into memory touched before costs a third of that. The copy is the
    caller's for as long as it uses it: it must be done with every computation that reads it
    before the same thread stages something else in that slot.
    """
    if x.ctypes.data % _ALIGNMENT == 0 or x.nbytes > STAGING_MAX_BYTES:
        return x
    buffers = _staging.__dict__.setdefault("buffers", {})
    buffer = buffers.get(slot)
    if buffer is None or buffer.nbytes < x.nbytes + _ALIGNMENT:
        buffer = buffers[slot] = np.empty(x.nbytes + _ALIGNMENT, np.uint8)
    start = -buffer.ctypes.data % _ALIGNMENT
    copy = buffer[start : start + x.nbytes].view(np.float32).reshape(x.shape)
    np.copyto(copy, x)
    return copy
