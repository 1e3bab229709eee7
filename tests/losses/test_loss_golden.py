"""Every registered loss against its recorded value, metrics and gradients, bit for bit.

The record is ``tests/golden/losses/bitwise.npz``, written by ``tools/make_loss_golden.py``
before the losses' masked reductions moved to ``jdml.losses.base`` (``masked_mean``,
``masked_fraction``): the move keeps every loss's numbers identical. A loss added later has no
record here until the tool is run again.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.helpers import REPO, cpu_kind, load_script, recorded_cpu_kind

RECORD = os.path.join(REPO, "tests", "golden", "losses", "bitwise.npz")


def _tool():
    return load_script("tools/make_loss_golden.py")


def _recorded() -> dict[str, dict[str, np.ndarray]]:
    with np.load(RECORD) as f:
        out: dict[str, dict[str, np.ndarray]] = {}
        for key in f.files:
            if ":" in key:
                name, what = key.split(":", 1)
                out.setdefault(name, {})[what] = f[key]
        return out


RECORDED = _recorded()


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_a_loss_keeps_its_recorded_numbers(name):
    tool = _tool()
    with np.load(RECORD) as f:
        same_cpu = recorded_cpu_kind(f) == cpu_kind()
    now = tool.compute(name)
    assert set(now) == set(RECORDED[name])
    for what, value in RECORDED[name].items():
        if same_cpu:
            np.testing.assert_array_equal(now[what], value, err_msg=f"{name} {what}")
        else:  # another CPU kind's rounding, amplified by SoftTriple's scale (8e-7, measured)
            np.testing.assert_allclose(now[what], value, rtol=1e-5, atol=1e-6, err_msg=what)
