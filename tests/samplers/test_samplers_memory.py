"""full_random and the embedding-driven samplers: structure, determinism, selection and costs."""

from __future__ import annotations

import functools

import jax
import numpy as np
import pytest
import scipy.linalg
from scipy.stats import multivariate_normal, wasserstein_distance

from jdml.config import component_defaults
from jdml.samplers import SAMPLERS
from jdml.samplers.batchmatch import binned_wasserstein, sample_wasserstein, trace_sqrt_psd
from jdml.samplers.coreset import _d2_one, _greedy_one
from jdml.samplers.embedded import STREAM_REFERENCE_BUG

B, N_PER = 24, 2  # batch size, samples per class: 12 groups per batch
MEMORY_SAMPLERS = ("greedy_coreset", "d2_coreset", "disthist_batchmatch", "fid_batchmatch")


@pytest.fixture(scope="module")
def clusters() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20 well separated clusters of 30 points in 8-D, 3 classes per cluster.

    Returns labels, float32 memory and the cluster of each point.
    """
    rng = np.random.default_rng(0)
    cluster = np.repeat(np.arange(20), 30)
    memory = rng.normal(size=(20, 8))[cluster] * 3 + 0.3 * rng.normal(size=(600, 8))
    labels = cluster * 3 + rng.integers(0, 3, size=600)
    return labels, memory.astype(np.float32), cluster


@pytest.fixture(scope="module")
def imbalanced() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One cluster of 500 points (25 classes) and 9 small clusters of 12 (one class each)."""
    rng = np.random.default_rng(1)
    cluster = np.repeat(np.arange(10), [500] + [12] * 9)
    memory = rng.normal(size=(10, 8))[cluster] * 5 + 0.3 * rng.normal(size=(len(cluster), 8))
    labels = np.concatenate([np.repeat(np.arange(25), 20), 25 + np.repeat(np.arange(9), 12)])
    return labels, memory.astype(np.float32), cluster


def _make(name: str, labels: np.ndarray, **kwargs):
    args = {"batch_size": B, "samples_per_class": N_PER, "seed": 3}
    if name in MEMORY_SAMPLERS:
        args["bigbs"] = 128
    return SAMPLERS.get(name)(labels, **(args | kwargs))


def _assert_groups(batches: np.ndarray, labels: np.ndarray, n: int = N_PER) -> None:
    assert batches.dtype == np.int64
    assert batches.min() >= 0 and batches.max() < len(labels)
    groups = labels[batches].reshape(len(batches), -1, n)
    assert np.all(groups == groups[..., :1])


def _clusters_covered(batches: np.ndarray, cluster: np.ndarray) -> float:
    return float(np.mean([len(np.unique(cluster[b])) for b in batches]))


def _covering_radius(batches: np.ndarray, memory: np.ndarray) -> float:
    """Mean over batches of max over memory points of the distance to the nearest batch point."""
    radii = [
        np.sqrt(((memory[:, None] - memory[b][None]) ** 2).sum(-1)).min(1).max() for b in batches
    ]
    return float(np.mean(radii))


def test_registry_flags_and_defaults():
    assert not SAMPLERS.get("class_random").needs_memory
    assert not SAMPLERS.get("full_random").needs_memory
    for name in MEMORY_SAMPLERS:
        assert SAMPLERS.get(name).needs_memory
    assert component_defaults(SAMPLERS.get("greedy_coreset")) == {
        "bigbs": 512,
        "softened": False,
        "lowproj_dim": -1,
        "reference_index_bug": False,
    }
    assert component_defaults(SAMPLERS.get("d2_coreset"))["d2_lambda"] == 1.0
    assert component_defaults(SAMPLERS.get("disthist_batchmatch")) == {
        "bigbs": 512,
        "ncomps": 10,
        "hist_bins": 50,
        "hist_weight": 75.0,
        "lowproj_dim": -1,
        "reference_histogram_samples": False,
    }
    assert component_defaults(SAMPLERS.get("fid_batchmatch"))["fid_eps"] == 1e-8


# ----------------------------------------------------------------------------- full_random


def test_full_random_structure_and_guaranteed_pair():
    rng = np.random.default_rng(0)
    labels = rng.permutation(np.repeat(np.arange(40), rng.integers(1, 30, size=40)))
    sampler = _make("full_random", labels)
    assert sampler.steps_per_epoch == len(labels) // B
    firsts = []
    for step in range(300):
        batch = sampler.batch(step)
        assert batch.shape == (B,) and batch.dtype == np.int64
        assert batch.min() >= 0 and batch.max() < len(labels)
        assert labels[batch[-1]] in labels[batch[:-1]]  # at least one shared-label pair
        firsts.append(labels[batch[:-1]])
    np.testing.assert_array_equal(sampler.batch(7), _make("full_random", labels).batch(7))
    assert not np.array_equal(sampler.batch(7), sampler.batch(8))
    assert not np.array_equal(sampler.batch(7), _make("full_random", labels, seed=4).batch(7))
    # class-balanced: classes are uniform although their sizes range from 1 to 29
    freq = np.bincount(np.concatenate(firsts), minlength=40) / (300 * (B - 1))
    assert np.abs(freq - 1 / 40).max() < 0.008


# ------------------------------------------------------------------------ shared interface


@pytest.mark.parametrize("name", MEMORY_SAMPLERS)
def test_epoch_batches_structure_and_determinism(name, clusters):
    labels, memory, _ = clusters
    sampler = _make(name, labels)
    batches = sampler.epoch_batches(0, memory)
    assert batches.shape == (len(labels) // B, B)
    _assert_groups(batches, labels)
    np.testing.assert_array_equal(batches, sampler.epoch_batches(0, jax.device_put(memory)))
    np.testing.assert_array_equal(batches, _make(name, labels).epoch_batches(0, memory))
    assert not np.array_equal(batches, sampler.epoch_batches(1, memory))
    assert not np.array_equal(batches, _make(name, labels, seed=4).epoch_batches(0, memory))
    np.random.seed(0)  # global numpy state plays no part
    np.testing.assert_array_equal(batches, sampler.epoch_batches(0, memory))
    assert sampler.epoch_batches(0, memory, num_batches=3).shape == (3, B)
    with pytest.raises(NotImplementedError, match="epoch_batches"):
        sampler.batch(0)


@pytest.mark.parametrize("name", MEMORY_SAMPLERS)
def test_duplicate_memory_rows(name, clusters):
    labels, memory, _ = clusters
    identical = np.broadcast_to(memory[:1], memory.shape)
    two_rows = np.where(np.arange(len(labels))[:, None] % 2 == 0, memory[0], memory[1])
    for mem in (identical, two_rows):
        sampler = _make(name, labels)
        _assert_groups(sampler.epoch_batches(0, mem), labels)
        if hasattr(sampler, "candidate_costs"):
            assert np.all(np.isfinite(sampler.candidate_costs(0, mem)[2]))


def test_errors(clusters):
    labels, memory, _ = clusters
    sampler = _make("greedy_coreset", labels)
    with pytest.raises(ValueError, match="memory must be"):
        sampler.epoch_batches(0, memory[:-1])
    with pytest.raises(ValueError, match="epoch"):
        sampler.epoch_batches(-1, memory)
    with pytest.raises(ValueError, match="raise bigbs"):
        _make("greedy_coreset", labels, bigbs=8)
    with pytest.raises(ValueError, match="lowproj_dim"):
        _make("fid_batchmatch", labels, lowproj_dim=0)


def test_fill_groups():
    labels = np.array([0] * 6 + [1] + [2] * 2)
    sampler = _make("greedy_coreset", labels, batch_size=8, samples_per_class=4, bigbs=9)
    anchors = np.array([[0, 3, 6, 7]] * 50)
    groups = sampler.fill_groups(np.random.default_rng(0), anchors).reshape(50, 4, 4)
    np.testing.assert_array_equal(groups[..., 0], anchors)
    assert np.all(labels[groups] == labels[anchors][..., None])
    assert all(len(set(g)) == 4 for g in groups[:, :2].reshape(-1, 4))  # enough images: distinct
    assert np.all(groups[:, 2] == 6)  # a single image is repeated
    assert all(set(g) == {7, 8} for g in groups[:, 3])  # a small class gives all its images
    assert len(np.unique(groups[:, 0, 1:])) == 5  # the others are all reachable


# -------------------------------------------------------------------------------- coresets


def _numpy_k_center(x: np.ndarray, first: int, k: int) -> list[int]:
    m = ((x[:, None] - x[None]) ** 2).sum(-1)
    chosen, min_dist = [first], m[first].copy()
    while len(chosen) < k:
        masked = np.where(np.isin(np.arange(len(x)), chosen), -1.0, min_dist)
        chosen.append(int(np.argmax(masked)))
        min_dist = np.minimum(min_dist, m[chosen[-1]])
    return chosen


def test_greedy_is_k_center(clusters):
    x = clusters[1][:200].astype(np.float64).astype(np.float32)
    for seed in range(3):
        chosen = np.asarray(_greedy_one(jax.random.key(seed), x, 12, False))
        assert chosen.tolist() == _numpy_k_center(x.astype(np.float64), int(chosen[0]), 12)


def test_coresets_cover_better_than_random(imbalanced):
    labels, memory, cluster = imbalanced
    rand = _make("class_random", labels)
    random_batches = np.stack([rand.batch(s) for s in range(25)])
    greedy = _make("greedy_coreset", labels, bigbs=256).epoch_batches(0, memory)
    soft = _make("greedy_coreset", labels, bigbs=256, softened=True).epoch_batches(0, memory)
    buggy = _make("greedy_coreset", labels, bigbs=256, reference_index_bug=True)
    buggy_batches = buggy.epoch_batches(0, memory)

    covered = {
        k: _clusters_covered(b, cluster)
        for k, b in [("random", random_batches), ("greedy", greedy), ("soft", soft)]
    }
    covered["bug"] = _clusters_covered(buggy_batches, cluster)
    assert covered["greedy"] > 9.8 and covered["soft"] > 9.0  # a big batch can miss a cluster
    assert covered["random"] < 5.0 and covered["bug"] < 5.0
    radius_greedy = _covering_radius(greedy, memory)
    assert radius_greedy < 0.3 * _covering_radius(random_batches, memory)
    assert radius_greedy < 0.3 * _covering_radius(buggy_batches, memory)

    # the reference's anchors come from one unrelated draw of bigbs indices per epoch
    unrelated = buggy.host_rng(0, STREAM_REFERENCE_BUG).choice(len(labels), 256, replace=True)
    assert np.all(np.isin(buggy_batches[:, ::N_PER], unrelated))


def test_d2_second_pick_follows_density_times_distance():
    """P(second = x | first = f) is proportional to N(x; mean, cov) * M(x, f) (lambda = 1)."""
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(7, 2)) * [1.0, 0.5]).astype(np.float32)
    draws = jax.vmap(functools.partial(_d2_one, x=x, num_select=2, d2_lambda=1.0))(
        jax.random.split(jax.random.key(0), 20_000)
    )
    draws = np.asarray(draws)
    x64 = x.astype(np.float64)
    density = multivariate_normal.pdf(x64, x64.mean(0), np.cov(x64.T))
    m = ((x64[:, None] - x64[None]) ** 2).sum(-1)
    tested = 0
    for first in np.unique(draws[:, 0]):
        second = draws[draws[:, 0] == first, 1]
        if len(second) < 1500:
            continue
        expected = density * m[first]
        expected /= expected.sum()
        observed = np.bincount(second, minlength=len(x)) / len(second)
        assert np.abs(observed - expected).max() < 0.04
        tested += 1
    assert tested >= 2


def test_d2_distance_term_spreads_the_anchors(clusters):
    labels, memory, _ = clusters

    def mean_pairwise(lam: float) -> float:
        anchors = _make("d2_coreset", labels, d2_lambda=lam).anchors(0, jax.device_put(memory), 25)
        x = memory[anchors]
        return float(np.sqrt(((x[:, :, None] - x[:, None]) ** 2).sum(-1)).mean())

    assert mean_pairwise(1.0) > 1.05 * mean_pairwise(0.0)


def test_coreset_options_run(clusters):
    labels, memory, _ = clusters
    for name, kwargs in [
        ("d2_coreset", {"reference_index_bug": True}),
        ("greedy_coreset", {"lowproj_dim": 4}),
    ]:
        sampler = _make(name, labels, **kwargs)
        batches = sampler.epoch_batches(0, memory)
        _assert_groups(batches, labels)
        np.testing.assert_array_equal(batches, sampler.epoch_batches(0, memory))


# --------------------------------------------------------------------------- batch matching


def _pairwise_upper(x: np.ndarray) -> np.ndarray:
    d = np.sqrt(np.clip(((x[:, None] - x[None]) ** 2).sum(-1), 0, None))
    return d[np.triu_indices(len(x), 1)]


def _ddm_cost(big: np.ndarray, sub: np.ndarray, quirk: bool) -> float:
    values_big, values_sub = _pairwise_upper(big), _pairwise_upper(sub)
    span = (values_big.min(), values_big.max())
    h_big = np.histogram(values_big, bins=50, range=span)[0]
    h_sub = np.histogram(values_sub, bins=50, range=span)[0]
    h_big, h_sub = h_big / h_big.sum(), h_sub / h_sub.sum()
    if quirk:
        w = wasserstein_distance(h_big, h_sub) + wasserstein_distance(h_sub, h_big)
    else:
        edges = np.linspace(*span, 51)
        centres = (edges[1:] + edges[:-1]) / 2
        w = 2 * wasserstein_distance(centres, centres, h_big, h_sub)
    moments = np.linalg.norm(big.mean(0) - sub.mean(0)) + np.linalg.norm(big.std(0) - sub.std(0))
    return moments + 75 * w


def _frd_cost(big: np.ndarray, sub: np.ndarray) -> float:
    cov_big, cov_sub = np.cov(big.T), np.cov(sub.T)
    offset = 1e-8 * np.eye(len(cov_big))
    root = scipy.linalg.sqrtm((cov_big + offset) @ (cov_sub + offset)).real
    diff = big.mean(0) - sub.mean(0)
    return diff @ diff + np.trace(cov_big) + np.trace(cov_sub) - 2 * np.trace(root)


@pytest.mark.parametrize(
    ("name", "kwargs", "cost"),
    [
        ("disthist_batchmatch", {}, functools.partial(_ddm_cost, quirk=False)),
        (
            "disthist_batchmatch",
            {"reference_histogram_samples": True},
            functools.partial(_ddm_cost, quirk=True),
        ),
        ("fid_batchmatch", {}, _frd_cost),
    ],
    ids=["ddm", "ddm-reference-quirk", "frd"],
)
def test_matching_picks_the_cheapest_candidate(name, kwargs, cost, clusters):
    labels, memory, _ = clusters
    sampler = _make(name, labels, **kwargs)
    big, cands, costs = sampler.candidate_costs(0, memory)
    steps = len(big)
    assert cands.shape == (steps, 10, B) and costs.shape == (steps, 10)
    batches = sampler.epoch_batches(0, memory)
    chosen = cands[np.arange(steps), costs.argmin(1)]
    np.testing.assert_array_equal(batches, np.take_along_axis(big, chosen, axis=1))
    mem64 = memory.astype(np.float64)
    for step in range(6):
        ref = np.array([cost(mem64[big[step]], mem64[big[step][c]]) for c in cands[step]])
        np.testing.assert_allclose(costs[step], ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())
        order = np.sort(ref)
        if order[1] - order[0] > 1e-3 * np.abs(ref).max():  # a clear winner
            assert costs[step].argmin() == ref.argmin()


def test_candidates_are_spc_subsets_of_the_big_batch(clusters):
    labels, _, _ = clusters
    sampler = _make("fid_batchmatch", labels)
    big, cands = sampler.candidates(0, 5)
    assert big.shape == (5, 128) and cands.shape == (5, 10, B)
    _assert_groups(big, labels)
    for b, c in zip(big, cands, strict=True):
        groups = c.reshape(10, -1, N_PER)
        assert np.all(labels[b][groups] == labels[b][groups[..., :1]])
        assert all(len(set(g)) == N_PER for g in groups.reshape(-1, N_PER))  # no repeats


def test_wasserstein_helpers_match_scipy():
    rng = np.random.default_rng(0)
    for _ in range(5):
        h_a, h_b = rng.random(50), rng.random(50) * (rng.random(50) > 0.5)
        h_a, h_b = h_a / h_a.sum(), h_b / h_b.sum()
        centres = 0.3 + 0.02 * (np.arange(50) + 0.5)
        expected = wasserstein_distance(centres, centres, h_a, h_b)
        got = binned_wasserstein(np.float32(h_a), np.float32(h_b), np.float32(0.02))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(
            sample_wasserstein(np.float32(h_a), np.float32(h_b)),
            wasserstein_distance(h_a, h_b),
            rtol=1e-5,
            atol=1e-8,
        )


def test_trace_sqrt_matches_scipy_sqrtm():
    rng = np.random.default_rng(0)
    for rank in (16, 9, 1):
        f = rng.normal(size=(16, rank))
        m = f @ f.T + 1e-6 * np.eye(16)
        expected = np.trace(scipy.linalg.sqrtm(m).real)
        # float32: eigenvalues near 0 are off by ~1e-7 lambda_max, their square roots by ~1e-4
        np.testing.assert_allclose(trace_sqrt_psd(np.float32(m)), expected, rtol=1e-3)
