"""GoogLeNet weights from a torchvision ``googlenet`` state dict.

Keys: ``conv{1,2,3}.conv.weight``, ``conv{1,2,3}.bn.*`` and, per Inception block
``inception{3a,3b,4a,...,5b}``, ``.branch1.{conv,bn}``, ``.branch2.{0,1}.{conv,bn}``,
``.branch3.{0,1}.{conv,bn}`` and ``.branch4.1.{conv,bn}`` (``branch4.0`` is the max pool). The
ImageNet checkpoint also holds the auxiliary classifiers ``aux1.*`` / ``aux2.*`` (torchvision
builds them to load the file, then drops them) and ``fc.*``; the backbone uses neither.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jdml.models.pretrained.convert import CONVERTERS, Converter, leaf_source
from jdml.models.pretrained.resnet50 import leaf_kind, torch_prefix


def rule(
    collection: str, path: tuple[str, ...]
) -> tuple[str, Callable[[np.ndarray], np.ndarray]] | None:
    """The PyTorch key of one leaf of :class:`jdml.models.googlenet.GoogLeNet`."""
    *modules, leaf = path
    return leaf_source(torch_prefix(tuple(modules)), collection, leaf, leaf_kind(leaf))


def ignore(key: str) -> bool:
    """The auxiliary classifiers and the ImageNet classifier."""
    return key.startswith(("aux1.", "aux2.", "fc."))


CONVERTERS.register("googlenet")(Converter(rule=rule, ignore=ignore))
