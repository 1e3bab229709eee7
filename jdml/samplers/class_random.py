"""SPC-n batches: a few random classes, n random images of each."""

from __future__ import annotations

import numpy as np

from jdml.samplers.base import SAMPLERS, Sampler


@SAMPLERS.register("class_random")
class ClassRandomSampler(Sampler):
    """SPC-n sampler: batch_size / n draws of (one class, n images of it).

    Each draw picks a class uniformly among the classes present in ``labels`` and then
    ``samples_per_class`` of its images uniformly. By default both picks are with replacement, as
    in the reference: a class can occupy two groups of one batch and an image can repeat (which
    yields zero distances that losses and miners must survive). The batch is laid out group by
    group: entries [k n, (k + 1) n) share a label.

    Args:
      labels: (N,) int training labels.
      batch_size: samples per batch, a multiple of ``samples_per_class``.
      samples_per_class: n, the group size (2 in the reference default).
      seed: non-negative base seed; ``batch(step)`` depends only on (seed, step).
      unique_classes: draw the batch's classes without replacement (as the Revisiting paper's
        text describes SPC-n); needs at least batch_size / n classes.
      unique_images: draw images without replacement within a group. A class with fewer than n
        images contributes all of them, topped up with repeats drawn uniformly.

    Raises:
      ValueError: see ``Sampler``; also with ``unique_classes`` when there are fewer classes
        than groups per batch.

    References:
      Roth et al., "Revisiting Training Strategies and Generalization Performance in Deep Metric
      Learning", ICML 2020 (SPC-n; reference ``datasampler/class_random_sampler.py``).
    """

    unique_classes: bool = False
    unique_images: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        order = np.argsort(self.labels, kind="stable")
        classes, starts, counts = np.unique(
            self.labels[order], return_index=True, return_counts=True
        )
        self.num_groups = self.batch_size // self.samples_per_class
        if self.unique_classes and len(classes) < self.num_groups:
            raise ValueError(
                f"unique_classes needs {self.num_groups} classes per batch (batch size "
                f"{self.batch_size} / samples_per_class {self.samples_per_class}), but the labels "
                f"hold only {len(classes)}; lower the batch size, raise samples_per_class or "
                "allow repeats"
            )
        self._members = np.split(order.astype(np.int64), starts[1:])
        self._counts = counts

    def batch(self, step: int) -> np.ndarray:
        rng = self.rng(step)
        n = self.samples_per_class
        groups = rng.choice(
            len(self._members), size=self.num_groups, replace=not self.unique_classes
        )
        if not self.unique_images:
            offsets = rng.integers(0, self._counts[groups][:, None], size=(self.num_groups, n))
            return np.concatenate(
                [self._members[g][o] for g, o in zip(groups, offsets, strict=True)]
            )
        return np.concatenate([self._distinct_images(rng, self._members[g]) for g in groups])

    def _distinct_images(self, rng: np.random.Generator, members: np.ndarray) -> np.ndarray:
        n = self.samples_per_class
        if len(members) >= n:
            return rng.choice(members, size=n, replace=False)
        extra = rng.choice(members, size=n - len(members), replace=True)
        return rng.permutation(np.concatenate([members, extra]))
