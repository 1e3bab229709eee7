"""Pretrained-weight readers and converters.

Importing this package imports every module in it, which registers each backbone's converter in
``jdml.models.pretrained.convert.CONVERTERS``; weights for a new backbone need one module here.
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
