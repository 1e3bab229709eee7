"""grain input pipelines: training batches indexed by global step, and evaluation batches.

A training batch is a pure function of (seed, step): the sampler draws its indices from
``default_rng((seed, step))`` and row i's augmentation from its own generator (``row_rng``), so
that any process can build any rows of the global batch (multi-host input) and they are the rows
one process would build. The grain dataset is therefore indexed by step, and resuming at step s
is ``MapDataset.range(s, total)``: the iterator state that has to be checkpointed is the step
itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import grain
import numpy as np
from absl import flags

from jdml.data.arrays import ImageSet
from jdml.data.augment import Augmentation


def row_rng(seed: int, step: int, view: int, member: int, row: int) -> np.random.Generator:
    """The generator of one augmented image: row ``row`` of the global batch of ``step``, view
    ``view`` (1 and 2: DaNCE's two views; ``2 + s``: stream s), as member ``member`` sees it.

    The last entry is ``row + 1`` because NumPy's seed sequences ignore trailing zeros: no row's
    tuple can equal a shorter one (the sampler's ``(seed, step)``, a stream's draw
    ``(seed, step, 2 + s)``).
    """
    return np.random.default_rng((seed, step, view, member, row + 1))


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """grain map function: step -> {'images', 'labels', 'indices'} for that step.

    With ``views=2`` the batch also holds ``images_b``: the same images under an independent
    augmentation draw, the second view DaNCE's keys see. With ``streams=s``, streams 1..s-1 add
    ``images_<i>`` / ``labels_<i>``: a batch of the same size drawn uniformly without replacement
    (``default_rng((seed, step, 2 + i))``). With ``members=(m1, m2, ...)`` (a DM2 cohort with view
    diversity: the members whose views this process builds) the views get a leading member axis:
    member ``m`` sees its own augmentation of the same images; member 0's is the plain run's.
    Every image has its own generator (``row_rng``).

    With ``rows=(start, stop)`` (multi-host input: the rows of the global batch on this
    process's devices) only those rows are loaded and augmented; they equal the same rows of
    the whole batch.
    """

    data: ImageSet
    sampler: object  # jdml.samplers.base sampler with .batch(step)
    augment: Augmentation
    seed: int
    views: int = 1
    streams: int = 1
    members: tuple[int, ...] = ()
    rows: tuple[int, int] | None = None

    def _augment(self, images: np.ndarray, step: int, view: int, member: int) -> np.ndarray:
        start = self.rows[0] if self.rows else 0
        return np.concatenate(
            [
                self.augment(images[i : i + 1], row_rng(self.seed, step, view, member, start + i))
                for i in range(len(images))
            ]
        )

    def _view(self, images: np.ndarray, step: int, view: int) -> np.ndarray:
        if not self.members:
            return self._augment(images, step, view, 0)
        return np.stack([self._augment(images, step, view, m) for m in self.members])

    def _rows(self, idx: np.ndarray) -> np.ndarray:
        return idx[slice(*self.rows)] if self.rows else idx

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        step = int(step)
        batch = self.sampler.batch(step)  # the global batch's indices
        idx = self._rows(batch)
        images = self.data.load(idx)
        out = {
            "images": self._view(images, step, 1),
            "labels": self.data.labels[idx].astype(np.int32),
            "indices": idx.astype(np.int32),
        }
        if self.views == 2:
            out["images_b"] = self._view(images, step, 2)
        for stream in range(1, self.streams):
            # A further stream: images in random order (the Sharing Matters shared stream).
            rng = np.random.default_rng((self.seed, step, 2 + stream))
            idx = self._rows(rng.choice(len(self.data), len(batch), replace=False))
            out[f"images_{stream}"] = self._augment(self.data.load(idx), step, 2 + stream, 0)
            out[f"labels_{stream}"] = self.data.labels[idx].astype(np.int32)
        return out


def train_batches(
    make_batch: TrainBatch,
    *,
    start_step: int,
    total_steps: int,
    num_threads: int,
    prefetch: int,
    num_workers: int = 0,
) -> Iterator[dict[str, np.ndarray]]:
    """Iterates the batches of steps ``start_step .. total_steps - 1``, in step order.

    Args:
      make_batch: the step -> batch function.
      start_step: the first step (resuming starts here: the iterator state is the step).
      total_steps: one past the last step.
      num_threads: reader threads (of each worker process, with ``num_workers``).
      prefetch: batches prepared ahead (per worker process, with ``num_workers``).
      num_workers: worker processes that build batches (grain's ``mp_prefetch``), for decoding
        and augmentation heavier than threads can carry; 0 builds them in this process. The
        batches are the same either way: each is a function of its step alone.
    """
    ds = grain.MapDataset.range(start_step, total_steps).map(make_batch)
    opts = grain.ReadOptions(num_threads=max(1, num_threads), prefetch_buffer_size=max(1, prefetch))
    batches = ds.to_iter_dataset(opts)
    if num_workers > 0:
        if not flags.FLAGS.is_parsed():  # grain's workers read its absl flags (their defaults
            flags.FLAGS.mark_as_parsed()  # when jdml is used as a library, e.g. in a notebook)
        options = grain.MultiprocessingOptions(
            num_workers=num_workers, per_worker_buffer_size=max(1, prefetch)
        )
        batches = batches.mp_prefetch(options)
    return iter(batches)


def eval_batches(data: ImageSet, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """Yields fixed-shape (batch_size, H, W, C) float32 batches in [0, 1] and their valid counts.

    The images are ``data.eval_images`` (the evaluation transform of photos). The last batch is
    padded by repeating its final image so that the embedding function compiles once; callers
    drop the padded rows using the count.
    """
    n = len(data)
    for start in range(0, n, batch_size):
        index = np.arange(start, min(start + batch_size, n))
        valid = len(index)
        index = np.concatenate([index, np.full(batch_size - valid, index[-1])])
        yield data.eval_images(index), valid
