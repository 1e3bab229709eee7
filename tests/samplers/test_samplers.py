"""SPC-n sampler: batch structure, determinism per (seed, step), options and errors."""

from __future__ import annotations

import numpy as np
import pytest

from jdml.errors import UnknownNameError
from jdml.samplers import SAMPLERS
from jdml.samplers.class_random import ClassRandomSampler


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    """30 classes of 1 to 7 images each, shuffled so class members are not contiguous."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, 8, size=30)
    return rng.permutation(np.repeat(np.arange(30), sizes))


def _make(labels, **kwargs) -> ClassRandomSampler:
    args = {"batch_size": 24, "samples_per_class": 4, "seed": 3} | kwargs
    return SAMPLERS.get("class_random")(labels, **args)


def test_batch_shape_and_group_structure(labels):
    sampler = _make(labels)
    assert sampler.steps_per_epoch == len(labels) // 24
    for step in range(20):
        batch = sampler.batch(step)
        assert batch.shape == (24,) and batch.dtype == np.int64
        assert batch.min() >= 0 and batch.max() < len(labels)
        groups = labels[batch].reshape(6, 4)
        assert np.all(groups == groups[:, :1])


def test_deterministic_per_seed_and_step(labels):
    a, b = _make(labels), _make(labels)
    np.testing.assert_array_equal(a.batch(5), b.batch(5))
    np.testing.assert_array_equal(a.batch(5), a.batch(5))  # no hidden state
    assert not np.array_equal(a.batch(5), a.batch(6))
    assert not np.array_equal(a.batch(5), _make(labels, seed=4).batch(5))
    np.random.seed(0)  # global numpy state plays no part
    first = a.batch(7)
    np.random.seed(1)
    np.testing.assert_array_equal(first, a.batch(7))


def test_reference_draws_with_replacement(labels):
    sampler = _make(labels, batch_size=8, samples_per_class=8)
    small = {c for c in range(30) if np.sum(labels == c) < 8}
    batches = [sampler.batch(s) for s in range(50)]
    # a class with fewer than 8 images necessarily repeats images in its group
    assert any(labels[b[0]] in small and len(np.unique(b)) < 8 for b in batches)
    # classes are drawn uniformly, not in proportion to their size
    classes = np.array([labels[_make(labels).batch(s)[::4]] for s in range(400)]).ravel()
    freq = np.bincount(classes, minlength=30) / len(classes)
    assert np.abs(freq - 1 / 30).max() < 0.015


def test_unique_options(labels):
    sampler = _make(labels, unique_classes=True, unique_images=True)
    for step in range(20):
        batch = sampler.batch(step)
        groups = batch.reshape(6, 4)
        assert len(np.unique(labels[groups[:, 0]])) == 6
        for group in groups:
            size = np.sum(labels == labels[group[0]])
            assert len(np.unique(group)) == min(4, size)  # small classes give all their images


def test_errors(labels):
    with pytest.raises(ValueError, match="batch size 100 is not divisible by samples_per_class 3"):
        _make(labels, batch_size=100, samples_per_class=3)
    with pytest.raises(ValueError, match="unique_classes needs 12 classes"):
        _make(np.repeat(np.arange(5), 10), batch_size=24, samples_per_class=2, unique_classes=True)
    with pytest.raises(ValueError, match="exceeds"):
        _make(labels[:10])
    with pytest.raises(ValueError, match="step"):
        _make(labels).batch(-1)
    with pytest.raises(UnknownNameError, match="known sampler names: class_epoch, class_random"):
        SAMPLERS.get("spc")


def _epochs(labels, **kwargs):
    args = {"batch_size": 24, "samples_per_class": 4, "seed": 3} | kwargs
    return SAMPLERS.get("class_epoch")(labels, **args)


def test_class_epochs_take_every_class_once_per_epoch(labels):
    sampler = _epochs(labels)
    assert sampler.steps_per_epoch == 30 // 6
    for epoch in range(3):
        steps = range(epoch * 5, (epoch + 1) * 5)
        batches = [sampler.batch(s) for s in steps]
        classes = np.concatenate([labels[b].reshape(6, 4)[:, 0] for b in batches])
        for b in batches:
            groups = labels[b].reshape(6, 4)
            assert np.all(groups == groups[:, :1])
        # 30 classes in 5 batches of 6: each class exactly once in the epoch
        np.testing.assert_array_equal(np.sort(classes), np.arange(30))
    assert not np.array_equal(sampler.batch(0), sampler.batch(5))  # a new order per epoch
    np.testing.assert_array_equal(sampler.batch(7), _epochs(labels).batch(7))


def test_class_epochs_draw_distinct_images_where_a_class_has_enough(labels):
    sampler = _epochs(labels)
    counts = np.bincount(labels)
    for step in range(40):
        for group in sampler.batch(step).reshape(6, 4):
            if counts[labels[group[0]]] >= 4:
                assert len(np.unique(group)) == 4
            else:  # all four drawn with replacement from its few images
                assert set(group) <= set(np.flatnonzero(labels == labels[group[0]]))


def test_class_epochs_skip_the_classes_left_over(labels):
    sampler = _epochs(labels, batch_size=28, samples_per_class=4)  # 7 groups: 4 steps, 2 left
    assert sampler.steps_per_epoch == 4
    seen = np.concatenate([labels[sampler.batch(s)][::4] for s in range(4)])
    assert len(np.unique(seen)) == 28
    with pytest.raises(ValueError, match="class_epoch needs 31 classes per batch"):
        _epochs(labels, batch_size=124, samples_per_class=4)
