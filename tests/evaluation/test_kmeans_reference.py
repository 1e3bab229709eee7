"""The reference k-means (faiss's Clustering, as the Revisiting-DML evaluation runs it), the
clustering metrics given cluster labels, ``eval.kmeans`` from the config to the evaluator, and
recall@k's exclusion of the query with duplicate embeddings.

faiss-cpu is part of the test extra: the comparisons with the real faiss always run.
"""

from __future__ import annotations

import itertools
import re

import faiss
import ml_collections
import numpy as np
import pytest
from sklearn.metrics import normalized_mutual_info_score
from sklearn.metrics.cluster import pair_confusion_matrix

from jdml.backends import resolve_backends
from jdml.config import validate
from jdml.data.arrays import ImageArrays
from jdml.errors import ConfigError
from jdml.evaluation import embeddings as evaluator
from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.evaluation.kmeans import (
    KMEANS_MODES,
    REFERENCE_SEED,
    kmeans,
    mt19937_outputs,
    reference_kmeans,
    reference_permutation,
    split_empty_clusters,
)
from jdml.evaluation.kmeans.draws import SPLIT_EPS
from jdml.evaluation.metrics import Requirements, f1, nmi
from jdml.evaluation.splits import evaluate_splits


def faiss_kmeans(
    x: np.ndarray, k: int, niter: int = 20, seed: int = REFERENCE_SEED
) -> tuple[np.ndarray, np.ndarray, int]:
    """faiss's k-means as the Revisiting-DML evaluation runs it.

    Args:
      x: (N, D) float32 points.
      k: number of clusters.
      niter: faiss's iterations.
      seed: faiss's clustering seed.

    Returns:
      (k, D) centroids, (N,) nearest final centroid of every point (exact L2 search) and the
      number of empty-cluster splits over all iterations.
    """
    d = x.shape[1]
    clustering = faiss.Clustering(d, k)
    clustering.niter = niter
    clustering.seed = seed
    clustering.min_points_per_centroid = 1
    clustering.max_points_per_centroid = 1_000_000_000
    if hasattr(clustering, "early_stop_threshold"):  # recent faiss stops once converged
        clustering.early_stop_threshold = float("-inf")
    clustering.train(x, faiss.IndexFlatL2(d))
    centroids = faiss.vector_to_array(clustering.centroids).reshape(k, d)
    search = faiss.IndexFlatL2(d)
    search.add(centroids)
    assignments = search.search(x, 1)[1][:, 0]
    stats = clustering.iteration_stats
    nsplit = sum(stats.at(i).nsplit for i in range(stats.size()))
    return centroids, assignments, nsplit


def blobs(seed: int, n: int = 240, d: int = 16, classes: int = 8) -> np.ndarray:
    """(n, d) float32 points around ``classes`` well separated centres."""
    rng = np.random.default_rng(seed)
    centres = 5.0 * rng.standard_normal((classes, d))
    return (centres[rng.integers(0, classes, n)] + rng.standard_normal((n, d))).astype(np.float32)


def assert_same_as_faiss(x: np.ndarray, k: int, niter: int = 20) -> int:
    """jdml's reference k-means equals faiss's (same assignments, centroids within 1e-5).

    Returns:
      faiss's number of splits.
    """
    centroids, assignments, nsplit = faiss_kmeans(x, k, niter)
    ours = reference_kmeans(x, k, num_iters=niter)
    np.testing.assert_array_equal(np.asarray(ours.assignments), assignments)
    np.testing.assert_allclose(np.asarray(ours.centroids), centroids, rtol=0, atol=1e-5)
    return nsplit


# ---------------------------------------------------------------------------------------------
# The random numbers and the initialisation.


def test_mt19937_outputs_are_std_mt19937() -> None:
    """The C++ standard fixes std::mt19937's outputs for the default seed 5489: the first is
    3499211612 and the 10000th 4123659995."""
    outputs = mt19937_outputs(5489, 10_000)
    assert outputs.dtype == np.uint32
    assert outputs[0] == 3499211612 and outputs[-1] == 4123659995


@pytest.mark.parametrize(("n", "k", "seed"), [(50, 7, REFERENCE_SEED), (300, 40, 99), (13, 12, 5)])
def test_initial_centroids_are_faiss_permutation(n: int, k: int, seed: int) -> None:
    """With no iteration faiss's centroids are its initialisation: the points perm[:k] of its
    permutation seeded with seed + 1."""
    x = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
    centroids, _, _ = faiss_kmeans(x, k, niter=0, seed=seed)
    perm = reference_permutation(n, k, seed + 1)
    assert len(set(perm.tolist())) == k and perm.min() >= 0 and perm.max() < n
    np.testing.assert_array_equal(x[perm], centroids)
    ours = kmeans(x, k, num_iters=0, seed=seed, init="reference")
    np.testing.assert_array_equal(np.asarray(ours.centroids), centroids)


# ---------------------------------------------------------------------------------------------
# The whole algorithm against faiss.


@pytest.mark.parametrize(
    ("seed", "k", "d"),
    [
        *[(0, 5, 16), (0, 8, 16), (1, 20, 16), (2, 20, 16), (3, 60, 16), (4, 200, 16)],
        # wider points: the native sums of up to 16 clusters go R registers of dimensions at a
        # time, the clusters in groups, the ranges of clusters on both threads
        *[(5, 5, 40), (6, 13, 200), (7, 16, 130)],
    ],
)
def test_reference_kmeans_equals_faiss_on_blobs(seed: int, k: int, d: int) -> None:
    assert_same_as_faiss(blobs(seed, d=d), k)


def smallest_margin(x: np.ndarray, k: int, niter: int = 20) -> float:
    """How clearly every assignment of the reference k-means is decided, over its iterations.

    For every point and every set of centroids it is assigned to (after 0, 1, ..., ``niter``
    iterations): the gap between the squared distances to the nearest centroid and to the
    nearest centroid that differs from it, in float64, relative to |x|^2 + |c|^2 (the size of
    the terms of the float32 Gram expansion, whose rounding is about 1e-7 of it). Coinciding
    centroids are exact ties, decided by the index in both implementations.

    Returns:
      The smallest relative gap.
    """
    x64 = x.astype(np.float64)
    smallest = np.inf
    for i in range(niter + 1):
        c = np.asarray(reference_kmeans(x, k, num_iters=i).centroids).astype(np.float64)
        d = np.sum((x64[:, None, :] - c[None]) ** 2, axis=-1)
        best = d.argmin(axis=1)
        coincide = np.all(c[best][:, None, :] == c[None, :, :], axis=-1)
        gap = np.where(coincide, np.inf, d).min(axis=1) - d.min(axis=1)
        scale = np.sum(x64**2, axis=1) + np.sum(c[best] ** 2, axis=1)
        smallest = min(smallest, float(np.min(gap / scale)))
    return smallest


@pytest.mark.parametrize(("num_pairs", "seed"), [(1, 0), (2, 3), (4, 0), (4, 3)])
def test_reference_kmeans_equals_faiss_with_empty_clusters(num_pairs: int, seed: int) -> None:
    """Points chosen as initial centroids are duplicated, so pairs of initial centroids coincide:
    every point goes to the lower index of a pair (an exact tie), the other cluster is empty
    and faiss's split rule fills it, in the first iteration and possibly later.

    A split centroid pair differs by about 2/1024 relative, so some assignments after a split
    are decided by a small margin; these cases keep every margin above 1e-6 of the Gram terms
    (ten times their float32 rounding), where the rounding of faiss's BLAS and of XLA cannot
    decide differently.
    """
    x = blobs(seed, n=200, d=8, classes=6)
    k = 12
    perm = reference_permutation(len(x), k, REFERENCE_SEED + 1)
    for first, second in ((0, 1), (2, 3), (4, 7), (9, 5))[:num_pairs]:
        x[perm[second]] = x[perm[first]]
    assert smallest_margin(x, k) > 1e-6
    nsplit = assert_same_as_faiss(x, k)
    assert nsplit >= num_pairs


def test_reference_kmeans_one_cluster_per_point() -> None:
    """N == K: faiss copies the points as centroids; an exact duplicate goes to the lower index."""
    x = np.random.default_rng(3).standard_normal((30, 5)).astype(np.float32)
    x[17] = x[4]
    assert_same_as_faiss(x, 30)
    assignments = np.asarray(reference_kmeans(x, 30).assignments)
    expected = np.arange(30)
    expected[17] = 4
    np.testing.assert_array_equal(assignments, expected)


def test_reference_kmeans_seed_and_defaults() -> None:
    """``kmeans(init="reference")`` defaults to faiss's seed 1234; another seed is faiss's
    ``seed`` parameter."""
    x = blobs(5, n=120)
    default = kmeans(x, 10, init="reference")
    np.testing.assert_array_equal(
        np.asarray(default.assignments), faiss_kmeans(x, 10, seed=REFERENCE_SEED)[1]
    )
    other = kmeans(x, 10, init="reference", seed=7)
    np.testing.assert_array_equal(np.asarray(other.assignments), faiss_kmeans(x, 10, seed=7)[1])


# ---------------------------------------------------------------------------------------------
# The empty-cluster split, without faiss.


def test_split_rule_by_hand() -> None:
    """The first rand_float draws of std::mt19937(1234) are 0.19152, 0.49766, 0.62211, 0.81784,
    0.43773, ...; a candidate cj is accepted when the draw is below (size_cj - 1) / (N - K).

    Case 1: sizes (0, 4, 5), N - K = 6, p = (-1/6, 1/2, 2/3): draw 0 rejects cluster 0, draw 1
    (0.49766 < 0.5) accepts cluster 1.
    Case 2: sizes (0, 2, 0, 6), N - K = 4, p = (-1/4, 1/4, -1/4, 5/4): cluster 0 is split from
    cluster 3 at draw 3; sizes become (3, 2, 0, 3), p = (1/2, 1/4, -1/4, 1/2), and cluster 2
    restarts the scan at candidate 0 with draw 4 (0.43773 < 0.5): it is split from cluster 0,
    which was itself filled a moment before.
    """
    draws = mt19937_outputs(REFERENCE_SEED, 5).astype(np.float32) / np.float32(2.0**32)
    np.testing.assert_allclose(draws, [0.19152, 0.49766, 0.62211, 0.81784, 0.43773], atol=1e-5)
    up = np.float32(1 + SPLIT_EPS)
    down = np.float32(1 - SPLIT_EPS)

    centroids = np.array([[9.0, 9.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    out = split_empty_clusters(centroids, np.array([0, 4, 5], np.float32), num_points=9)
    np.testing.assert_array_equal(out.sources, [1])
    np.testing.assert_array_equal(out.counts, [2, 2, 5])
    np.testing.assert_array_equal(out.centroids[0], [3 * up, 4 * down])  # even dims * (1 + eps)
    np.testing.assert_array_equal(out.centroids[1], [3 * down, 4 * up])
    np.testing.assert_array_equal(out.centroids[2], [5, 6])
    assert centroids[0, 0] == 9.0  # the input is not modified

    centroids = np.array([[0, 0, 0], [2, 2, 2], [0, 0, 0], [4, 4, 4]], np.float32)
    out = split_empty_clusters(centroids, np.array([0, 2, 0, 6], np.float32), num_points=8)
    np.testing.assert_array_equal(out.sources, [3, 0])
    np.testing.assert_array_equal(out.counts, [1.5, 2, 1.5, 3])
    first = np.float32(4) * np.array([up, down, up], np.float32)
    np.testing.assert_array_equal(out.centroids[3], np.float32(4) * np.array([down, up, down]))
    np.testing.assert_array_equal(out.centroids[2], first * np.array([up, down, up], np.float32))
    np.testing.assert_array_equal(out.centroids[0], first * np.array([down, up, down], np.float32))


def scalar_split(
    centroids: np.ndarray, counts: np.ndarray, num_points: int
) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """The split rule one draw at a time, in plain Python floats rounded to float32."""
    centroids, counts = centroids.copy(), counts.astype(np.float32).copy()
    k = len(counts)
    outputs = iter(mt19937_outputs(REFERENCE_SEED, 1_000_000).tolist())
    sources = []
    for ci in range(k):
        if counts[ci] != 0:
            continue
        cj = 0
        while True:
            p = np.float32((float(counts[cj]) - 1.0) / float(np.float32(num_points - k)))
            r = np.float32(next(outputs)) / np.float32(4294967295.0)
            if r < p:
                break
            cj = (cj + 1) % k
        centroids[ci] = centroids[cj]
        for j in range(centroids.shape[1]):
            sign = 1 if j % 2 == 0 else -1
            centroids[ci, j] *= np.float32(1 + sign / 1024)
            centroids[cj, j] *= np.float32(1 - sign / 1024)
        counts[ci] = counts[cj] / np.float32(2)
        counts[cj] -= counts[ci]
        sources.append(cj)
    return centroids, counts, sources


def test_split_matches_scalar_rule_with_many_empty_clusters() -> None:
    rng = np.random.default_rng(0)
    k, n = 300, 420
    counts = np.zeros(k, np.int64)
    np.add.at(counts, rng.integers(0, 160, n), 1)  # clusters 160.. and some below are empty
    centroids = rng.standard_normal((k, 5)).astype(np.float32)
    out = split_empty_clusters(centroids, counts, n)
    expected, expected_counts, sources = scalar_split(centroids, counts, n)
    assert len(sources) == np.sum(counts == 0) > 140
    np.testing.assert_array_equal(out.sources, sources)
    np.testing.assert_array_equal(out.counts, expected_counts)
    np.testing.assert_array_equal(out.centroids, expected)
    assert out.counts.sum() == n and np.all(out.counts > 0)


# ---------------------------------------------------------------------------------------------
# NMI and F1 given the cluster labels.


def pair_f1(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Pair-counting F1 over every unordered pair of samples (0 without a true positive)."""
    tp = fp = fn = 0
    for i, j in itertools.combinations(range(len(labels)), 2):
        same_class, same_cluster = labels[i] == labels[j], clusters[i] == clusters[j]
        tp += same_class and same_cluster
        fp += same_cluster and not same_class
        fn += same_class and not same_cluster
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def sklearn_f1(labels: np.ndarray, clusters: np.ndarray) -> float:
    """F1 from scikit-learn's pair confusion matrix [[TN, FP], [FN, TP]] (ordered pairs)."""
    (_, fp), (fn, tp) = pair_confusion_matrix(labels, clusters)
    return 0.0 if tp == 0 else float(2 * tp / (2 * tp + fp + fn))


def entropy_nmi(labels: np.ndarray, clusters: np.ndarray) -> float:
    """I(labels; clusters) / mean(H(labels), H(clusters)) from the contingency table (1 when
    both are a single group, 0 when only one is)."""
    _, a = np.unique(labels, return_inverse=True)
    _, b = np.unique(clusters, return_inverse=True)
    joint = np.zeros((a.max() + 1, b.max() + 1))
    np.add.at(joint, (a, b), 1.0)
    joint /= len(labels)
    pa, pb = joint.sum(1), joint.sum(0)

    def entropy(p: np.ndarray) -> float:
        p = p[p > 0]
        return float(-np.sum(p * np.log(p)))

    nz = joint > 0
    mutual = float(np.sum(joint[nz] * np.log(joint[nz] / np.outer(pa, pb)[nz])))
    ha, hb = entropy(pa), entropy(pb)
    if ha == 0 and hb == 0:
        return 1.0
    if ha == 0 or hb == 0:
        return 0.0
    return mutual / ((ha + hb) / 2)


def clustering_cases() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 6, 60)
    noisy = np.where(rng.random(60) < 0.3, rng.integers(0, 8, 60), labels)
    return {
        "noisy": (labels, noisy),
        "perfect-relabelled": (labels, (labels * 7 + 3) % 11),
        "one-cluster": (labels, np.zeros(60, np.int64)),
        "all-singletons": (labels, np.arange(60)),
        "singleton-classes": (np.arange(12), rng.integers(0, 3, 12)),
        "both-singletons": (np.arange(12), np.arange(12)[::-1].copy()),
        "one-class": (np.zeros(20, np.int64), rng.integers(0, 4, 20)),
    }


@pytest.mark.parametrize("case", list(clustering_cases()))
def test_nmi_and_f1_given_cluster_labels(case: str) -> None:
    labels, clusters = clustering_cases()[case]
    requirements = Requirements(
        labels=labels, class_sizes=np.bincount(labels)[labels], cluster_assignments=clusters
    )
    expected_nmi = normalized_mutual_info_score(labels, clusters)
    assert nmi(requirements) == pytest.approx(expected_nmi, abs=1e-12)
    assert nmi(requirements) == pytest.approx(entropy_nmi(labels, clusters), abs=1e-12)
    assert f1(requirements) == pytest.approx(pair_f1(labels, clusters), abs=1e-12)
    assert f1(requirements) == pytest.approx(sklearn_f1(labels, clusters), abs=1e-12)


def test_nmi_and_f1_edge_values() -> None:
    cases = clustering_cases()
    labels, one = cases["one-cluster"]
    requirements = Requirements(labels, np.bincount(labels)[labels], cluster_assignments=one)
    assert nmi(requirements) == 0.0
    sizes = np.bincount(labels)
    precision = 1.0  # every same-class pair shares the one cluster
    recall = np.sum(sizes * (sizes - 1)) / (60 * 59)
    assert f1(requirements) == pytest.approx(2 * precision * recall / (precision + recall))
    labels, singletons = cases["all-singletons"]
    requirements = Requirements(labels, sizes[labels], cluster_assignments=singletons)
    assert f1(requirements) == 0.0
    labels, clusters = cases["perfect-relabelled"]
    requirements = Requirements(labels, sizes[labels], cluster_assignments=clusters)
    assert nmi(requirements) == pytest.approx(1.0) and f1(requirements) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------
# eval.kmeans: from the config to the evaluator.


def glyph_eval_config(kmeans_mode: str) -> ml_collections.ConfigDict:
    from configs.revisiting import get_config

    config = get_config("data=glyphs")
    with config.unlocked():
        config.eval.kmeans = kmeans_mode
        config.eval.metrics = ("recall@1", "nmi", "f1")
    return config


@pytest.fixture(scope="module")
def tiny_split() -> tuple[ImageArrays, np.ndarray]:
    """48 random 4x4 images of 6 classes and their embeddings (the flattened pixels)."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(6), 8).astype(np.int32)
    images = rng.integers(0, 40, (6, 4, 4, 1))[labels] + rng.integers(0, 20, (48, 4, 4, 1))
    data = ImageArrays(images.astype(np.uint8), labels, tuple("abcdef"))
    return data, data.eval_images(np.arange(48)).reshape(48, -1)


def flatten_embed(params: object, batch_stats: object, images: np.ndarray) -> dict:
    return {"embedding": images.reshape(images.shape[0], -1)}


@pytest.mark.parametrize("mode", ["reference", "k-means++"])
def test_config_kmeans_reaches_the_evaluator(
    mode: str, tiny_split: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, x = tiny_split
    config = glyph_eval_config(mode)
    validate(config)
    calls = []
    real_kmeans = evaluator.kmeans

    def recording_kmeans(*args: object, **kwargs: object) -> object:
        calls.append(kwargs)
        return real_kmeans(*args, **kwargs)

    monkeypatch.setattr(evaluator, "kmeans", recording_kmeans)
    scalars = evaluate_splits(
        flatten_embed,
        None,
        None,
        {"test": data},
        {"test": list(config.eval.metrics)},
        config.eval,
        head="embedding",
        seed=7,
    ).metrics
    # The reference k-means always runs with faiss's seed 1234 (None: the mode's default).
    # No backends given: resolved once, at the entry, from the environment.
    native = resolve_backends().native_kmeans
    want = {"native": native, "seed": None if mode == "reference" else 7, "init": mode}
    assert calls == [want]
    direct = evaluate_embeddings(x, data.labels, config.eval.metrics, seed=7, kmeans_init=mode)
    assert scalars["test"] == pytest.approx(direct, abs=1e-12)
    if mode == "reference":
        clusters = faiss_kmeans(np.asarray(x, np.float32), 6)[1]
        assert scalars["test"]["nmi"] == pytest.approx(
            normalized_mutual_info_score(data.labels, clusters), abs=1e-12
        )


def test_unknown_kmeans_is_a_config_error() -> None:
    config = glyph_eval_config("faiss")
    message = "eval.kmeans='faiss'; choose one of: k-means++, random, reference"
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(config)
    assert KMEANS_MODES == ("k-means++", "random", "reference")


@pytest.mark.parametrize("module", ["revisiting", "diva", "sharing", "dm2"])
def test_benchmark_presets_use_the_reference_kmeans(module: str) -> None:
    import importlib

    get_config = importlib.import_module(f"configs.{module}").get_config
    for data in ("cub200", "cars196", "sop", "inshop"):
        assert get_config(f"data={data}").eval.kmeans == "reference"
    assert get_config("data=glyphs").eval.kmeans == "k-means++"


# ---------------------------------------------------------------------------------------------
# Recall@k with exact duplicate embeddings.


def test_recall_excludes_the_query_itself_with_duplicates() -> None:
    """Samples 1 and 2 are the same embedding with different classes, far from the rest.

    jdml excludes each query by its index, so their nearest other sample is the duplicate of
    the other class: two misses. Dropping the first neighbour of faiss's search instead drops
    sample 1 (the tie goes to the lower index) from the list of query 2, whose first remaining
    neighbour is then query 2 itself: a hit.
    """
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    x[2] = x[1] = 10.0
    labels = np.array([0, 1, 2, 5, 3, 3, 4, 4])  # 0 and 5: single-sample classes, misses
    # Each of 4-7 has its classmate (0.1 away) as its nearest other sample.
    x[4:] = [[-5, 0, 0, 0], [-5, 0.1, 0, 0], [0, -5, 0, 0], [0, -5, 0.1, 0]]
    recall = evaluate_embeddings(x, labels, ["recall@1"])["recall@1"]
    assert recall == pytest.approx(4 / 8)  # the pairs 4-5 and 6-7 only

    index = faiss.IndexFlatL2(4)
    index.add(x)
    first_dropped = index.search(x, 2)[1][:, 1]
    assert first_dropped[2] == 2  # query 2 is its own first kept neighbour
    assert np.mean(labels[first_dropped] == labels) == pytest.approx(5 / 8)
