"""Miners against explicit NumPy enumerations: validity, distributions, degenerate batches."""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.errors import UnknownNameError
from jdml.miners import MINERS, Tuples, make_miner
from jdml.miners.distance import MAX_DISTANCE, negative_log_weights

NUM_DRAWS = 20_000
BATCH = 8  # every test batch has 8 samples, so each miner configuration compiles once
LABELS = np.array([0, 0, 0, 1, 1, 2, 3, 3])  # class 2 is a singleton


@functools.cache
def _batched(name: str, **hparams):
    """Jitted miner vmapped over keys; cached so each configuration compiles once."""
    fn = make_miner(name, **hparams)
    return jax.jit(jax.vmap(fn, in_axes=(0, None, None)))


@functools.cache
def _log_weights(upper_cutoff: float | None):
    return jax.jit(functools.partial(negative_log_weights, upper_cutoff=upper_cutoff))


def _draw(name: str, x: np.ndarray, labels: np.ndarray, **hparams) -> Tuples:
    assert len(labels) == BATCH
    keys = jax.random.split(jax.random.key(1234), NUM_DRAWS)
    out = _batched(name, **hparams)(keys, jnp.asarray(x), jnp.asarray(labels))
    return Tuples(*(np.asarray(v) for v in out))


def _probs(x: np.ndarray, labels: np.ndarray, upper_cutoff: float | None) -> np.ndarray:
    """Normalised sampling probabilities from the library's log weights."""
    w = np.exp(np.asarray(_log_weights(upper_cutoff)(jnp.asarray(x), jnp.asarray(labels))))
    return w / w.sum(axis=1, keepdims=True)


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _np_negative_probs(
    x: np.ndarray, labels: np.ndarray, *, lower: float = 0.5, upper: float | None = 1.4
) -> np.ndarray:
    """Wu et al. sampling probabilities, row by row in float64, with the documented fallback."""
    x = x.astype(np.float64)
    n, dim = x.shape
    probs = np.zeros((n, n))
    for i in range(n):
        others = [j for j in range(n) if labels[j] != labels[i]]
        dist = {j: np.linalg.norm(x[i] - x[j]) for j in others}
        allowed = [j for j in others if upper is None or dist[j] < upper]
        if not allowed:
            probs[i, others] = 1.0 / max(len(others), 1)
            continue
        d = np.array([min(max(dist[j], lower), MAX_DISTANCE) for j in allowed])
        log_w = (2 - dim) * np.log(d) - (dim - 3) / 2 * np.log(1 - d**2 / 4)
        w = np.exp(log_w - log_w.max())
        probs[i, allowed] = w / w.sum()
    return probs


def _empirical(indices: np.ndarray) -> np.ndarray:
    """(draws, B) sampled columns -> (B, B) per-row frequencies."""
    return np.stack([np.bincount(col, minlength=BATCH) / len(col) for col in indices.T])


@pytest.fixture(scope="module")
def sphere() -> np.ndarray:
    return _unit(np.random.default_rng(3).normal(size=(BATCH, 8)))


# ----------------------------------------------------------------------------- distance


@pytest.mark.parametrize("upper_cutoff", [1.4, None])
def test_distance_negative_frequencies_match_weights(sphere, upper_cutoff):
    expected = _np_negative_probs(sphere, LABELS, upper=upper_cutoff)
    if upper_cutoff is not None:  # the batch must actually exercise the cutoff
        assert (expected == 0).sum() > (LABELS[:, None] == LABELS[None]).sum()
    np.testing.assert_allclose(_probs(sphere, LABELS, upper_cutoff), expected, atol=1e-5)
    freq = _empirical(_draw("distance", sphere, LABELS, upper_cutoff=upper_cutoff).negatives)
    tv = 0.5 * np.abs(freq - expected).sum(axis=1)
    assert tv.max() < 0.02, tv
    assert np.all(freq[expected == 0] == 0)


def test_distance_tuples_are_well_formed(sphere):
    t = _draw("distance", sphere, LABELS)
    assert all(v.dtype == np.int32 for v in t[:3]) and t.valid.dtype == bool
    assert np.all(t.anchors == np.arange(BATCH))
    ya, yp, yn = LABELS[t.anchors], LABELS[t.positives], LABELS[t.negatives]
    assert np.all(yn != ya)
    assert np.all(yp[t.valid] == ya[t.valid])
    assert np.all(t.positives[t.valid] != t.anchors[t.valid])
    # the singleton class has no positive: invalid, positive = anchor
    np.testing.assert_array_equal(t.valid, np.broadcast_to(LABELS != 2, t.valid.shape))
    assert np.all(t.positives[:, 5] == 5)
    # positives are uniform over the other members of the class
    np.testing.assert_allclose(_empirical(t.positives)[0, [1, 2]], 0.5, atol=0.02)
    # draws differ between keys, and a key determines its draw
    assert len(np.unique(t.negatives, axis=0)) > 1
    again = _draw("distance", sphere, LABELS)
    np.testing.assert_array_equal(t.negatives, again.negatives)


def test_distance_self_positive_option(sphere):
    t = _draw("distance", sphere, LABELS, allow_self_positive=True)
    assert t.valid.all()
    assert np.all(t.positives[:, 5] == 5)
    assert np.all(LABELS[t.negatives] != LABELS[t.anchors])


def test_distance_single_class_batch_is_invalid(sphere):
    t = _draw("distance", sphere, np.zeros(BATCH, np.int64), allow_self_positive=True)
    assert not t.valid.any()
    assert np.all(t.negatives == t.anchors)


def test_distance_no_nan_with_duplicate_and_antipodal_points():
    e = np.eye(128, dtype=np.float32)
    # duplicates within a class, across classes (d = 0) and antipodal pairs (d = 2)
    x = np.stack([e[0], e[0], -e[0], -e[0], e[0], e[1], -e[1], e[1]])
    labels = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    for upper in (1.4, None):
        log_w = np.asarray(_log_weights(upper)(jnp.asarray(x), jnp.asarray(labels)))
        assert not np.isnan(log_w).any() and not np.isposinf(log_w).any()
        assert np.all(np.isfinite(log_w).any(axis=1))
        np.testing.assert_allclose(
            _probs(x, labels, upper), _np_negative_probs(x, labels, upper=upper), atol=1e-5
        )
        t = _draw("distance", x, labels, upper_cutoff=upper)
        assert t.valid.all()
        assert np.all(labels[t.negatives] != labels[t.anchors])


def test_distance_upper_cutoff_and_fallback():
    e = np.eye(8, dtype=np.float32)
    near = _unit(e[0] + e[1])  # distance sqrt(2 - sqrt(2)) ~ 0.77 from e0, ~ 1.85 from -e0
    x = np.stack([e[0], e[0], -e[0], near, -e[0], e[2], e[3], e[4]])
    labels = np.array([0, 0, 2, 1, 2, 0, 0, 0])
    with_cutoff = _empirical(_draw("distance", x, labels, upper_cutoff=1.4).negatives)
    # the only negative of anchor 0 under the cutoff is the near point
    np.testing.assert_allclose(with_cutoff[0], [0, 0, 0, 1, 0, 0, 0, 0])
    # anchor 4 (at -e0) sees e0, e0 at d = 2 and `near` at d ~ 1.85, but e2..e4 at d = sqrt(2)
    # (>= 1.4 as well): every negative is beyond the cutoff, so it falls back to uniform
    np.testing.assert_allclose(with_cutoff[4], [1 / 6] * 2 + [0, 1 / 6, 0] + [1 / 6] * 3, atol=0.02)
    np.testing.assert_allclose(with_cutoff, _np_negative_probs(x, labels, upper=1.4), atol=0.02)
    without = _empirical(_draw("distance", x, labels, upper_cutoff=None).negatives)
    # without the cutoff the antipodal points (d clamped just below 2) dominate
    assert without[0, 2] + without[0, 4] > 0.99
    np.testing.assert_allclose(without, _np_negative_probs(x, labels, upper=None), atol=0.02)


def test_distance_rejects_bad_cutoffs(sphere):
    with pytest.raises(ValueError, match="upper_cutoff"):
        negative_log_weights(sphere, LABELS, lower_cutoff=0.5, upper_cutoff=0.4)


# ----------------------------------------------------------------------------- random


def _enumerate_triplets(labels: np.ndarray) -> list[tuple[int, int, int]]:
    n = len(labels)
    return [
        (a, p, q)
        for a, p, q in itertools.product(range(n), repeat=3)
        if labels[a] == labels[p] and a != p and labels[q] != labels[a]
    ]


def test_random_is_uniform_over_valid_triplets():
    triplets = _enumerate_triplets(LABELS)  # anchors carry unequal numbers of triplets
    assert len(triplets) == 3 * 2 * 5 + 2 * 1 * 6 + 2 * 1 * 6
    t = _draw("random", np.zeros((BATCH, 2), np.float32), LABELS)
    assert t.valid.all()
    assert all(v.dtype == np.int32 for v in t[:3])
    drawn = np.stack([t.anchors, t.positives, t.negatives], -1).reshape(-1, 3)
    index = {trip: i for i, trip in enumerate(triplets)}
    ids = np.array([index.get(tuple(row), -1) for row in drawn.tolist()])
    assert np.all(ids >= 0), "an invalid triplet was drawn"
    freq = np.bincount(ids, minlength=len(triplets)) / len(ids)
    assert 0.5 * np.abs(freq - 1 / len(triplets)).sum() < 0.02


@pytest.mark.parametrize(
    "labels", [np.zeros(BATCH, np.int64), np.arange(BATCH)], ids=["one_class", "no_positive_pairs"]
)
def test_random_without_valid_triplets(labels):
    t = _draw("random", np.zeros((BATCH, 2), np.float32), labels)
    assert not t.valid.any()
    assert np.all((t.anchors == t.positives) & (t.anchors == t.negatives))
    assert t.anchors.min() >= 0 and t.anchors.max() < BATCH


# ----------------------------------------------------------------------------- registry


def test_registry_errors():
    assert {"distance", "random"} <= set(MINERS.names())
    with pytest.raises(UnknownNameError, match=r"known miner names: .*distance"):
        MINERS.get("hardest")
    with pytest.raises(TypeError, match="upper"):
        make_miner("distance", upper=1.0)
