"""Pretrained backbone weights by backbone name: which converter fills which Flax backbone.

``model.pretrained`` names a weight file (or ``packaged`` for weights a pip package ships); the
backbone's converter maps its tensors onto the ``backbone`` subtree of the embedding model, while
the embedding heads keep their random initialisation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from jdml.models.pretrained.convert import CONVERTERS, PACKAGED, fill


def weight_path(backbone: str, pretrained: str) -> str:
    """The weight file ``model.pretrained`` names for ``backbone``.

    Raises:
      FileNotFoundError: for a missing file, or ``packaged`` without a package that ships it.
      ValueError: for a backbone without a converter.
    """
    converter = CONVERTERS.get(backbone)
    if pretrained == PACKAGED:
        if converter.packaged is None:
            raise ValueError(
                f"no pip package ships weights for {backbone}; set model.pretrained to a file"
            )
        path = converter.packaged()
    else:
        path = os.path.expanduser(pretrained)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"model.pretrained={pretrained!r}: no weight file at {path}; give the path of the "
            f"{backbone} weights (PyTorch .pth/.pt or .safetensors)"
        )
    return path


def load_backbone(backbone: str, pretrained: str) -> Callable[[Mapping[str, Any]], dict]:
    """Reads the weight file once; returns ``variables -> variables`` with the ``backbone``
    subtree of an embedding model's variables replaced by the converted weights."""
    from jdml.models.pretrained.torch_io import load_weights

    path = weight_path(backbone, pretrained)
    state: dict[str, np.ndarray] = load_weights(path)
    converter = CONVERTERS.get(backbone)
    if converter.prepare is not None:
        state = converter.prepare(state)

    def apply(variables: Mapping[str, Any]) -> dict:
        sub = {name: tree["backbone"] for name, tree in variables.items() if "backbone" in tree}
        filled = fill(sub, state, converter.rule, source=path, ignore=converter.ignore)
        return {
            name: {**tree, "backbone": filled[name]} if name in filled else tree
            for name, tree in variables.items()
        }

    return apply
