"""Statistics over seeds: sample standard deviations, paired differences and their verdicts.

Results over a few seeds are summarised by their mean and **sample** standard deviation
(``ddof=1``). Two rows trained with the same seeds are compared by the per-seed (paired)
differences: their mean and a Student-t confidence interval. A claim that row A beats row B
then reads, from the interval of A - B:

* **reproduces**: the whole interval lies on the claimed side of 0;
* **does not reproduce**: the whole interval lies on the other side;
* **not resolved**: the interval holds 0 (more seeds, or a larger effect, would decide).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

VERDICTS = ("reproduces", "does not reproduce", "not resolved")


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value)."""
    a = np.asarray(values, np.float64)
    if a.size == 0:
        raise ValueError("no values")
    return float(a.mean()), float(a.std(ddof=1)) if a.size > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class Paired:
    """The paired difference ``a - b`` over ``n`` seeds, with its ``level`` interval."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    def verdict(self, sign: int = 1) -> str:
        """The claim "``a - b`` has the sign ``sign``" read from the interval."""
        if self.n < 2 or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "not resolved"
        low, high = (self.low, self.high) if sign > 0 else (-self.high, -self.low)
        if low > 0:
            return "reproduces"
        if high < 0:
            return "does not reproduce"
        return "not resolved"

    def cell(self, scale: float = 100.0, digits: int = 2) -> str:
        """``+0.90 [-0.71, 2.51]`` (the mean and the interval, times ``scale``)."""
        if self.n < 2:
            return f"{scale * self.mean:+.{digits}f} (1 seed)"
        return (
            f"{scale * self.mean:+.{digits}f} [{scale * self.low:+.{digits}f}, "
            f"{scale * self.high:+.{digits}f}]"
        )


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> Paired:
    """The mean of ``a[i] - b[i]`` and its two-sided Student-t interval (``n - 1`` degrees of
    freedom; no interval for one pair)."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if d.ndim != 1 or d.size == 0 or len(a) != len(b):
        raise ValueError(f"need two equally long, non-empty sequences, got {len(a)} and {len(b)}")
    mean = float(d.mean())
    if d.size < 2:
        return Paired(mean, -math.inf, math.inf, 1, level)
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return Paired(mean, mean - half, mean + half, int(d.size), level)
