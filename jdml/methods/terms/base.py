"""The protocol every kind of loss term implements, and the ``TERMS`` registry of kinds.

A term kind is a ``Term`` subclass registered under its kind name, with the ranges of its
numeric config keys. It owns its config section (``section``), the checks of that section
(``validate``, ``components``), and everything the method and the step ask of it: its own
learnable parameters and their optimiser group, the state it carries between steps, its value
on a batch, the update of its state after the optimiser step, and the filling of that state
before the first step. The method and the run call these for every term without knowing kinds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import jax
import ml_collections
import numpy as np

from jdml.optim import Group
from jdml.registry import Registry

Metrics = dict[str, jax.Array]


@dataclasses.dataclass(frozen=True)
class TermInputs:
    """What a term sees of one batch inside the step.

    Attributes:
      out: train-mode embeddings of every head, ``{head: (B, dim)}``.
      labels: (B,) class labels.
      key: the term's PRNG key for this step.
      batch: the whole batch (views, streams, indices).
      batch_stats: the model's BatchNorm statistics before the step.
      state: the term's own state (``None`` for a term without one).
      network: ``network(params, images)``: every head's train-mode embeddings of ``images``
        under other model parameters (e.g. an EMA copy), BatchNorm statistics not updated.
    """

    out: dict[str, jax.Array]
    labels: jax.Array
    key: jax.Array
    batch: dict[str, jax.Array]
    batch_stats: Any
    state: Any
    network: Callable[[Any, jax.Array], dict[str, jax.Array]]


class PrefillSource(Protocol):
    """What a term may read before the first step (``jdml.run.Run.prepare``)."""

    def embed_training_images(
        self, count: int, embed: Callable[[np.ndarray], Any]
    ) -> tuple[np.ndarray, np.ndarray]:
        """``embed`` over ``count`` augmented training images drawn with a fixed seed, in
        batches: the outputs concatenated on their second-to-last axis, and the labels."""
        ...

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """The program's ``(keys(ema, batch_stats, images), push(queue, keys, labels))`` over
        every member (``jdml.program.Program.key_functions``)."""
        ...


class Term:
    """One loss term on one embedding head, weighted in the method's total.

    Subclasses set ``kind`` (by registering), may set ``views`` (image views per sample the term
    needs) and override the hooks below; the defaults describe a term without parameters or
    state.

    Attributes:
      head: the embedding head the term trains.
      weight: its weight in the total loss.
    """

    kind: ClassVar[str] = ""
    views: ClassVar[int] = 1
    stateful: ClassVar[bool] = False  # whether ``init_state`` returns a state (filled by prefill)
    head: str
    weight: float

    # -- configuration ------------------------------------------------------------------------

    @classmethod
    def section(cls, **kwargs: Any) -> ml_collections.ConfigDict:
        """The term's config section (``aux.<name>``): ``kind``, ``head``, ``dim``, ``weight``
        and the kind's own keys."""
        raise NotImplementedError

    @classmethod
    def validate(cls, where: str, cfg: ml_collections.ConfigDict) -> None:
        """Checks beyond the numeric ranges; raises ``ConfigError`` naming ``where``."""

    @classmethod
    def components(
        cls, where: str, cfg: ml_collections.ConfigDict
    ) -> list[tuple[str, ml_collections.ConfigDict, Registry]]:
        """``(key prefix, section, registry)`` of the registered components the term selects
        (their hyperparameters are range-checked with the config)."""
        return []

    @classmethod
    def build(
        cls, cfg: ml_collections.ConfigDict, *, num_classes: int, batch_size: int, dim: int
    ) -> Term:
        """The term of a config section."""
        raise NotImplementedError

    # -- parameters and state -----------------------------------------------------------------

    def init_params(self, key: jax.Array, out: dict[str, jax.Array], labels: jax.Array) -> Any:
        """The term's own learnable parameters, or None for a term without a params group."""
        return None

    def param_group(self) -> Group | None:
        """How the term's parameters learn (``jdml.optim.Group``; None: it has none)."""
        return None

    def init_state(self, model_params: Any) -> Any:
        """The state the term carries between steps, or None."""
        return None

    # -- the step -----------------------------------------------------------------------------

    def apply(self, params: Any, inputs: TermInputs) -> tuple[jax.Array, Metrics, Any]:
        """``(value, metrics, output)`` on one batch; ``output`` (None: nothing) is passed to
        ``update_state`` after the optimiser update."""
        raise NotImplementedError

    def update_state(self, state: Any, model_params: Any, output: Any, labels: jax.Array) -> Any:
        """The term's state after the optimiser update, from ``apply``'s output."""
        return state

    def prefill(self, state: Any, batch_stats: Any, source: PrefillSource) -> Any:
        """The term's state before the first step (e.g. a queue filled with keys)."""
        return state


#: Term kinds by name (``aux.<term>.kind``), with the ranges of their numeric keys.
TERMS: Registry[type[Term]] = Registry("term kind")
