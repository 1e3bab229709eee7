"""The evaluator on 4 (fake CPU) devices equals the one-device evaluator: the kNN search with
the references passed around a ring (same neighbours in the same order, ties and duplicates
included), k-means (same assignments), the TSQR singular values, and evaluate_embeddings."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from sklearn.datasets import make_blobs

from jdml.evaluation.embeddings import evaluate_embeddings, evaluate_embeddings_with_vectors
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import knn
from jdml.evaluation.metrics import singular_values
from jdml.evaluation.sharded import (
    eval_mesh,
    knn_program,
    sharded_kmeans,
    sharded_knn,
    sharded_singular_values,
)
from jdml.geometry import l2_normalize

pytestmark = pytest.mark.skipif(len(jax.devices()) < 4, reason="needs 4 (fake) devices")

N = 301  # not a multiple of 4: the last device's shard ends with padding


@pytest.fixture(scope="module")
def mesh():
    return eval_mesh(4)


def _random(rng: np.random.Generator) -> np.ndarray:
    """Gaussian points with exact duplicates (distance 0 to each other)."""
    x = rng.normal(size=(N, 12)).astype(np.float32)
    x[[40, 41, 290]] = x[7]
    x[150] = x[299]
    return x


def _integers(rng: np.random.Generator) -> np.ndarray:
    """Small integers: every score is exact, and there are many exactly tied distances."""
    x = rng.integers(-2, 3, size=(N, 6)).astype(np.float32)
    x[[3, 100, 300]] = x[200]
    return x


def _signs(rng: np.random.Generator) -> np.ndarray:
    """Four entries of +-1 per row (norm 2): the cosine scores are exact too, with ties."""
    x = np.zeros((N, 8), np.float32)
    for row in x:
        row[rng.choice(8, 4, replace=False)] = rng.choice([-1.0, 1.0], 4)
    return x


DATA = {"random": _random, "integers": _integers, "signs": _signs}
# How a dataset's scores compare between two devices' layouts: "exact" (every score exactly
# representable: bit-identical neighbours and distances), "indices" (no near-ties: the same
# neighbours, distances within rounding), "ties" (ties in exact arithmetic that float32
# rounding breaks, differently for products of other shapes: swaps only among those).
AGREEMENT = {
    ("random", "euclidean"): "indices",
    ("random", "cosine"): "indices",
    ("integers", "euclidean"): "exact",
    ("integers", "cosine"): "ties",
    ("signs", "euclidean"): "exact",
    ("signs", "cosine"): "exact",
}


@pytest.fixture(scope="module", params=list(DATA))
def data(request: pytest.FixtureRequest) -> tuple[str, np.ndarray]:
    return request.param, DATA[request.param](np.random.default_rng(0))


def _exact_distances(queries: np.ndarray, references: np.ndarray, distance: str) -> np.ndarray:
    """float64 (Q, N) distances."""
    q, r = queries.astype(np.float64), references.astype(np.float64)
    if distance == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
        return 1.0 - q @ r.T
    return np.sqrt(np.maximum(((q[:, None, :] - r[None, :, :]) ** 2).sum(-1), 0.0))


def assert_same_neighbours(one, many, agreement: str, queries, references, distance) -> None:
    """The neighbours of ``many`` equal those of ``one`` as ``agreement`` says (see
    ``AGREEMENT``)."""
    d1, i1 = (np.asarray(a) for a in one)
    dk, ik = many
    assert ik.shape == i1.shape and ik.dtype == np.int32 and dk.dtype == np.float32
    if agreement == "exact":
        np.testing.assert_array_equal(ik, i1)
        np.testing.assert_array_equal(dk, d1)
        return
    scale = float(np.max(np.sum(references * references, axis=1)))
    if distance == "euclidean":  # near 0 a distance carries sqrt(rounding of |q|^2)
        np.testing.assert_allclose(dk**2, d1**2, rtol=1e-5, atol=1e-5 * scale)
    else:
        np.testing.assert_allclose(dk, d1, rtol=1e-5, atol=1e-6)
    if agreement == "indices":
        np.testing.assert_array_equal(ik, i1)
        return
    rows = np.flatnonzero(np.any(ik != i1, axis=1))
    exact = _exact_distances(queries[rows], references, distance)
    for row, got, want in zip(exact, ik[rows], i1[rows], strict=True):
        # Row by row the same multiset of exact distances: swaps only among exact ties.
        np.testing.assert_allclose(np.sort(row[got]), np.sort(row[want]), atol=1e-9)


# (k, exclude_self): one neighbour leave-one-out, a few with the query itself included, and
# more than a shard holds (76 rows per device).
NEIGHBOURS = [(1, True), (7, False), (100, True)]


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("k, exclude_self", NEIGHBOURS, ids=["1-loo", "7-self", "100-loo"])
def test_knn_on_four_devices_equals_one_device(
    mesh, data, distance: str, exclude_self: bool, k: int
) -> None:
    """Queries = references (N = 301, 76 per device): k = 100 is more than a shard holds. (The
    sharded search selects on device whatever the selection; the one-device search's two
    selections agree, ``tests/evaluation/test_evaluation.py``.)"""
    name, x = data
    one = knn(x, x, k, exclude_self=exclude_self, distance=distance, block_size=64)
    many = sharded_knn(x, x, k, exclude_self=exclude_self, distance=distance, mesh=mesh)
    assert_same_neighbours(one, many, AGREEMENT[name, distance], x, x, distance)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
def test_knn_over_several_chunks_and_query_blocks(mesh, data, distance: str):
    """Shards of several chunks (a running top-k within a shard) and several query blocks per
    device, with separate queries (Q = 43) against the references."""
    name, x = data
    queries = x[::7] + (0.25 if name == "random" else 0.0)
    options = {"distance": distance, "block_size": 4, "chunk_size": 32}
    one = knn(queries, x, 9, exclude_self=False, **options)
    many = sharded_knn(queries, x, 9, exclude_self=False, mesh=mesh, **options)
    assert_same_neighbours(one, many, AGREEMENT[name, distance], queries, x, distance)


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("exclude_self", [True, False], ids=["leave-one-out", "self-included"])
def test_shards_of_whole_chunks_give_bit_identical_neighbours(
    monkeypatch: pytest.MonkeyPatch, mesh, distance: str, exclude_self: bool
) -> None:
    """With at least one one-device chunk per device (chunks of 64: 5 chunks, 2 per device) the
    products have the one-device shapes: the distances of the chunked one-device search are
    reproduced bit for bit, on random points too."""
    x = _random(np.random.default_rng(5))
    options = {"exclude_self": exclude_self, "distance": distance, "chunk_size": 64}
    d1, i1 = knn(x, x, 7, block_size=32, selection="xla", **options)
    dk, ik = sharded_knn(x, x, 7, mesh=mesh, **options)
    np.testing.assert_array_equal(ik, np.asarray(i1))
    np.testing.assert_array_equal(dk, np.asarray(d1))


def test_knn_ties_go_to_the_lower_index_across_shards(mesh) -> None:
    """Every point has the same distance to all others: the neighbours of every query are the
    lowest indices, whichever device holds them and in whatever order the ring brings them."""
    x = np.zeros((30, 4), np.float32)
    d, i = sharded_knn(x, x, 5, exclude_self=True, mesh=mesh)
    expected = [[j for j in range(30) if j != q][:5] for q in range(30)]
    np.testing.assert_array_equal(i, expected)
    np.testing.assert_array_equal(d, 0.0)


def test_knn_errors_are_those_of_one_device(mesh) -> None:
    x = np.zeros((10, 4), np.float32)
    with pytest.raises(ValueError, match=r"k=10 must be in \[1, 9\]"):
        sharded_knn(x, x, 10, exclude_self=True, mesh=mesh)
    with pytest.raises(ValueError, match="unknown distance"):
        sharded_knn(x, x, 2, exclude_self=True, distance="l1", mesh=mesh)


def test_each_device_holds_a_quarter_of_the_references() -> None:
    """Per device, the compiled program's arguments (the device's queries, which are its
    references) are 1/D of the one-device program's; its temporaries (the augmented shard, the
    shard received from the ring, a block's scores) hold less than all references, and the
    whole falls about as 1/D from 2 to 4 devices (the received shard is the ring's cost)."""
    n, dim = 8192, 32

    def memory(devices: int):
        program, inputs = knn_program(
            n,
            None,
            dim,
            4,
            mesh=eval_mesh(devices),
            exclude_self=True,
            block_size=64,
            chunk_size=512,
        )
        return program.lower(*inputs).compile().memory_analysis()

    def total(stats) -> int:
        return stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes

    one, two, four = memory(1), memory(2), memory(4)
    assert four.argument_size_in_bytes * 4 == one.argument_size_in_bytes == n * dim * 4
    assert four.temp_size_in_bytes < n * (dim + 1) * 4
    assert total(four) < 0.6 * total(two) and total(four) < 0.45 * total(one)


@pytest.fixture(scope="module")
def blobs() -> tuple[np.ndarray, np.ndarray]:
    x, labels = make_blobs(n_samples=N, centers=6, n_features=8, random_state=1)
    return x.astype(np.float32), labels


@pytest.mark.parametrize("init", ["k-means++", "random"])
@pytest.mark.parametrize("normalize", [False, True], ids=["points", "normalised"])
def test_kmeans_on_four_devices_equals_one_device(mesh, blobs, init: str, normalize: bool):
    x, _ = blobs
    points = np.asarray(l2_normalize(x)) if normalize else x
    one = kmeans(points, 6, seed=3, init=init, block_size=32)
    many = sharded_kmeans(x, 6, seed=3, init=init, block_size=32, mesh=mesh, normalize=normalize)
    np.testing.assert_array_equal(many.assignments, np.asarray(one.assignments))
    np.testing.assert_allclose(many.centroids, np.asarray(one.centroids), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(many.inertia, np.asarray(one.inertia), rtol=1e-5)


def test_reference_kmeans_runs_on_one_device(mesh, blobs) -> None:
    x, _ = blobs
    one = kmeans(x, 6, init="reference")
    many = sharded_kmeans(x, 6, init="reference", mesh=mesh)
    np.testing.assert_array_equal(many.assignments, np.asarray(one.assignments))
    np.testing.assert_array_equal(many.centroids, np.asarray(one.centroids))


@pytest.mark.parametrize("shape", [(N, 16), (10, 16), (3, 5)], ids=["tall", "wide", "tiny"])
def test_singular_values_on_four_devices_equal_one_device(mesh, shape) -> None:
    """TSQR within 1e-5 of the largest singular value, also with fewer rows than dimensions
    (the wide and tiny cases give the devices fewer rows than columns, or none but padding);
    normalised rows as the cosine distance uses them."""
    x = np.random.default_rng(2).normal(size=shape).astype(np.float32)
    x[:, 0] *= 30.0  # a spread spectrum
    for normalize in (False, True):
        one = singular_values(l2_normalize(x) if normalize else x)
        many = sharded_singular_values(x, mesh=mesh, normalize=normalize)
        assert many.shape == one.shape == (min(shape),)
        np.testing.assert_allclose(many, one, rtol=0, atol=1e-5 * one[0])


METRICS = ["recall@1", "recall@4", "map@r", "r_precision", "nmi", "f1", "rho_spectrum@1"]


@pytest.fixture(scope="module")
def classes() -> tuple[np.ndarray, np.ndarray]:
    """Classes of about 5 noisy members in 16 dimensions (N = 301)."""
    rng = np.random.default_rng(4)
    labels = np.arange(N) // 5
    centres = rng.normal(size=(labels.max() + 1, 16))
    x = centres[labels] + 0.8 * rng.normal(size=(N, 16))
    return x.astype(np.float32), labels


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("devices", [4, 0], ids=["four", "all"])
def test_evaluate_embeddings_on_four_devices_equals_one_device(classes, distance, devices):
    x, labels = classes
    metrics = [*METRICS, "rho_spectrum@0"]
    one = evaluate_embeddings_with_vectors(x, labels, metrics, distance=distance)
    many = evaluate_embeddings_with_vectors(x, labels, metrics, distance=distance, devices=devices)
    assert list(many.metrics) == METRICS
    for name in ("recall@1", "recall@4", "map@r", "r_precision", "nmi", "f1"):
        assert many.metrics[name] == one.metrics[name], name
    assert many.metrics["rho_spectrum@1"] == pytest.approx(one.metrics["rho_spectrum@1"], rel=1e-4)
    np.testing.assert_allclose(
        many.vectors["rho_spectrum@0"], one.vectors["rho_spectrum@0"], rtol=1e-4
    )


def test_evaluate_embeddings_with_a_gallery_on_four_devices(classes) -> None:
    """Queries ranked against a gallery (the In-Shop protocol), and the set-level metrics of
    the two together, on 4 devices; map (the complete ranking) runs on the default device."""
    x, labels = classes
    options = {"gallery": x[101:], "gallery_labels": labels[101:]}
    metrics = ["recall@1", "recall@8", "map@r", "map", "nmi"]
    one = evaluate_embeddings(x[:101], labels[:101], metrics, **options)
    many = evaluate_embeddings(x[:101], labels[:101], metrics, devices=4, **options)
    assert many == one


def test_too_many_eval_devices_name_the_key() -> None:
    from jdml.errors import ConfigError

    with pytest.raises(ConfigError, match=r"parallel\.eval_devices=99 must be in \[0, "):
        eval_mesh(99)


def test_a_run_evaluates_on_parallel_eval_devices(tmp_path, monkeypatch) -> None:
    """``parallel.eval_devices=4`` reaches the evaluator of a run (the sharded kNN is called,
    on a mesh of 4 devices) and gives the metrics of ``parallel.eval_devices=1``."""
    from jdml.evaluation import embeddings as evaluator
    from jdml.run import Run
    from tests.helpers import make_npz, tiny_config

    npz = make_npz(str(tmp_path / "tiny.npz"))
    meshes = []
    original = evaluator.sharded_knn_blocks

    def spy(*args, mesh, **kwargs):
        meshes.append(mesh.size)
        return original(*args, mesh=mesh, **kwargs)

    monkeypatch.setattr(evaluator, "sharded_knn_blocks", spy)
    results = {}
    for devices in (1, 4):
        run = Run(tiny_config(npz, **{"parallel.eval_devices": devices}))
        splits = {name: run.splits[name] for name in ("train", "test")}
        results[devices] = run.evaluate(run.initial_state, splits).metrics
    assert meshes == [4, 4]  # the two splits on 4 devices, none with eval_devices=1
    assert results[4].keys() == results[1].keys()
    for split, values in results[1].items():
        for name, value in values.items():
            assert results[4][split][name] == pytest.approx(value, rel=1e-4), (split, name)
