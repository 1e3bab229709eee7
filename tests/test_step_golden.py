"""The train step keeps its recorded numbers, bit for bit: a plain run, a stacked DM2 cohort on
2 devices and a heterogeneous one with its batch split over 2 devices, 4 steps each (every
step's metrics and the final params, batch statistics, optimiser and method states).

The record is ``tests/golden/step/bitwise.npz``, written by ``tools/make_step_golden.py`` before
the member spine's refactor (issue 71); on a CPU without the record's AVX-512 support the
numbers are compared to 1e-5 instead.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from tests.helpers import REPO, cpu_kind, load_script, make_npz, recorded_cpu_kind

RECORD = os.path.join(REPO, "tests", "golden", "step", "bitwise.npz")


def _tool():
    return load_script("tools/make_step_golden.py")


def _recorded(name: str) -> dict[str, np.ndarray]:
    with np.load(RECORD) as f:
        return {k.split(":", 1)[1]: f[k] for k in f.files if k.startswith(f"{name}:")}


@pytest.fixture(scope="module")
def npz(tmp_path_factory):
    return make_npz(str(tmp_path_factory.mktemp("data") / "tiny.npz"))


@pytest.mark.parametrize("name", ["plain", "stacked", "listed"])
def test_the_step_keeps_its_recorded_numbers(name, npz):
    tool = _tool()
    with np.load(RECORD) as f:
        same_cpu = recorded_cpu_kind(f) == cpu_kind()
    recorded = _recorded(name)
    now = tool.compute(name, npz)
    assert set(now) == set(recorded)
    for key, value in recorded.items():
        if same_cpu:
            np.testing.assert_array_equal(now[key], value, err_msg=f"{name} {key}")
        else:
            np.testing.assert_allclose(now[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
