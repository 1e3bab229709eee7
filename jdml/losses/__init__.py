"""Losses as Flax Linen modules, looked up by the reference's names.

Importing this package imports every module in it, which registers each loss in ``LOSSES`` (and
every miner in ``MINERS``); a new loss only needs a module here with ``@register_loss``.
"""

import importlib
import pkgutil

import jdml.miners  # noqa: F401  (registers the miners that check_compatible lists)
from jdml.losses.base import (
    LOSSES,
    Loss,
    LossOutput,
    check_compatible,
    compatible_miners,
    get,
    register_loss,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "LOSSES",
    "Loss",
    "LossOutput",
    "check_compatible",
    "compatible_miners",
    "get",
    "register_loss",
]
