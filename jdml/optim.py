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
(``optim.backbone_lr_multiplier``), and layer-wise decay of the backbone's learning rate
(``optim.layer_decay``).

This module is the one reader of the ``optim`` section. What it optimises is declared by its
owners, not read here: the method's parameter groups (:class:`Group`: a rate of their own, or
a multiple of ``optim.lr``), the frozen parameters (``model.frozen_stages``) and the backbone's
layers by depth (its ``LAYERS``).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jdml.errors import ConfigError
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
    """How one top-level subtree of the params learns, as its owner declares it.

    Attributes:
      lr: its own learning rate; None: ``optim.lr`` times ``lr_scale``.
      weight_decay: its own weight decay; None: ``optim.weight_decay``.
      lr_scale: the multiple of ``optim.lr`` when ``lr`` is None.
    """

    lr: float | None = None
    weight_decay: float | None = None
    lr_scale: float = 1.0

    def resolve(self, cfg: ml_collections.ConfigDict) -> Group:
        """The group's rate and decay under the ``optim`` section ``cfg``."""
        lr = float(cfg.lr) * self.lr_scale if self.lr is None else self.lr
        decay = float(cfg.weight_decay) if self.weight_decay is None else self.weight_decay
        return Group(float(lr), float(decay))


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


def lowered_rate(cfg: ml_collections.ConfigDict, factor: float = 10.0) -> float:
    """The learning rate to train again with after a non-finite loss: ``optim.lr`` / factor."""
    return float(cfg.lr) / factor


def learning_rate(cfg: ml_collections.ConfigDict, steps_per_epoch: int, total_steps: int):
    """``step -> `` the base learning rate (``optim.lr``) at that step, for the logs."""
    multiplier = lr_multiplier(cfg, steps_per_epoch, total_steps)
    return lambda step: float(cfg.lr) * multiplier(step)


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
    layers: tuple[tuple[str, ...], ...] | None = None,
) -> optax.GradientTransformation:
    """Builds the optimiser for params shaped ``{group_name: subtree, ...}``.

    Args:
      cfg: the ``optim`` config section.
      groups: each top-level key of the params tree's :class:`Group`, as its owner declares it.
      steps_per_epoch: optimiser steps per epoch (schedules are stated in epochs).
      total_steps: steps of the whole run (for the cosine schedule).
      frozen: a leaf's path of dict keys -> whether it stays fixed (zero update, no weight
        decay, no optimiser state); None freezes nothing.
      layers: the backbone's parameter names by depth (its ``LAYERS``; None: it declares none),
        for ``optim.layer_decay``: each layer's factor of the learning rate
        (:func:`layer_lr_scale`) applies to its whole update (the step and its decoupled
        weight decay, as a parameter group's learning rate is).

    The backbone (``model/backbone``) learns at ``optim.backbone_lr_multiplier`` times the
    model's rate, and ``optim.clip_norm`` > 0 clips the global norm of all gradients first.
    """
    multiplier = lr_multiplier(cfg, steps_per_epoch, total_steps)
    groups = {name: group.resolve(cfg) for name, group in groups.items()}
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
    layer_scale = layer_lr_scale(cfg, layers)
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


#: ``optim.layer_decay_grouping``: how a backbone's declared layers (the stem, each block, the
#: final norm) become learning-rate groups. ``mae``: each is a group, the final norm the last,
#: at the full rate (BEiT's and MAE's ``param_groups_lrd``); ``timm``: the final norm joins the
#: last block's group, which learns at the full rate (``timm.optim.param_groups_layer_decay`` of
#: the backbone alone, without a classifier), so every other group learns at 1 / decay times
#: the ``mae`` rate.
LAYER_GROUPINGS = ("mae", "timm")


def layer_groups(layers: tuple[tuple[str, ...], ...], grouping: str) -> tuple[tuple[str, ...], ...]:
    """A backbone's declared ``LAYERS`` (the stem, each block, then the final norm) as the
    learning-rate groups of ``grouping``, a name of :data:`LAYER_GROUPINGS`, shallowest first."""
    if grouping not in LAYER_GROUPINGS:
        raise ValueError(
            f"optim.layer_decay_grouping={grouping!r}; choose one of: {', '.join(LAYER_GROUPINGS)}"
        )
    if grouping == "timm":  # timm's MATCH_PREV_GROUP: the final norm with the last block
        return (*layers[:-2], layers[-2] + layers[-1])
    return layers


def layer_scales(
    layers: tuple[tuple[str, ...], ...], decay: float, grouping: str = "mae"
) -> dict[str, float]:
    """Layer-wise learning-rate decay: each backbone parameter name -> the factor of its
    learning rate, ``decay ** (G - g)`` for the parameters of group g of G + 1 (the last group,
    and everything outside the backbone, keep the rate).

    Args:
      layers: the backbone's declared ``LAYERS`` (``jdml.models.embedding.backbone_layers``).
      decay: ``optim.layer_decay``, in (0, 1].
      grouping: ``optim.layer_decay_grouping``, a name of :data:`LAYER_GROUPINGS`.

    References:
      Bao, Dong, Piao, Wei, "BEiT: BERT Pre-Training of Image Transformers", ICLR 2022 (layer-wise
      learning-rate decay; MAE's ``util/lr_decay.py`` groups a ViT the same way, timm's
      ``param_groups_layer_decay`` with the final norm in the last block's group).
    """
    groups = layer_groups(layers, grouping)
    last = len(groups) - 1
    return {name: decay ** (last - depth) for depth, names in enumerate(groups) for name in names}


def layer_lr_scale(
    cfg: ml_collections.ConfigDict, layers: tuple[tuple[str, ...], ...] | None
) -> Callable[[tuple[str, ...]], float] | None:
    """``optim.layer_decay`` grouped by ``optim.layer_decay_grouping``: a params path -> the
    factor of its learning rate (a backbone parameter's, by its layer; 1 elsewhere); None
    without decay.

    Raises:
      ValueError: a decay below 1 for a backbone that declares no layers.
    """
    decay = float(cfg.get("layer_decay", 1.0))
    if decay == 1.0:
        return None
    if layers is None:
        raise ValueError(
            f"optim.layer_decay={decay:g}, but the backbone declares no layers to decay; set it "
            "to 1 or choose a backbone with layers (e.g. vit)"
        )
    scales = layer_scales(layers, decay, cfg.get("layer_decay_grouping", "mae"))

    def scale(path: tuple[str, ...]) -> float:
        backbone = path[:2] == ("model", "backbone") and len(path) > 2
        return scales.get(path[2], 1.0) if backbone else 1.0

    return scale


def check_no_decay(cfg: ml_collections.ConfigDict, params: Any) -> None:
    """Every name of ``optim.no_decay`` (``"1d"`` names none) is a dict key on the paths of
    ``params`` (the built model's): a name that matches nothing would change nothing, silently.

    Raises:
      ConfigError: naming the value, the nearest parameter names and a value that works.
    """
    names = param_names(params)
    rules = tuple(cfg.no_decay)
    for rule in rules:
        if rule == "1d" or rule in names:
            continue
        close = difflib.get_close_matches(rule, names, n=3, cutoff=0.6)
        fixed = tuple(close[0] if r == rule else r for r in rules if close or r != rule)
        nearest = close or difflib.get_close_matches(rule, names, n=3, cutoff=0.0)
        raise ConfigError(
            f"optim.no_decay has {rule!r}, which names no parameter of this model; the nearest "
            f"parameter names: {', '.join(nearest)}"
            f"{'' if close else ', none close: drop it'}. Use e.g. "
            f"--config.optim.no_decay={_tuple_flag(fixed)}"
        )


def _tuple_flag(values: tuple[str, ...]) -> str:
    """A tuple of strings as a ``--config.`` flag's value: ``('1d','cls_token')``, ``()``."""
    if len(values) == 1:
        return f"({values[0]!r},)"
    return "(" + ",".join(repr(v) for v in values) + ")"
