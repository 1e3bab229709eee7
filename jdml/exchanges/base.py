"""The exchange interface: an extra loss per member from every member's embeddings."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from jdml.registry import Registry


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


class Exchange:
    """What the members of a cohort exchange: ``lambda(step) * value_l`` joins member l's loss.

    Subclasses set ``metric`` (the name of the logged values: ``<metric>/loss``,
    ``<metric>/weight`` and ``member<l>/<metric>``), may declare ``section()`` (their config
    keys, placed at ``exchange.<name>``), and implement ``weight`` and ``losses``.

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

    @property
    def active(self) -> bool:
        """Whether the exchange is computed at all (False: its values are zeros)."""
        return True

    def weight(self, step: jax.Array) -> jax.Array:
        """The weight of the exchanged term at ``step`` (a float32 scalar)."""
        raise NotImplementedError

    def losses(self, embeddings: tuple[jax.Array, ...], peers: Peers) -> jax.Array:
        """Each local member's exchanged term.

        Args:
          embeddings: per group of local members, their train-mode embeddings of the main head,
            ``(n_g, B, D_g)`` (the whole batch; the groups in member order).
          peers: where the local members sit in the cohort (``gather`` to see every member).

        Returns:
          (L_local,) the term of each local member, differentiable in its own embeddings.
        """
        raise NotImplementedError


def local_members(embeddings: tuple[jax.Array, ...], fn: Callable[[jax.Array], jax.Array]) -> Any:
    """``fn`` over each member of every group, stacked on one (L_local, ...) axis in member
    order (``fn`` maps one member's (B, D) embeddings to an array of a common shape). A group
    of one calls ``fn`` unbatched: its products stay plain matrix products (a batched one may
    round differently)."""
    out = [fn(e[0])[None] if e.shape[0] == 1 else jax.vmap(fn)(e) for e in embeddings]
    return out[0] if len(out) == 1 else jnp.concatenate(out)


EXCHANGES: Registry[type[Exchange]] = Registry("exchange")
