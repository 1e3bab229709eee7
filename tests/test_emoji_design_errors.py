"""experiments/emoji_design_errors.py's count of same-design retrieval errors, on explicit
points."""

from __future__ import annotations

import os

import numpy as np
import pytest

from jdml.errors import DataError
from tests.helpers import load_experiment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def script():
    return load_experiment("emoji_design_errors")


def test_design_errors_on_explicit_points(script):
    # classes 0, 1, 2 drawn by designs a=0 and b=1; points on a line.
    x = np.array([[0.0], [0.1], [1.0], [5.0], [5.3], [9.0]], np.float32)
    labels = np.array([0, 0, 1, 1, 2, 2])
    designs = np.array([0, 1, 0, 1, 0, 1])
    # first neighbours: 0->1 (right), 1->0 (right), 2->1 (wrong, design b vs a: other),
    # 3->4 (wrong, b vs a: other), 4->3 (wrong, a vs b: other), 5->4 (right)
    r = script.design_errors(x, labels, designs)
    assert r["recall@1"] == pytest.approx(3 / 6)
    assert r["same_design"] == 0.0
    # same design: point 2 (class 1, design a) moved next to point 0 (class 0, design a)
    x[2] = -0.05
    r = script.design_errors(x, labels, designs)
    # 0->2 (wrong, same design), 1->0 (right), 2->0 (wrong, same), 3->4, 4->3 (wrong, other),
    # 5->4 (right)
    assert r["recall@1"] == pytest.approx(2 / 6)
    assert r["same_design"] == pytest.approx(2 / 4)
    # chance: among the other classes' 4 images, 2 share the query's design, for every query
    assert r["chance"] == pytest.approx(0.5)


def test_test_designs_follow_the_split_and_refuse_another_build(script):
    labels = np.array([3, 0, 2, 1, 3, 2])
    designs = np.array([0, 1, 2, 3, 4, 5])
    # classes 2 and 3 are the upper half: images 0, 2, 4, 5 in dataset order
    np.testing.assert_array_equal(script.test_designs(labels, designs, 4), [0, 2, 4, 5])
    with pytest.raises(DataError, match="not trained on this build"):
        script.test_designs(labels, designs, 5)
