"""A cohort's embeddings by name: every member's heads (``member<l>`` its main head,
``member<l>/<head>`` its others), each member evaluated alone and the members' concatenation
(``ensemble``), as DM2 evaluates its cohorts."""

from __future__ import annotations

import functools
from typing import Any

import jax
import ml_collections

from jdml.backends import Backends
from jdml.cohort.layout import Layout, make_layout
from jdml.cohort.members import member_configs, member_name, over_members
from jdml.embedder import Embedder, Embeddings


class CohortEmbeddings(Embeddings):
    """The embeddings of a cohort's members.

    Args:
      config: the run config.
      layout: how the members' params are stored (``jdml.cohort.layout``).
      embedders: each group's network (``layout.group_sizes``).
      loop: how a group's members are run (``cohort.member_loop``).
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        layout: Layout,
        embedders: tuple[Embedder, ...],
        loop: str,
    ) -> None:
        super().__init__(config, embedders[0])
        self.layout, self.embedders, self.loop = layout, embedders, loop
        self.head = member_name(0)

    def _member_embedders(self) -> list[Embedder]:
        sizes = self.layout.group_sizes
        return [e for e, n in zip(self.embedders, sizes, strict=True) for _ in range(n)]

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """Per member ``member<l>`` (its main head) and ``member<l>/<head>`` (its others)."""
        return tuple(
            _name(i, embedder, head)
            for i, embedder in enumerate(self._member_embedders())
            for head in sorted(embedder.heads, key=lambda h: h != embedder.head)
        )

    @functools.cached_property
    def eval_config(self) -> ml_collections.ConfigDict:
        """``eval`` with every member evaluated alone and the ensemble (their concatenation)."""
        cfg = ml_collections.ConfigDict(self.config.eval.to_dict())
        cfg.heads = self.ensemble
        cfg.combinations = ((1.0,) * self.layout.size,)
        return cfg

    @property
    def ensemble(self) -> tuple[str, ...]:
        return self.layout.names

    def network_params(self, params: Any) -> Any:
        layout = self.layout
        return layout.join(tuple({"model": g["model"]} for g in layout.split(params)))

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Every member's eval-mode embeddings, each group's members run as the step runs
        them (``cohort.member_loop``)."""
        layout, out, index = self.layout, {}, 0
        groups = zip(self.embedders, layout.split(params), layout.split(batch_stats), strict=True)
        for embedder, group_params, group_stats in groups:
            embed = lambda p, s, e=embedder: e(p["model"], s, images)  # noqa: E731
            embedded = over_members(embed, self.loop, group_params, group_stats)
            count = jax.tree.leaves(group_params)[0].shape[0]
            for i in range(count):
                for head, emb in embedded.items():
                    out[_name(index + i, embedder, head)] = emb[i]
            index += count
        return out


def _name(index: int, embedder: Embedder, head: str) -> str:
    """A head's name: ``member<l>`` for member l's main head, ``member<l>/<head>`` for others."""
    return member_name(index) + ("" if head == embedder.head else f"/{head}")


def member_loop(config: ml_collections.ConfigDict) -> str:
    """How the members of a group run: ``cohort.member_loop``, unrolled for a heterogeneous
    cohort (groups of one)."""
    return "unroll" if config.cohort.members else str(config.cohort.member_loop)


def cohort_embeddings(
    config: ml_collections.ConfigDict, backends: Backends | None = None
) -> CohortEmbeddings:
    """A cohort's embeddings from its config alone (each member's network, no losses)."""
    configs = member_configs(config) or (config,)
    embedders = tuple(Embedder(c, backends) for c in configs)
    layout = make_layout(config, listed=bool(config.cohort.members))
    return CohortEmbeddings(config, layout, embedders, member_loop(config))
