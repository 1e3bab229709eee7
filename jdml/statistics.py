"""Statistics over seeds: sample standard deviations, paired differences and their verdicts.

Results over a few seeds are summarised by their mean and **sample** standard deviation
(``ddof=1``). Two rows trained with the same seeds are compared by the per-seed (paired)
differences: their mean and a Student-t confidence interval. A claim that row A beats row B
then reads, from the interval of A - B:

* **reproduces**: the whole interval lies on the claimed side of 0;
* **does not reproduce**: the whole interval lies on the other side;
* **not resolved**: the interval holds 0 (more seeds, or a larger effect, would decide).

A design that adds seeds to the claims still unresolved and reads the interval again looks at
the data more than once; :func:`pocock_level` gives the level each look's interval must use so
that the chance of a false verdict over all looks stays at ``alpha`` (Pocock, 1977). Reading
many claims at once, :func:`holm` keeps the chance of any false verdict among them at the
same level (Holm, 1979), from each claim's :meth:`Paired.p_value`.

The Student-t interval counts one source of variance: the training seed, on one fixed set of
test classes. Where the per-query hits of both rows are kept, :func:`two_way_bootstrap`
resamples the test classes as well, for an interval that also covers the choice of classes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

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
    method: str = "t"  # "t": Student-t over seeds; "bootstrap": a percentile bootstrap

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

    def p_value(self) -> float:
        """The two-sided p-value of the paired t-test of a zero mean difference, recovered from
        the interval (its half-width is ``t(level, n - 1)`` standard errors); 1 for one seed.

        Raises:
          ValueError: for a bootstrap interval, which has no t-test behind it.
        """
        se = self._standard_error()
        if se is None:
            return 1.0
        if se <= 0:
            return 1.0 if self.mean == 0 else 0.0
        return float(2 * stats.t.sf(abs(self.mean) / se, self.n - 1))

    def p_below(self, bound: float) -> float:
        """The one-sided p-value of the paired t-test of "the true difference is ``bound`` or
        more" (small: the difference lies below ``bound``), recovered from the interval as
        :meth:`p_value` is; 1 for one seed.

        Raises:
          ValueError: for a bootstrap interval, which has no t-test behind it.
        """
        se = self._standard_error()
        if se is None:
            return 1.0
        if se <= 0:
            return 0.0 if self.mean < bound else 1.0
        return float(stats.t.cdf((self.mean - bound) / se, self.n - 1))

    def _standard_error(self) -> float | None:
        """The standard error behind a t interval (its half-width is ``t(level, n - 1)`` of
        them), or None for one seed or an unbounded interval."""
        if self.method != "t":
            raise ValueError(f"a {self.method} interval has no t-test p-value")
        if self.n < 2 or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return None
        return (self.high - self.low) / 2 / float(stats.t.ppf(0.5 + self.level / 2, self.n - 1))

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
    freedom; no interval for one pair).

    Example: a method against its baseline over four seeds (the same seed paired), Recall@1 in
    points; the interval holds 0, so the difference is not resolved:

    >>> from jdml.statistics import paired
    >>> d = paired([0.71, 0.69, 0.72, 0.70], [0.70, 0.68, 0.70, 0.70])
    >>> d.cell(), d.verdict()
    ('+1.00 [-0.30, +2.30]', 'not resolved')
    """
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    if d.ndim != 1 or d.size == 0 or len(a) != len(b):
        raise ValueError(f"need two equally long, non-empty sequences, got {len(a)} and {len(b)}")
    mean = float(d.mean())
    if d.size < 2:
        return Paired(mean, -math.inf, math.inf, 1, level)
    half = float(stats.t.ppf(0.5 + level / 2, d.size - 1) * d.std(ddof=1) / math.sqrt(d.size))
    return Paired(mean, mean - half, mean + half, int(d.size), level)


def false_verdict_rate(
    level: float, looks: Sequence[int] = (5, 10), draws: int = 200_000, seed: int = 0
) -> float:
    """The chance that a claim without a true difference gets a verdict at some look of a
    sequential design, simulated: normal per-seed differences, the first ``looks[0]`` seeds
    read at ``level``, and while unresolved the first ``looks[k]`` seeds read again at the
    same level (Student-t intervals as :func:`paired` computes them).

    With ``level=pocock_level(2)`` and looks of 5 and 10 seeds this is about 5 %; reading both
    looks at 95 % gives about 8.7 %.
    """
    d = np.random.default_rng(seed).standard_normal((draws, max(looks)))
    verdict = np.zeros(draws, bool)
    for n in looks:
        x = d[:, :n]
        half = stats.t.ppf(0.5 + level / 2, n - 1) * x.std(1, ddof=1) / np.sqrt(n)
        verdict |= np.abs(x.mean(1)) > half
    return float(verdict.mean())


def seeds_to_resolve(
    effect: float, std: float, level: float, power: float = 0.8, most: int = 10_000
) -> int:
    """The fewest seeds with which a paired difference of true mean ``effect`` and per-seed
    standard deviation ``std`` gets an interval at ``level`` wholly above 0 with probability
    ``power`` (one look; the noncentral t distribution of the paired t statistic).

    Raises:
      ValueError: for a non-positive effect or std, or when ``most`` seeds are not enough.
    """
    if effect <= 0 or std <= 0 or not 0 < power < 1:
        raise ValueError(f"need effect > 0, std > 0 and 0 < power < 1, got {effect}, {std}")
    n = 2
    while n <= most:
        critical = stats.t.ppf(0.5 + level / 2, n - 1)
        if stats.nct.sf(critical, n - 1, effect * math.sqrt(n) / std) >= power:
            return n
        n += 1
    raise ValueError(f"more than {most} seeds are needed")


def std_upper_bound(std: float, n: int, level: float = 0.95) -> float:
    """The one-sided upper confidence bound at ``level`` of a normal population's standard
    deviation from a sample std ``std`` of ``n`` values (chi-square with ``n - 1`` degrees of
    freedom): a planning value that does not take the observed spread as the true one."""
    if n < 2 or std < 0 or not 0 < level < 1:
        raise ValueError(f"need n >= 2, std >= 0 and 0 < level < 1, got {n}, {std}, {level}")
    return std * math.sqrt((n - 1) / float(stats.chi2.ppf(1 - level, n - 1)))


def two_way_bootstrap(
    differences: np.ndarray,
    classes: np.ndarray,
    level: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    over_classes: bool = True,
) -> Paired:
    """The mean per-query difference of two rows and its percentile bootstrap interval over
    training seeds and test classes.

    Each of ``resamples`` draws picks the seeds with replacement and, independently, the test
    classes with replacement (each class with all its queries), and takes the mean difference
    over the drawn seeds' drawn queries; the interval holds the central ``level`` of the draws.
    This is the two-way (seeds x classes) bootstrap of crossed random effects: it counts the
    test classes as a sample of the classes the method could be tested on, where the paired
    Student-t interval (:func:`paired`) holds them fixed. It keeps each query's hit as it was
    measured against the whole test set, so it approximates the resampled benchmark (a class
    drawn twice does not change its neighbours); it is known to be somewhat conservative, as it
    counts the seed-by-class interaction in both margins. With ``over_classes=False`` only the
    seeds are resampled: the same percentile method with the classes fixed, for comparing the
    widths.

    Args:
      differences: (S, Q) per-query differences, row A's hit minus row B's (e.g. Recall@1's 0/1
        hits), for S seeds on the same Q test queries, in the same order; NaN for a query the
        metric leaves out (dropped, in every seed).
      classes: (Q,) the queries' classes.
      level: the interval's central probability.
      resamples: the number of bootstrap draws.
      seed: the seed of the draws (the interval is a deterministic function of the inputs).
      over_classes: resample the classes as well as the seeds.

    Returns:
      :class:`Paired` with ``method="bootstrap"``: the mean over all seeds and queries, and the
      interval (n: the seeds).
    """
    d = np.asarray(differences, np.float64)
    classes = np.asarray(classes).reshape(-1)
    if d.ndim != 2 or d.shape[1] != classes.shape[0] or d.size == 0:
        raise ValueError(
            f"need (seeds, queries) differences and (queries,) classes, got {d.shape} and "
            f"{classes.shape}"
        )
    if not 0.0 < level < 1.0 or resamples < 1:
        raise ValueError(f"need 0 < level < 1 and resamples >= 1, got {level} and {resamples}")
    kept = ~np.isnan(d).any(axis=0)
    d, classes = d[:, kept], classes[kept]
    _, ids = np.unique(classes, return_inverse=True)
    num_seeds, num_classes = d.shape[0], int(ids.max()) + 1
    sums = np.zeros((num_seeds, num_classes))  # (S, C) summed differences per seed and class
    np.add.at(sums, (slice(None), ids), d)
    sizes = np.bincount(ids, minlength=num_classes).astype(np.float64)
    mean = float(sums.sum() / (num_seeds * sizes.sum()))
    if num_seeds < 2 and not over_classes:
        return Paired(mean, -math.inf, math.inf, num_seeds, level, "bootstrap")
    rng = np.random.default_rng(seed)
    draws = np.empty(resamples)
    chunk = 1000
    for start in range(0, resamples, chunk):
        b = min(chunk, resamples - start)
        seeds = rng.multinomial(num_seeds, np.full(num_seeds, 1 / num_seeds), size=b)
        if over_classes:
            weights = rng.multinomial(num_classes, np.full(num_classes, 1 / num_classes), size=b)
        else:
            weights = np.ones((b, num_classes))
        total = np.einsum("bs,sc,bc->b", seeds, sums, weights)
        draws[start : start + b] = total / (num_seeds * (weights @ sizes))
    low, high = np.quantile(draws, [0.5 - level / 2, 0.5 + level / 2])
    return Paired(mean, float(low), float(high), num_seeds, level, "bootstrap")


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Which of a family of hypotheses Holm's step-down procedure rejects at family-wise error
    ``alpha`` (Holm, "A simple sequentially rejective multiple test procedure", Scand. J.
    Statist. 1979): the p-values in increasing order, the ``i``-th (from 0) rejected while it
    is at most ``alpha / (m - i)``; the first that is not stops the procedure.

    Returns:
      One flag per p-value, in the order given.

    Example: three claims at 5 %: 0.01 <= 0.05/3 is rejected, then 0.03 > 0.05/2 stops:

    >>> from jdml.statistics import holm
    >>> holm([0.01, 0.04, 0.03], alpha=0.05)
    [True, False, False]
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"need 0 < alpha < 1, got {alpha}")
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    rejected = [False] * m
    for rank, i in enumerate(order):
        if p_values[i] > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected


def pocock_level(looks: int, alpha: float = 0.05) -> float:
    """The two-sided confidence level of each of ``looks`` equally spaced looks at accumulating
    data (the same number of new seeds before each), such that a claim whose true difference is
    0 gets a verdict at some look with probability ``alpha`` (Pocock, "Group sequential methods
    in the design and analysis of clinical trials", Biometrika 1977).

    The boundary is Pocock's: under the normal approximation the look-``k`` statistics are
    ``Z_k = S_k / sqrt(k)`` of a random walk (correlation ``sqrt(j / k)`` between looks ``j <
    k``), and ``c`` solves ``P(max_k |Z_k| > c) = alpha`` (c = 2.178 for two looks, 2.413 for
    five). Each look then reads its Student-t interval at the level ``1 - 2 * (1 - Phi(c))``
    (0.9706 for two looks), the usual small-sample use of the nominal level.
    """
    if looks < 1 or not 0.0 < alpha < 1.0:
        raise ValueError(f"need looks >= 1 and 0 < alpha < 1, got looks={looks}, alpha={alpha}")
    if looks == 1:
        return 1.0 - alpha
    k = np.arange(1, looks + 1)
    corr = np.sqrt(np.minimum.outer(k, k) / np.maximum.outer(k, k))
    walk = stats.multivariate_normal(np.zeros(looks), corr, seed=0)

    def excess(c: float) -> float:
        inside = walk.cdf(np.full(looks, c), lower_limit=np.full(looks, -c))
        return 1.0 - inside - alpha

    c = optimize.brentq(excess, stats.norm.isf(alpha / 2), 6.0, xtol=1e-7)
    return float(1.0 - 2.0 * stats.norm.sf(c))
