"""faiss's random draws, on the host, for the reference k-means
(:mod:`jdml.evaluation.kmeans.reference`): the Mersenne Twister as ``std::mt19937``, the
initial permutation (``rand_perm``) and the empty-cluster split (``split_clusters``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

# The clustering seed of the reference mode (faiss's default ClusteringParameters.seed), and the
# fixed seed of its empty-cluster split.
REFERENCE_SEED = 1234
# Relative perturbation of the two halves of a split cluster (1/1024).
SPLIT_EPS = 1.0 / 1024.0
# Mersenne-Twister outputs drawn at a time by the split's rejection scan (at least K).
_DRAW_BLOCK = 1 << 16


class _MersenneStream:
    """The 32-bit outputs of MT19937 seeded like ``std::mt19937(seed)``, read in order.

    ``np.random.RandomState(seed)`` seeds MT19937 with the same ``init_genrand`` as the C++
    ``std::mt19937(seed)``, and ``randint(0, 2**32, dtype=uint32)`` returns its raw outputs.
    Outputs are drawn in blocks and can be looked at ahead of the read position.
    """

    def __init__(self, seed: int) -> None:
        self._state = np.random.RandomState(seed % 2**32)
        self._outputs = np.empty((0,), np.uint32)
        self._position = 0

    def peek(self, start: int, count: int) -> np.ndarray:
        """The outputs ``start .. start + count - 1`` after the read position, unread.

        Args:
          start: offset from the read position.
          count: number of outputs.

        Returns:
          (count,) uint32.
        """
        end = self._position + start + count
        if end > len(self._outputs):
            fresh = self._state.randint(
                0, 2**32, size=max(end - len(self._outputs), _DRAW_BLOCK), dtype=np.uint32
            )
            self._outputs = np.concatenate([self._outputs[self._position :], fresh])
            end -= self._position
            self._position = 0
        return self._outputs[end - count : end]

    def read(self, count: int) -> np.ndarray:
        """The next ``count`` outputs, consumed.

        Args:
          count: number of outputs.

        Returns:
          (count,) uint32.
        """
        out = self.peek(0, count)
        self._position += count
        return out


def mt19937_outputs(seed: int, count: int) -> np.ndarray:
    """The first ``count`` 32-bit outputs of ``std::mt19937(seed)``.

    Args:
      seed: the generator's seed (taken modulo 2**32, like ``(unsigned int) seed``).
      count: number of outputs.

    Returns:
      (count,) uint32.
    """
    return _MersenneStream(seed).read(count)


def _unit_floats(outputs: np.ndarray) -> np.ndarray:
    """faiss's ``RandomGenerator::rand_float``: an output divided by ``float(mt.max())``.

    The output is rounded to float32 and ``float(2**32 - 1)`` is 2**32, so the division is
    exact: the result is in [0, 1] (1 when the output rounds up to 2**32).

    Args:
      outputs: (M,) uint32 MT19937 outputs.

    Returns:
      (M,) float32.
    """
    return outputs.astype(np.float32) / np.float32(2.0**32)


@functools.lru_cache(maxsize=64)
def reference_permutation(num_points: int, count: int, seed: int) -> np.ndarray:
    """The first ``count`` entries of faiss's ``rand_perm(perm, num_points, seed)``.

    Fisher-Yates over ``0 .. N - 1``: for i = 0 .. N - 2, swap positions i and
    ``i + u_i mod (N - i)``, u_i the i-th output of ``std::mt19937(seed)`` (faiss's
    ``RandomGenerator::rand_int(max)``, ``mt() % max`` up to faiss 1.15.1 at least; later faiss
    sources use a multiply-shift, which draws other points). Step i only touches positions
    >= i, so the first ``count`` entries are final after ``count`` steps.

    Args:
      num_points: N.
      count: how many leading entries to return, 0 <= count <= N.
      seed: seed of the Mersenne Twister.

    Returns:
      (count,) int64 distinct indices in [0, N), read-only: remembered per arguments (with the
      generator's seeding, 0.65 ms per 5-cluster k-means of 20,000 points, a tenth of it).
    """
    steps = min(count, num_points - 1)
    outputs = mt19937_outputs(seed, steps).astype(np.int64)
    targets = np.arange(steps) + outputs % (num_points - np.arange(steps))
    moved: dict[int, int] = {}  # the positions the swaps touched (the others hold themselves)
    for i, j in enumerate(targets.tolist()):
        moved[i], moved[j] = moved.get(j, j), moved.get(i, i)
    perm = np.asarray([moved.get(i, i) for i in range(count)], np.int64)
    perm.flags.writeable = False
    return perm


def _split_probabilities(counts: np.ndarray, surplus: int) -> np.ndarray:
    """faiss's probability of splitting a cluster of (float) size h: ``(h - 1.0) / float(N -
    K)``, evaluated in double precision and rounded to float32.

    Args:
      counts: (M,) float32 cluster sizes.
      surplus: N - K, the number of points minus the number of clusters.

    Returns:
      (M,) float32 (negative for an empty cluster, 0 for a singleton: never chosen).
    """
    denominator = np.float64(np.float32(surplus))
    return ((counts.astype(np.float64) - 1.0) / denominator).astype(np.float32)


class SplitResult(NamedTuple):
    """Output of :func:`split_empty_clusters`.

    Attributes:
      centroids: (K, D) float32 centroids with every empty cluster filled.
      counts: (K,) float32 cluster sizes after the splits (halves of the split clusters).
      sources: (E,) int64 for each of the E empty clusters, in increasing order, the cluster it
        was split from.
    """

    centroids: np.ndarray
    counts: np.ndarray
    sources: np.ndarray


def split_empty_clusters(
    centroids: np.ndarray, counts: np.ndarray, num_points: int, seed: int = REFERENCE_SEED
) -> SplitResult:
    """Fills the empty clusters by splitting others, as faiss's ``split_clusters``.

    A fresh ``std::mt19937(seed)`` per call. For each empty cluster ci in increasing order, the
    candidates cj = 0, 1, 2, ... are scanned cyclically, each drawing r = ``rand_float`` (see
    :func:`_unit_floats`), until r < p_cj (:func:`_split_probabilities`: proportional to the
    cluster's size minus one). Then ci takes cj's centroid, and the two are pushed apart
    symmetrically: in even dimensions ci is multiplied by 1 + eps and cj by 1 - eps, in odd
    dimensions the other way round (eps = :data:`SPLIT_EPS`); ci gets half of cj's size
    (float32), cj keeps the rest. The scan is vectorised over one cycle of K candidates at a time.

    Args:
      centroids: (K, D) float32 centroids (rows of empty clusters are overwritten).
      counts: (K,) cluster sizes (0 = empty); they sum to ``num_points``.
      num_points: N > K, the number of clustered points.
      seed: seed of the Mersenne Twister (faiss always uses 1234).

    Returns:
      :class:`SplitResult` (new arrays; the inputs are not modified).
    """
    num_clusters = len(counts)
    if num_points <= num_clusters:
        raise ValueError(f"splitting needs more points ({num_points}) than clusters")
    centroids = np.array(centroids, np.float32)
    counts = np.array(counts, np.float32)
    surplus = num_points - num_clusters
    probabilities = _split_probabilities(counts, surplus)
    up = np.where(np.arange(centroids.shape[1]) % 2 == 0, 1 + SPLIT_EPS, 1 - SPLIT_EPS)
    up = up.astype(np.float32)
    down = (2.0 - up).astype(np.float32)  # 1 - eps where up is 1 + eps, and vice versa
    stream = _MersenneStream(seed)
    sources = []
    for ci in np.flatnonzero(counts == 0).tolist():
        cycle = 0
        while True:
            draws = _unit_floats(stream.peek(cycle * num_clusters, num_clusters))
            hits = np.flatnonzero(draws < probabilities)
            if len(hits):
                cj = int(hits[0])
                stream.read(cycle * num_clusters + cj + 1)
                break
            cycle += 1
        source = centroids[cj].copy()
        centroids[ci] = source * up
        centroids[cj] = source * down
        counts[ci] = counts[cj] / np.float32(2.0)
        counts[cj] -= counts[ci]
        probabilities[[ci, cj]] = _split_probabilities(counts[[ci, cj]], surplus)
        sources.append(cj)
    return SplitResult(centroids, counts, np.asarray(sources, np.int64))
