"""SPC-R batches: class-balanced random images, the last one completing a positive pair."""

from __future__ import annotations

import numpy as np

from jdml.samplers.base import SAMPLERS, Sampler


@SAMPLERS.register("full_random")
class FullRandomSampler(Sampler):
    """SPC-R sampler: random images, with at least one pair of a shared label per batch.

    The first ``batch_size - 1`` entries are drawn independently, each by picking a class uniformly
    and then one of its images uniformly (class-balanced rather than image-uniform, as in the
    reference). The last entry is a random image of the class of a randomly chosen earlier entry,
    so that every batch holds at least one pair with a shared label and a triplet can be mined.
    That image may be the chosen entry itself (a duplicate image), as in the reference. The
    number of classes per batch is therefore not fixed; ``samples_per_class`` is unused apart from
    the base class's divisibility check.

    Args:
      labels: (N,) int training labels.
      batch_size: samples per batch (at least 2).
      samples_per_class: accepted for a uniform interface; it does not shape the batch.
      seed: non-negative base seed; ``batch(step)`` depends only on (seed, step).

    Raises:
      ValueError: see ``Sampler``; also for a batch size below 2.

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020, Sec. 3.2 (SPC-R; reference ``datasampler/random_sampler.py``).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 2:
            raise ValueError(f"full_random needs a batch size of at least 2, got {self.batch_size}")
        order = np.argsort(self.labels, kind="stable").astype(np.int64)
        _, starts, inverse, counts = np.unique(
            self.labels[order], return_index=True, return_inverse=True, return_counts=True
        )
        self._order = order
        self._starts = starts
        self._counts = counts
        self._class_of = np.empty(len(order), np.int64)
        self._class_of[order] = inverse

    def _images_of(self, rng: np.random.Generator, classes: np.ndarray) -> np.ndarray:
        """One uniformly drawn image index of each class index in ``classes``."""
        offsets = rng.integers(0, self._counts[classes])
        return self._order[self._starts[classes] + offsets]

    def batch(self, step: int) -> np.ndarray:
        rng = self.rng(step)
        first = self._images_of(rng, rng.integers(0, len(self._counts), size=self.batch_size - 1))
        partner = first[rng.integers(0, len(first))]
        last = self._images_of(rng, self._class_of[partner][None])
        return np.concatenate([first, last])
