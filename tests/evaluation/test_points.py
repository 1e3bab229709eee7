"""Host embeddings handed to the evaluators (jdml/evaluation/points.py): staged copies are
aligned, equal to the input and reused per slot; a search of host arrays reads them only while
it runs."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.evaluation import points
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import knn


def placed(shape: tuple[int, ...], seed: int, past: int) -> np.ndarray:
    """A float32 array of normal values whose data starts ``past`` bytes after a 64-byte
    boundary."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    raw = np.empty(values.nbytes + 80, np.uint8)
    start = (-raw.ctypes.data % 64) + past
    out = raw[start : start + values.nbytes].view(np.float32).reshape(shape)
    out[...] = values
    return out


def unaligned(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A float32 array whose data starts 16 bytes past a 64-byte boundary."""
    return placed(shape, seed, past=16)


def test_an_aligned_array_is_not_copied() -> None:
    aligned = placed((10, 4), 0, past=0)
    assert points.staged(aligned, 1) is aligned


def test_host_arrays_become_contiguous_float32_and_device_arrays_stay() -> None:
    x = np.arange(24, dtype=np.float64).reshape(4, 6)[:, ::2]  # float64, not contiguous
    host = points.as_float32(x, 0)
    assert isinstance(host, np.ndarray) and host.dtype == np.float32
    assert host.flags.c_contiguous and host.ctypes.data % 64 == 0
    np.testing.assert_array_equal(host, x)
    on_device = points.float32_on_device(x)
    assert isinstance(on_device, jax.Array) and on_device.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(on_device), x)
    y = jnp.ones((3, 2), jnp.bfloat16)
    assert points.as_float32(y, 0).dtype == jnp.float32
    z = jnp.ones((3, 2), jnp.float32)
    assert points.as_float32(z, 0) is z and points.float32_on_device(z) is z


def test_kmeans_of_host_arrays_keeps_its_results() -> None:
    """k-means stages host points in the kNN search's slot: a search after it leaves its result
    as it was, also where every point is a centroid (the result is then a copy of the points)."""
    x = unaligned((6, 3), 6)
    result = kmeans(x, 6, num_iters=2, init="reference")
    centroids = np.asarray(result.centroids).copy()
    knn(unaligned((6, 3), 7), unaligned((6, 3), 8), 2, exclude_self=False)
    x[...] = 0.0
    np.testing.assert_array_equal(np.asarray(result.centroids), centroids)


def test_an_unaligned_array_is_copied_aligned_and_the_slot_is_reused() -> None:
    x, y = unaligned((30, 5), 1), unaligned((7, 3), 2)
    first = points.staged(x, 0)
    assert first is not x and first.ctypes.data % 64 == 0
    np.testing.assert_array_equal(first, x)
    second = points.staged(y, 0)  # smaller: the same memory
    assert second.ctypes.data == first.ctypes.data
    np.testing.assert_array_equal(second, y)
    other = points.staged(x, 1)  # another slot: other memory
    assert other.ctypes.data != second.ctypes.data


def test_large_arrays_are_copied_aligned_into_memory_of_their_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(points, "STAGING_MAX_BYTES", 100)
    x = unaligned((10, 4), 3)  # 160 bytes
    first, second = points.staged(x, 0), points.staged(x, 0)
    for copy in (first, second):
        assert copy is not x and copy.ctypes.data % 64 == 0
        np.testing.assert_array_equal(copy, x)
    assert first.ctypes.data != second.ctypes.data  # not a kept buffer


def test_searches_of_host_arrays_one_after_another_keep_their_results() -> None:
    """The staging buffers are reused by the next search: the first search's results are its
    own, and changing the caller's arrays after a search changes nothing."""
    a, b = unaligned((300, 8), 4), unaligned((300, 8), 5)
    da, ia = (np.asarray(v).copy() for v in knn(a, a, 5, exclude_self=True))
    first = knn(a, b, 5, exclude_self=False)
    knn(b, a, 5, exclude_self=False)
    a[...] = 0.0
    want = knn(unaligned((300, 8), 4), unaligned((300, 8), 5), 5, exclude_self=False)
    np.testing.assert_array_equal(np.asarray(first[1]), np.asarray(want[1]))
    np.testing.assert_array_equal(np.asarray(first[0]), np.asarray(want[0]))
    a[...] = unaligned((300, 8), 4)
    again = knn(a, a, 5, exclude_self=True)
    np.testing.assert_array_equal(np.asarray(again[1]), ia)
    np.testing.assert_array_equal(np.asarray(again[0]), da)
