"""Optimisers and learning-rate schedules with per-group learning rates and weight decay.

The reference (Roth et al., ICML 2020) trains the network with Adam and *coupled* weight decay
(PyTorch's ``Adam(weight_decay=...)``: the decay is added to the gradient before the moment
estimates, unlike AdamW), and gives learnable loss parameters (margin betas, proxies, ...) their own
learning rate and no weight decay. Both schedules are applied per epoch, as its MultiStepLR is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jdml.registry import Registry

Schedule = Callable[[ml_collections.ConfigDict, int, int], optax.Schedule]
#: ``optim.schedule``: (the ``optim`` section, steps per epoch, total steps) -> step -> multiplier.
SCHEDULES: Registry[Schedule] = Registry("schedule")
#: ``optim.name``: the ``optim`` section -> the update direction (before the learning rate).
OPTIMIZERS: Registry[Callable[[ml_collections.ConfigDict], optax.GradientTransformation]] = (
    Registry("optimiser")
)


@SCHEDULES.register("constant")
def _constant(cfg: ml_collections.ConfigDict, steps_per_epoch: int, total_steps: int):
    """The base learning rate throughout."""
    return optax.constant_schedule(1.0)


@SCHEDULES.register("multistep")
def _multistep(cfg: ml_collections.ConfigDict, steps_per_epoch: int, total_steps: int):
    """Multiplied by ``gamma`` at each epoch in ``milestones`` (the reference's MultiStepLR; its
    default milestone 1000 means no decay in practice)."""
    return optax.piecewise_constant_schedule(
        1.0, {int(m) * steps_per_epoch: float(cfg.gamma) for m in cfg.milestones}
    )


@SCHEDULES.register("cosine")
def _cosine(cfg: ml_collections.ConfigDict, steps_per_epoch: int, total_steps: int):
    """Cosine decay to 0 over the run."""
    return optax.cosine_decay_schedule(1.0, max(total_steps, 1))


@OPTIMIZERS.register("adam")
def _adam(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Adam's moment estimates (the weight decay, coupled, is added to the gradient before)."""
    return optax.scale_by_adam()


@OPTIMIZERS.register("sgd")
def _sgd(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """SGD with momentum 0.9."""
    return optax.trace(decay=0.9)


class Group(NamedTuple):
    """Learning rate and weight decay of one top-level subtree of the params."""

    lr: float
    weight_decay: float


def lr_multiplier(cfg: ml_collections.ConfigDict, steps_per_epoch: int, total_steps: int):
    """Returns ``step -> multiplier`` of the base learning rate.

    The schedule is ``SCHEDULES[cfg.schedule]`` (``constant``, ``multistep``, ``cosine``); an
    optional linear warm-up over ``warmup_epochs`` multiplies any of them.
    """
    sched = SCHEDULES.get(cfg.schedule)(cfg, steps_per_epoch, total_steps)
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
    parts.append(OPTIMIZERS.get(cfg.name)(cfg))
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


def per_member(txs: Mapping[str, optax.GradientTransformation]) -> optax.GradientTransformation:
    """One optimiser over params ``{member name: member params}``: each member's own
    transformation (heterogeneous DM2 cohorts, whose members have different param trees and
    frozen parts) on its own subtree, with its own state."""

    def init(params: Any) -> dict[str, Any]:
        return {name: tx.init(params[name]) for name, tx in txs.items()}

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        out = {
            name: tx.update(updates[name], state[name], None if params is None else params[name])
            for name, tx in txs.items()
        }
        return {k: v[0] for k, v in out.items()}, {k: v[1] for k, v in out.items()}

    return optax.GradientTransformation(init, update)
