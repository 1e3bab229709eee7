"""Optimisers and learning-rate schedules with per-group learning rates and weight decay.

The reference (Roth et al., ICML 2020) trains the network with Adam and *coupled* weight decay
(PyTorch's ``Adam(weight_decay=...)``: the decay is added to the gradient before the moment
estimates, unlike AdamW), and gives learnable loss parameters (margin betas, proxies, ...) their own
learning rate and no weight decay. Both schedules are applied per epoch, as its MultiStepLR is.

The recipe of today's transformer DML (``optim.name="adamw"``, warm-up then ``cosine``) needs
more, all off by default: AdamW's *decoupled* decay (Loshchilov and Hutter, ICLR 2019: applied
after the moment estimates, scaled by the learning rate, as PyTorch's ``AdamW``), clipping of the
gradients' global norm (``optim.clip_norm``), no decay on chosen parameters (``optim.no_decay``:
``"1d"`` for every parameter of fewer than 2 dimensions, norms and biases, and names such as
``cls_token`` or ``pos_embed``), and the backbone at a multiple of the learning rate
(``optim.backbone_lr_multiplier``).
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


@OPTIMIZERS.register("adamw")
def _adamw(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
    """Adam's moment estimates; the weight decay, decoupled, is added after them (AdamW)."""
    return optax.scale_by_adam()


# The optimisers whose weight decay is decoupled: added to the update after the optimiser's own
# transformation (then scaled by the learning rate), not to the gradient before it.
DECOUPLED_DECAY = frozenset({"adamw"})


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


def decay_mask(rules: tuple[str, ...]) -> Callable[[Any], Any] | None:
    """``optim.no_decay`` as an optax mask: params -> a tree of bools, True where the weight
    decay applies. A rule is ``"1d"`` (no decay on parameters of fewer than 2 dimensions: norm
    scales and biases) or a name (no decay on a parameter any of whose path keys is that name,
    e.g. ``cls_token``). None (decay everywhere) for no rule."""
    if not rules:
        return None
    names = {rule for rule in rules if rule != "1d"}

    def mask(params: Any) -> Any:
        def decays(path: Any, leaf: Any) -> bool:
            keys = {str(getattr(k, "key", getattr(k, "name", k))) for k in path}
            return not (("1d" in rules and jnp.ndim(leaf) < 2) or keys & names)

        return jax.tree_util.tree_map_with_path(decays, params)

    return mask


def _group_tx(
    cfg: ml_collections.ConfigDict, group: Group, multiplier
) -> optax.GradientTransformation:
    decay = []
    if group.weight_decay:
        mask = decay_mask(tuple(cfg.get("no_decay", ())))
        decay.append(optax.add_decayed_weights(group.weight_decay, mask))
    direction = [OPTIMIZERS.get(cfg.name)(cfg)]
    parts = direction + decay if cfg.name in DECOUPLED_DECAY else decay + direction
    parts.append(optax.scale_by_learning_rate(lambda step: group.lr * multiplier(step)))
    return optax.chain(*parts)


def make_optimizer(
    cfg: ml_collections.ConfigDict,
    groups: Mapping[str, Group],
    *,
    steps_per_epoch: int,
    total_steps: int,
    frozen: Callable[[tuple[str, ...]], bool] | None = None,
    layer_scale: Callable[[tuple[str, ...]], float] | None = None,
) -> optax.GradientTransformation:
    """Builds the optimiser for params shaped ``{group_name: subtree, ...}``.

    Args:
      cfg: the ``optim`` config section.
      groups: learning rate and weight decay per top-level key of the params tree.
      steps_per_epoch: optimiser steps per epoch (schedules are stated in epochs).
      total_steps: steps of the whole run (for the cosine schedule).
      frozen: a leaf's path of dict keys -> whether it stays fixed (zero update, no weight
        decay, no optimiser state); None freezes nothing.
      layer_scale: a leaf's path -> the factor of its learning rate (``optim.layer_decay``),
        applied to its whole update (the step and its decoupled weight decay, as a parameter
        group's learning rate is); None scales nothing.

    The backbone (``model/backbone``) learns at ``optim.backbone_lr_multiplier`` times the
    model's rate, and ``optim.clip_norm`` > 0 clips the global norm of all gradients first.
    """
    multiplier = lr_multiplier(cfg, steps_per_epoch, total_steps)
    groups = dict(groups)
    backbone = float(cfg.get("backbone_lr_multiplier", 1.0))
    if backbone != 1.0 and "model" in groups:
        model = groups["model"]
        groups[BACKBONE] = Group(model.lr * backbone, model.weight_decay)
    transforms = {name: _group_tx(cfg, g, multiplier) for name, g in groups.items()}
    if frozen is not None:
        transforms[FROZEN] = optax.set_to_zero()

    def labels(params):
        def label(path, _):
            keys = tuple(str(getattr(k, "key", k)) for k in path)
            if frozen is not None and frozen(keys):
                return FROZEN
            if BACKBONE in groups and keys[:2] == ("model", "backbone"):
                return BACKBONE
            return keys[0]

        return jax.tree_util.tree_map_with_path(label, params)

    if frozen is None and BACKBONE not in groups:  # one label per group: the state's old layout
        tx = optax.multi_transform(transforms, lambda params: {name: name for name in params})
    else:
        tx = optax.multi_transform(transforms, labels)
    if layer_scale is not None:
        tx = optax.chain(tx, scale_by_path(layer_scale))
    clip = float(cfg.get("clip_norm", 0.0))
    return optax.chain(optax.clip_by_global_norm(clip), tx) if clip > 0 else tx


def _keys(path: Any) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", k)) for k in path)


def param_names(params: Any) -> set[str]:
    """Every dict key on the paths of ``params``' leaves: the names an ``optim.no_decay`` rule
    and a frozen module may give."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return {key for path, _ in leaves for key in _keys(path)}


def scale_by_path(scale: Callable[[tuple[str, ...]], float]) -> optax.GradientTransformation:
    """Multiplies each leaf's update by ``scale`` of its path of dict keys (a constant)."""

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, Any]:
        del params
        scaled = jax.tree_util.tree_map_with_path(
            lambda path, u: u * jnp.asarray(scale(_keys(path)), u.dtype), updates
        )
        return scaled, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


#: The label of frozen leaves (not a params group name: those are dict keys of the model).
FROZEN = "__frozen__"
#: The label of the backbone's leaves when ``optim.backbone_lr_multiplier`` is not 1.
BACKBONE = "__backbone__"


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
