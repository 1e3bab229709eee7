"""Tests of the full metric suite: precision@1, r_precision, map@k, map, f1, rho_spectrum, dists,
vector outputs, multi-head evaluation and the one-computation-per-requirement contract.

Every metric is checked against a brute-force float64 NumPy computation written from its
definition (or against scikit-learn) on small random and hand-built embeddings.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import jax
import numpy as np
import pytest
from scipy.spatial.distance import cdist
from sklearn.decomposition import TruncatedSVD
from sklearn.metrics import average_precision_score

from jdml.backends import Backends
from jdml.errors import UnknownMetricError
from jdml.evaluation import embeddings as evaluator
from jdml.evaluation.embeddings import (
    EmbeddingEvaluation,
    combine_heads,
    evaluate_embeddings,
    evaluate_embeddings_with_vectors,
    evaluate_heads,
    head_embeddings,
)
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import full_ranking_blocks, knn, knn_full_ranking
from jdml.evaluation.metrics import Requirements, f1, get_metric
from jdml.evaluation.table import format_table

RETRIEVAL = ["recall@1", "recall@4", "precision@1", "r_precision", "map@r", "map@c"]
RETRIEVAL += ["map@1000", "map@7", "map"]
SPECTRUM = ["rho_spectrum@1", "rho_spectrum@2", "rho_spectrum@-1", "rho_spectrum@10"]
SPECTRUM += ["rho_spectrum_trunc@1", "rho_spectrum_trunc@-1"]
DISTS = ["dists@intra", "dists@inter", "dists@intra_over_inter"]
ALL = [*RETRIEVAL, "nmi", "f1", *SPECTRUM, *DISTS]

# ---------------------------------------------------------------------------------------------
# Brute-force references, written directly from the definitions.


def distance_matrix(x: np.ndarray, distance: str) -> np.ndarray:
    """float64 all-pairs Euclidean or cosine (1 - cos) distances."""
    x = x.astype(np.float64)
    if distance == "euclidean":
        return np.sqrt(np.maximum(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1), 0.0))
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    return 1.0 - unit @ unit.T


def rankings(x: np.ndarray, distance: str) -> np.ndarray:
    """(N, N - 1): the other samples of each query ordered by (distance, index)."""
    d = distance_matrix(x, distance)
    n = len(x)
    out = []
    for i in range(n):
        others = np.array([j for j in range(n) if j != i])
        out.append(others[np.lexsort((others, d[i, others]))])
    return np.array(out)


def relevance(x: np.ndarray, labels: np.ndarray, distance: str) -> np.ndarray:
    """(N, N - 1) whether rank k of each query has the query's class."""
    return labels[rankings(x, distance)] == labels[:, None]


def ap_sums(rel: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """sum_{k <= depth} P@k * rel_k per query, by an explicit loop."""
    out = []
    for row, cut in zip(rel, depth, strict=True):
        found, total = 0, 0.0
        for k, hit in enumerate(row[:cut], start=1):
            if hit:
                found += 1
                total += found / k
        out.append(total)
    return np.array(out)


def brute_force_retrieval(x: np.ndarray, labels: np.ndarray, distance: str) -> dict[str, float]:
    """Every retrieval metric of RETRIEVAL from the brute-force ranking."""
    rel = relevance(x, labels, distance)
    n = len(x)
    sizes = np.array([np.sum(labels == c) for c in labels])
    others = sizes - 1
    lone = others == 0
    return {
        "recall@1": float(np.mean(rel[:, :1].any(1))),
        "recall@4": float(np.mean(rel[:, :4].any(1))),
        "precision@1": float(np.mean(rel[~lone, 0])),
        "r_precision": float(
            np.mean([rel[i, : others[i]].sum() / others[i] for i in range(n) if not lone[i]])
        ),
        "map@r": float(np.mean((ap_sums(rel, others) / np.maximum(others, 1))[~lone])),
        "map@c": float(np.mean(ap_sums(rel, sizes) / sizes)),
        "map@1000": float(np.mean(ap_sums(rel, np.full(n, 1000)) / sizes)),
        "map@7": float(np.mean(ap_sums(rel, np.full(n, 7)) / sizes)),
        "map": float(np.mean(ap_sums(rel, np.full(n, n - 1)) / sizes)),
    }


def brute_force_f1(labels: np.ndarray, clusters: np.ndarray) -> float:
    """Pair-counting F1 by looping over all pairs."""
    tp = same_class = same_cluster = 0
    for i in range(len(labels)):
        for j in range(i + 1, len(labels)):
            same_class += labels[i] == labels[j]
            same_cluster += clusters[i] == clusters[j]
            tp += labels[i] == labels[j] and clusters[i] == clusters[j]
    if tp == 0:
        return 0.0
    p, r = tp / same_class, tp / same_cluster
    return 2 * p * r / (p + r)


def explicit_rho(s: np.ndarray, mode: int) -> float | np.ndarray:
    """The reference's spectral-decay formula on given singular values."""
    if mode != 0:
        s = s[abs(mode) - 1 :]
    s_hat = s / s.sum()
    u = np.full(len(s), 1.0 / len(s))
    if mode > 0:
        return float(np.sum(u * np.log(u / s_hat)))
    if mode < 0:
        return float(np.sum(s_hat * np.log(s_hat / u)))
    return s_hat


def brute_force_dists(x: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """dists@* with scipy's cosine cdist per class; singletons get the largest class value."""
    x = x.astype(np.float64)
    intra = []
    for c in np.unique(labels):
        members = x[labels == c]
        n = len(members)
        intra.append(cdist(members, members, "cosine").sum() / (n * n - n) if n > 1 else np.nan)
    intra = np.array(intra)
    intra[np.isnan(intra)] = np.nanmax(intra)
    means = np.array([x[labels == c].mean(0) for c in np.unique(labels)])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    inter_d = cdist(means, means, "cosine")
    m = len(means)
    inter = inter_d.sum() / (m * m - m)
    return {
        "dists@intra": float(intra.mean()),
        "dists@inter": float(inter),
        "dists@intra_over_inter": float(intra.mean() / inter),
    }


# ---------------------------------------------------------------------------------------------
# Fixtures.


@pytest.fixture(scope="module")
def labelled() -> tuple[np.ndarray, np.ndarray]:
    """40 noisy points in 8 classes of sizes 1, 2, 2, 3, 5, 8, 9, 10."""
    rng = np.random.default_rng(7)
    labels = np.repeat(np.arange(8), [1, 2, 2, 3, 5, 8, 9, 10])
    rng.shuffle(labels)
    centres = rng.standard_normal((8, 6))
    scale = rng.uniform(0.5, 3.0, (len(labels), 1))  # norms vary: cosine != euclidean
    x = scale * (centres[labels] + 0.8 * rng.standard_normal((len(labels), 6)))
    return x.astype(np.float32), labels


@pytest.fixture(scope="module", params=["euclidean", "cosine"])
def suite(request: pytest.FixtureRequest, labelled: tuple[np.ndarray, np.ndarray]) -> tuple:
    """(distance, scalar results, vector results) of every metric on ``labelled``."""
    x, labels = labelled
    got = evaluate_embeddings_with_vectors(
        x,
        labels,
        [*ALL, "rho_spectrum@0", "rho_spectrum_trunc@0"],
        distance=request.param,
        block_size=16,
    )
    return request.param, got.metrics, got.vectors


def evaluation_points(x: np.ndarray, distance: str) -> np.ndarray:
    """The points k-means / SVD / class means see: L2-normalised rows for cosine."""
    x = x.astype(np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True) if distance == "cosine" else x


# ---------------------------------------------------------------------------------------------
# Retrieval metrics.


def test_retrieval_metrics_match_brute_force(
    labelled: tuple[np.ndarray, np.ndarray], suite: tuple
) -> None:
    x, labels = labelled
    distance, got, _ = suite
    expected = brute_force_retrieval(x, labels, distance)
    assert {name: got[name] for name in expected} == pytest.approx(expected, abs=1e-12)


def test_cosine_and_euclidean_differ_and_cosine_ignores_scale(
    labelled: tuple[np.ndarray, np.ndarray],
) -> None:
    x, labels = labelled
    rescaled = x * np.random.default_rng(0).uniform(0.1, 10.0, (len(x), 1)).astype(np.float32)
    names = ["map", "map@r", "r_precision"]
    cos = evaluate_embeddings(x, labels, names, distance="cosine")
    assert evaluate_embeddings(rescaled, labels, names, distance="cosine") == pytest.approx(cos)
    euc = evaluate_embeddings(x, labels, names, distance="euclidean")
    assert euc != pytest.approx(cos)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_map_matches_sklearn_average_precision(
    labelled: tuple[np.ndarray, np.ndarray], distance: str
) -> None:
    """sklearn's AP over all other samples divides by R = n_c - 1; "map" divides by n_c."""
    x, labels = labelled
    d = distance_matrix(x, distance)
    per_query = []
    for i in range(len(x)):
        others = np.arange(len(x)) != i
        relevant = labels[others] == labels[i]
        if not relevant.any():
            per_query.append(0.0)
            continue
        ap = average_precision_score(relevant, -d[i, others])
        per_query.append(ap * relevant.sum() / (relevant.sum() + 1))
    got = evaluate_embeddings(x, labels, ["map"], distance=distance)["map"]
    assert got == pytest.approx(np.mean(per_query), abs=1e-12)


def test_map_equals_map_at_1000_when_n_minus_1_is_at_most_1000(
    labelled: tuple[np.ndarray, np.ndarray], suite: tuple
) -> None:
    x, labels = labelled
    distance, got, _ = suite
    assert got["map"] == pytest.approx(got["map@1000"], abs=1e-12)
    # map@1000 alone takes the plain kNN path (no full ranking): the same value.
    alone = evaluate_embeddings(x, labels, ["map@1000"], distance=distance)["map@1000"]
    assert alone == pytest.approx(got["map"], abs=1e-12)


def test_known_values_on_six_points_on_a_line() -> None:
    # Rankings (self excluded, ties to the lower index): 0: 1 2 3 4 5 | 1: 0 2 3 4 5 |
    # 2: 1 0 3 4 5 | 3: 4 2 1 0 5 | 4: 3 2 1 0 5 | 5: 4 3 2 1 0. Classes {0, 1, 5}, {2, 3, 4}.
    x = np.array([0.0, 1.0, 2.0, 10.0, 11.0, 30.0], np.float32)[:, None]
    labels = np.array([0, 0, 1, 1, 1, 0])
    got = evaluate_embeddings(x, labels, ["precision@1", "r_precision", "map", "map@2"])
    full = [1 + 2 / 5, 1 + 2 / 5, 1 / 3 + 2 / 4, 2, 2, 1 / 4 + 2 / 5]
    at_2 = [1, 1, 0, 2, 2, 0]
    assert got == pytest.approx(
        {
            "precision@1": 4 / 6,
            "r_precision": (1 / 2 + 1 / 2 + 0 + 1 + 1 + 0) / 6,
            "map": np.mean(full) / 3,
            "map@2": np.mean(at_2) / 3,
        }
    )


@pytest.mark.parametrize("block_size", [7, 1000])
def test_ties_follow_distance_then_index(selection: str, block_size: int) -> None:
    """Points on a 4 x 4 integer grid: many exact distance ties, broken by the lower index."""
    rng = np.random.default_rng(3)
    x = rng.integers(0, 4, (60, 2)).astype(np.float32)
    labels = rng.integers(0, 6, 60)
    backends = Backends(jax.default_backend(), "xla", selection, "xla")
    got = evaluate_embeddings(x, labels, RETRIEVAL, block_size=block_size, backends=backends)
    assert got == pytest.approx(brute_force_retrieval(x, labels, "euclidean"), abs=1e-12)
    ranking = knn_full_ranking(x, labels, 10, block_size=block_size, selection=selection)
    np.testing.assert_array_equal(ranking.indices, rankings(x, "euclidean")[:, :10])
    _, plain = knn(x, x, 10, exclude_self=True, selection=selection)
    np.testing.assert_array_equal(ranking.indices, np.asarray(plain))


def test_classes_of_size_one_and_two() -> None:
    # Pairs {0, 1} and {2, 3}, singletons 4 and 5.
    x = np.array([0.0, 1.0, 5.0, 7.0, 2.0, 20.0], np.float32)[:, None]
    labels = np.array([0, 0, 1, 1, 2, 3])
    got = evaluate_embeddings(x, labels, ["precision@1", "r_precision", "map@r", "map"])
    # Rankings: 0: 1 4 2 3 5 | 1: 0 4 2 3 5 | 2: 3 4 1 0 5 | 3: 2 4 1 0 5. Every pair is
    # mutually nearest; lone queries are excluded from precision@1 / r_precision / map@r and
    # score 0 in map, whose maximum for a pair is 1/2.
    assert got == pytest.approx(
        {"precision@1": 1.0, "r_precision": 1.0, "map@r": 1.0, "map": (4 * 0.5) / 6}
    )
    only_lone = evaluate_embeddings(x, np.arange(6), ["precision@1", "map@r", "map", "map@c"])
    assert np.isnan(only_lone["precision@1"]) and np.isnan(only_lone["map@r"])
    assert only_lone["map"] == 0.0 and only_lone["map@c"] == 0.0


def test_full_ranking_blocks_and_classes_larger_than_blocks(selection: str) -> None:
    """Block sizes not dividing N, and a class bigger than a block, give the same sums."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((90, 5)).astype(np.float32)
    labels = np.where(np.arange(90) < 50, 0, rng.integers(1, 9, 90))
    reference = knn_full_ranking(x, labels, 3, block_size=1000, selection=selection)
    for block_size in (1, 13, 32):
        other = knn_full_ranking(x, labels, 3, block_size=block_size, selection=selection)
        np.testing.assert_allclose(other.precision_sums, reference.precision_sums, rtol=1e-12)
        np.testing.assert_array_equal(other.indices, reference.indices)
    rel = relevance(x, labels, "euclidean")
    np.testing.assert_allclose(reference.precision_sums, ap_sums(rel, np.full(90, 89)))


# ---------------------------------------------------------------------------------------------
# Clustering metrics.


def test_f1_matches_pair_count() -> None:
    rng = np.random.default_rng(5)
    for _ in range(5):
        labels = rng.integers(0, 6, 50)
        clusters = rng.integers(0, 7, 50)
        requirements = Requirements(labels, np.bincount(labels)[labels], None, clusters)
        assert f1(requirements) == pytest.approx(brute_force_f1(labels, clusters))
    perfect = np.repeat(np.arange(4), 3)
    assert f1(Requirements(perfect, np.full(12, 3), None, (perfect + 1) % 4)) == 1.0
    singletons = np.arange(5)
    assert f1(Requirements(singletons, np.ones(5, int), None, np.zeros(5, int))) == 0.0


def test_f1_and_nmi_use_one_kmeans(labelled: tuple[np.ndarray, np.ndarray], suite: tuple) -> None:
    x, labels = labelled
    distance, got, _ = suite
    points = evaluation_points(x, distance).astype(np.float32)
    clusters = np.asarray(kmeans(points, len(np.unique(labels)), seed=0).assignments)
    assert got["f1"] == pytest.approx(brute_force_f1(labels, clusters))


# ---------------------------------------------------------------------------------------------
# Spectral decay.


@pytest.mark.parametrize("mode", [1, 2, -1])
def test_rho_spectrum_matches_numpy_svd(
    labelled: tuple[np.ndarray, np.ndarray], suite: tuple, mode: int
) -> None:
    x, _ = labelled
    distance, got, _ = suite
    s = np.linalg.svd(evaluation_points(x, distance), compute_uv=False)
    name = f"rho_spectrum@{mode}"
    if name in got:
        assert got[name] == pytest.approx(explicit_rho(s, mode), rel=1e-4, abs=1e-6)
    trunc = f"rho_spectrum_trunc@{mode}"
    if trunc in got:
        assert got[trunc] == pytest.approx(explicit_rho(s[:-1], mode), rel=1e-4, abs=1e-6)
    assert np.isnan(got["rho_spectrum@10"])  # D = 6: dropping 9 values leaves none


def test_rho_spectrum_vectors(labelled: tuple[np.ndarray, np.ndarray], suite: tuple) -> None:
    x, _ = labelled
    distance, got, vectors = suite
    s = np.linalg.svd(evaluation_points(x, distance), compute_uv=False)
    np.testing.assert_allclose(vectors["rho_spectrum@0"], s / s.sum(), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(
        vectors["rho_spectrum_trunc@0"], s[:-1] / s[:-1].sum(), rtol=1e-4, atol=1e-7
    )
    assert "rho_spectrum@0" not in got


def test_rho_spectrum_trunc_matches_the_reference_cpu_path(
    labelled: tuple[np.ndarray, np.ndarray],
) -> None:
    """The reference's CPU path: TruncatedSVD(D - 1, n_iter=7, random_state=42)."""
    x, labels = labelled
    svd = TruncatedSVD(n_components=x.shape[1] - 1, n_iter=7, random_state=42).fit(x)
    got = evaluate_embeddings(x, labels, ["rho_spectrum_trunc@1", "rho_spectrum_trunc@-1"])
    assert got["rho_spectrum_trunc@1"] == pytest.approx(
        explicit_rho(svd.singular_values_, 1), rel=1e-4
    )
    assert got["rho_spectrum_trunc@-1"] == pytest.approx(
        explicit_rho(svd.singular_values_, -1), rel=1e-4
    )


def test_vector_metrics_are_skipped_by_evaluate_embeddings(
    labelled: tuple[np.ndarray, np.ndarray],
) -> None:
    """``evaluate_embeddings`` gives scalars only, naming the function that gives the vectors
    too; that one gives both, and the per-query values asked for."""
    x, labels = labelled
    with pytest.warns(UserWarning, match="evaluate_embeddings_with_vectors"):
        got = evaluate_embeddings(x, labels, ["rho_spectrum@0", "rho_spectrum@1"])
    assert list(got) == ["rho_spectrum@1"] and isinstance(got["rho_spectrum@1"], float)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        full = evaluate_embeddings_with_vectors(x, labels, ["recall@1"], per_query=["recall@1"])
    assert isinstance(full, EmbeddingEvaluation)
    assert list(full.metrics) == ["recall@1"] and full.vectors == {}
    assert full.per_query["recall@1"].shape == (len(x),)
    assert full.per_query["recall@1"].mean() == pytest.approx(full.metrics["recall@1"])


# ---------------------------------------------------------------------------------------------
# Class distances.


def test_dists_match_brute_force(labelled: tuple[np.ndarray, np.ndarray], suite: tuple) -> None:
    x, labels = labelled
    distance, got, _ = suite
    expected = brute_force_dists(evaluation_points(x, distance), labels)
    assert {name: got[name] for name in DISTS} == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_dists_hand_built() -> None:
    # Class 0: two orthogonal vectors (distance 1); class 1: two equal vectors (0);
    # class 2: a singleton, which gets the largest class value, 1.
    x = np.array([[1, 0, 0], [0, 2, 0], [0, 0, 1], [0, 0, 3], [1, 1, 1]], np.float32)
    labels = np.array([0, 0, 1, 1, 2])
    got = evaluate_embeddings(x, labels, DISTS)
    means = np.array([[0.5, 1.0, 0.0], [0, 0, 2.0], [1, 1, 1.0]])
    expected = brute_force_dists(x, labels)
    assert expected["dists@intra"] == pytest.approx(2 / 3)
    assert got == pytest.approx(expected, rel=1e-6)
    unit = means / np.linalg.norm(means, axis=1, keepdims=True)
    cos = unit @ unit.T
    assert got["dists@inter"] == pytest.approx(np.mean(1 - cos[~np.eye(3, dtype=bool)]))


# ---------------------------------------------------------------------------------------------
# Multi-head evaluation.


@pytest.fixture(scope="module")
def heads(labelled: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    x, _ = labelled
    rng = np.random.default_rng(8)
    return {
        "discriminative": x,
        "shared": (x[:, :4] + rng.standard_normal((len(x), 4))).astype(np.float32),
        "intra": rng.standard_normal((len(x), 3)).astype(np.float32),
    }


def test_evaluate_heads_combination_equals_manual_concatenation(
    labelled: tuple[np.ndarray, np.ndarray], heads: dict[str, np.ndarray]
) -> None:
    _, labels = labelled
    names = ["recall@1", "map@r", "map", "nmi", "rho_spectrum@1", "dists@intra"]
    weights = {"discriminative": 0.5, "shared": 1.0, "intra": 1.0}
    got = evaluate_heads(heads, labels, names, combinations={"disc0.5+others1": weights})
    assert list(got) == ["discriminative", "shared", "intra", "disc0.5+others1"]

    def unit(v: np.ndarray) -> np.ndarray:
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    manual = unit(np.concatenate([w * unit(heads[h]) for h, w in weights.items()], axis=1))
    np.testing.assert_allclose(np.asarray(combine_heads(heads, weights)), manual, atol=1e-6)
    direct = evaluate_embeddings(manual.astype(np.float32), labels, names)
    assert got["disc0.5+others1"] == pytest.approx(direct, rel=1e-5)
    assert got["shared"] == pytest.approx(evaluate_embeddings(heads["shared"], labels, names))


def test_evaluate_heads_rejects_unknown_heads(
    labelled: tuple[np.ndarray, np.ndarray], heads: dict[str, np.ndarray]
) -> None:
    _, labels = labelled
    with pytest.raises(ValueError, match="selfsimilarity"):
        evaluate_heads(heads, labels, ["recall@1"], combinations={"c": {"selfsimilarity": 1}})
    with pytest.raises(ValueError, match="name of a head"):
        evaluate_heads(heads, labels, ["recall@1"], combinations={"intra": {"shared": 1}})
    with pytest.raises(UnknownMetricError):
        evaluate_heads(heads, labels, ["recal@1"])
    with pytest.raises(ValueError, match="needs heads"):  # at the call, before any row
        head_embeddings(heads, combinations={"c": {}})


# ---------------------------------------------------------------------------------------------
# One computation per requirement.


def counting(calls: list[str], name: str, fn: Callable) -> Callable:
    """``fn`` that also appends ``name`` to ``calls``."""

    def wrapped(*args: object, **kwargs: object) -> object:
        calls.append(name)
        return fn(*args, **kwargs)

    return wrapped


def test_each_requirement_is_computed_once(
    monkeypatch: pytest.MonkeyPatch, labelled: tuple[np.ndarray, np.ndarray]
) -> None:
    x, labels = labelled
    calls: list[str] = []
    ks: list[int] = []
    for name in ("knn_blocks", "kmeans", "singular_values", "class_distances"):
        monkeypatch.setattr(evaluator, name, counting(calls, name, getattr(evaluator, name)))

    def full(*args: object, **kwargs: object) -> object:
        calls.append("full_ranking_blocks")
        ks.append(int(args[2]))
        return full_ranking_blocks(*args, **kwargs)

    monkeypatch.setattr(evaluator, "full_ranking_blocks", full)
    scalars = evaluate_embeddings_with_vectors(x, labels, [*ALL, "rho_spectrum@0"]).metrics
    assert sorted(calls) == sorted(
        ["full_ranking_blocks", "kmeans", "singular_values", "class_distances"]
    )
    assert ks == [len(x) - 1]  # map@1000 clipped to N - 1
    assert len(scalars) == len(ALL)

    calls.clear()
    evaluate_embeddings(x, labels, ["recall@1", "map@r", "nmi", "f1", "rho_spectrum@1"])
    assert sorted(calls) == ["kmeans", "knn_blocks", "singular_values"]
    calls.clear()
    evaluate_embeddings(x, labels, ["map"])
    assert calls == ["full_ranking_blocks"]


# ---------------------------------------------------------------------------------------------
# Names and the table.


def test_metric_name_patterns() -> None:
    assert get_metric("map@17").name == "map@17"
    assert get_metric("rho_spectrum@-3").name == "rho_spectrum@-3"
    assert get_metric("rho_spectrum_trunc@5").name == "rho_spectrum_trunc@5"
    assert get_metric("rho_spectrum@0").vector and not get_metric("rho_spectrum@1").vector
    for bad in ("map@0", "rho_spectrum@x", "rho_spectrum@01", "dists@all"):
        with pytest.raises(UnknownMetricError, match="rho_spectrum_trunc@<m>"):
            get_metric(bad)


def test_format_table_shows_non_fractions_as_is() -> None:
    table = format_table({"test": {"recall@1": 0.5, "rho_spectrum@1": 0.12345, "dists@intra": 1}})
    assert table.splitlines()[2].split() == ["test", "50.00", "0.1235", "1.0000"]


def test_kmeans_random_init(labelled: tuple[np.ndarray, np.ndarray]) -> None:
    x, labels = labelled
    first = kmeans(x, 8, seed=1, init="random")
    second = kmeans(x, 8, seed=1, init="random")
    np.testing.assert_array_equal(np.asarray(first.assignments), np.asarray(second.assignments))
    with pytest.raises(ValueError, match="init"):
        kmeans(x, 8, init="kmeans||")
    got = evaluate_embeddings(x, labels, ["nmi", "f1"], kmeans_init="random")
    assert 0.0 <= got["f1"] <= 1.0 and 0.0 <= got["nmi"] <= 1.0
    # The initial centres are the points of K distinct uniformly drawn indices.
    from jdml.evaluation.kmeans import random_indices

    drawn = random_indices(len(x), 8, seed=1)
    assert drawn.dtype == np.int32 and len(set(drawn.tolist())) == 8
    assert drawn.min() >= 0 and drawn.max() < len(x)
    np.testing.assert_array_equal(drawn, random_indices(len(x), 8, seed=1))
    assert set(random_indices(8, 8, seed=3).tolist()) == set(range(8))
    untrained = kmeans(x, 8, seed=1, init="random", num_iters=0)
    # (up to the rounding of centring: x - mean + mean)
    np.testing.assert_allclose(np.asarray(untrained.centroids), x[drawn], atol=1e-6)
