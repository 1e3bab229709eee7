"""The ``BACKBONES`` registry: every backbone module registers its factory here.

A factory takes the ``model`` config section and ``train`` (batch statistics in train mode) and
returns a Flax module mapping images (B, H, W, C) to pooled features (B, F). A backbone declares
everything about itself as facts of its registration, so adding one touches its own module only:

* ``keys``: its own keys with their defaults, in a section of ``model`` for its family
  (``"small_resnet.stem_features": 32`` is ``model.small_resnet.stem_features``), added to the
  base config; ``ranges``: the values each of them accepts;
* ``check``: ``check(config)`` on the full config, raising ``ConfigError`` for a combination of
  its keys (and the data's) that cannot run; ``jdml.config.validate`` applies the ranges and the
  check of the selected backbone;
* ``input_normalization=(mean, std)``: the per-channel (RGB) constants on [0, 1] pixels that its
  pretrained weights expect (``data.normalization=backbone``);
* one whose stages can be frozen declares ``STAGE_MODULES`` on its module class.

``POOLINGS`` holds the global poolings of ``model.pooling``, ``INPUT_NORMALIZATIONS`` the input
normalisations of ``data.normalization``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import ml_collections
import numpy as np

from jdml.keys import declared_keys
from jdml.registry import Registry

BACKBONES: Registry[Callable[..., nn.Module]] = Registry("backbone")

#: ``model.dtype``: the dtype of every backbone's activations and products (its parameters stay
#: float32; bfloat16 runs the matrix units of GPUs and TPUs at full rate).
MODEL_DTYPES = ("float32", "bfloat16")

#: Global poolings of a (B, H, W, C) float32 map to (B, C), by ``model.pooling`` name.
POOLINGS: Registry[Callable[[jnp.ndarray], jnp.ndarray]] = Registry("pooling")


@POOLINGS.register("avg")
def average_pool(x: jnp.ndarray) -> jnp.ndarray:
    """The mean over the spatial positions."""
    return jnp.mean(x, axis=(1, 2))


@POOLINGS.register("avg+max")
def average_plus_max_pool(x: jnp.ndarray) -> jnp.ndarray:
    """The sum of the average and the maximum over the spatial positions (the reference's
    ``double`` pooling)."""
    return jnp.mean(x, axis=(1, 2)) + jnp.max(x, axis=(1, 2))


def input_normalization(backbone: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The (mean, std) per RGB channel the ``backbone``'s weights expect, or None if it
    registered none."""
    return BACKBONES.meta(backbone).get("input_normalization")


#: The mean and standard deviation the input is normalised with, by ``data.normalization``
#: name: ``(mean, std)`` of a full config, or None where the config has none to give.
INPUT_NORMALIZATIONS: Registry[Callable[[ml_collections.ConfigDict], Any]] = Registry(
    "input normalization"
)


@INPUT_NORMALIZATIONS.register("mean_std")
def configured_normalization(config: ml_collections.ConfigDict) -> tuple[float, float]:
    """``(x - data.mean) / data.std`` on [0, 1] pixels."""
    return float(config.data.mean), float(config.data.std)


@INPUT_NORMALIZATIONS.register("backbone")
def backbone_normalization(
    config: ml_collections.ConfigDict,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The per-channel constants the backbone's pretrained weights expect (None: it has none)."""
    constants = input_normalization(config.model.backbone)
    if constants is None:
        return None
    mean, std = constants
    return np.asarray(mean, np.float32), np.asarray(std, np.float32)


def backbone_keys() -> dict[str, Any]:
    """The ``model.*`` keys every registered backbone declares (its ``keys`` fact), with their
    defaults (:func:`jdml.keys.declared_keys`)."""
    return declared_keys(BACKBONES, "model")
