"""Losses as Flax Linen modules, looked up by the reference's names.

Importing this package registers every loss in ``LOSSES`` (and every miner in ``MINERS``).
"""

import jdml.miners  # noqa: F401  (registers the miners that check_compatible lists)
from jdml.losses import margin, triplet
from jdml.losses.base import (
    LOSSES,
    Loss,
    LossOutput,
    check_compatible,
    compatible_miners,
    register_loss,
)
from jdml.losses.margin import MarginLoss
from jdml.losses.triplet import TripletLoss

__all__ = [
    "LOSSES",
    "Loss",
    "LossOutput",
    "MarginLoss",
    "TripletLoss",
    "check_compatible",
    "compatible_miners",
    "margin",
    "register_loss",
    "triplet",
]
