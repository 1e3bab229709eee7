"""The ``BACKBONES`` registry: every backbone module registers its factory here.

A factory takes the ``model`` config section and ``train`` (batch statistics in train mode) and
returns a Flax module mapping images (B, H, W, C) to pooled features (B, F). A backbone with
pretrained weights registers the per-channel (RGB) mean and standard deviation on [0, 1] pixels
that its weights expect, as ``input_normalization=(mean, std)`` (``data.normalization=backbone``);
one whose stages can be frozen declares ``STAGE_MODULES`` on its module class.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.linen as nn

from jdml.registry import Registry

BACKBONES: Registry[Callable[..., nn.Module]] = Registry("backbone")


def input_normalization(backbone: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The (mean, std) per RGB channel the ``backbone``'s weights expect, or None if it
    registered none."""
    return BACKBONES.meta(backbone).get("input_normalization")
