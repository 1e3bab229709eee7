"""Class epochs: every class once per epoch, n images of each, no class twice in a batch."""

from __future__ import annotations

import numpy as np

from jdml.samplers.base import SAMPLERS, Sampler


@SAMPLERS.register("class_epoch")
class ClassEpochSampler(Sampler):
    """An epoch is a random order of the classes; each batch takes the next batch_size / n
    classes of it and n images of each.

    Within a group the n images are distinct, drawn uniformly without replacement; a class with
    fewer than n images has all n drawn with replacement. The classes left over at the end of the
    order (fewer than a batch) are skipped, so an epoch is floor(K / (batch_size / n)) steps for
    K classes: with CUB200's 100 training classes and batch 900 at n = 9, one step. The batch is
    laid out group by group: entries [k n, (k + 1) n) share a label.

    This is the "unique class" sampler of the ViT metric-learning recipes, whose losses read the
    batch as n views of distinct classes (NT-Xent over pairs of view slots,
    ``--config.loss.ntxent.slot_pairs``).

    Args:
      labels: (N,) int training labels.
      batch_size: samples per batch, a multiple of ``samples_per_class``.
      samples_per_class: n, the images of each class in a batch.
      seed: non-negative base seed; ``batch(step)`` depends only on (seed, step).

    Raises:
      ValueError: see ``Sampler``; also when there are fewer classes than groups per batch.

    References:
      Ermolov, Mirvakhabova, Khrulkov, Sebe, Oseledets, "Hyperbolic Vision Transformers:
      Combining Improvements in Metric Learning", CVPR 2022 (its code's ``UniqueClassSampler``).
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        order = np.argsort(self.labels, kind="stable")
        _, starts = np.unique(self.labels[order], return_index=True)
        self._members = np.split(order.astype(np.int64), starts[1:])
        self.num_groups = self.batch_size // self.samples_per_class
        if len(self._members) < self.num_groups:
            raise ValueError(
                f"class_epoch needs {self.num_groups} classes per batch (batch size "
                f"{self.batch_size} / samples_per_class {self.samples_per_class}), but the labels "
                f"hold only {len(self._members)}; lower the batch size or raise samples_per_class"
            )

    @property
    def steps_per_epoch(self) -> int:
        """floor(K / groups per batch): each class at most once per epoch."""
        return len(self._members) // self.num_groups

    def class_order(self, epoch: int) -> np.ndarray:
        """The classes (indices of the sorted labels) in epoch ``epoch``'s order."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        # The epoch's order has its own stream, apart from every step's (``rng``).
        return np.random.default_rng((self.seed, epoch, 1)).permutation(len(self._members))

    def batch(self, step: int) -> np.ndarray:
        epoch, index = divmod(step, self.steps_per_epoch)
        rng = self.rng(step)
        groups = self.class_order(epoch)[index * self.num_groups : (index + 1) * self.num_groups]
        n = self.samples_per_class
        draws = [
            rng.choice(members, size=n, replace=len(members) < n)
            for members in (self._members[g] for g in groups)
        ]
        return np.concatenate(draws)
