"""grain input pipelines: training batches indexed by global step, and evaluation batches.

A training batch is a pure function of (seed, step): the sampler draws its indices from
``default_rng((seed, step))`` and the augmentation from ``default_rng((seed, step, 1))``. The grain
dataset is therefore indexed by step, and resuming at step s is ``MapDataset.range(s, total)``: the
iterator state that has to be checkpointed is the step itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import grain
import numpy as np

from jdml.data.arrays import ImageArrays
from jdml.data.augment import Augmentation


@dataclasses.dataclass(frozen=True)
class TrainBatch:
    """grain map function: step -> {'images', 'labels', 'indices'} for that step.

    With ``views=2`` the batch also holds ``images_b``: the same images under an independent
    augmentation draw (``default_rng((seed, step, 2))``), the second view DaNCE's keys see. With
    ``streams=s``, streams 1..s-1 add ``images_<i>`` / ``labels_<i>``: a batch of the same size
    drawn uniformly without replacement (``default_rng((seed, step, 2 + i))``).
    """

    data: ImageArrays
    sampler: object  # jdml.samplers.base sampler with .batch(step)
    augment: Augmentation
    seed: int
    views: int = 1
    streams: int = 1

    def __call__(self, step: int) -> dict[str, np.ndarray]:
        idx = self.sampler.batch(int(step))
        rng = np.random.default_rng((self.seed, int(step), 1))
        images = self.data.images[idx]
        out = {
            "images": self.augment(images, rng),
            "labels": self.data.labels[idx].astype(np.int32),
            "indices": idx.astype(np.int32),
        }
        if self.views == 2:
            out["images_b"] = self.augment(images, np.random.default_rng((self.seed, int(step), 2)))
        for stream in range(1, self.streams):
            # A further stream: images in random order (the Sharing Matters shared stream).
            rng = np.random.default_rng((self.seed, int(step), 2 + stream))
            idx = rng.choice(len(self.data), len(idx), replace=False)
            out[f"images_{stream}"] = self.augment(self.data.images[idx], rng)
            out[f"labels_{stream}"] = self.data.labels[idx].astype(np.int32)
        return out


def train_batches(
    make_batch: TrainBatch,
    *,
    start_step: int,
    total_steps: int,
    num_threads: int,
    prefetch: int,
) -> Iterator[dict[str, np.ndarray]]:
    """Iterates the batches of steps ``start_step .. total_steps - 1`` with reader threads."""
    ds = grain.MapDataset.range(start_step, total_steps).map(make_batch)
    opts = grain.ReadOptions(num_threads=max(1, num_threads), prefetch_buffer_size=max(1, prefetch))
    return iter(ds.to_iter_dataset(opts))


def eval_batches(data: ImageArrays, batch_size: int) -> Iterator[tuple[np.ndarray, int]]:
    """Yields fixed-shape (batch_size, H, W, C) float32 batches in [0, 1] and their valid counts.

    The last batch is padded by repeating its final image so that the embedding function compiles
    once; callers drop the padded rows using the count.
    """
    n = len(data)
    for start in range(0, n, batch_size):
        chunk = data.images[start : start + batch_size]
        valid = chunk.shape[0]
        if valid < batch_size:
            pad = np.repeat(chunk[-1:], batch_size - valid, axis=0)
            chunk = np.concatenate([chunk, pad])
        yield chunk.astype(np.float32) / 255.0, valid
