"""Loss terms of a method: a registered loss with its miner on one head, and DaNCE.

A method (``jdml.methods.method.Method``) is a set of terms over named embedding heads of one
backbone, plus an optional decorrelation between heads. The Revisiting methods have one metric
term; DiVA adds metric terms on class-shared and intra-class heads and a DaNCE term; Sharing
Matters adds a metric term with cross-class triplets on a shared head.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jdml.losses import LOSSES
from jdml.losses.dance import dance_loss
from jdml.methods.ema_queue import KeyQueue, valid_mask
from jdml.miners import make_miner
from jdml.optim import Group

Metrics = dict[str, jax.Array]


def _loss_kwargs(loss: ml_collections.ConfigDict, miner_name: str, num_classes: int) -> dict:
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


class MetricTerm:
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
        self.loss = self.loss_cls(**_loss_kwargs(loss, miner.name, num_classes))
        self.miner = (
            make_miner(miner.name, **miner[miner.name].to_dict())
            if self.loss_cls.needs_miner
            else None
        )

    def init(self, key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Any:
        """The loss's own learnable parameters (``{}`` for a loss without any)."""
        tuples = self.miner(key, embeddings, labels) if self.miner is not None else None
        return self.loss.init(key, embeddings, labels, tuples).get("params", {})

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

    def param_group(self, optim: ml_collections.ConfigDict) -> Group:
        """The loss parameters' learning rate (own value or multiplier) and no weight decay."""
        lr = optim.lr
        if self.loss_cls.param_lr is not None:
            value = self.loss_config[self.loss_config.name][self.loss_cls.param_lr]
            lr = value * optim.lr if self.loss_cls.param_lr_is_multiplier else value
        return Group(lr, 0.0)


class DanceTerm:
    """DiVA's DaNCE on one head: online queries on view a, EMA-network keys on view b, and a
    FIFO queue of past keys as negatives (see ``jdml.losses.dance``).

    The EMA key parameters and the queue live in the train state (``method_state[<term>]``) and
    are updated inside the jitted step after the optimiser update.
    """

    views = 2

    def __init__(self, cfg: ml_collections.ConfigDict, *, batch_size: int, dim: int) -> None:
        self.head, self.weight = cfg.head, float(cfg.weight)
        self.cfg = cfg
        self.queue_size = int(cfg.queue_batches) * batch_size
        self.dim = dim
        if self.queue_size < batch_size:
            raise ValueError(f"DaNCE queue_batches must be >= 1, got {cfg.queue_batches}")

    def init_state(self, model_params: Any) -> dict[str, Any]:
        """EMA key parameters (a copy of the online ones) and an empty key queue."""
        return {
            "ema": jax.tree.map(jnp.array, model_params),
            "queue": KeyQueue.create(self.queue_size, self.dim),
        }

    def __call__(
        self, queries: jax.Array, keys: jax.Array, state: dict[str, Any]
    ) -> tuple[jax.Array, Metrics]:
        queue: KeyQueue = state["queue"]
        loss, metrics = dance_loss(
            queries,
            jax.lax.stop_gradient(keys),
            queue.keys,
            temperature=self.cfg.temperature,
            lower_cutoff=self.cfg.lower_cutoff,
            upper_cutoff=self.cfg.upper_cutoff,
            normalize=self.cfg.normalize,
            weighting=self.cfg.weighting,
            queue_valid=valid_mask(queue),
        )
        return loss, {**metrics, "loss": loss}
