"""Host-side batch samplers, looked up by the reference's names.

Importing this package imports every module in it, which registers each sampler in ``SAMPLERS``.
"""

import importlib
import pkgutil

from jdml.samplers.base import SAMPLERS, Sampler

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["SAMPLERS", "Sampler"]
