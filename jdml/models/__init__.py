"""Backbones and embedding models, looked up by name.

Importing this package imports every module in it, which registers each backbone in
``BACKBONES``; a new backbone only needs a module here with ``@BACKBONES.register`` (its own
``model.*`` keys, their ranges and its checks included, see ``jdml.models.registry``).
"""

import importlib
import pkgutil

from jdml.models.registry import (
    BACKBONES,
    INPUT_NORMALIZATIONS,
    MODEL_DTYPES,
    POOLINGS,
    backbone_keys,
    input_normalization,
)

for _module in pkgutil.iter_modules(__path__):
    if not _module.ispkg:
        importlib.import_module(f"{__name__}.{_module.name}")

from jdml.models.embedding import EmbeddingModel, build_model  # noqa: E402

__all__ = [
    "BACKBONES",
    "INPUT_NORMALIZATIONS",
    "MODEL_DTYPES",
    "POOLINGS",
    "EmbeddingModel",
    "backbone_keys",
    "build_model",
    "input_normalization",
]
