"""Optimisers and learning-rate schedules with per-group learning rates and weight decay.

The reference (Roth et al., ICML 2020) trains the network with Adam and *coupled* weight decay
(PyTorch's ``Adam(weight_decay=...)``: the decay is added to the gradient before the moment
estimates, unlike AdamW), and gives learnable loss parameters (margin betas, proxies, ...) their own
learning rate and no weight decay. Both schedules are applied per epoch, as its MultiStepLR is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax


class Group(NamedTuple):
    """Learning rate and weight decay of one top-level subtree of the params."""

    lr: float
    weight_decay: float


def lr_multiplier(cfg: ml_collections.ConfigDict, steps_per_epoch: int, total_steps: int):
    """Returns ``step -> multiplier`` of the base learning rate.

    ``multistep``: multiply by ``gamma`` at each epoch in ``milestones`` (reference MultiStepLR, its
    default milestone 1000 means no decay in practice); ``cosine``: cosine decay to 0 over the run;
    ``constant``. An optional linear warm-up over ``warmup_epochs`` multiplies any of them.
    """
    if cfg.schedule == "constant":
        sched = optax.constant_schedule(1.0)
    elif cfg.schedule == "multistep":
        sched = optax.piecewise_constant_schedule(
            1.0, {int(m) * steps_per_epoch: float(cfg.gamma) for m in cfg.milestones}
        )
    elif cfg.schedule == "cosine":
        sched = optax.cosine_decay_schedule(1.0, max(total_steps, 1))
    else:
        raise ValueError(f"unknown schedule {cfg.schedule!r}; choose constant, multistep or cosine")
    warm = int(cfg.warmup_epochs * steps_per_epoch)
    if warm <= 0:
        return sched
    return lambda step: sched(step) * jnp.minimum(1.0, (step + 1) / warm)


def _group_tx(
    cfg: ml_collections.ConfigDict, group: Group, multiplier
) -> optax.GradientTransformation:
    parts = []
    if group.weight_decay:
        parts.append(optax.add_decayed_weights(group.weight_decay))
    if cfg.name == "adam":
        parts.append(optax.scale_by_adam())
    elif cfg.name == "sgd":
        parts.append(optax.trace(decay=0.9))
    else:
        raise ValueError(f"unknown optimiser {cfg.name!r}; choose adam or sgd")
    parts.append(optax.scale_by_learning_rate(lambda step: group.lr * multiplier(step)))
    return optax.chain(*parts)


def make_optimizer(
    cfg: ml_collections.ConfigDict,
    groups: Mapping[str, Group],
    *,
    steps_per_epoch: int,
    total_steps: int,
    frozen: Callable[[tuple[str, ...]], bool] | None = None,
) -> optax.GradientTransformation:
    """Builds the optimiser for params shaped ``{group_name: subtree, ...}``.

    Args:
      cfg: the ``optim`` config section.
      groups: learning rate and weight decay per top-level key of the params tree.
      steps_per_epoch: optimiser steps per epoch (schedules are stated in epochs).
      total_steps: steps of the whole run (for the cosine schedule).
      frozen: a leaf's path of dict keys -> whether it stays fixed (zero update, no weight
        decay, no optimiser state); None freezes nothing.
    """
    multiplier = lr_multiplier(cfg, steps_per_epoch, total_steps)
    transforms = {name: _group_tx(cfg, g, multiplier) for name, g in groups.items()}
    if frozen is None:
        return optax.multi_transform(transforms, lambda params: {name: name for name in params})
    transforms[FROZEN] = optax.set_to_zero()

    def labels(params):
        def label(path, _):
            keys = tuple(str(getattr(k, "key", k)) for k in path)
            return FROZEN if frozen(keys) else keys[0]

        return jax.tree_util.tree_map_with_path(label, params)

    return optax.multi_transform(transforms, labels)


#: The label of frozen leaves (not a params group name: those are dict keys of the model).
FROZEN = "__frozen__"
