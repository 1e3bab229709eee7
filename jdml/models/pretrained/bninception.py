"""BN-Inception weights from a Cadene ``pretrainedmodels`` ``bninception`` state dict.

Keys are the PyTorch module names, flat: ``conv1_7x7_s2.{weight,bias}``,
``conv1_7x7_s2_bn.*``, ``conv2_3x3_reduce``, ``conv2_3x3`` and per block
``inception_<3a..5b>_<unit>`` / ``inception_<3a..5b>_<unit>_bn`` with units ``1x1``,
``3x3_reduce``, ``3x3``, ``double_3x3_reduce``, ``double_3x3_1``, ``double_3x3_2``,
``pool_proj``; the ImageNet classifier ``last_linear.*`` is not part of the backbone.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from jdml.models.pretrained.convert import CONVERTERS, Converter, leaf_source
from jdml.models.pretrained.resnet50 import leaf_kind


def rule(
    collection: str, path: tuple[str, ...]
) -> tuple[str, Callable[[np.ndarray], np.ndarray]] | None:
    """The PyTorch key of one leaf of :class:`jdml.models.bninception.BNInception`: a block's
    module ``inception_4a/double_3x3_1`` is ``inception_4a_double_3x3_1``."""
    *modules, leaf = path
    return leaf_source("_".join(modules), collection, leaf, leaf_kind(leaf))


def ignore(key: str) -> bool:
    """The ImageNet classifier."""
    return key.startswith("last_linear.")


CONVERTERS.register("bninception")(Converter(rule=rule, ignore=ignore))
