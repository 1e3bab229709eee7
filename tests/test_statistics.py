"""Sample std, paired intervals and verdicts (jdml.statistics) against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from jdml.statistics import (
    false_verdict_rate,
    holm,
    mean_std,
    paired,
    pocock_level,
    seeds_to_resolve,
)


def test_mean_and_sample_std():
    mean, std = mean_std([1.0, 2.0, 4.0])
    assert mean == pytest.approx(7 / 3)
    # sum of squared deviations 14/3 over n - 1 = 2
    assert std == pytest.approx(math.sqrt(7 / 3))
    assert mean_std([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        mean_std([])


def test_paired_interval_is_students_t():
    # differences 1.1, 1.5, 0.2: mean 0.9333, sample std 0.6658, t(0.975, 2) = 4.302653
    d = paired([2.1, 2.5, 1.2], [1.0, 1.0, 1.0])
    sd = math.sqrt(((1.1 - 0.9333333) ** 2 + (1.5 - 0.9333333) ** 2 + (0.2 - 0.9333333) ** 2) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)
    assert d.mean == pytest.approx(0.9333333, abs=1e-6) and d.n == 3
    assert (d.low, d.high) == pytest.approx((0.9333333 - half, 0.9333333 + half), abs=1e-6)
    assert d.verdict() == "not resolved"  # 0.93 +- 1.65
    assert d.cell() == "+93.33 [-72.07, +258.74]"


def test_verdicts_follow_the_interval_and_the_claimed_sign():
    up = paired([1.0, 1.1, 1.2, 1.3], [0.0, 0.0, 0.0, 0.0])
    assert up.verdict(+1) == "reproduces" and up.verdict(-1) == "does not reproduce"
    down = paired([0.0, 0.0, 0.0], [1.0, 1.2, 0.9])
    assert down.verdict(+1) == "does not reproduce" and down.verdict(-1) == "reproduces"
    one = paired([1.0], [0.0])
    assert one.verdict() == "not resolved" and one.cell() == "+100.00 (1 seed)"
    with pytest.raises(ValueError):
        paired([1.0, 2.0], [1.0])


def test_pocock_levels_match_the_tabulated_boundaries():
    """Pocock's (1977) constants for 2-5 looks at a 5 % two-sided error: 2.178, 2.289, 2.361,
    2.413 (the nominal level is 1 - 2 * (1 - Phi(c))); one look is the plain 95 %."""

    assert pocock_level(1) == pytest.approx(0.95)
    for looks, c in ((2, 2.178), (3, 2.289), (4, 2.361), (5, 2.413)):
        assert stats.norm.isf((1 - pocock_level(looks)) / 2) == pytest.approx(c, abs=2e-3)
    assert pocock_level(2) == pytest.approx(0.9706, abs=2e-4)
    with pytest.raises(ValueError):
        pocock_level(0)


def test_a_two_look_design_at_the_pocock_level_keeps_its_error_rate():
    """Simulated claims with no true difference, 5 seeds then 5 more where the first look is
    unresolved: reading both looks at 95 % gives a false verdict far more often than 5 %, at
    the Pocock level about 5 % (``false_verdict_rate``, whose reading is ``paired``'s)."""
    x = np.random.default_rng(0).standard_normal((1, 10))[0, :5]
    for level in (0.95, pocock_level(2)):
        half = stats.t.ppf(0.5 + level / 2, 4) * x.std(ddof=1) / np.sqrt(5)
        assert (abs(x.mean()) > half) == (paired(x, np.zeros(5), level).verdict() != "not resolved")
    for level, low, high in ((0.95, 0.080, 0.090), (pocock_level(2), 0.047, 0.056)):
        assert low < false_verdict_rate(level) < high, level
    assert false_verdict_rate(0.95, looks=(5,)) == pytest.approx(0.05, abs=0.002)


def test_seeds_to_resolve_is_the_smallest_count_with_the_power():
    """Against a simulation of the paired t interval at the count returned and one fewer."""
    rng = np.random.default_rng(1)
    for effect, std, level in ((1.0, 1.0, 0.95), (0.5, 1.5, 0.9706)):
        n = seeds_to_resolve(effect, std, level)
        for k, above in ((n, True), (n - 1, False)):
            x = effect + std * rng.standard_normal((100_000, k))
            half = stats.t.ppf(0.5 + level / 2, k - 1) * x.std(1, ddof=1) / np.sqrt(k)
            rate = (x.mean(1) - half > 0).mean()
            assert (rate >= 0.8 - 0.005) if above else (rate < 0.8 + 0.005), (effect, k, rate)
    assert seeds_to_resolve(1.0, 1.0, 0.95) == 10  # the textbook 80 % count for d = 1
    with pytest.raises(ValueError, match="effect > 0"):
        seeds_to_resolve(-0.5, 1.0, 0.95)
    with pytest.raises(ValueError, match="more than 50"):
        seeds_to_resolve(0.01, 1.0, 0.95, most=50)


def test_the_p_value_is_the_paired_t_tests_at_any_level():
    """``Paired.p_value`` recovers the t-test's p-value from the interval, whatever its level."""
    rng = np.random.default_rng(3)
    for n in (2, 5, 10):
        a, b = rng.normal(0.4, 1.0, n), rng.normal(0.0, 1.0, n)
        want = stats.ttest_rel(a, b).pvalue
        for level in (0.95, pocock_level(2), 0.99):
            assert paired(a, b, level).p_value() == pytest.approx(want, rel=1e-9)
    assert paired([1.0], [0.0]).p_value() == 1.0
    assert paired([1.0, 1.0], [0.0, 0.0]).p_value() == 0.0  # no spread, a difference


def test_the_one_sided_p_value_below_a_bound_is_the_t_tests():
    """``Paired.p_below(bound)`` is scipy's one-sided paired t-test of a mean below ``bound``
    (``ttest_1samp`` of the differences against ``bound``, ``alternative="less"``); the
    interval lies wholly below ``bound`` exactly when it is under half the interval's error."""
    rng = np.random.default_rng(4)
    for n in (2, 5, 10):
        a, b = rng.normal(0.4, 1.0, n), rng.normal(0.0, 1.0, n)
        for bound in (-1.0, 0.0, 0.4, 2.5):
            want = stats.ttest_1samp(a - b, bound, alternative="less").pvalue
            for level in (0.95, pocock_level(2)):
                d = paired(a, b, level)
                assert d.p_below(bound) == pytest.approx(want, rel=1e-9)
                assert (d.high < bound) == (d.p_below(bound) < (1 - level) / 2)
    assert paired([1.0], [0.0]).p_below(5.0) == 1.0
    assert paired([1.0, 1.0], [0.0, 0.0]).p_below(2.0) == 0.0  # no spread, below the bound


@pytest.mark.parametrize(
    "p_values, alpha, rejected",
    [
        # sorted 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: stops there
        ([0.01, 0.04, 0.03, 0.005], 0.05, [True, False, False, True]),
        ([0.01, 0.02, 0.03, 0.04], 0.05, [True, False, False, False]),  # 0.02 > 0.05/3
        ([0.001, 0.001, 0.001], 0.05, [True, True, True]),
        ([0.04], 0.05, [True]),  # one hypothesis: the level itself
        ([0.02, 0.5, 0.011], 0.0294, [False, False, False]),  # 0.011 > 0.0294 / 3: none
        ([0.02, 0.5, 0.009], 0.0294, [False, False, True]),  # 0.02 > 0.0294 / 2: one
        ([], 0.05, []),
    ],
)
def test_holm_rejects_step_down(p_values, alpha, rejected):
    assert holm(p_values, alpha) == rejected
    with pytest.raises(ValueError, match="0 < alpha < 1"):
        holm([0.1], 1.5)


def _exact_bootstrap(d: np.ndarray, classes: np.ndarray, over_classes: bool):
    """Every outcome of the seeds-and-classes bootstrap with its probability, enumerated
    draw by draw (an independent computation of what ``two_way_bootstrap`` samples)."""
    import itertools

    names = sorted(set(classes.tolist()))
    num_seeds = d.shape[0]
    outcomes: dict[float, float] = {}
    class_draws = itertools.product(names, repeat=len(names)) if over_classes else [tuple(names)]
    class_draws = list(class_draws)
    for seeds in itertools.product(range(num_seeds), repeat=num_seeds):
        for drawn in class_draws:
            values = [d[s, q] for s in seeds for c in drawn for q in np.flatnonzero(classes == c)]
            value = round(float(np.mean(values)), 12)
            p = 1 / (num_seeds**num_seeds * len(class_draws))
            outcomes[value] = outcomes.get(value, 0.0) + p
    return sorted(outcomes.items())


def _quantile(outcomes, q: float) -> float:
    total = 0.0
    for value, p in outcomes:
        total += p
        if total >= q - 1e-12:
            return value
    return outcomes[-1][0]


@pytest.mark.parametrize("over_classes", [False, True])
def test_two_way_bootstrap_samples_seeds_and_classes(over_classes):
    """Two seeds, three classes of unequal size: the bootstrap's interval ends are the exact
    quantiles of the enumerated resampling distribution, and its mean the mean difference."""
    from jdml.statistics import two_way_bootstrap

    classes = np.array([4, 4, 4, 9, 7, 7])
    d = np.array([[1.0, 0.0, 1.0, -1.0, 0.0, 1.0], [0.0, 0.0, -1.0, 1.0, 1.0, 1.0]])
    exact = _exact_bootstrap(d, classes, over_classes)
    # Levels whose ends fall strictly inside a step of the exact distribution function.
    cdf = np.cumsum([p for _, p in exact])
    levels = [lv for lv in np.arange(0.3, 0.96, 0.05) if all(
        np.min(np.abs(cdf - q)) > 0.01 for q in (0.5 - lv / 2, 0.5 + lv / 2))]  # fmt: skip
    assert levels
    for level in levels:
        got = two_way_bootstrap(d, classes, level, resamples=40_000, over_classes=over_classes)
        assert got.method == "bootstrap" and got.n == 2 and got.level == level
        assert got.mean == pytest.approx(d.mean())
        assert got.low == pytest.approx(_quantile(exact, 0.5 - level / 2))
        assert got.high == pytest.approx(_quantile(exact, 0.5 + level / 2))
    with pytest.raises(ValueError, match="no t-test"):
        got.p_value()


def test_two_way_bootstrap_edge_cases():
    from jdml.statistics import two_way_bootstrap

    classes = np.array([0, 0, 1, 1])
    same = np.tile([0.0, 1.0, 1.0, 0.0], (3, 1))  # every seed alike: no seed variance
    fixed = two_way_bootstrap(same, classes, over_classes=False)
    assert (fixed.low, fixed.mean, fixed.high) == pytest.approx((0.5, 0.5, 0.5))
    # Classes 0 and 1 differ in mean only through their queries' mix: counting them widens.
    wide = two_way_bootstrap(np.tile([1.0, 1.0, 0.0, 0.0], (3, 1)), classes)
    assert wide.low == 0.0 and wide.high == 1.0
    # A query left out (NaN in some seed) is left out of every seed; reproducible by seed.
    gaps = np.array([[1.0, np.nan, 0.0, 1.0], [1.0, 0.0, 0.0, 1.0]])
    got = two_way_bootstrap(gaps, classes, resamples=500, seed=3)
    assert got.mean == pytest.approx(2 / 3)
    assert got == two_way_bootstrap(gaps, classes, resamples=500, seed=3)
    one = two_way_bootstrap(same[:1], classes, over_classes=False)
    assert one.verdict() == "not resolved" and one.n == 1
    for bad in (np.ones(4), np.ones((2, 3))):
        with pytest.raises(ValueError, match=r"\(seeds, queries\)"):
            two_way_bootstrap(bad, classes)
    with pytest.raises(ValueError, match="level"):
        two_way_bootstrap(same, classes, level=1.0)


def test_the_stds_upper_bound_covers_the_true_std_at_its_level():
    """``std_upper_bound``: the textbook value for ten values (sqrt(9 / 3.325) of the sample
    std), and in simulation it lies above the true standard deviation 95 % of the time."""
    from jdml.statistics import std_upper_bound

    assert std_upper_bound(1.0, 10) == pytest.approx(math.sqrt(9 / 3.32511), rel=1e-4)
    rng = np.random.default_rng(5)
    samples = rng.normal(0.0, 2.0, (20_000, 5))
    bounds = np.array([std_upper_bound(s, 5) for s in samples.std(axis=1, ddof=1)])
    assert np.mean(bounds >= 2.0) == pytest.approx(0.95, abs=0.005)
    with pytest.raises(ValueError, match="n >= 2"):
        std_upper_bound(1.0, 1)
