"""Query-against-gallery evaluation (the In-Shop protocol) against explicit NumPy rankings.

Every query is ranked against every gallery item (nothing excluded); R is the number of
gallery items of the query's class. The brute force below sorts each query's distances by
(distance, gallery index) and evaluates the definitions directly.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import average_precision_score

from jdml.evaluation.embeddings import evaluate_embeddings
from jdml.evaluation.knn import knn_full_ranking

RETRIEVAL = ["recall@1", "recall@2", "recall@8", "precision@1", "r_precision", "map@r"]
ROTH = ["map@c", "map@5", "map"]


def ranked_relevance(q, ql, g, gl, distance="euclidean"):
    """(Q, M) relevance of each query's gallery ranking, by (distance, index)."""
    if distance == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        g = g / np.linalg.norm(g, axis=1, keepdims=True)
        d = 1.0 - q @ g.T
    else:
        d = np.sqrt(((q[:, None, :].astype(np.float64) - g[None]) ** 2).sum(-1))
    order = np.lexsort((np.broadcast_to(np.arange(len(g)), d.shape), d), axis=1)
    return gl[order] == ql[:, None]


def brute_force(q, ql, g, gl, distance="euclidean") -> dict[str, float]:
    rel = ranked_relevance(q, ql, g, gl, distance)
    r = np.array([np.sum(gl == c) for c in ql])
    out = {f"recall@{k}": float(np.mean(rel[:, :k].any(1))) for k in (1, 2, 8)}
    has = r > 0
    out["precision@1"] = float(np.mean(rel[has, 0]))
    prec = np.cumsum(rel, 1) / np.arange(1, rel.shape[1] + 1)
    rp, apr, apc, ap5, ap = [], [], [], [], []
    for i in range(len(q)):
        ri = r[i]
        rp.append(rel[i, :ri].sum() / max(ri, 1))
        apr.append((prec[i, :ri] * rel[i, :ri]).sum() / max(ri, 1))
        apc.append((prec[i, :ri] * rel[i, :ri]).sum() / max(ri, 1))
        ap5.append((prec[i, :5] * rel[i, :5]).sum() / max(ri, 1))
        ap.append((prec[i] * rel[i]).sum() / max(ri, 1))
    out["r_precision"] = float(np.mean(np.array(rp)[has]))
    out["map@r"] = float(np.mean(np.array(apr)[has]))
    out["map@c"] = float(np.mean(apc))
    out["map@5"] = float(np.mean(ap5))
    out["map"] = float(np.mean(ap))
    return out


@pytest.fixture(scope="module")
def shop() -> tuple[np.ndarray, ...]:
    """Queries and a gallery sharing most classes: class 7 has no gallery item, class 8 is in
    the gallery only, and one gallery item duplicates a query exactly (distance 0)."""
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(9, 6)) * 1.5
    ql = np.repeat(np.arange(8), 3)
    gl = np.concatenate([np.repeat(np.arange(7), rng.integers(1, 6, size=7)), [8, 8]])
    q = (centres[ql] + rng.normal(size=(len(ql), 6))).astype(np.float32)
    g = (centres[gl] + rng.normal(size=(len(gl), 6))).astype(np.float32)
    g[0] = q[0]  # a duplicate image in query and gallery
    return q, ql.astype(np.int32), g, gl.astype(np.int32)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_retrieval_metrics_match_brute_force(shop, distance) -> None:
    q, ql, g, gl = shop
    got = evaluate_embeddings(
        q, ql, RETRIEVAL + ROTH, gallery=g, gallery_labels=gl, distance=distance, block_size=5
    )
    want = brute_force(q, ql, g, gl, distance)
    for name in RETRIEVAL + ROTH:
        assert got[name] == pytest.approx(want[name], abs=1e-9), name


def test_map_matches_sklearn_per_query(shop) -> None:
    """``map`` is the mean of scikit-learn's average precision over queries with gallery
    items of their class (a query without any scores 0)."""
    q, ql, g, gl = shop
    d = np.sqrt(((q[:, None, :].astype(np.float64) - g[None]) ** 2).sum(-1))
    scores = []
    for i in range(len(q)):
        relevant = gl == ql[i]
        scores.append(average_precision_score(relevant, -d[i]) if relevant.any() else 0.0)
    got = evaluate_embeddings(q, ql, ["map"], gallery=g, gallery_labels=gl)
    assert got["map"] == pytest.approx(np.mean(scores), abs=1e-9)


def test_duplicate_in_gallery_is_found_first(shop) -> None:
    """The query is not excluded from the gallery: its exact duplicate is its first hit."""
    q, ql, g, gl = shop
    ranking = knn_full_ranking(q[:1], ql[:1], 1, references=g, reference_ids=gl)
    assert ranking.indices[0, 0] == 0 and ranking.distances[0, 0] == 0.0


def test_gallery_equal_to_queries_differs_from_leave_one_out(shop) -> None:
    """With the queries as their own gallery, every query finds itself: recall@1 is 1, while
    leave-one-out excludes the query."""
    q, ql, _, _ = shop
    assert evaluate_embeddings(q, ql, ["recall@1"], gallery=q, gallery_labels=ql)[
        "recall@1"
    ] == pytest.approx(1.0)
    assert evaluate_embeddings(q, ql, ["recall@1"])["recall@1"] < 1.0


def test_set_level_metrics_describe_queries_and_gallery_together(shop) -> None:
    q, ql, g, gl = shop
    names = ["nmi", "f1", "rho_spectrum@1", "dists@intra"]
    got = evaluate_embeddings(q, ql, names, gallery=g, gallery_labels=gl, seed=4)
    union = evaluate_embeddings(np.concatenate([q, g]), np.concatenate([ql, gl]), names, seed=4)
    assert got == pytest.approx(union)


def test_single_query_and_more_neighbours_than_gallery(shop) -> None:
    q, ql, g, gl = shop
    got = evaluate_embeddings(q[:1], ql[:1], ["recall@64"], gallery=g[:3], gallery_labels=gl[:3])
    assert got["recall@64"] == float(np.any(gl[:3] == ql[0]))


def test_gallery_errors(shop) -> None:
    q, ql, g, gl = shop
    with pytest.raises(ValueError, match="gallery_labels"):
        evaluate_embeddings(q, ql, ["recall@1"], gallery=g)
    with pytest.raises(ValueError, match="dimensions"):
        evaluate_embeddings(q, ql, ["recall@1"], gallery=g[:, :3], gallery_labels=gl)
    with pytest.raises(ValueError, match="reference_ids"):
        knn_full_ranking(q, ql, 1, references=g)
