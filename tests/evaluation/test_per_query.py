"""Per-query values kept compressed in evaluation records (``jdml.evaluation.per_query``)."""

from __future__ import annotations

import ml_collections
import numpy as np
import pytest

from jdml.data.arrays import ImageArrays
from jdml.evaluation import per_query as pq
from jdml.evaluation.embeddings import evaluate_embeddings_with_vectors
from jdml.evaluation.splits import Evaluation, evaluate_splits

# Five points on a line, classes 0 0 1 1 0: the nearest other point of each (Euclidean) is
# 1 -> 0 (hit), 0 -> 1 (hit), 2 -> 3 (hit), 3 -> 2 (hit), 4 -> 3 (miss; class 1 against 0).
POINTS = np.array([[0.0], [1.0], [10.0], [11.0], [13.0]], np.float32)
LABELS = np.array([0, 0, 1, 1, 0])
HITS = np.array([1.0, 1.0, 1.0, 1.0, 0.0])


def test_per_query_recall_at_1_is_each_querys_hit():
    got = evaluate_embeddings_with_vectors(
        POINTS, LABELS, ["recall@1", "map@r"], per_query=["recall@1"]
    )
    np.testing.assert_array_equal(got.per_query["recall@1"], HITS)
    assert got.metrics["recall@1"] == pytest.approx(HITS.mean())
    assert list(got.per_query) == ["recall@1"] and got.vectors == {}


def test_per_query_against_a_gallery_is_one_value_per_query():
    gallery = np.array([[0.5], [12.0]], np.float32)
    got = evaluate_embeddings_with_vectors(
        POINTS,
        LABELS,
        ["recall@1"],
        gallery=gallery,
        gallery_labels=np.array([0, 1]),
        per_query=["recall@1"],
    )
    # nearest gallery item: 0.5 (class 0) for 0, 1; 12 (class 1) for 10, 11, 13.
    np.testing.assert_array_equal(got.per_query["recall@1"], [1, 1, 1, 1, 0])


@pytest.mark.parametrize(
    "per_query, match",
    [(["recall@4"], "not among the metrics"), (["nmi"], "has no per-query values")],
)
def test_per_query_refuses_what_it_cannot_return(per_query, match):
    with pytest.raises(ValueError, match=match):
        evaluate_embeddings_with_vectors(POINTS, LABELS, ["recall@1", "nmi"], per_query=per_query)


def test_encode_decode_round_trip_and_corrupt_text():
    values = np.array([1.0, 0.0, np.nan, 0.25], np.float32)
    text = pq.encode(values)
    assert text.startswith("f4:")
    np.testing.assert_array_equal(pq.decode(text), values)
    ids = np.array([3, 3, 7, -1])
    assert pq.encode(ids).startswith("i4:")
    np.testing.assert_array_equal(pq.decode(pq.encode(ids)), ids)
    for bad in ("", "f4:", "f4:not base64!", "x8:AAAA", "f4:" + pq.encode(ids)[3:-4], 12):
        with pytest.raises(ValueError, match="per-query array"):
            pq.decode(bad)
    with pytest.raises(ValueError, match="1-D"):
        pq.encode(np.zeros((2, 2)))


def test_pack_unpack_and_paired_differences():
    def block(hits, classes=LABELS, main="embedding"):
        vectors = {
            "rho_spectrum@0": np.ones(3),  # other vectors are left out
            pq.classes_key(): classes,
            pq.vector_key(main, "recall@1"): np.asarray(hits, np.float64),
            pq.vector_key("concat:1,1", "recall@1"): np.ones(5),
        }
        return pq.pack(vectors, main)

    assert pq.pack({"rho_spectrum@0": np.ones(3)}, "embedding") == {}
    classes, values = pq.unpack(block(HITS))
    np.testing.assert_array_equal(classes, LABELS)
    np.testing.assert_array_equal(values["embedding"]["recall@1"], HITS)
    a = {0: block(HITS), 1: block([1, 1, 1, 1, 1]), 2: block(HITS)}
    b = {0: block([0, 1, 1, 1, 0], main="other"), 1: block(HITS, main="other")}
    diffs, classes, seeds = pq.paired_differences(a, b, (None, None))
    assert seeds == [0, 1]
    np.testing.assert_array_equal(diffs, [[1, 0, 0, 0, 0], [0, 0, 0, 0, 1]])
    diffs, _, _ = pq.paired_differences(a, b, ("concat:1,1", None))
    np.testing.assert_array_equal(diffs[1], [0, 0, 0, 0, 1])
    with pytest.raises(ValueError, match="no per-query recall@1 of 'nope'"):
        pq.paired_differences(a, b, ("nope", None))
    with pytest.raises(ValueError, match="other test queries"):
        pq.paired_differences(a, {0: block(HITS, classes=LABELS[::-1])}, (None, None))
    with pytest.raises(ValueError, match="no seed"):
        pq.paired_differences(a, {5: block(HITS)}, (None, None))
    with pytest.raises(ValueError, match="no 'classes'"):
        pq.unpack({"main": "x"})
    short = block(HITS)
    short["embedding"]["recall@1"] = pq.encode(np.ones(2))
    with pytest.raises(ValueError, match="2 values for 5 queries"):
        pq.unpack(short)


def test_evaluate_splits_keeps_every_head_and_combination_per_query():
    """The split's vectors hold the per-query hits of the main head, of the other heads and of
    the weighted concatenations, and the queries' classes, on the full splits only."""
    data = ImageArrays(np.zeros((5, 2, 2, 1), np.uint8), LABELS.astype(np.int32), ("x", "y"))
    flipped = np.array([[13.0], [1.0], [10.0], [11.0], [0.0]], np.float32)

    def embed(params, batch_stats, images):
        n = images.shape[0]
        return {"a": np.resize(POINTS, (n, 1)), "b": np.resize(flipped, (n, 1))}

    cfg = ml_collections.ConfigDict(
        {
            "batch_size": 5,
            "distance": "euclidean",
            "kmeans": "k-means++",
            "metrics": ("recall@1",),
            "heads": ("a", "b"),
            "combinations": ((1.0, 1.0),),
            "per_query": ("recall@1",),
        }
    )
    metrics = {"test": ["recall@1"], "train": ["recall@1"]}
    splits = {"test": data, "train": data}
    got = evaluate_splits(embed, None, None, splits, metrics, cfg, head="a", full=("test",))
    assert isinstance(got, Evaluation) and list(got.heads) == ["test"]
    assert list(got.heads["test"]) == ["b", "concat:1,1"]
    assert got.metrics["test"]["recall@1"] == pytest.approx(HITS.mean())
    vectors = got.vectors
    classes, values = pq.unpack(pq.pack(vectors["test"], "a"))
    np.testing.assert_array_equal(classes, LABELS)
    assert set(values) == {"a", "b", "concat:1,1"}
    np.testing.assert_array_equal(values["a"]["recall@1"], HITS)
    for name in ("b", "concat:1,1"):
        assert values[name]["recall@1"].mean() == pytest.approx(got.heads["test"][name]["recall@1"])
    assert pq.pack(vectors["train"], "a") == {}
