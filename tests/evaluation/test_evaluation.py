"""Tests of the retrieval evaluator: kNN, k-means, metrics and evaluate_embeddings."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.cluster import KMeans
from sklearn.datasets import make_blobs
from sklearn.metrics import normalized_mutual_info_score

from jdml.errors import UnknownMetricError
from jdml.evaluation import embeddings as evaluator
from jdml.evaluation.embeddings import check_metric_names, evaluate_embeddings
from jdml.evaluation.kmeans import assignment, kmeans
from jdml.evaluation.knn import blocks, host, knn, knn_blocks, largest_k, sortable_key, xla
from jdml.evaluation.metrics import METRICS, Metric, Requirements, get_metric
from jdml.evaluation.table import format_table

# ---------------------------------------------------------------------------------------------
# Brute-force references, written directly from the definitions.


def brute_force_knn(
    queries: np.ndarray, references: np.ndarray, k: int, exclude_self: bool, distance: str
) -> tuple[np.ndarray, np.ndarray]:
    """float64 all-pairs distances, ranked by (distance, index); query i excludes reference i."""
    q = queries.astype(np.float64)
    r = references.astype(np.float64)
    if distance == "euclidean":
        d = np.sqrt(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1))
    else:
        qn = q / np.linalg.norm(q, axis=1, keepdims=True)
        rn = r / np.linalg.norm(r, axis=1, keepdims=True)
        d = 1.0 - qn @ rn.T
    if exclude_self:
        d[np.arange(len(q)), np.arange(len(q))] = np.inf
    order = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, order, axis=1), order


def ranking_without_self(x: np.ndarray, i: int) -> list[int]:
    """All other samples ordered by Euclidean distance to sample i (ties: lower index first)."""
    d = np.sqrt(((x.astype(np.float64) - x[i].astype(np.float64)) ** 2).sum(-1))
    return [j for j in np.argsort(d, kind="stable") if j != i]


def loop_recall(x: np.ndarray, labels: np.ndarray, k: int) -> float:
    hits = []
    for i in range(len(x)):
        top = ranking_without_self(x, i)[:k]
        hits.append(any(labels[j] == labels[i] for j in top))
    return float(np.mean(hits))


def loop_map_at_r(x: np.ndarray, labels: np.ndarray) -> float:
    aps = []
    for i in range(len(x)):
        r = int(np.sum(labels == labels[i])) - 1
        if r == 0:
            continue
        ranked = ranking_without_self(x, i)[:r]
        found, total = 0, 0.0
        for rank, j in enumerate(ranked, start=1):
            if labels[j] == labels[i]:
                found += 1
                total += found / rank
        aps.append(total / r)
    return float(np.mean(aps))


def loop_map_at_c(x: np.ndarray, labels: np.ndarray) -> float:
    aps = []
    for i in range(len(x)):
        n_c = int(np.sum(labels == labels[i]))
        ranked = ranking_without_self(x, i)[:n_c]
        found, total = 0, 0.0
        for rank, j in enumerate(ranked, start=1):
            if labels[j] == labels[i]:
                found += 1
                total += found / rank
        aps.append(total / n_c)
    return float(np.mean(aps))


# ---------------------------------------------------------------------------------------------
# Fixtures.


@pytest.fixture(scope="module")
def points() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((53, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def labelled() -> tuple[np.ndarray, np.ndarray]:
    """41 noisy points in 6 classes of sizes 1..11 (class 5 has a single sample)."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(6), [11, 9, 8, 7, 5, 1])
    rng.shuffle(labels)
    centres = rng.standard_normal((6, 6))
    x = centres[labels] + 0.9 * rng.standard_normal((len(labels), 6))
    return x.astype(np.float32), labels


@pytest.fixture(scope="module")
def labelled_results(labelled: tuple[np.ndarray, np.ndarray]) -> dict[str, float]:
    x, labels = labelled
    names = ["recall@1", "recall@2", "recall@3", "recall@8", "map@r", "map@c"]
    return evaluate_embeddings(x, labels, names, block_size=16)


# ---------------------------------------------------------------------------------------------
# kNN.


@pytest.mark.parametrize(
    ("k", "block_size", "chunk_size"),
    [(5, 16, 24), (10, 4, 8), (52, 1024, 8192)],
    ids=["blocks-not-dividing-n", "k-larger-than-block-and-chunk", "all-neighbours"],
)
def test_knn_matches_brute_force_exclude_self(
    selection: str, points: np.ndarray, k: int, block_size: int, chunk_size: int
) -> None:
    dist, idx = knn(
        points, points, k, exclude_self=True, block_size=block_size, chunk_size=chunk_size
    )
    ref_dist, ref_idx = brute_force_knn(points, points, k, True, "euclidean")
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    np.testing.assert_allclose(np.asarray(dist), ref_dist, atol=1e-5)


def test_knn_separate_queries(selection: str, points: np.ndarray) -> None:
    queries, references = points[:19], points[19:]
    options = {"block_size": 8, "chunk_size": 16, "selection": selection}
    dist, idx = knn(queries, references, 7, exclude_self=False, **options)
    ref_dist, ref_idx = brute_force_knn(queries, references, 7, False, "euclidean")
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    np.testing.assert_allclose(np.asarray(dist), ref_dist, atol=1e-5)


def test_knn_cosine(selection: str, points: np.ndarray) -> None:
    options = {"distance": "cosine", "block_size": 16, "selection": selection}
    dist, idx = knn(points, points, 6, exclude_self=True, **options)
    ref_dist, ref_idx = brute_force_knn(points, points, 6, True, "cosine")
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    np.testing.assert_allclose(np.asarray(dist), ref_dist, atol=1e-5)


def test_knn_excludes_self_by_index_with_duplicates(selection: str, points: np.ndarray) -> None:
    x = points[:20].copy()
    x[7] = x[3]
    x[12] = x[3]  # 3, 7, 12 coincide: for query 12, naive order puts 3 (not 12) first
    dist, idx = knn(x, x, 4, exclude_self=True, block_size=8, chunk_size=16, selection=selection)
    dist, idx = np.asarray(dist), np.asarray(idx)
    assert not np.any(idx == np.arange(20)[:, None])
    np.testing.assert_array_equal(idx[3, :2], [7, 12])
    np.testing.assert_array_equal(idx[7, :2], [3, 12])
    np.testing.assert_array_equal(idx[12, :2], [3, 7])
    np.testing.assert_allclose(dist[[3, 7, 12], :2], 0.0, atol=1e-3)  # Gram-trick rounding
    ref_dist, ref_idx = brute_force_knn(x, x, 4, True, "euclidean")
    np.testing.assert_array_equal(idx, ref_idx)
    # Distance 0 comes out of the Gram expansion as sqrt of a rounding error (checked above at
    # 1e-3; its size depends on the CPU's summation order); every other distance to 1e-5.
    apart = ref_dist > 0
    np.testing.assert_allclose(dist[apart], ref_dist[apart], atol=1e-5)


@pytest.mark.parametrize("grid", [3, 21])
@pytest.mark.parametrize("chunk_size", [8192, 512], ids=["one-chunk", "two-chunks"])
def test_knn_ties_lower_index_first(selection: str, chunk_size: int, grid: int) -> None:
    """Many exact ties (points on a small integer grid): the order must be (distance, index).

    With a 3 x 3 grid the ties are mostly at distance 0, with a 21 x 21 grid mostly at
    distance 1 behind a few exact duplicates.
    """
    x = np.random.default_rng(2).integers(0, grid, (1000, 2)).astype(np.float32)
    dist, idx = knn(x, x, 3, exclude_self=True, chunk_size=chunk_size, selection=selection)
    ref_dist, ref_idx = brute_force_knn(x, x, 3, True, "euclidean")
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    np.testing.assert_allclose(np.asarray(dist), ref_dist, atol=1e-6)


@pytest.mark.parametrize("exclude_self", [True, False])
def test_host_selection_over_memory_capped_blocks_and_row_pieces(
    points: np.ndarray, monkeypatch: pytest.MonkeyPatch, exclude_self: bool
) -> None:
    """Blocks capped by HOST_BLOCK_BYTES (5 queries, the last one padded) and rows split into
    pieces of 2 over the threads give the brute-force neighbours."""
    monkeypatch.setattr(host, "HOST_BLOCK_BYTES", 4 * len(points) * 5)
    monkeypatch.setattr(host, "HOST_PIECE_ELEMENTS", 2 * len(points))
    dist, idx = knn(points, points, 9, exclude_self=exclude_self, selection="host")
    ref_dist, ref_idx = brute_force_knn(points, points, 9, exclude_self, "euclidean")
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    # Without exclusion each query finds itself at 0, which the Gram expansion gives only to
    # sqrt(float32 rounding of |q|^2), about 1e-3 here.
    np.testing.assert_allclose(np.asarray(dist), ref_dist, atol=1e-5 if exclude_self else 2e-3)


def test_query_blocks_grow_while_they_hold_few_scores(
    selection: str, points: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the tests' ``small_blocks``: blocks hold up to BLOCK_SCORES scores."""
    monkeypatch.setattr(blocks, "BLOCK_SCORES", 2**22)
    assert blocks.query_block(1000, 1000, 512) == 1000
    assert blocks.query_block(50_000, 20_000, 512) == 512
    assert blocks.query_block(50_000, 2_000, 512) == 2**22 // 2_000
    monkeypatch.setattr(blocks, "BLOCK_SCORES", 6 * len(points))  # 6 queries per block
    dist, idx = knn(points, points, 4, exclude_self=True, block_size=2, selection=selection)
    ref_dist, ref_idx = brute_force_knn(points, points, 4, True, "euclidean")
    np.testing.assert_array_equal(np.asarray(idx), ref_idx)
    np.testing.assert_allclose(np.asarray(dist), ref_dist, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 7, 40])
def test_largest_k_orders_by_score_then_index_with_ties(k: int) -> None:
    rng = np.random.default_rng(3)
    scores = rng.integers(-4, 4, (64, 40)).astype(np.float32)  # every row full of ties
    scores[0] = 1.0  # one row entirely tied
    scores[1, ::3] = -0.5
    scores[2, ::2] = -0.0  # -0.0 and +0.0 are one value
    scores[2, 1::2] = 0.0
    scores[3] = rng.standard_normal(40)  # no ties: one sort of exactly k keys per row
    # Python's float comparison, like the distances, has -0.0 == 0.0.
    expected = [sorted(range(40), key=lambda j, row=row: (-row[j], j))[:k] for row in scores]
    values, chosen = largest_k(scores, k)
    np.testing.assert_array_equal(chosen, expected)
    np.testing.assert_array_equal(values, np.take_along_axis(scores, chosen, axis=1))
    rows_without_signed_zeros = [0, 1, 3, *range(4, 64)]
    np.testing.assert_array_equal(  # the order lax.top_k chooses
        chosen[rows_without_signed_zeros],
        np.asarray(jax.lax.top_k(jnp.asarray(scores[rows_without_signed_zeros]), k)[1]),
    )
    assert chosen.dtype == np.int32 and values.dtype == np.float32


def test_equal_distances_out_of_index_order_are_reordered() -> None:
    """Different scores can round to one distance; rows must end in (distance, index) order."""
    d = jnp.asarray([[0.0, 0.0, 1.0], [0.5, 0.5, 0.5]], jnp.float32)
    i = jnp.asarray([[4, 2, 0], [1, 3, 9]], jnp.int32)
    got_d, got_i = xla.by_distance_then_index(d, i)
    np.testing.assert_array_equal(np.asarray(got_i), [[2, 4, 0], [1, 3, 9]])
    np.testing.assert_array_equal(np.asarray(got_d), np.asarray(d))
    in_order = jnp.asarray([[0, 1, 2], [5, 6, 7]], jnp.int32)
    np.testing.assert_array_equal(
        np.asarray(xla.by_distance_then_index(d, in_order)[1]), np.asarray(in_order)
    )


def test_sortable_key_orders_value_then_index() -> None:
    values = np.array([0.5, -2.0, -0.25, 3.0, 0.5, -np.inf, np.inf, 0.0, -2.0], np.float32)
    indices = np.array([4, 9, 1, 0, 2, 3, 5, 8, 7], np.int32)
    order = np.argsort(sortable_key(values, indices))
    expected = sorted(range(len(values)), key=lambda i: (values[i], indices[i]))
    np.testing.assert_array_equal(order, expected)
    back_values, back_indices = host.from_key(np.sort(sortable_key(values, indices)))
    np.testing.assert_array_equal(back_values, values[expected])
    np.testing.assert_array_equal(back_indices, indices[expected])


def test_knn_rejects_bad_k(points: np.ndarray) -> None:
    with pytest.raises(ValueError, match="k="):
        knn(points, points, len(points), exclude_self=True)


# ---------------------------------------------------------------------------------------------
# Metrics.


def test_metrics_on_six_points_on_a_line() -> None:
    # Neighbour orders (self excluded; 1 is equidistant from 0 and 2 -> 0 first):
    # 0: 1 2 3 | 1: 0 2 3 | 2: 1 0 3 | 3: 4 2 1 | 4: 3 2 1 | 5: 4 3 2 1
    x = np.array([0.0, 1.0, 2.0, 10.0, 11.0, 30.0], np.float32)[:, None]
    labels = np.array([0, 0, 1, 1, 1, 0])
    names = ["recall@1", "recall@2", "recall@3", "recall@4", "map@r", "map@c"]
    got = evaluate_embeddings(x, labels, names)
    expected = {
        "recall@1": 4 / 6,
        "recall@2": 4 / 6,
        "recall@3": 5 / 6,
        "recall@4": 1.0,
        "map@r": (0.5 + 0.5 + 0 + 1 + 1 + 0) / 6,
        "map@c": (1 / 3 + 1 / 3 + 1 / 9 + 2 / 3 + 2 / 3 + 0) / 6,
    }
    assert got == pytest.approx(expected)


@pytest.mark.parametrize("k", [1, 2, 3, 8])
def test_recall_matches_loop(
    labelled: tuple[np.ndarray, np.ndarray], labelled_results: dict[str, float], k: int
) -> None:
    x, labels = labelled
    assert labelled_results[f"recall@{k}"] == pytest.approx(loop_recall(x, labels, k))


def test_map_at_r_matches_loop(
    labelled: tuple[np.ndarray, np.ndarray], labelled_results: dict[str, float]
) -> None:
    x, labels = labelled
    assert labelled_results["map@r"] == pytest.approx(loop_map_at_r(x, labels))


def test_map_at_c_matches_loop(
    labelled: tuple[np.ndarray, np.ndarray], labelled_results: dict[str, float]
) -> None:
    x, labels = labelled
    assert labelled_results["map@c"] == pytest.approx(loop_map_at_c(x, labels))


def test_perfect_separation_and_single_sample_class() -> None:
    sizes = [2, 3, 5, 1]
    labels = np.repeat(np.arange(4), sizes)
    rng = np.random.default_rng(3)
    x = (100.0 * np.eye(4)[labels] + 0.01 * rng.standard_normal((11, 4))).astype(np.float32)
    got = evaluate_embeddings(x, labels, ["recall@1", "map@r", "map@c"])
    # The single-sample class has no relevant neighbour: a recall miss, excluded from MAP@R,
    # 0 in mAP@C. Every other query reaches the maximum (n_c - 1) / n_c of mAP@C.
    assert got["recall@1"] == pytest.approx(10 / 11)
    assert got["map@r"] == pytest.approx(1.0)
    assert got["map@c"] == pytest.approx((2 * (1 / 2) + 3 * (2 / 3) + 5 * (4 / 5) + 0) / 11)


def test_map_at_c_maximum_is_below_one() -> None:
    labels = np.repeat(np.arange(3), 4)
    x = (10.0 * np.eye(3)[labels]).astype(np.float32)
    got = evaluate_embeddings(x, labels, ["map@c", "map@r"])
    assert got["map@c"] == pytest.approx(3 / 4)
    assert got["map@r"] == pytest.approx(1.0)


def test_unknown_metric_name_lists_known_names(
    monkeypatch: pytest.MonkeyPatch, points: np.ndarray
) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("names must be validated before any computation")

    monkeypatch.setattr(evaluator, "knn_blocks", fail)
    with pytest.raises(UnknownMetricError, match=r"recall@<k>") as info:
        evaluate_embeddings(points, np.zeros(len(points)), ["recall@1", "recal@1"])
    assert "map@r" in str(info.value) and "nmi" in str(info.value)
    # Both a ValueError (configuration checks) and a KeyError (registry look-ups).
    with pytest.raises(ValueError, match="'recall@0'"):
        check_metric_names(["map@c", "recall@0"])
    with pytest.raises(KeyError):
        get_metric("ndcg")
    check_metric_names(["recall@3", "map@r", "map@c", "nmi"])
    assert get_metric("recall@17").name == "recall@17"
    assert {"recall@1", "map@r", "map@c", "nmi"} <= set(METRICS.names())


def test_knn_computed_once_with_largest_k(
    monkeypatch: pytest.MonkeyPatch, labelled: tuple[np.ndarray, np.ndarray]
) -> None:
    x, labels = labelled
    calls: list[int] = []

    def counting_knn(*args: object, **kwargs: object):
        calls.append(int(args[2]))
        return knn_blocks(*args, **kwargs)

    def no_kmeans(*args: object, **kwargs: object) -> None:
        raise AssertionError("k-means must only run when nmi is requested")

    monkeypatch.setattr(evaluator, "knn_blocks", counting_knn)
    monkeypatch.setattr(evaluator, "kmeans", no_kmeans)
    evaluate_embeddings(x, labels, ["recall@1", "recall@20", "map@r", "map@c"], block_size=16)
    assert calls == [20]  # max(20, largest class 11, 11 - 1)
    calls.clear()
    evaluate_embeddings(x, labels, ["recall@1", "map@c"], block_size=16)
    assert calls == [11]


# ---------------------------------------------------------------------------------------------
# k-means and NMI.


@pytest.fixture(scope="module")
def blobs() -> tuple[np.ndarray, np.ndarray]:
    x, y = make_blobs(n_samples=600, n_features=16, centers=10, cluster_std=1.5, random_state=0)
    return x.astype(np.float32), y


def test_nmi_close_to_sklearn(blobs: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = blobs
    ours = evaluate_embeddings(x, y, ["nmi"])["nmi"]
    sk = KMeans(10, n_init=10, random_state=0).fit(x)
    assert ours == pytest.approx(normalized_mutual_info_score(y, sk.labels_), abs=0.01)


def test_kmeans_inertia_close_to_sklearn(blobs: tuple[np.ndarray, np.ndarray]) -> None:
    x, _ = blobs
    ours = kmeans(x, 10, seed=0)
    sk = KMeans(10, n_init=10, random_state=0).fit(x)
    assert float(ours.inertia) == pytest.approx(sk.inertia_, rel=0.01)
    # The inertia is consistent with the returned centroids and assignments.
    centroids, assignments = np.asarray(ours.centroids), np.asarray(ours.assignments)
    direct = np.sum((x - centroids[assignments]) ** 2)
    assert float(ours.inertia) == pytest.approx(direct, rel=1e-4)


def test_kmeans_more_clusters_than_distinct_points() -> None:
    x = np.repeat(np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0]], np.float32), 4, axis=0)
    first = kmeans(x, 5, seed=0, block_size=5)
    second = kmeans(x, 5, seed=0, block_size=5)
    assert np.all(np.isfinite(np.asarray(first.centroids)))
    np.testing.assert_array_equal(np.asarray(first.assignments), np.asarray(second.assignments))
    assert float(first.inertia) == pytest.approx(0.0, abs=1e-6)
    assert len(set(np.asarray(first.assignments).tolist())) == 3


# ---------------------------------------------------------------------------------------------
# Results table.


def test_format_table() -> None:
    table = format_table(
        {"val": {"recall@1": 0.5, "map@r": 0.12345}, "test": {"recall@1": 1.0, "nmi": 0.9}}
    )
    lines = table.splitlines()
    assert lines[0].split() == ["recall@1", "map@r", "nmi"]
    assert lines[2].split() == ["val", "50.00", "12.35", "-"]
    assert lines[3].split() == ["test", "100.00", "-", "90.00"]
    assert len({len(line) for line in lines}) == 1  # fixed width


def test_a_metric_without_per_query_values_gets_every_neighbour_list(
    monkeypatch: pytest.MonkeyPatch, labelled: tuple[np.ndarray, np.ndarray]
) -> None:
    """Built-in retrieval metrics are reduced block by block; a registered metric with only
    ``compute`` still gets the (N, k) neighbour classes, and both agree."""

    def first_neighbour_hits(requirements: Requirements) -> float:
        first = requirements.neighbour_labels[:, 0]
        return float(np.mean(first == requirements.labels))

    metric = Metric("first_hits", first_neighbour_hits, num_neighbours=lambda _: 3)
    monkeypatch.setitem(METRICS._items, "first_hits", metric)
    x, labels = labelled
    got = evaluate_embeddings(x, labels, ["first_hits", "recall@1", "map@r"], block_size=16)
    assert got["first_hits"] == got["recall@1"]
    alone = evaluate_embeddings(x, labels, ["map@r"], block_size=7)
    assert alone["map@r"] == pytest.approx(got["map@r"], abs=1e-12)


def test_kmeans_automatic_blocks_hold_assign_scores_distances(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a block_size, assignment blocks hold about ASSIGN_SCORES distances, and the
    clustering is the same as with explicit small blocks."""

    assert assignment.block_rows(20_000, 5, None) == 20_000
    assert assignment.block_rows(20_000, 1_000, None) == min(
        20_000, assignment.assign_scores() // 1_000
    )
    assert assignment.block_rows(20_000, 50_000, None) == assignment.MIN_BLOCK_ROWS
    assert assignment.block_rows(20_000, 5, 7) == 7
    x = np.random.default_rng(4).normal(size=(60, 3)).astype(np.float32)
    small = kmeans(x, 4, seed=0, block_size=7)
    monkeypatch.setattr(assignment, "ASSIGN_SCORES", 4 * 13)  # blocks of 13 points
    for init in ("k-means++", "reference"):
        got = kmeans(x, 4, seed=0 if init != "reference" else None, init=init)
        want = kmeans(x, 4, seed=0 if init != "reference" else None, init=init, block_size=7)
        np.testing.assert_array_equal(np.asarray(got.assignments), np.asarray(want.assignments))
    auto = kmeans(x, 4, seed=0)
    np.testing.assert_array_equal(np.asarray(auto.assignments), np.asarray(small.assignments))
    np.testing.assert_allclose(np.asarray(auto.centroids), np.asarray(small.centroids), atol=1e-6)
