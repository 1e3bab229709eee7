"""The exchange interface: what the members of a cohort add to each other's losses, and how
they differ from each other (their diversities).

An exchange reads the local members' :class:`MemberOutputs` (train-mode embeddings, their
params, from which it may compute class logits or anything else of a member's network, the
labels, and its own per-member state) and gives each member a term ``value_l`` that joins its
loss with weight ``lambda(step)``, and its new state. It also declares how the members differ:
their own initialisation of the embedding heads, their own views of the batch, and the
probability with which each applies its update (DM2's model, view and temporal diversity).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jdml.registry import Registry

#: The key of an exchange's per-member state in each member's ``method_state``.
EXCHANGE_STATE = "exchange"


@dataclasses.dataclass(frozen=True)
class Peers:
    """Where this step's members sit in the cohort.

    Attributes:
      gather: ``(L_local, ...) -> (L, ...)``: concatenates every device's members on the leading
        axis, in member order (the identity when all members are local).
      offset: cohort index of the first local member.
      size: the number of members of the cohort, ``L``.
    """

    gather: Callable[[jax.Array], jax.Array]
    offset: jax.Array | int
    size: int


@dataclasses.dataclass(frozen=True)
class MemberOutputs:
    """What an exchange reads of the local members, per group of members (in member order;
    every array has a leading ``(n_g,)`` member axis).

    Attributes:
      embeddings: the train-mode embeddings of the main head, ``(n_g, B, D_g)``.
      params: the groups' params (``{"model", "loss", ...}``, differentiable: a term computed
        from them, such as logits over the main loss's class map, trains them).
      labels: (B,) the batch's class labels.
      state: the groups' exchange states (``Exchange.init_state``; None without one).
    """

    embeddings: tuple[jax.Array, ...]
    params: tuple[Any, ...]
    labels: jax.Array
    state: tuple[Any, ...] | None


class Exchanged(NamedTuple):
    """An exchange's result: (L_local,) each local member's term, and the groups' new states
    (None for an exchange without one)."""

    values: jax.Array
    state: tuple[Any, ...] | None = None


class Exchange:
    """What the members of a cohort exchange: ``lambda(step) * value_l`` joins member l's loss.

    Subclasses set ``metric`` (the name of the logged values: ``<metric>/loss``,
    ``<metric>/weight`` and ``member<l>/<metric>``), may declare ``section()`` (their config
    keys, placed at ``exchange.<name>``), the members' diversities and a per-member state, and
    implement ``weight`` and ``losses``.

    Args:
      config: the full run config.
      steps_per_epoch: for schedules of the weight in epochs.
    """

    metric: ClassVar[str] = "exchange"

    def __init__(self, config: ml_collections.ConfigDict, steps_per_epoch: int = 1) -> None:
        self.config = config
        self.steps_per_epoch = steps_per_epoch

    @classmethod
    def section(cls) -> dict[str, Any]:
        """The exchange's own config keys and defaults (``exchange.<name>``); none by default."""
        return {}

    @classmethod
    def check(cls, section: ml_collections.ConfigDict) -> None:
        """Checks the exchange's section beyond its registered ranges (e.g. a choice of names);
        raises ``jdml.errors.ConfigError`` naming the key and the choices."""

    # -- the members' diversities ---------------------------------------------------------------

    @property
    def model_diversity(self) -> bool:
        """Whether member l > 1 draws its embedding heads (a listed member: its whole network)
        from its own key (default: yes; else every member starts as member 1)."""
        return True

    @property
    def view_diversity(self) -> bool:
        """Whether each member views the batch through its own augmentation (default: no)."""
        return False

    def update_probabilities(self, size: int) -> np.ndarray:
        """(size,) float32: the probability that each member applies its update at a step
        (default: every member every step)."""
        return np.ones(size, np.float32)

    # -- the exchanged term ---------------------------------------------------------------------

    @property
    def active(self) -> bool:
        """Whether the exchange is computed at all (False: its values are zeros)."""
        return True

    def init_state(self, params: Any) -> Any:
        """One member's exchange state at step 0 from its params (None: the exchange keeps no
        state). It is stored with the member's other state, checkpointed, and kept unchanged
        for a member that does not apply its update."""
        return None

    def weight(self, step: jax.Array) -> jax.Array:
        """The weight of the exchanged term at ``step`` (a float32 scalar)."""
        raise NotImplementedError

    def losses(self, outputs: MemberOutputs, peers: Peers) -> Exchanged:
        """Each local member's exchanged term, differentiable in its own outputs (``peers.gather``
        sees every member's), and its new state.

        Returns:
          :class:`Exchanged`: the (L_local,) terms and the groups' new states (None without
          a state).
        """
        raise NotImplementedError


def local_members(embeddings: tuple[jax.Array, ...], fn: Callable[..., jax.Array]) -> Any:
    """``fn`` over each member of every group, stacked on one (L_local, ...) axis in member
    order (``fn`` maps one member's (B, D) embeddings to an array of a common shape). A group
    of one calls ``fn`` unbatched: its products stay plain matrix products (a batched one may
    round differently)."""
    out = [fn(e[0])[None] if e.shape[0] == 1 else jax.vmap(fn)(e) for e in embeddings]
    return out[0] if len(out) == 1 else jnp.concatenate(out)


EXCHANGES: Registry[type[Exchange]] = Registry("exchange")
