"""Loss terms of a method, looked up by kind (``aux.<term>.kind``) in ``TERMS``.

A method (``jdml.methods.method.Method``) is a set of terms over named embedding heads of one
backbone, plus an optional decorrelation between heads. The Revisiting methods have one metric
term; DiVA adds metric terms on class-shared and intra-class heads and a DaNCE term; Sharing
Matters adds a metric term with cross-class triplets on a shared head.

Importing this package imports every module in it, which registers each kind; a new kind is one
module here with ``@TERMS.register(<kind>, ranges=...)`` on a ``Term`` subclass.
"""

import importlib
import pkgutil

from jdml.methods.terms.base import TERMS, Metrics, PrefillSource, Term, TermInputs

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

from jdml.methods.terms.dance import DanceTerm  # noqa: E402
from jdml.methods.terms.metric import MetricTerm  # noqa: E402

__all__ = [
    "TERMS",
    "DanceTerm",
    "MetricTerm",
    "Metrics",
    "PrefillSource",
    "Term",
    "TermInputs",
]
