"""Shared loss interface: the ``Loss`` module base class, the ``LOSSES`` registry and helpers.

A loss is a ``flax.linen.Module`` whose fields are its hyperparameters (keyword-only, with the
reference defaults) and whose learnable parameters (e.g. margin betas) live in the params tree:

    loss_fn = LOSSES.get("margin")(num_classes=100)
    params = loss_fn.init(key, embeddings, labels, tuples)
    loss, metrics = loss_fn.apply(params, embeddings, labels, tuples)

Class attributes describe how the trainer must wire the loss: ``loss_name`` (its registry name;
Linen reserves ``name`` for the module instance name), ``needs_miner``, ``allowed_miners``,
``param_lr`` (the field holding the learning rate of the loss's own parameters),
``param_lr_is_multiplier``, and how the reference's sample runs use it: ``reference_miner`` (the
miner it is run with, "" for a loss that mines itself) and ``reference_normalize`` (whether
its embedding is L2-normalised; the reference runs angular, lifted and N-pair on raw
embeddings, whose L2 regularisers then act on the embedding norms).

Fields the method fills in at construction (never set in configs): ``num_classes`` (number of
training classes) and ``miner_name`` (the configured miner's registry name), for losses that
declare them.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from jdml.checks import check_batch, check_class_labels, check_tuples, poison_unless_inside
from jdml.miners.base import MINERS, Tuples
from jdml.registry import COUNT, Range, Registry

LossOutput = tuple[jax.Array, dict[str, jax.Array]]
"""(scalar float32 loss, {metric name: scalar}) with a fixed set of metric names per loss."""


class Loss(nn.Module):
    """Base class of every loss module.

    Subclasses implement ``__call__(embeddings (B, D), labels (B,) int, tuples: Tuples | None)
    -> (loss, metrics)`` and compute in float32 whatever the input dtype.
    """

    loss_name: ClassVar[str]
    allowed_miners: ClassVar[tuple[str, ...] | None] = None
    needs_miner: ClassVar[bool] = True
    param_lr: ClassVar[str | None] = None
    # True when the ``param_lr`` field multiplies the network's learning rate (the reference's
    # ``--loss_<name>_lrmulti`` flags) rather than giving the learning rate itself.
    param_lr_is_multiplier: ClassVar[bool] = False
    # The values each numeric hyperparameter accepts (checked with the config).
    param_ranges: ClassVar[Mapping[str, Range]] = {}
    # The miner of the reference's sample runs ("" for a loss that takes none) and whether they
    # L2-normalise the embedding (the presets of configs/revisiting.py follow both).
    reference_miner: ClassVar[str] = ""
    reference_normalize: ClassVar[bool] = True

    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        raise NotImplementedError

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every subclass's ``__call__`` first checks its arguments (``check_loss_inputs``)."""
        call = cls.__dict__.get("__call__")
        if call is not None:

            @functools.wraps(call)
            def checked(
                self: Loss,
                embeddings: jax.Array,
                labels: jax.Array,
                tuples: Tuples | None = None,
                *args: Any,
                **kw: Any,
            ) -> LossOutput:
                check_loss_inputs(self, embeddings, labels, tuples)
                num_classes = getattr(self, "num_classes", None)
                per_class = isinstance(num_classes, int) and num_classes > 0
                embeddings = poison_unless_inside(
                    embeddings, labels, tuples, num_classes if per_class else None
                )
                return call(self, embeddings, labels, tuples, *args, **kw)

            cls.__call__ = checked  # type: ignore[method-assign]
        super().__init_subclass__(**kwargs)


def symmetric_uniform(bound: float) -> nn.initializers.Initializer:
    """Initializer drawing every entry from U(-bound, bound).

    Args:
      bound: half-width of the interval.

    Returns:
      An ``init(key, shape, dtype=float32)`` function for ``Module.param``.
    """

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def uniform_last_axis(
    key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32
) -> jax.Array:
    """Entries from U(-1/sqrt(n), 1/sqrt(n)), n = ``shape[-1]`` (the reference's class maps)."""
    return symmetric_uniform(1.0 / math.sqrt(shape[-1]))(key, shape, dtype)


class ClassMapLoss(Loss):
    """Base class of the losses that learn a map over the classes: class weights, proxies or
    centres, one float32 parameter of the params tree.

    They take no miner, need ``num_classes`` (filled in by the method) and learn the map with
    the subclass's ``param_lr`` field times the network's learning rate. A subclass names the
    parameter (``map_param``), may change its shape and initialiser (``map_shape``, ``map_init``:
    by default (num_classes, D) from U(-1/sqrt(D), 1/sqrt(D)), the reference's class maps) and
    computes the loss from it in ``map_loss``.
    """

    needs_miner: ClassVar[bool] = False
    param_lr_is_multiplier: ClassVar[bool] = True
    map_param: ClassVar[str] = "class_map"

    _: dataclasses.KW_ONLY
    num_classes: int

    def map_shape(self, dim: int) -> tuple[int, int]:
        """Shape of the map for D = ``dim`` embedding dimensions: (num_classes, D)."""
        return (self.num_classes, dim)

    def map_init(self) -> nn.initializers.Initializer:
        """Initialiser of the map: U(-1/sqrt(n), 1/sqrt(n)) over its last axis's size n."""
        return uniform_last_axis

    @nn.compact
    def __call__(
        self, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None = None
    ) -> LossOutput:
        """Declares the map and computes the loss from it (``map_loss``).

        Args:
          embeddings: (B, D) float (any float dtype; computed in float32).
          labels: (B,) int in [0, num_classes); out-of-range labels are not checked under jit.
          tuples: ignored (the loss takes no miner).

        Returns:
          (loss, metrics): scalar float32 loss and the metrics ``map_loss`` names.
        """
        x = embeddings.astype(jnp.float32)
        shape = self.map_shape(x.shape[-1])
        class_map = self.param(self.map_param, self.map_init(), shape, jnp.float32)
        return self.map_loss(x, class_map, labels)

    def map_loss(self, x: jax.Array, class_map: jax.Array, labels: jax.Array) -> LossOutput:
        """The loss of float32 (B, D) embeddings ``x`` given the map (its raw parameter)."""
        raise NotImplementedError


def check_loss_inputs(
    loss: Loss, embeddings: jax.Array, labels: jax.Array, tuples: Tuples | None
) -> None:
    """The checks of ``jdml.checks`` for a loss's arguments: (B, D) floating embeddings, (B,)
    integer labels, well-formed tuples, and labels in ``[0, num_classes)`` for a loss with a
    parameter per class. Shapes and dtypes fail at trace time with one clear error."""
    owner = f"loss {getattr(type(loss), 'loss_name', type(loss).__name__)!r}"
    check_batch(owner, embeddings, labels)
    check_tuples(owner, tuples, embeddings.shape[0])
    num_classes = getattr(loss, "num_classes", None)
    if isinstance(num_classes, int) and num_classes > 0:
        check_class_labels(owner, labels, num_classes)


LOSSES: Registry[type[Loss]] = Registry("loss")

# The fields the method fills in (never config keys, so not in ``param_ranges``), with the values
# ``get`` accepts for them in one's own loop.
METHOD_FILLED: Mapping[str, Range] = {"num_classes": COUNT}

LossT = TypeVar("LossT", bound=type[Loss])


def register_loss(cls: LossT) -> LossT:
    """Class decorator registering a loss under its ``loss_name``.

    Raises:
      ValueError: if ``param_lr`` or ``param_ranges`` name no field of the class, an ``int``
        field (other than ``num_classes``) has no integer range in ``param_ranges``, or if
        ``reference_miner`` is given without ``needs_miner`` (or missing with it, or not among
        ``allowed_miners``).
    """
    fields = {f.name for f in dataclasses.fields(cls)}
    if cls.param_lr is not None and cls.param_lr not in fields:
        raise ValueError(f"{cls.__name__}.param_lr={cls.param_lr!r} is not one of its fields")
    unknown = set(cls.param_ranges) - fields
    if unknown:
        raise ValueError(f"{cls.__name__}.param_ranges names no field: {sorted(unknown)}")
    uncounted = [
        f
        for f in _fields_of_type(cls, int)
        if f not in METHOD_FILLED and not getattr(cls.param_ranges.get(f), "integer", False)
    ]
    if uncounted:
        raise ValueError(f"{cls.__name__}.param_ranges needs an integer Range for {uncounted}")
    if cls.needs_miner != bool(cls.reference_miner) or (
        cls.allowed_miners is not None
        and cls.needs_miner
        and cls.reference_miner not in cls.allowed_miners
    ):
        raise ValueError(
            f"{cls.__name__}.reference_miner={cls.reference_miner!r} does not fit "
            f"needs_miner={cls.needs_miner} and allowed_miners={cls.allowed_miners}"
        )
    LOSSES.register(cls.loss_name, ranges=cls.param_ranges)(cls)
    return cls


def _fields_of_type(cls: type[Loss], kind: type) -> list[str]:
    """The hyperparameter fields of ``cls`` annotated as exactly ``kind`` (``int``, ``bool``)."""
    return [f.name for f in dataclasses.fields(cls) if f.type in (kind, kind.__name__)]


def get(name: str, **hparams: Any) -> Loss:
    """A registered loss with its hyperparameters, for use in any training loop.

    Unknown names, unknown hyperparameters and values outside a hyperparameter's declared
    range are refused at once. The loss is a Flax module: ``params = loss.init(key, embeddings,
    labels, tuples)`` (``{}`` for a loss without learnable parameters) and ``value, metrics =
    loss.apply(params, embeddings, labels, tuples)``, with ``tuples`` from a miner of
    ``jdml.miners.get`` (None for a loss that mines itself, see ``compatible_miners``).

    Args:
      name: registered loss name, e.g. ``"margin"``.
      **hparams: its keyword hyperparameters (the reference defaults otherwise); per-class
        losses need ``num_classes``.

    Example: Revisiting's margin loss (Wu et al. 2017) on four unit embeddings of two classes,
    with distance-weighted mining; of the 8 terms, two are active (anchors 1 and 2 lie
    ``sqrt(0.8)`` from a negative, inside ``beta + margin = 1.4``), and the loss is their mean:

    >>> import jax, jax.numpy as jnp
    >>> import jdml.losses, jdml.miners
    >>> loss = jdml.losses.get("margin", num_classes=2, margin=0.2, beta=1.2)
    >>> miner = jdml.miners.get("distance")
    >>> embeddings = jnp.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-0.6, 0.8]])
    >>> labels = jnp.array([0, 0, 1, 1])
    >>> key = jax.random.key(0)
    >>> tuples = miner(key, embeddings, labels)
    >>> params = loss.init(key, embeddings, labels, tuples)  # the per-class betas
    >>> value, metrics = loss.apply(params, embeddings, labels, tuples)
    >>> round(float(value), 4), float(metrics["active_fraction"])
    (0.5056, 0.25)
    >>> jdml.losses.get("margn")
    Traceback (most recent call last):
    ...
    jdml.errors.UnknownNameError: unknown loss 'margn'; known loss names: angular, ...

    Raises:
      UnknownNameError: for an unregistered name (the message lists the known losses).
      TypeError: for a hyperparameter the loss does not take (the message lists those it does).
      ValueError: for a value outside the hyperparameter's range (integer hyperparameters, such
        as ``num_classes``, must be integers of at least 1), or a switch not True or False.
    """
    cls = LOSSES.get(name)
    fields = sorted(f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name"))
    unknown = sorted(set(hparams) - set(fields))
    if unknown:
        raise TypeError(f"loss {name!r} takes no {unknown}; its hyperparameters: {fields}")
    filled = {k: METHOD_FILLED[k] for k in fields if k in METHOD_FILLED}
    for key, allowed in {**filled, **LOSSES.ranges(name)}.items():
        if key in hparams:
            values = hparams[key] if isinstance(hparams[key], tuple | list) else (hparams[key],)
            for value in values:
                problem = allowed.problem(value)
                if problem:
                    raise ValueError(f"loss {name!r}: {key}={hparams[key]!r} {problem}")
    for key in _fields_of_type(cls, bool):
        if key in hparams and not isinstance(hparams[key], bool):
            raise ValueError(f"loss {name!r}: {key}={hparams[key]!r} must be True or False")
    counts = {k: int(hparams[k]) for k in _fields_of_type(cls, int) if k in hparams}
    return cls(**{**hparams, **counts})  # NumPy integers as Python's (the checks read int)


def compatible_miners(loss_name: str) -> list[str]:
    """Registered miners the loss accepts ([] for a loss that takes no miner)."""
    cls = LOSSES.get(loss_name)
    if not cls.needs_miner:
        return []
    if cls.allowed_miners is None:
        return MINERS.names()
    return sorted(cls.allowed_miners)


def check_compatible(loss_name: str, miner_name: str | None) -> None:
    """Checks that a loss can be trained with a miner (or with none).

    Args:
      loss_name: registered loss name.
      miner_name: registered miner name, or None for no miner.

    Raises:
      UnknownNameError: for an unregistered loss or miner name.
      ValueError: if the loss needs a miner and gets none or one it does not accept, or takes no
        miner and gets one; the message lists the compatible miners.

    References:
      Roth et al., ICML 2020, reference ``criteria/__init__.py`` (``ALLOWED_MINING_OPS``).
    """
    allowed = compatible_miners(loss_name)
    needs = LOSSES.get(loss_name).needs_miner
    if miner_name is not None:
        MINERS.get(miner_name)
    if not needs:
        if miner_name is not None:
            raise ValueError(
                f"loss {loss_name!r} mines its own pairs and takes no miner, got {miner_name!r}; "
                "set the miner to None"
            )
        return
    if miner_name is None or miner_name not in allowed:
        got = "no miner" if miner_name is None else f"miner {miner_name!r}"
        raise ValueError(
            f"loss {loss_name!r} cannot be used with {got}; compatible miners: "
            + ", ".join(allowed)
        )


def require_tuples(loss_name: str, tuples: Tuples | None) -> Tuples:
    """Returns ``tuples`` or raises a clear error for a tuple-based loss called without them."""
    if tuples is None:
        raise ValueError(f"loss {loss_name!r} needs mined tuples, got None")
    return tuples


def gather_triplets(
    embeddings: jax.Array, tuples: Tuples
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Float32 embeddings of the anchors, positives and negatives, each (B_t, D)."""
    x = embeddings.astype(jnp.float32)
    return x[tuples.anchors], x[tuples.positives], x[tuples.negatives]


def safe_divide(numerator: jax.Array, count: jax.Array) -> jax.Array:
    """numerator / count, or numerator itself when count is 0 (then the sums are empty, so 0)."""
    return numerator / jnp.maximum(count, 1).astype(jnp.float32)


# The masked reductions every loss over mined tuples uses: the rows a miner marks invalid (or a
# loss leaves out) are zeroed before any sum, so that they add neither value nor gradient, and a
# mean over no row is 0 rather than NaN.


def masked(values: jax.Array, mask: jax.Array) -> jax.Array:
    """``values`` where ``mask`` holds, 0 elsewhere (no value and no gradient from the rest)."""
    return jnp.where(mask, values, 0.0)


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    """The mean of ``values`` over the entries ``mask`` keeps; 0 when it keeps none."""
    return safe_divide(jnp.sum(masked(values, mask)), jnp.sum(mask))


def masked_fraction(flags: jax.Array, mask: jax.Array) -> jax.Array:
    """The fraction of the entries ``mask`` keeps where ``flags`` holds; 0 when it keeps none."""
    return safe_divide(jnp.sum(flags & mask), jnp.sum(mask))


def fraction_of(count: jax.Array, total: jax.Array) -> jax.Array:
    """``count / total`` as float32; 0 when ``total`` is 0 (a metric over no entry)."""
    return safe_divide(count.astype(jnp.float32), total)


def valid_fraction(valid: jax.Array) -> jax.Array:
    """The fraction of the rows that are valid (the ``valid_fraction`` metric)."""
    return jnp.mean(valid.astype(jnp.float32))
