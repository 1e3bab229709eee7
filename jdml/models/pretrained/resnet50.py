"""ResNet-50 weights from torchvision, timm or Cadene ``pretrainedmodels`` state dicts.

All three name the backbone tensors alike: ``conv1.weight``, ``bn1.*``,
``layer{1..4}.{i}.conv{1,2,3}.weight``, ``layer{1..4}.{i}.bn{1,2,3}.*``,
``layer{1..4}.0.downsample.0.weight`` and ``layer{1..4}.0.downsample.1.*`` (BatchNorm ``*`` =
``weight``, ``bias``, ``running_mean``, ``running_var``, ``num_batches_tracked``). They differ
only in the ImageNet classifier, which the backbone does not use: ``fc.*`` (torchvision, timm)
or ``last_linear.*`` (Cadene).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from jdml.models.pretrained.convert import CONVERTERS, Converter, leaf_source

_INDEX = re.compile(r"_(\d+)$")


def torch_prefix(modules: tuple[str, ...]) -> str:
    """The PyTorch module name of a Flax module path: a trailing ``_<i>`` of a Flax name is
    PyTorch's ``.<i>`` (list or ``Sequential`` index), e.g. ``layer2_0/downsample_1`` ->
    ``layer2.0.downsample.1``."""
    return ".".join(_INDEX.sub(r".\1", m) for m in modules)


def leaf_kind(leaf: str) -> str:
    """``conv`` or ``bn`` for a Flax leaf name. A ``bias`` maps to ``<module>.bias`` for both,
    so only kernels (transposed) and BatchNorm's scale / statistics need telling apart."""
    return "conv" if leaf in ("kernel", "bias") else "bn"


def rule(
    collection: str, path: tuple[str, ...]
) -> tuple[str, Callable[[np.ndarray], np.ndarray]] | None:
    """The PyTorch key of one leaf of :class:`jdml.models.resnet50.ResNet50`."""
    *modules, leaf = path
    return leaf_source(torch_prefix(tuple(modules)), collection, leaf, leaf_kind(leaf))


def ignore(key: str) -> bool:
    """The ImageNet classifier: ``fc.*`` (torchvision, timm) or ``last_linear.*`` (Cadene)."""
    return key.startswith(("fc.", "last_linear."))


CONVERTERS.register("resnet50")(Converter(rule=rule, ignore=ignore))
