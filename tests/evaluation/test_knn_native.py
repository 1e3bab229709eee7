"""The native kNN kernels (jdml/native/knn.cc): ``jdml_knn_top`` selects what an explicit
sort of every score selects, ties to the lower index (within a vector of compares, across
reference tiles, across buffer cuts and across threads), and ``jdml_order_rows`` orders rows as
a lexicographic sort does; ``selection="native"`` (a run's ``backends.knn``) chooses the
kernel; NumPy arrays searched directly (``jdml_knn_search_host``) give the jitted search's
results: bit for bit where oneDNN's sgemm rounds a product alike in every tile shape (AVX-512),
up to float32 rounding elsewhere."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.backends import resolve_backends
from jdml.errors import ConfigError
from jdml.evaluation.knn import blocks, knn, search
from jdml.native import build, switches
from tests.helpers import sgemm_tiles_round_alike

pytestmark = pytest.mark.cpu  # the CPU backend's native kernels


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    build.library()  # compiled once per machine; the tests need it


@jax.jit
def _order(distances: jax.Array, indices: jax.Array) -> tuple[jax.Array, jax.Array]:
    """``jdml_order_rows``: the ordering step of ``jdml_knn_search`` on rows as they are."""
    call = jax.ffi.ffi_call(
        "jdml_order_rows",
        (
            jax.ShapeDtypeStruct(distances.shape, jnp.float32),
            jax.ShapeDtypeStruct(indices.shape, jnp.int32),
        ),
        vmap_method="sequential",
    )
    return tuple(call(distances, indices))


@functools.partial(jax.jit, static_argnums=(3, 4))
def _top(queries, references, bias, k: int, scale: float):
    """``jdml_knn_top``: the selection step of ``jdml_knn_search`` on its own."""
    call = jax.ffi.ffi_call(
        "jdml_knn_top",
        (
            jax.ShapeDtypeStruct((queries.shape[0], k), jnp.float32),
            jax.ShapeDtypeStruct((queries.shape[0], k), jnp.int32),
        ),
        vmap_method="sequential",
    )
    return call(queries, references, bias, k=np.int64(k), scale=np.float32(scale))


def top(queries: np.ndarray, references: np.ndarray, bias: np.ndarray, k: int, scale: float = 1):
    """The kernel's selection of the scores ``scale * q.r + bias`` (scale 2: Euclidean)."""
    values, indices = _top(
        jnp.asarray(queries), jnp.asarray(references), jnp.asarray(bias), k, scale
    )
    return np.asarray(values), np.asarray(indices)


def sorted_scores(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row sorted by (score descending, index ascending) explicitly; its first k."""
    order = np.lexsort((np.broadcast_to(np.arange(scores.shape[1]), scores.shape), -scores))
    order = order[:, :k]
    return np.take_along_axis(scores, order, axis=1), order


def integer_problem(rng: np.random.Generator, n: int, refs: int, dim: int, grid: int):
    """Small-integer queries, references and biases: every score is an exact float32 in any
    summation order, so the selection can be checked for exact equality, ties included."""
    queries = rng.integers(-grid, grid + 1, (n, dim)).astype(np.float32)
    references = rng.integers(-grid, grid + 1, (refs, dim)).astype(np.float32)
    bias = rng.integers(-grid, grid + 1, refs).astype(np.float32)
    return queries, references, bias, queries @ references.T + bias


@pytest.mark.smoke
@pytest.mark.parametrize(
    ("n", "refs", "dim", "k", "grid"),
    [
        (300, 5000, 16, 1, 3),  # many exact ties for the single best, over 5 reference tiles
        (300, 5000, 16, 40, 3),  # buffer cuts (cap 96) with ties at every threshold
        (70, 3000, 8, 1000, 2),  # k larger than a reference tile
        (65, 1037, 3, 1037, 1),  # every reference; a tail of 13 scalar compares
        (1, 40, 5, 7, 4),  # one query: one thread
        (100, 2000, 4, 5, 0),  # every score 0: the first tile's floor of the k-th best is 0
    ],
)
@pytest.mark.parametrize("scale", [1, 2])
def test_selection_equals_an_explicit_sort(
    n: int, refs: int, dim: int, k: int, grid: int, scale: int
) -> None:
    queries, references, bias, scores = integer_problem(
        np.random.default_rng(n + k), n, refs, dim, grid
    )
    scores = scores + (scale - 1) * (queries @ references.T)
    values, indices = top(queries, references, bias, k, scale)
    want_values, want_indices = sorted_scores(scores, k)
    np.testing.assert_array_equal(indices, want_indices)
    np.testing.assert_array_equal(values, want_values)
    assert values.dtype == np.float32 and indices.dtype == np.int32


def test_random_scores_match_float64_up_to_rounding() -> None:
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((200, 64)).astype(np.float32)
    references = rng.standard_normal((4000, 64)).astype(np.float32)
    bias = rng.standard_normal(4000).astype(np.float32)
    values, indices = top(queries, references, bias, 50)
    exact = queries.astype(np.float64) @ references.T.astype(np.float64) + bias
    want_values, want_indices = sorted_scores(exact, 50)
    np.testing.assert_allclose(values, want_values, atol=1e-4)
    assert np.mean(indices == want_indices) > 0.999  # near-ties may swap under rounding


def test_padding_references_never_enter_and_missing_slots_are_marked() -> None:
    """References with bias -inf are padding: with fewer other references than k, the
    remaining slots are (-inf, INT32_MAX), as the XLA selection's running top-k starts."""
    rng = np.random.default_rng(1)
    queries, references, bias, _ = integer_problem(rng, 9, 30, 4, 3)
    bias[5:] = -np.inf
    values, indices = top(queries, references, bias, 8)
    want_values, want_indices = sorted_scores(queries @ references[:5].T + bias[:5], 5)
    np.testing.assert_array_equal(indices[:, :5], want_indices)
    np.testing.assert_array_equal(values[:, :5], want_values)
    assert np.all(values[:, 5:] == -np.inf)
    assert np.all(indices[:, 5:] == np.iinfo(np.int32).max)


def test_zero_scores_of_either_sign_tie_by_index() -> None:
    """-0.0 and +0.0 are equal scores: the lower index goes first whatever the sign."""
    queries = np.array([[1.0]], np.float32)
    references = np.zeros((4, 1), np.float32)
    bias = np.array([0.0, -0.0, -0.0, 0.0], np.float32)
    _, indices = top(queries, references, bias, 4)
    np.testing.assert_array_equal(indices, [[0, 1, 2, 3]])


@pytest.mark.parametrize("rows", [1, 200])
def test_order_rows_equals_a_lexicographic_sort(rows: int) -> None:
    """Rows sorted by distance with runs of equal distances out of index order (what rounding
    leaves after the selection), and arbitrary rows: both come out in (distance, index) order."""
    rng = np.random.default_rng(rows)
    distances = np.sort(rng.integers(0, 6, (rows, 300)), axis=1).astype(np.float32)
    distances[: rows // 2] = rng.integers(0, 6, (rows // 2, 300))  # not even distance order
    distances[0, :4] = [0.0, -0.0, 0.0, -0.0]
    indices = np.stack([rng.permutation(1000)[:300] for _ in range(rows)]).astype(np.int32)
    got_d, got_i = map(np.asarray, _order(jnp.asarray(distances), jnp.asarray(indices)))
    order = np.lexsort((indices, distances + np.float32(0)))
    np.testing.assert_array_equal(got_i, np.take_along_axis(indices, order, axis=1))
    np.testing.assert_array_equal(got_d, np.take_along_axis(distances, order, axis=1))


def _exact_distances(
    queries: np.ndarray, references: np.ndarray, indices: np.ndarray, distance: str
) -> np.ndarray:
    """Every row's distances to its references ``indices`` in float64."""
    q = queries.astype(np.float64)[:, None, :]
    r = references.astype(np.float64)[indices]
    if distance == "cosine":
        q = q / np.linalg.norm(q, axis=-1, keepdims=True)
        r = r / np.linalg.norm(r, axis=-1, keepdims=True)
        return 1.0 - np.sum(q * r, axis=-1)
    return np.sqrt(np.sum((r - q) ** 2, axis=-1))


def assert_equal_up_to_rounding_ties(
    queries: np.ndarray, references: np.ndarray, got, want, distance: str = "euclidean"
) -> None:
    """Two (distances, indices) results of a search of ``queries`` against ``references`` have
    the same neighbours in every row but where a row swaps references whose distances differ by
    float32 rounding only (the native kernel sums |q|^2 and |r|^2 in its own order, so near-equal
    distances can round to a tie in one result and not in the other), with the distances equal
    up to rounding."""
    (got_d, got_i), (want_d, want_i) = (tuple(np.asarray(a) for a in pair) for pair in (got, want))
    if distance == "cosine":  # 1 - q.r of unit rows: rounding of a sum of unit-scale products
        np.testing.assert_allclose(got_d, want_d, rtol=0, atol=1e-6)
    else:  # near 0 a distance is the square root of the rounding of |q|^2 + |r|^2 - 2 q.r
        scale = float(np.max(np.sum(queries**2, axis=1)) + np.max(np.sum(references**2, axis=1)))
        np.testing.assert_allclose(got_d**2, want_d**2, rtol=1e-5, atol=0.5e-6 * scale)
    rows = np.flatnonzero(np.any(got_i != want_i, axis=1))
    assert len(rows) <= 0.05 * len(queries)
    for row in rows:
        exact = _exact_distances(queries[row : row + 1], references, got_i[row : row + 1], distance)
        exact_want = _exact_distances(
            queries[row : row + 1], references, want_i[row : row + 1], distance
        )
        # the same distances position by position, up to float32 rounding of the scores
        np.testing.assert_allclose(exact, exact_want, rtol=0, atol=1e-5)


def assert_same_search(
    queries: np.ndarray, references: np.ndarray, got, want, distance: str = "euclidean"
) -> None:
    """Two native searches of the same problem whose dot products came from sgemm tiles of other
    shapes (one block or several, the direct search or the jitted one): bit for bit where sgemm
    rounds alike in every tile (``sgemm_tiles_round_alike``), else the same up to rounding."""
    if sgemm_tiles_round_alike():
        np.testing.assert_array_equal(np.asarray(got[1]), np.asarray(want[1]))
        np.testing.assert_array_equal(np.asarray(got[0]), np.asarray(want[0]))
    else:
        assert_equal_up_to_rounding_ties(queries, references, got, want, distance)


@pytest.mark.parametrize("exclude_self", [True, False])
def test_knn_with_the_native_selection_equals_the_others(exclude_self: bool) -> None:
    """The three selections give the same neighbours at k = 300 of 2,000, where rounding maps
    many different scores to one distance and the rows need ordering (host and XLA: exactly
    the same; native: up to swaps of references at the same distance up to rounding)."""
    x = np.random.default_rng(4).standard_normal((2000, 32)).astype(np.float32)
    on_device = jnp.asarray(x)  # NumPy arrays would take the direct search (compared below)
    results = {}
    for selection in ("native", "host", "xla"):
        found = knn(on_device, on_device, 300, exclude_self=exclude_self, selection=selection)
        results[selection] = [np.asarray(a) for a in found]
    np.testing.assert_array_equal(results["host"][1], results["xla"][1])
    assert_equal_up_to_rounding_ties(x, x, results["native"], results["xla"])
    direct = knn(x, x, 300, exclude_self=exclude_self, selection="native")
    assert_same_search(x, x, direct, results["native"])


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize("exclude_self", [True, False])
def test_the_native_search_is_the_same_in_one_block_or_several(
    monkeypatch: pytest.MonkeyPatch, distance: str, exclude_self: bool
) -> None:
    """Blocks of 64 queries (the biases from ``jdml_knn_bias``, the query offsets for the own
    index) give the neighbours and distances of one block (the biases computed inside
    ``jdml_knn_search``), bit for bit where sgemm rounds alike in every tile."""
    native_knn = functools.partial(knn, selection="native")
    rng = np.random.default_rng(7)
    x = rng.standard_normal((700, 24)).astype(np.float32)
    x[5] = x[600]  # an exact duplicate: kept as a neighbour at distance 0, ranked by index
    on_device = jnp.asarray(x)  # NumPy arrays would take the direct search, in one call
    options = {"exclude_self": exclude_self, "distance": distance}
    one = [np.asarray(a) for a in native_knn(on_device, on_device, 9, **options)]
    monkeypatch.setattr(blocks, "BLOCK_SCORES", 1)  # blocks of block_size queries
    several = [np.asarray(a) for a in native_knn(on_device, on_device, 9, block_size=64, **options)]
    assert_same_search(x, x, several, one, distance)
    direct = native_knn(x, x, 9, block_size=64, **options)  # direct for the Euclidean one
    assert_same_search(x, x, direct, one, distance)
    if exclude_self:
        assert not np.any(one[1] == np.arange(len(x))[:, None])
        assert one[1][5, 0] == 600 and one[1][600, 0] == 5
    else:  # the query and its duplicate tie at distance 0: the lower index first
        np.testing.assert_array_equal(one[1][[5, 600], :2], [[5, 600], [5, 600]])


def _placed_at(x: np.ndarray, past: int) -> np.ndarray:
    """A copy of ``x`` whose data starts ``past`` bytes after a 64-byte boundary."""
    raw = np.empty(x.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data % 64) + past
    out = raw[start : start + x.nbytes].view(x.dtype).reshape(x.shape)
    out[...] = x
    return out


@pytest.mark.parametrize(
    ("queries", "references", "k", "exclude_self", "dim"),
    [
        (1, 1, 1, False, 24),  # a single query and reference
        (5, 5, 4, True, 24),  # every other point
        (257, 257, 7, True, 24),  # one query past a tile of 256
        (300, 1100, 16, False, 24),  # a gallery
        (300, 1748, 5, False, 24),  # ranges of 150 queries: tiles of 1,747 references and of 1
        (600, 600, 300, True, 24),  # k of half the points: buffers cut many times
        (40, 3000, 1000, False, 24),  # k of a third of the references
        (1100, 1100, 3, True, 1030),  # wide embeddings: tiles of 1,024 queries
    ],
)
def test_the_direct_search_of_numpy_arrays_is_the_jitted_search(
    monkeypatch: pytest.MonkeyPatch,
    queries: int,
    references: int,
    k: int,
    exclude_self: bool,
    dim: int,
) -> None:
    """``jdml_knn_search_host`` on NumPy arrays where they are (unaligned, or converted from
    float64 / a strided view) equals the jitted ``jdml_knn_search`` on device arrays, also with
    exact duplicates (ties by index) and with several jitted blocks. From 1,024 dimensions on,
    oneDNN's sgemm sums the dot products in blocks that depend on the tile's shape, so routes
    that cut the queries differently agree up to float32 rounding, as they do at every width on
    CPUs whose sgemm rounds differently per tile shape (``sgemm_tiles_round_alike``)."""
    native_knn = functools.partial(knn, selection="native")
    rng = np.random.default_rng(queries + references + k)
    r = rng.standard_normal((references, dim)).astype(np.float32)
    if references > 3:
        r[3] = r[1]  # an exact duplicate
    q = r.copy() if exclude_self else rng.standard_normal((queries, dim)).astype(np.float32)
    refs = r if exclude_self else _placed_at(r, 16)
    qs = refs if exclude_self else _placed_at(q, 48)

    def assert_same(found: tuple, reference: tuple) -> None:
        if dim < 1024:  # bit for bit where sgemm rounds alike in every tile
            assert_same_search(q, r, found, reference)
        else:
            assert_equal_up_to_rounding_ties(q, r, found, reference)

    got = native_knn(qs, refs, k, exclude_self=exclude_self)
    assert all(isinstance(a, np.ndarray) for a in got)
    want = native_knn(jnp.asarray(q), jnp.asarray(r), k, exclude_self=exclude_self)
    assert all(isinstance(a, jax.Array) for a in want)
    assert_same(got, want)
    monkeypatch.setattr(blocks, "BLOCK_SCORES", 1)  # several jitted blocks
    several = native_knn(
        jnp.asarray(q), jnp.asarray(r), k, exclude_self=exclude_self, block_size=64
    )
    assert_same(got, several)
    if not exclude_self:  # float64 and a strided view: converted, then searched directly
        wide = np.zeros((queries, 2 * dim))
        wide[:, ::2] = q
        again = native_knn(wide[:, ::2], r.astype(np.float64), k, exclude_self=False)
        np.testing.assert_array_equal(again[1], got[1])
        np.testing.assert_array_equal(again[0], got[0])


def test_numpy_arrays_give_numpy_results_on_every_path() -> None:
    """NumPy in, NumPy out: the direct search, the cosine distance (jitted) and the other
    selections; a device array among the inputs gives device arrays."""
    x = np.random.default_rng(9).standard_normal((50, 8)).astype(np.float32)
    for selection, distance in [
        ("native", "euclidean"),
        ("native", "cosine"),
        ("xla", "euclidean"),
    ]:
        options = {"exclude_self": True, "distance": distance, "selection": selection}
        found = knn(x, x, 3, **options)
        assert all(isinstance(a, np.ndarray) for a in found), (selection, distance)
        mixed = knn(jnp.asarray(x), x, 3, **options)
        assert all(isinstance(a, jax.Array) for a in mixed), (selection, distance)
        np.testing.assert_array_equal(np.asarray(mixed[1]), found[1])


def test_the_direct_search_checks_its_arguments() -> None:
    native_knn = functools.partial(knn, selection="native")
    x = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="k"):
        native_knn(x, x, 4, exclude_self=True)  # only 3 other points
    with pytest.raises(ValueError):
        native_knn(x, np.zeros((4, 3), np.float32), 1, exclude_self=False)  # dimensions differ


@pytest.mark.parametrize("mode", ["xla", "onednn"])
def test_the_switch_chooses_the_selection(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    monkeypatch.setenv(switches.KNN_ENV, mode)
    selection = resolve_backends().knn  # where the variable is read: once per run
    assert (search._selection(5, 100, selection) == "native") == (mode == "onednn")


def test_an_unknown_switch_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(switches.KNN_ENV, "fast")
    with pytest.raises(ConfigError, match=r"JDML_KNN='fast' is not one of .*JDML_KNN=auto"):
        resolve_backends()
    x = np.zeros((4, 2), np.float32)
    knn(x, x, 1, exclude_self=False)  # the search does not read the variable
