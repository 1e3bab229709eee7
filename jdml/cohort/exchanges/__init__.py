"""What the members of a cohort exchange, looked up by name (``cohort.exchange``) in ``EXCHANGES``.

A cohort (``cohort.size > 1``) trains its members side by side; an exchange adds to each
member's loss a term computed from every member's embeddings of the batch (DM2's relation
matrices are the first entry). Importing this package imports every module in it, which
registers each exchange; a new member-wrapping method is one module with
``@EXCHANGES.register(<name>)`` on an ``Exchange`` subclass, plus its ``configs/<method>.py``.
"""

import importlib
import pkgutil

from jdml.cohort.exchanges.base import (
    EXCHANGE_STATE,
    EXCHANGES,
    Exchange,
    Exchanged,
    MemberOutputs,
    Peers,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["EXCHANGES", "EXCHANGE_STATE", "Exchange", "Exchanged", "MemberOutputs", "Peers"]
