"""Shared machinery of the samplers that select batches from a memory of training embeddings.

The Revisiting paper's embedded samplers (greedy / D2 coreset, DDM and FRD batch matching) read a
memory bank holding one embedding per training image, which the trainer fills with eval-mode
embeddings at the start of training and overwrites with each training batch's embeddings. A
memory sampler produces all batches of an epoch at once, at the start of the epoch, from a
snapshot of that memory (as the reference precomputes an epoch's indices at epoch start):
``epoch_batches(epoch, memory)`` is a pure function of (seed, epoch, memory).

Randomness is explicit: host-side index draws (big batches, candidates, class fillers) use
``np.random.default_rng((seed, epoch, stream))`` and the selection kernels use JAX keys derived by
``fold_in`` from (seed, epoch, step). The embedding computations (distances, Gaussian fits,
histograms, Frechet distances) run in jitted kernels mapped over the steps of the epoch.

The memory itself (filling, per-step updates, the epoch table in the train state) is kept by the
trainer, see ``jdml.samplers.memory``; this module holds the sampler side.
"""

from __future__ import annotations

import abc
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import scipy.linalg.cython_lapack  # noqa: F401 - loads the LAPACK that XLA calls on CPU
import threadpoolctl

from jdml.samplers.base import Sampler

STEPS_PER_CHUNK = 8
"""Steps of an epoch that a kernel processes together (``jax.lax.map`` batch size)."""

# Independent host random streams of one epoch: default_rng((seed, epoch, stream)).
STREAM_BIG_BATCH = 0
STREAM_CANDIDATES = 1
STREAM_FILLERS = 2
STREAM_REFERENCE_BUG = 3


class MemorySampler(Sampler):
    """Base class of the samplers that draw an epoch's batches from an embedding memory.

    Subclasses implement ``_epoch_batches``. Every batch is laid out group by group as in
    ``class_random``: entries [k n, (k + 1) n) share a label, n = ``samples_per_class``.

    Args:
      labels: (N,) int training labels, one per memory row.
      batch_size: samples per batch, a multiple of ``samples_per_class``.
      samples_per_class: n, the group size.
      seed: non-negative base seed.
      bigbs: size of the big batch each mini-batch is distilled from (512 in the reference).
      lowproj_dim: if positive, the big batch is first mapped by a fresh random linear projection
        to this many dimensions (entries uniform in +-1/sqrt(D), like a bias-free linear layer's
        initialisation); -1 (the default) keeps the embeddings as they are.

    Raises:
      ValueError: see ``Sampler``; also for a non-positive ``bigbs`` or a ``lowproj_dim`` of 0 or
        below -1.
    """

    needs_memory: ClassVar[bool] = True

    bigbs: int = 512
    lowproj_dim: int = -1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.bigbs < 1:
            raise ValueError(f"bigbs must be positive, got {self.bigbs}")
        if self.lowproj_dim == 0 or self.lowproj_dim < -1:
            raise ValueError(f"lowproj_dim must be positive or -1 (off), got {self.lowproj_dim}")
        self.num_groups = self.batch_size // self.samples_per_class
        order = np.argsort(self.labels, kind="stable").astype(np.int64)
        _, starts, inverse, counts = np.unique(
            self.labels[order], return_index=True, return_inverse=True, return_counts=True
        )
        self._order = order
        self._starts = starts.astype(np.int64)
        self._counts = counts.astype(np.int64)
        self._class_of = np.empty(len(order), np.int64)
        self._class_of[order] = inverse
        self._rank = np.empty(len(order), np.int64)
        self._rank[order] = np.arange(len(order)) - self._starts[inverse]

    @property
    def num_classes(self) -> int:
        """Number of distinct labels."""
        return len(self._counts)

    def batch(self, step: int) -> np.ndarray:
        raise NotImplementedError(
            f"{type(self).__name__} selects batches from the embedding memory: call "
            "epoch_batches(epoch, memory) at the start of each epoch instead of batch(step) "
            "(samplers with needs_memory = True have no per-step batches)"
        )

    def epoch_batches(
        self, epoch: int, memory: jax.Array | np.ndarray, num_batches: int | None = None
    ) -> np.ndarray:
        """All batches of one epoch, selected from a snapshot of the memory.

        Args:
          epoch: non-negative epoch number.
          memory: (N, D) float embeddings, row i belonging to dataset index i.
          num_batches: batches to produce; ``steps_per_epoch`` by default.

        Returns:
          int64 (num_batches, batch_size) dataset indices, a pure function of (seed, epoch,
          memory).

        Raises:
          ValueError: for a negative epoch, a non-positive ``num_batches`` or a memory whose shape
            does not match the labels.
        """
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        steps = self.steps_per_epoch if num_batches is None else num_batches
        if steps < 1:
            raise ValueError(f"num_batches must be positive, got {steps}")
        memory = self._check_memory(memory)
        with single_threaded_lapack():
            out = self._epoch_batches(epoch, memory, steps)
        return np.asarray(out, dtype=np.int64).reshape(steps, self.batch_size)

    @abc.abstractmethod
    def _epoch_batches(self, epoch: int, memory: jax.Array, steps: int) -> np.ndarray:
        """(steps, batch_size) dataset indices of one epoch."""

    def _check_memory(self, memory: jax.Array | np.ndarray) -> jax.Array:
        shape = tuple(memory.shape)
        if len(shape) != 2 or shape[0] != len(self.labels) or shape[1] < 1:
            raise ValueError(
                f"memory must be (num_train, dim) = ({len(self.labels)}, D) embeddings, one row "
                f"per training index, got shape {shape}"
            )
        return jnp.asarray(memory, dtype=jnp.float32)

    def host_rng(self, epoch: int, stream: int) -> np.random.Generator:
        """Host generator of one random stream of an epoch, seeded by (seed, epoch, stream)."""
        return np.random.default_rng((self.seed, epoch, stream))

    def step_keys(self, epoch: int, steps: int) -> jax.Array:
        """(steps,) JAX keys, key i = fold_in(fold_in(key(seed), epoch), i)."""
        epoch_key = jax.random.fold_in(jax.random.key(self.seed), epoch)
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(epoch_key, jnp.arange(steps))

    def class_images(self, rng: np.random.Generator, classes: np.ndarray, n: int) -> np.ndarray:
        """``n`` images of each class index, drawn uniformly with replacement: (*shape, n)."""
        offsets = rng.integers(0, self._counts[classes][..., None], size=(*classes.shape, n))
        return self._order[self._starts[classes][..., None] + offsets]

    def fill_groups(self, rng: np.random.Generator, anchors: np.ndarray) -> np.ndarray:
        """Expands each anchor image into a group of n images of its class.

        A group is the anchor followed by n - 1 other images of its class drawn without
        replacement; a class with fewer than n images contributes all of them, topped up with
        images drawn uniformly (with replacement) from the whole class.

        Args:
          rng: host generator.
          anchors: (..., G) int dataset indices.

        Returns:
          int64 (..., G * n) dataset indices, group by group.
        """
        n = self.samples_per_class
        anchors = np.asarray(anchors, np.int64)
        cls = self._class_of[anchors]
        start, count, rank = self._starts[cls], self._counts[cls], self._rank[anchors]
        others = count - 1
        picks = [anchors]
        taken: list[np.ndarray] = []  # offsets among the class's other images, drawn so far
        for j in range(n - 1):
            u = rng.random(anchors.shape)
            offset = np.floor(u * np.maximum(others - j, 1)).astype(np.int64)
            # Sequential sampling without replacement: skip the offsets taken so far.
            for prev in np.sort(np.stack(taken), axis=0) if taken else []:
                offset += offset >= prev
            taken.append(offset)
            offset = offset + (offset >= rank)  # index among others -> index in the class
            repeat = np.floor(u * count).astype(np.int64)  # classes with too few images
            offset = np.where(j < others, offset, repeat)
            picks.append(self._order[start + offset])
        return np.stack(picks, axis=-1).reshape(*anchors.shape[:-1], -1)


def single_threaded_lapack() -> threadpoolctl.threadpool_limits:
    """Context limiting the BLAS/LAPACK libraries (OpenBLAS) of the process to one thread.

    On CPU, XLA runs eigendecompositions and tridiagonalisations through the LAPACK of SciPy's
    OpenBLAS, whose worker threads busy-wait: next to other busy threads (a training step, other
    processes) the small per-batch factorisations then run 20-40 times slower than on one
    thread. The kernels' results must be fetched (``np.asarray``) inside the context. SciPy's
    LAPACK, which XLA loads only at its first call, is imported with this module so that the
    limit applies from the first epoch on.
    """
    return threadpoolctl.threadpool_limits(limits=1, user_api="blas")


def random_projection(key: jax.Array, x: jax.Array, dim: int) -> jax.Array:
    """Maps (M, D) rows by a random (D, dim) matrix with entries uniform in +-1/sqrt(D)."""
    bound = 1.0 / np.sqrt(x.shape[-1])
    proj = jax.random.uniform(key, (x.shape[-1], dim), x.dtype, -bound, bound)
    return x @ proj


def maybe_project(key: jax.Array, x: jax.Array, dim: int) -> jax.Array:
    """``random_projection`` for a positive ``dim``; the rows unchanged for -1."""
    return random_projection(key, x, dim) if dim > 0 else x
