"""The metric term: a registered loss with its own miner on one head.

Every method's main term is one (its sections are the top-level ``loss`` and ``miner``); DiVA's
class-shared and intra-class terms and Sharing Matters' shared term are auxiliary ones
(``aux.<name>.kind = "metric"``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jdml.errors import ConfigError
from jdml.keys import component_section
from jdml.losses import LOSSES, compatible_miners
from jdml.methods.terms.base import TERMS, Metrics, Term, TermInputs
from jdml.miners import MINERS, make_miner
from jdml.optim import Group
from jdml.registry import NON_NEGATIVE, Range


def check_sections(
    prefix: str, loss: ml_collections.ConfigDict, miner: ml_collections.ConfigDict
) -> None:
    """A known loss and miner, and a miner the loss accepts (none for a loss that mines its own
    pairs).

    Args:
      prefix: where the sections sit (``""`` or ``aux.<term>.``), for the message.
      loss: the loss section.
      miner: the miner section (``name = ""``: no miner).

    Raises:
      ConfigError: naming the key to change and the names to choose from.
    """
    if loss.name not in LOSSES:
        raise ConfigError(
            f"{prefix}loss.name={loss.name!r} is not a known loss; choose one of: "
            + ", ".join(LOSSES.names())
        )
    name = miner.name or None
    if name is not None and name not in MINERS:
        raise ConfigError(
            f"{prefix}miner.name={name!r} is not a known miner; choose one of: "
            + ", ".join(MINERS.names())
        )
    if not LOSSES.get(loss.name).needs_miner:
        if name is not None:
            raise ConfigError(
                f"{prefix}loss.name={loss.name} mines its own pairs and takes no miner, but "
                f"{prefix}miner.name={name}; set --config.{prefix}miner.name=''"
            )
        return
    allowed = compatible_miners(loss.name)
    if name not in allowed:
        got = f"{prefix}miner.name={name}" if name else f"no miner ({prefix}miner.name='')"
        raise ConfigError(
            f"{prefix}loss.name={loss.name} cannot be trained with {got}; compatible miners: "
            f"{', '.join(allowed)} (set --config.{prefix}miner.name to one of them)"
        )


def loss_kwargs(loss: ml_collections.ConfigDict, miner_name: str, num_classes: int) -> dict:
    """The loss's configured hyperparameters plus the runtime fields it declares."""
    cls = LOSSES.get(loss.name)
    section = loss[loss.name]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in section.to_dict().items()}
    fields = {f.name for f in dataclasses.fields(cls)}
    if "num_classes" in fields:
        kwargs["num_classes"] = num_classes
    if "miner_name" in fields:
        kwargs["miner_name"] = miner_name if cls.needs_miner else ""
    return kwargs


@TERMS.register("metric", ranges={"dim": Range(0, integer=True), "weight": NON_NEGATIVE})
class MetricTerm(Term):
    """A registered loss on one head's embeddings, with tuples from its own miner.

    Args:
      head: the embedding head.
      weight: the term's weight in the total loss.
      loss: a loss config section (``name`` plus every loss's hyperparameters).
      miner: a miner config section (``name`` plus every miner's hyperparameters).
      num_classes: number of training classes (sizes per-class loss parameters).
    """

    def __init__(
        self,
        *,
        head: str,
        weight: float,
        loss: ml_collections.ConfigDict,
        miner: ml_collections.ConfigDict,
        num_classes: int,
    ) -> None:
        self.head, self.weight = head, float(weight)
        self.loss_cls = LOSSES.get(loss.name)
        self.loss_config = loss
        self.loss = self.loss_cls(**loss_kwargs(loss, miner.name, num_classes))
        self.miner = (
            make_miner(miner.name, **miner[miner.name].to_dict())
            if self.loss_cls.needs_miner
            else None
        )

    @classmethod
    def section(
        cls, loss: str, miner: str, *, head: str, weight: float, dim: int = 0
    ) -> ml_collections.ConfigDict:
        """An auxiliary metric term's section: a registered loss on ``head``'s embeddings with
        its own miner.

        The section has every registered loss and miner with its defaults (as the top-level
        ``loss``/``miner`` sections), so ``--config.aux.<term>.loss.margin.beta=...`` works; the
        loss's learnable parameters (e.g. its own per-class betas) are separate from the main
        loss's.

        Args:
          loss: registered loss name.
          miner: registered miner name ("" for a loss that mines its own pairs).
          head: embedding head the term trains (created if no other term uses it).
          weight: the term's weight in the total loss.
          dim: the head's dimension (0: ``model.embed_dim``).
        """
        t = ml_collections.ConfigDict()
        t.kind = "metric"
        t.head = head
        t.dim = dim
        t.weight = weight
        t.loss = component_section(LOSSES)
        t.loss.name = loss
        t.miner = component_section(MINERS)
        t.miner.name = miner
        return t

    @classmethod
    def validate(cls, where: str, cfg: ml_collections.ConfigDict) -> None:
        check_sections(f"{where}.", cfg.loss, cfg.miner)

    @classmethod
    def components(cls, where: str, cfg: ml_collections.ConfigDict) -> list:
        return [(f"{where}.loss", cfg.loss, LOSSES), (f"{where}.miner", cfg.miner, MINERS)]

    @classmethod
    def build(
        cls, cfg: ml_collections.ConfigDict, *, num_classes: int, batch_size: int, dim: int
    ) -> MetricTerm:
        return cls(
            head=cfg.head,
            weight=cfg.weight,
            loss=cfg.loss,
            miner=cfg.miner,
            num_classes=num_classes,
        )

    def init_params(self, key: jax.Array, out: dict[str, jax.Array], labels: jax.Array) -> Any:
        return self.init(key, out[self.head], labels)

    def init(self, key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Any:
        """The loss's own learnable parameters (``{}`` for a loss without any)."""
        tuples = self.miner(key, embeddings, labels) if self.miner is not None else None
        return self.loss.init(key, embeddings, labels, tuples).get("params", {})

    def apply(self, params: Any, inputs: TermInputs) -> tuple[jax.Array, Metrics, Any]:
        value, metrics = self(params, inputs.out[self.head], inputs.labels, inputs.key)
        return value, metrics, None

    def __call__(
        self, params: Any, embeddings: jax.Array, labels: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, Metrics]:
        """Mines tuples on the detached embeddings and applies the loss to them."""
        tuples = None
        metrics: Metrics = {}
        if self.miner is not None:
            tuples = self.miner(key, jax.lax.stop_gradient(embeddings), labels)
            metrics["valid_tuples"] = jnp.mean(tuples.valid.astype(jnp.float32))
        loss, loss_metrics = self.loss.apply({"params": params}, embeddings, labels, tuples)
        metrics.update(loss_metrics)
        metrics["loss"] = loss
        return loss, metrics

    def param_group(self) -> Group:
        """The loss parameters' learning rate (the loss's own value, or its multiple of
        ``optim.lr``; without one ``optim.lr``) and no weight decay."""
        if self.loss_cls.param_lr is None:
            return Group(weight_decay=0.0)
        value = float(self.loss_config[self.loss_config.name][self.loss_cls.param_lr])
        if self.loss_cls.param_lr_is_multiplier:
            return Group(weight_decay=0.0, lr_scale=value)
        return Group(value, 0.0)
