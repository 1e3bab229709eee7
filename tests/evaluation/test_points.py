"""Host embeddings handed to the evaluators (jdml/evaluation/points.py): staged copies are
aligned, equal to the input and reused per slot; a search of host arrays reads them only while
it runs."""

from __future__ import annotations

import numpy as np
import pytest

from jdml.evaluation import points
from jdml.evaluation.knn import knn


def unaligned(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A float32 array whose data starts 16 bytes past a 64-byte boundary."""
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    raw = np.empty(values.nbytes + 80, np.uint8)
    start = (-raw.ctypes.data % 64) + 16
    out = raw[start : start + values.nbytes].view(np.float32).reshape(shape)
    out[...] = values
    return out


def test_an_aligned_array_is_not_copied() -> None:
    x = unaligned((10, 4), 0)
    aligned = points.staged(points.staged(x, 0), 1)  # a staged copy is aligned: kept as it is
    assert aligned.ctypes.data % 64 == 0
    assert points.staged(aligned, 1) is aligned


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


def test_large_arrays_are_not_staged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(points, "STAGING_MAX_BYTES", 100)
    x = unaligned((10, 4), 3)  # 160 bytes
    assert points.staged(x, 0) is x


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
