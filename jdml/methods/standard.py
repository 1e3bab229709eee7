"""The standard method: one embedding head trained with one ranking/classification loss.

This is the Revisiting-DML setting (Roth et al., ICML 2020): backbone -> linear embedding ->
L2 normalisation, a batch miner choosing tuples on the detached embeddings, and a loss over them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from jdml.losses import LOSSES
from jdml.miners import make_miner
from jdml.models import build_model
from jdml.optim import Group

Metrics = dict[str, jax.Array]


def _loss_kwargs(config: ml_collections.ConfigDict, num_classes: int, cls: type) -> dict:
    """The loss's configured hyperparameters plus the runtime fields it declares."""
    section = config.loss[config.loss.name]
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in section.to_dict().items()}
    fields = {f.name for f in dataclasses.fields(cls)}
    if "num_classes" in fields:
        kwargs["num_classes"] = num_classes
    if "miner_name" in fields:
        kwargs["miner_name"] = config.miner.name if cls.needs_miner else ""
    return kwargs


class StandardMethod:
    """Wires model, miner and loss for the train step and the evaluator.

    Args:
      config: the full run config.
      num_classes: number of training classes (sizes per-class loss parameters).
    """

    def __init__(self, config: ml_collections.ConfigDict, num_classes: int) -> None:
        self.config = config
        self.head = config.model.head
        self.train_model = build_model(config.model, train=True)
        self.eval_model = build_model(config.model, train=False)
        loss_cls = LOSSES.get(config.loss.name)
        self.loss_cls = loss_cls
        self.loss = loss_cls(**_loss_kwargs(config, num_classes, loss_cls))
        miner_name = config.miner.name
        self.miner = (
            make_miner(miner_name, **config.miner[miner_name].to_dict())
            if loss_cls.needs_miner
            else None
        )
        self.mean, self.std = float(config.data.mean), float(config.data.std)

    def preprocess(self, images: jax.Array) -> jax.Array:
        """Maps [0, 1] images to the network's input range."""
        return (images.astype(jnp.float32) - self.mean) / self.std

    def init(self, key: jax.Array, images: jax.Array) -> tuple[Any, Any]:
        """Returns ``(params, batch_stats)`` for a sample batch of images."""
        k_model, k_loss = jax.random.split(key)
        variables = self.train_model.init(k_model, self.preprocess(images))
        emb = self.eval_model.apply(variables, self.preprocess(images))[self.head]
        labels = jnp.zeros((images.shape[0],), jnp.int32)
        params = {"model": variables["params"], "loss": self.init_loss(k_loss, emb, labels)}
        return params, variables.get("batch_stats", {})

    def init_loss(self, key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Any:
        """The loss's own learnable parameters (``{}`` for a loss without any)."""
        tuples = self.miner(key, embeddings, labels) if self.miner is not None else None
        return self.loss.init(key, embeddings, labels, tuples).get("params", {})

    def head_loss(
        self, loss_params: Any, embeddings: jax.Array, labels: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, Metrics]:
        """Mines tuples on the detached embeddings and applies the loss to them."""
        tuples = None
        metrics: Metrics = {}
        if self.miner is not None:
            tuples = self.miner(key, jax.lax.stop_gradient(embeddings), labels)
            metrics["valid_tuples"] = jnp.mean(tuples.valid.astype(jnp.float32))
        loss, loss_metrics = self.loss.apply({"params": loss_params}, embeddings, labels, tuples)
        metrics.update(loss_metrics)
        metrics["loss"] = loss
        return loss, metrics

    def param_groups(self) -> dict[str, Group]:
        """Learning rate and weight decay of each params subtree (loss params: own lr, no decay)."""
        optim = self.config.optim
        loss_lr = optim.lr
        if self.loss_cls.param_lr is not None:
            value = self.config.loss[self.config.loss.name][self.loss_cls.param_lr]
            loss_lr = value * optim.lr if self.loss_cls.param_lr_is_multiplier else value
        return {"model": Group(optim.lr, optim.weight_decay), "loss": Group(loss_lr, 0.0)}

    def loss_fn(
        self, params: Any, batch_stats: Any, batch: dict[str, jax.Array], key: jax.Array
    ) -> tuple[jax.Array, tuple[Any, Metrics, jax.Array]]:
        """Total loss of one batch; returns ``(loss, (new_batch_stats, metrics, embeddings))``.

        The embeddings (of the trained head, train mode) feed the samplers' embedding memory.
        """
        out, updates = self.train_model.apply(
            {"params": params["model"], "batch_stats": batch_stats},
            self.preprocess(batch["images"]),
            mutable=["batch_stats"],
        )
        loss, metrics = self.head_loss(params["loss"], out[self.head], batch["labels"], key)
        new_stats = updates.get("batch_stats", batch_stats)
        return loss, (new_stats, metrics, out[self.head])

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Eval-mode embeddings of every head, ``{head: (B, dim)}``."""
        return self.eval_model.apply(
            {"params": params["model"], "batch_stats": batch_stats}, self.preprocess(images)
        )
