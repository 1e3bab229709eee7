"""Sample std, paired intervals and verdicts (jdml.statistics) against hand-computed values."""

from __future__ import annotations

import math

import pytest

from jdml.statistics import mean_std, paired


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
