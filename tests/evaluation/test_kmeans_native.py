"""The native k-means assignment (jdml/native/kmeans.cc) equals XLA's: the same nearest
centroids (ties to the lower index, across vector lanes and centroid tiles), the same distances
up to the rounding of the dot products, NaN rows as XLA treats them, and every k-means mode
gives the same result with either (``native=True``, a run's ``backends.kmeans=onednn``, against
``native=False``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.backends import resolve_backends
from jdml.errors import ConfigError
from jdml.evaluation import kmeans as km
from jdml.evaluation.kmeans import assignment, lloyd, reference
from jdml.native import build
from jdml.native import kmeans as native_kmeans
from tests.helpers import sgemm_tiles_round_alike

pytestmark = pytest.mark.cpu  # the CPU backend's native kernels


@pytest.fixture(scope="module", autouse=True)
def _library() -> None:
    build.library()  # compiled once per machine; the tests need it


@jax.jit
def _xla(points: jax.Array, centroids: jax.Array) -> tuple[jax.Array, jax.Array]:
    return assignment.assign(points[None], centroids, use_native=False)


@jax.jit
def _native(points: jax.Array, centroids: jax.Array) -> tuple[jax.Array, jax.Array]:
    return assignment.assign(points[None], centroids, use_native=True)


@jax.jit
def _native_with_norms(
    blocks: jax.Array, centroids: jax.Array, norms: jax.Array
) -> tuple[jax.Array, jax.Array]:
    return assignment.assign(blocks, centroids, norms[None, :, None], use_native=True)


def both(points: np.ndarray, centroids: np.ndarray) -> tuple[tuple, tuple]:
    args = (jnp.asarray(points, jnp.float32), jnp.asarray(centroids, jnp.float32))
    xla, ours = _xla(*args), _native(*args)
    return tuple(map(np.asarray, xla)), tuple(map(np.asarray, ours))


@pytest.mark.parametrize(
    ("n", "dim", "k"),
    [
        (1000, 16, 5),
        (700, 33, 37),
        (3000, 8, 1500),
        (100, 3, 100),
        (257, 128, 9),
        (1201, 33, 16),
        (515, 7, 1),
        (64, 200, 13),
    ],
)
def test_assignment_equals_xla(n: int, dim: int, k: int) -> None:
    """Fewer points than a thread's share, centroids not a multiple of the lanes, and more
    centroids than one tile (1,024); up to 16 centroids (the direct dot products, on CPUs with
    AVX-512): dimensions not a multiple of 16 and above 128, an odd number of points, more
    points than a tile of 512, one centroid and all 16 lanes."""
    rng = np.random.default_rng(n + k)
    points = rng.normal(size=(n, dim)).astype(np.float32)
    centroids = rng.normal(size=(k, dim)).astype(np.float32)
    (want, want_sq), (got, got_sq) = both(points, centroids)
    np.testing.assert_array_equal(got, want)
    scale = np.sum(points**2, 1) + np.sum(centroids[want] ** 2, 1)
    np.testing.assert_allclose(got_sq, want_sq, rtol=0, atol=float(np.max(scale)) * 1e-6)
    assert got.dtype == np.int32 and got_sq.dtype == np.float32


@pytest.mark.parametrize("k", [37, 1025])
def test_assigned_distances_do_not_depend_on_the_points_assigned_with_them(k: int) -> None:
    """The sgemm tiles (more than 16 centroids) give each point the same squared distance
    whether it is assigned alone, among a few points or among many, and across a tile of one
    centroid (1,025 = 1,024 + 1): small tiles are padded to one sgemm kernel. Bit for bit where
    sgemm rounds alike in every tile shape (AVX-512); up to a float32 ulp of the sum elsewhere."""
    rng = np.random.default_rng(k)
    points = jnp.asarray(rng.normal(size=(600, 24)), jnp.float32)
    centroids = jnp.asarray(rng.normal(size=(k, 24)), jnp.float32)
    # the points' squared norms fixed (XLA's reduction rounds differently for other shapes)
    norms = jnp.sum(points * points, axis=1)

    def assign(begin: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        rows = points[None, begin:end]
        return tuple(map(np.asarray, _native_with_norms(rows, centroids, norms[begin:end])))

    nearest, distances = assign(0, 600)
    scale = float(jnp.max(norms)) + float(jnp.max(jnp.sum(centroids * centroids, axis=1)))
    for begin, end in [(0, 1), (3, 8), (7, 300), (599, 600)]:
        part_nearest, part = assign(begin, end)
        np.testing.assert_array_equal(part_nearest, nearest[begin:end])
        if sgemm_tiles_round_alike():
            np.testing.assert_array_equal(part, distances[begin:end])
        else:  # one float32 ulp of a product of the sum |p|^2 + |c|^2 - 2 p.c
            np.testing.assert_allclose(part, distances[begin:end], rtol=0, atol=0.5e-6 * scale)


def test_ties_go_to_the_lower_index() -> None:
    """Integer coordinates make every distance exact, so duplicated centroids tie exactly: in
    one vector lane, in different lanes, in the scalar tail and in another tile of 1,024."""
    rng = np.random.default_rng(0)
    k = 1100
    centroids = rng.integers(-50, 50, size=(k, 6)).astype(np.float32)
    # lanes of 4, 8 and 16 (23: the same lane of 16 as 7, one register later), a later tile,
    # the tail
    for copy in (9, 15, 23, 1050, 1099):
        centroids[copy] = centroids[7]
    centroids[1098] = centroids[1030]  # both in the second tile
    points = np.concatenate([centroids[[7, 1030]], centroids[[7, 1030]] + 0.5])
    (want, want_sq), (got, got_sq) = both(points, centroids)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:2], [7, 1030])
    np.testing.assert_array_equal(got_sq, want_sq)


def test_ties_go_to_the_lower_index_among_few_centroids() -> None:
    """The same with at most 16 centroids (one register of distances on CPUs with AVX-512):
    the first of equal distances, wherever the copies sit in the register."""
    rng = np.random.default_rng(4)
    centroids = rng.integers(-50, 50, size=(16, 5)).astype(np.float32)
    centroids[[3, 11, 15]] = centroids[2]
    centroids[14] = centroids[9]
    points = np.concatenate([centroids[[2, 9, 3, 14]], centroids[[2, 9]] + 0.5])
    (want, want_sq), (got, got_sq) = both(points, centroids)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got[:4], [2, 9, 2, 9])
    np.testing.assert_array_equal(got_sq, want_sq)


def test_points_at_their_centroid_are_at_distance_zero() -> None:
    """The Gram expansion can round below 0: the distance is clamped at 0, as in XLA."""
    rng = np.random.default_rng(1)
    centroids = (rng.normal(size=(20, 64)) * 100).astype(np.float32)
    (want, want_sq), (got, got_sq) = both(centroids, centroids)
    np.testing.assert_array_equal(got, want)
    assert np.all(got_sq >= 0) and np.all(want_sq >= 0)


def test_a_nan_point_is_assigned_out_of_range_as_in_xla() -> None:
    rng = np.random.default_rng(2)
    points = rng.normal(size=(10, 4)).astype(np.float32)
    points[3, 1] = np.nan
    centroids = rng.normal(size=(12, 4)).astype(np.float32)
    (want, want_sq), (got, got_sq) = both(points, centroids)
    assert want[3] == got[3] == 12
    assert np.isnan(want_sq[3]) and np.isnan(got_sq[3])
    np.testing.assert_array_equal(np.delete(got, 3), np.delete(want, 3))


@pytest.mark.smoke
@pytest.mark.parametrize("init", km.KMEANS_MODES)
def test_every_mode_is_the_same_with_the_native_assignment(init: str) -> None:
    rng = np.random.default_rng(3)
    centres = rng.normal(size=(8, 16)) * 3
    x = (centres[np.arange(600) % 8] + rng.normal(size=(600, 16))).astype(np.float32)
    results = {}
    for mode in ("xla", "onednn"):
        seed = None if init == "reference" else 0
        results[mode] = km.kmeans(x, 8, seed=seed, init=init, native=mode == "onednn")
    np.testing.assert_array_equal(results["onednn"].assignments, results["xla"].assignments)
    np.testing.assert_allclose(results["onednn"].centroids, results["xla"].centroids, atol=1e-6)
    np.testing.assert_allclose(results["onednn"].inertia, results["xla"].inertia, rtol=1e-5)


def test_an_unknown_switch_value_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The variable is read where the backends are resolved (once per run), not by k-means."""
    monkeypatch.setenv("JDML_KMEANS", "fast")
    with pytest.raises(ConfigError, match=r"JDML_KMEANS='fast' is not one of .*JDML_KMEANS=auto"):
        resolve_backends()
    km.kmeans(np.zeros((4, 2), np.float32), 2)  # not asked: XLA's, the variable unread


def numpy_lloyd(x: np.ndarray, centroids: np.ndarray, iters: int) -> np.ndarray:
    """Lloyd's steps written out in float64: nearest centroid (lower index on ties), mean of
    its points, an empty cluster keeps its centroid."""
    c = centroids.astype(np.float64)
    for _ in range(iters):
        d = ((x[:, None, :].astype(np.float64) - c[None]) ** 2).sum(-1)
        nearest = np.argmin(d, axis=1)
        for k in range(len(c)):
            if np.any(nearest == k):
                c[k] = x[nearest == k].astype(np.float64).mean(0)
    return c


@pytest.mark.parametrize(("dim", "clusters"), [(6, 4), (33, 16), (6, 20)])
def test_native_lloyd_iterations_equal_lloyd_written_out(dim: int, clusters: int) -> None:
    """The fused iterations (``jdml_kmeans_lloyd``, few clusters; up to 16 with the direct dot
    products on CPUs with AVX-512, 20 with sgemm's): well separated clusters, one initial
    centroid far from every point (its cluster stays empty and keeps it), a NaN point (in no
    cluster, assigned out of range), 17,000 points (two pieces, the last tile of each partial).
    The final assignment is the nearest final centroid, the inertia the sum of its distances
    (NaN with the NaN point, as XLA's sum), and with a mean given every point and centroid is
    taken relative to it (the same iterations on points and centroids shifted by the mean)."""
    rng = np.random.default_rng(5)
    real = clusters - 1
    centres = rng.normal(size=(real, dim)) * 5
    x = centres[np.arange(17000) % real] + rng.normal(size=(17000, dim))
    x = (np.round(x * 1024) / 1024).astype(np.float32)  # so that x + 8 - 8 is x exactly
    initial = np.concatenate([x[:real], np.full((1, dim), 1e3, np.float32)])
    x[5000, 1] = np.nan
    got, nearest, sq, inertia = map(
        np.asarray, native_kmeans.lloyd(jnp.asarray(x), jnp.zeros(dim), jnp.asarray(initial), 4)
    )
    offset = np.float32(8.0)
    shifted = map(
        np.asarray,
        native_kmeans.lloyd(
            jnp.asarray(x + offset), jnp.full(dim, offset), jnp.asarray(initial), 4
        ),
    )
    for a, b in zip((got, nearest, sq, inertia), shifted, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(inertia, np.sum(sq.astype(np.float64)), rtol=1e-6)
    finite = np.isfinite(x).all(axis=1)
    want = numpy_lloyd(x[finite], initial, 4)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    np.testing.assert_array_equal(got[-1], initial[-1])
    d = ((x[finite, None, :].astype(np.float64) - got[None].astype(np.float64)) ** 2).sum(-1)
    np.testing.assert_array_equal(nearest[finite], np.argmin(d, axis=1))
    np.testing.assert_allclose(sq[finite], d.min(axis=1), rtol=1e-4, atol=1e-3)
    assert nearest[5000] == clusters and np.isnan(sq[5000])
    assert nearest.shape == sq.shape == (len(x),)


@pytest.mark.parametrize(("n", "dim"), [(37, 5), (9000, 33), (20000, 128)])
def test_native_centring_equals_numpy(n: int, dim: int) -> None:
    """``jdml_kmeans_centre``: the mean (float64 sums, one piece or several), the centred
    points (the float32 subtraction itself, so exactly) and their squared norms (float32 sums
    in another order: within rounding), with an offset ten times the spread."""
    rng = np.random.default_rng(n)
    x = (rng.normal(size=(n, dim)) + 10.0).astype(np.float32)
    centred, norms, mean = map(np.asarray, jax.jit(native_kmeans.centre)(jnp.asarray(x)))
    want_mean = x.astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-6)
    np.testing.assert_array_equal(centred, x - mean)
    want_norms = np.sum((x - mean).astype(np.float64) ** 2, axis=1)
    np.testing.assert_allclose(norms, want_norms, rtol=2e-6)


def sequential_means(x: np.ndarray, nearest: np.ndarray, clusters: int) -> np.ndarray:
    """Each cluster's float32 sum of its points in point order (``np.cumsum`` adds in order;
    ``np.sum`` would add pairwise) times the float32 ``1 / count``; an empty cluster is 0."""
    means = np.zeros((clusters, x.shape[1]), np.float32)
    for k in range(clusters):
        mine = x[nearest == k]
        if len(mine):
            means[k] = np.cumsum(mine, axis=0, dtype=np.float32)[-1] * (
                np.float32(1) / np.float32(len(mine))
            )
    return means


@pytest.mark.parametrize(("dim", "clusters"), [(40, 5), (200, 13), (130, 16), (7, 3)])
def test_native_reference_updates_sum_in_point_order(dim: int, clusters: int) -> None:
    """``jdml_kmeans_reference_lloyd`` up to 16 clusters sums each group of clusters in
    registers, 8, 4, 2 or 1 registers of dimensions at a time (13 or 16 clusters take several
    groups; each thread a range of clusters): each update equals the assignment followed by the
    float32 sums in point order written out, bit for bit, and the fused final assignment equals
    a separate assignment to the final centroids."""
    rng = np.random.default_rng(dim)
    x = rng.normal(size=(3000, dim)).astype(np.float32)
    points = jnp.asarray(x)
    rows = assignment.block_rows(len(x), clusters, None)
    centroids = x[:clusters]
    for _ in range(3):
        nearest = np.asarray(
            reference._final_assignment(
                points, jnp.asarray(centroids), block_size=rows, use_native=True
            )[0]
        )
        centroids = sequential_means(x, nearest, clusters)
    got, counts, steps, assignments, inertia = reference._reference_updates(
        points,
        jnp.asarray(x[:clusters]),
        jnp.int32(3),
        num_points=len(x),
        block_size=rows,
        use_native=True,
    )
    assert int(steps) == 3 and np.all(np.asarray(counts) > 0)
    np.testing.assert_array_equal(np.asarray(got), centroids)
    want, want_inertia = reference._final_assignment(points, got, block_size=rows, use_native=True)
    np.testing.assert_array_equal(np.asarray(assignments), np.asarray(want))
    np.testing.assert_allclose(float(inertia), float(want_inertia), rtol=1e-6)


def test_native_reference_updates_stop_at_an_empty_cluster_without_a_final_assignment() -> None:
    """An update that leaves a cluster empty ends the call (the host splits next): the final
    assignment is left out of range, and the reference k-means assigns after the split."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 24)).astype(np.float32)
    initial = np.concatenate([x[:3], np.full((1, 24), 1e3, np.float32)])  # cluster 3 stays empty
    got, counts, steps, assignments, _ = reference._reference_updates(
        jnp.asarray(x),
        jnp.asarray(initial),
        jnp.int32(5),
        num_points=len(x),
        block_size=500,
        use_native=True,
    )
    assert int(steps) == 1 and float(np.asarray(counts)[3]) == 0.0
    np.testing.assert_array_equal(np.asarray(got)[3], 0.0)
    np.testing.assert_array_equal(np.asarray(assignments), 4)


def test_reference_updates_are_the_same_on_every_call() -> None:
    """Two rounds per iteration on the caller and a helper thread (``run_rounds``): a helper
    that started before the caller opened round 0 used to run a piece of it early and count it
    into a later round, which then ended while its other piece still ran (about one call in 300
    came out different with both cores busy). 1,000 calls must all agree."""
    rng = np.random.default_rng(2)
    centres = rng.normal(size=(8, 16)) * 5
    x = jnp.asarray((centres[np.arange(240) % 8] + rng.normal(size=(240, 16))).astype(np.float32))

    def update() -> np.ndarray:
        return np.asarray(
            reference._reference_updates(
                x, x[:20], jnp.int32(20), num_points=240, block_size=240, use_native=True
            )[0]
        )

    first = update()
    differing = sum(not np.array_equal(update(), first) for _ in range(1000))
    assert differing == 0


# The bounded assignment (``jdml_kmeans_assign_bounded``) of the iterations above 64 clusters.


@jax.jit
def _bounded(
    points: jax.Array, centroids: jax.Array, bounds: assignment.Bounds
) -> assignment.Bounds:
    return assignment.assign_bounded(points, jnp.sum(points * points, axis=1), centroids, bounds)


def moving_centroids(rng: np.random.Generator, start: np.ndarray, steps: int) -> list:
    """Centroids that move less and less (as in Lloyd's iterations), some not at all."""
    path, c = [start], start
    for step in range(steps):
        shift = rng.normal(size=c.shape) * 0.5 ** (step + 1)
        shift[rng.random(len(c)) < 0.3] = 0.0
        c = (c + shift).astype(np.float32)
        path.append(c)
    return path


@pytest.mark.parametrize(("n", "dim", "k"), [(3000, 16, 80), (1500, 33, 1100), (700, 5, 200)])
def test_bounded_assignment_equals_the_full_one_at_every_step(n: int, dim: int, k: int) -> None:
    """Along a path of moving centroids, every bounded assignment is the full pass's, the
    bounds hold (float64: the upper one at or above each point's distance to its centroid, the
    lower one at or below its distance to every other). More centroids than a tile of 1,024,
    and dimensions not a multiple of the lanes."""
    rng = np.random.default_rng(n + k)
    centres = rng.normal(size=(k // 4, dim)) * 4
    points = (centres[rng.integers(0, len(centres), n)] + rng.normal(size=(n, dim))).astype(
        np.float32
    )
    path = moving_centroids(rng, points[rng.choice(n, k, replace=False)], 8)
    bounds = assignment.Bounds.unknown(jnp.asarray(path[0]), n)
    x64 = points.astype(np.float64)
    for c in path:
        bounds = _bounded(jnp.asarray(points), jnp.asarray(c), bounds)
        want, _ = _native(jnp.asarray(points), jnp.asarray(c))
        nearest = np.asarray(bounds.nearest)
        np.testing.assert_array_equal(nearest, np.asarray(want))
        dist = np.sqrt(((x64[:, None, :] - c.astype(np.float64)[None]) ** 2).sum(-1))
        own = dist[np.arange(n), nearest]
        others = np.where(np.arange(k)[None] == nearest[:, None], np.inf, dist).min(1)
        upper, lower = np.asarray(bounds.upper), np.asarray(bounds.lower)
        assert np.all(upper >= own) and np.all(lower <= others)


def test_bounded_assignment_keeps_ties_and_nan_points_as_the_full_one() -> None:
    """Exactly tied centroids (integer coordinates) are never settled by the bounds, so the
    lower index wins as in the full pass, step after step; a NaN point stays out of range.
    With centroids that do not move, a point assigned in full gets the same upper bound again,
    and a skipped one its bound rounded up: the tied points are assigned in full, most others
    are skipped."""
    rng = np.random.default_rng(9)
    k = 90
    centroids = rng.integers(-20, 20, size=(k, 4)).astype(np.float32)
    centroids[[30, 61]] = centroids[5]
    points = np.concatenate(
        [centroids[[5, 30, 61]], rng.integers(-20, 20, size=(200, 4)).astype(np.float32)]
    )
    points[100, 2] = np.nan
    bounds = assignment.Bounds.unknown(jnp.asarray(centroids), len(points))
    for step in range(3):
        before = np.asarray(bounds.upper)
        bounds = _bounded(jnp.asarray(points), jnp.asarray(centroids), bounds)
        want, _ = _native(jnp.asarray(points), jnp.asarray(centroids))
        np.testing.assert_array_equal(np.asarray(bounds.nearest), np.asarray(want))
        np.testing.assert_array_equal(np.asarray(bounds.nearest)[:3], [5, 5, 5])
        assert np.asarray(bounds.nearest)[100] == k
        if step:
            upper = np.asarray(bounds.upper)
            np.testing.assert_array_equal(upper[:3], before[:3])  # assigned in full
            assert np.mean(upper[3:] > before[3:]) > 0.5  # skipped


@pytest.mark.parametrize("init", ["random", "reference"])
def test_kmeans_above_64_clusters_is_the_same_without_bounds(
    monkeypatch: pytest.MonkeyPatch, init: str
) -> None:
    """The iterations with the bounded assignment end where full assignments end."""
    rng = np.random.default_rng(11)
    centres = rng.normal(size=(100, 12)) * 3
    x = (centres[np.arange(2000) % 100] + rng.normal(size=(2000, 12))).astype(np.float32)
    seed = None if init == "reference" else 0
    bounded = km.kmeans(x, 100, seed=seed, init=init, native=True)

    def full(points, norms, centroids, bounds):
        nearest, _ = native_kmeans.assign(points, norms, centroids)
        return assignment.Bounds(centroids, nearest, bounds.upper, bounds.lower)

    monkeypatch.setattr(assignment, "assign_bounded", full)
    lloyd.jitted_kmeans.clear_cache()
    reference._reference_updates.clear_cache()
    try:
        plain = km.kmeans(x, 100, seed=seed, init=init, native=True)
    finally:
        monkeypatch.undo()
        lloyd.jitted_kmeans.clear_cache()
        reference._reference_updates.clear_cache()
    np.testing.assert_array_equal(np.asarray(bounded.assignments), np.asarray(plain.assignments))
    np.testing.assert_array_equal(np.asarray(bounded.centroids), np.asarray(plain.centroids))
    assert float(bounded.inertia) == float(plain.inertia)


@pytest.mark.parametrize(
    ("n", "dim", "k"), [(1, 1, 1), (100, 5, 300), (3000, 7, 16), (4000, 33, 100), (5000, 130, 1000)]
)
def test_native_sums_equal_segment_sum_bit_for_bit(n: int, dim: int, k: int) -> None:
    """``jdml_kmeans_sums`` (ranges of clusters over the threads, each cluster's members summed in
    registers) gives XLA's ``segment_sum`` sums and counts bit for bit, with assignments out of
    range (-1 and K: NaN points, padding) counted for no cluster, and more clusters than points
    (empty clusters sum to 0); the sums equal float32 sums in point order written out, and
    differ from the sums in reverse order (so the test sees the order)."""
    rng = np.random.default_rng(n + k)
    x = (rng.normal(size=(n, dim)) * 10).astype(np.float32)
    nearest = rng.integers(-1, k + 1, n).astype(np.int32)

    def sums(use_native: bool) -> tuple[np.ndarray, np.ndarray]:
        got = jax.jit(lambda p, a: assignment.cluster_sums(p, a, k, use_native))(x, nearest)
        return tuple(np.asarray(v) for v in got)

    got_sums, got_counts = sums(True)
    want_sums, want_counts = sums(False)
    np.testing.assert_array_equal(got_sums, want_sums)
    np.testing.assert_array_equal(got_counts, want_counts)
    forward, backward = np.zeros((k, dim), np.float32), np.zeros((k, dim), np.float32)
    for i in range(n):
        if 0 <= nearest[i] < k:
            forward[nearest[i]] += x[i]
    for i in reversed(range(n)):
        if 0 <= nearest[i] < k:
            backward[nearest[i]] += x[i]
    np.testing.assert_array_equal(got_sums, forward)
    np.testing.assert_array_equal(
        got_counts, np.bincount(nearest[(nearest >= 0) & (nearest < k)], minlength=k)
    )
    if n >= 3000:
        assert not np.array_equal(got_sums, backward)


def unaligned(x: np.ndarray) -> np.ndarray:
    """``x`` copied to memory 4 bytes past a 64-byte boundary (C-contiguous float32)."""
    raw = np.empty(x.nbytes + 64 + 4, np.uint8)
    start = (-raw.ctypes.data % 64) + 4
    out = raw[start : start + x.nbytes].view(np.float32).reshape(x.shape)
    out[...] = x
    return out


@pytest.mark.parametrize("init", ["random", "reference"])
@pytest.mark.parametrize(
    ("n", "dim", "k"), [(3000, 40, 5), (1100, 33, 64), (9000, 130, 16), (40, 3, 40), (7, 2, 1)]
)
def test_host_arrays_take_the_direct_call_with_the_jitted_result(
    monkeypatch: pytest.MonkeyPatch, init: str, n: int, dim: int, k: int
) -> None:
    """Host points (here unaligned, float64 and strided too) into up to 64 clusters go to the
    native functions called directly (``_direct_lloyd``, ``_direct_reference_updates``; no
    JAX): NumPy arrays out, equal bit for bit to the jitted call's result on the same points
    as a JAX array, including N == K (the points themselves, copied) and one cluster."""
    rng = np.random.default_rng(n + k)
    centres = rng.normal(size=(max(k // 2, 1), dim)) * 3
    x = (centres[np.arange(n) % len(centres)] + rng.normal(size=(n, dim))).astype(np.float32)
    seed = None if init == "reference" else 1
    called = []
    call_host = native_kmeans.call_host
    monkeypatch.setattr(
        native_kmeans, "call_host", lambda name, *a: called.append(name) or call_host(name, *a)
    )
    want = km.kmeans(jnp.asarray(x), k, seed=seed, init=init, native=True)
    assert isinstance(want.assignments, jax.Array) and not called
    for points in (x, unaligned(x), x.astype(np.float64), np.repeat(x, 2, axis=1)[:, ::2]):
        called.clear()
        got = km.kmeans(points, k, seed=seed, init=init, native=True)
        assert called and all(name.startswith("jdml_kmeans_") for name in called)
        assert all(isinstance(v, np.ndarray | np.generic) for v in got), type(got.assignments)
        np.testing.assert_array_equal(got.assignments, np.asarray(want.assignments))
        np.testing.assert_array_equal(got.centroids, np.asarray(want.centroids))
        assert np.float32(got.inertia) == np.float32(want.inertia)
    if n == k:
        assert not np.shares_memory(km.kmeans(x, k, init=init, native=True).centroids, x)


@pytest.mark.parametrize("init", ["random", "reference"])
def test_direct_call_leaves_nan_points_out_as_the_jitted_call(init: str) -> None:
    """NaN points: the direct call gives the jitted one's result bit for bit. In the reference
    mode (no centring) the NaN point goes to no cluster (assignment K, NaN inertia) and the
    others cluster as usual; "random" centres the points, so its NaN mean makes every point NaN
    in both routes."""
    rng = np.random.default_rng(8)
    x = (rng.normal(size=(4, 6))[np.arange(900) % 4] + rng.normal(size=(900, 6))).astype(np.float32)
    x[-1, 2] = np.nan  # not among the initial centroids of either mode
    seed = None if init == "reference" else 0
    got = km.kmeans(x, 4, seed=seed, init=init, native=True)
    want = km.kmeans(jnp.asarray(x), 4, seed=seed, init=init, native=True)
    np.testing.assert_array_equal(got.assignments, np.asarray(want.assignments))
    np.testing.assert_array_equal(got.centroids, np.asarray(want.centroids))
    assert got.assignments[-1] == 4 and np.isnan(got.inertia) and np.isnan(want.inertia)
    if init == "reference":
        assert np.all(np.isfinite(got.centroids)) and np.all(got.assignments[:-1] < 4)


def test_direct_reference_splits_empty_clusters_as_the_jitted_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Coinciding initial centroids leave clusters empty in the first update: the direct call
    stops there, the host splits, and the iterations go on, as in the jitted call (the same
    result bit for bit, and every cluster used)."""
    rng = np.random.default_rng(4)
    x = (rng.normal(size=(6, 8))[np.arange(600) % 6] + rng.normal(size=(600, 8))).astype(np.float32)
    permutation = km.reference_permutation(len(x), 12, km.REFERENCE_SEED + 1)
    for first, second in ((0, 1), (2, 3), (4, 7)):
        x[permutation[second]] = x[permutation[first]]
    called = []
    direct = native_kmeans.reference_lloyd_host
    monkeypatch.setattr(
        native_kmeans, "reference_lloyd_host", lambda *a: called.append(a[2]) or direct(*a)
    )
    got = km.kmeans(x, 12, init="reference", native=True)
    assert len(called) >= 2 and called[0] == km.DEFAULT_NUM_ITERS  # a split came between
    want = km.kmeans(jnp.asarray(x), 12, init="reference", native=True)
    np.testing.assert_array_equal(got.assignments, np.asarray(want.assignments))
    np.testing.assert_array_equal(got.centroids, np.asarray(want.centroids))
    assert len(np.unique(got.assignments)) == 12


def test_a_failing_direct_call_raises_its_message() -> None:
    """A host function that fails (here told to run with a negative number of points) reports
    its message as a RuntimeError instead of returning garbage."""
    x = np.ones((10, 4), np.float32)
    mean = np.empty((4,), np.float32)
    with pytest.raises(RuntimeError, match="k-means mean: bad shapes: -10 points"):
        native_kmeans.call_host("jdml_kmeans_mean_host", x.ctypes.data, -10, 4, mean.ctypes.data)
