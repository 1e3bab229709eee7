"""Shared sampler interface: host-side batch index samplers and the ``SAMPLERS`` registry.

A sampler turns a step number into the dataset indices of that step's batch. ``batch(step)`` is a
pure function of ``(seed, step)``: it draws from ``np.random.default_rng((seed, step))`` and
never from global random state, so a resumed run draws exactly the batches of an uninterrupted
one without saving any sampler state.

Samplers are dataclasses: the base class takes the arguments every sampler shares, and each
subclass declares only its own options, as keyword-only fields with their defaults (which are
also its config keys, ``sampler.<name>.<option>``), and checks them in ``__post_init__``.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, dataclass_transform

import numpy as np

from jdml.registry import Registry


@dataclass_transform(kw_only_default=True)
@dataclasses.dataclass(eq=False, repr=False)
class Sampler(abc.ABC):
    """Base class of the batch samplers.

    Every subclass is made a dataclass too (``__init_subclass__``), with keyword-only fields:
    ``Sampler(labels, *, batch_size, samples_per_class, seed, **its own options)``. Instances
    compare and hash by identity (``eq=False``).

    Args:
      labels: (N,) int training labels, one per dataset index.
      batch_size: samples per batch.
      samples_per_class: samples drawn per class (the "n" of SPC-n).
      seed: non-negative base seed of the run.

    Raises:
      ValueError: for non-1-D labels, non-positive sizes, fewer samples than ``batch_size``,
        ``batch_size`` not divisible by ``samples_per_class``, or a negative seed.
    """

    needs_memory: ClassVar[bool] = False
    """True for samplers that select from a memory of training embeddings: they produce a whole
    epoch at once with ``epoch_batches(epoch, memory)`` instead of ``batch(step)`` (see
    ``jdml.samplers.embedded``; the trainer keeps the memory, see ``jdml.samplers.memory``)."""

    labels: np.ndarray
    _: dataclasses.KW_ONLY
    batch_size: int
    samples_per_class: int
    seed: int

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Makes every subclass a dataclass whose own fields are keyword-only."""
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(kw_only=True, eq=False, repr=False)(cls)

    def __post_init__(self) -> None:
        """Checks the shared arguments; subclasses check their own after calling this."""
        labels = np.asarray(self.labels)
        batch_size, samples_per_class = self.batch_size, self.samples_per_class
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise ValueError(
                f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}"
            )
        if batch_size < 1 or samples_per_class < 1:
            raise ValueError(
                f"batch_size ({batch_size}) and samples_per_class ({samples_per_class}) "
                "must be at least 1"
            )
        if batch_size % samples_per_class:
            raise ValueError(
                f"batch size {batch_size} is not divisible by samples_per_class "
                f"{samples_per_class}; choose a batch size that is a multiple of it "
                f"(e.g. {batch_size - batch_size % samples_per_class}) or another samples_per_class"
            )
        if len(labels) < batch_size:
            raise ValueError(f"batch size {batch_size} exceeds the {len(labels)} training samples")
        if self.seed < 0:
            raise ValueError(f"seed must be non-negative, got {self.seed}")
        self.labels = labels

    @property
    def steps_per_epoch(self) -> int:
        """Batches per epoch: floor(N / batch_size), as in the reference."""
        return len(self.labels) // self.batch_size

    def rng(self, step: int) -> np.random.Generator:
        """The generator of one step, seeded by ``(seed, step)`` only."""
        if step < 0:
            raise ValueError(f"step must be non-negative, got {step}")
        return np.random.default_rng((self.seed, step))

    @abc.abstractmethod
    def batch(self, step: int) -> np.ndarray:
        """int64 (batch_size,) dataset indices of the batch at global step ``step``."""


SAMPLERS: Registry[type[Sampler]] = Registry("sampler")
