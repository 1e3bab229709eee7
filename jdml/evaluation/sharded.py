"""The evaluator on every device of a 1-D mesh: exact kNN, k-means and the singular values.

``parallel.eval_devices`` (see :func:`jdml.evaluation.embeddings.evaluate_embeddings`) runs the
three expensive parts of an evaluation on a mesh of D devices (:func:`eval_mesh`; under
``jax.distributed`` the devices of every host). Each returns what its one-device counterpart
returns, so the metrics do not depend on the device count (up to float rounding, see below).

**kNN** (:func:`sharded_knn`): the queries are split over the devices, and so are the
references: each device holds N / D of them and, D times, scores its queries against the
reference shard it holds, merges that shard's best into a running top-k and passes the shard
on to the next device (``jax.lax.ppermute`` around a ring), so after D steps every query has
seen every reference. The alternative, every device holding all N references, costs N * (d + 1)
floats per device whatever D: at the scale of Stanford Online Products (60,000 x 512 float32
embeddings) that is 123 MB of references on every device, as much as on one device, next to
123 / D MB of queries. With the ring a device holds its N / D references (augmented with the
score-bias column) and the shard it receives, 2 * 123 / D MB, so the per-device memory falls
about as 1 / D; the part that does not shrink is a query block's scores against one chunk of
references (``block_size x chunk`` floats) and a copy of that chunk (about 60 MB together at
that scale). The
only traffic is the references, passed D - 1 times around the ring. Measured per device
(``bench/bench_eval_sharded.py``, k = 32: arguments, outputs and temporaries of the compiled
program): 401 MB on 1 device, 263 MB on 2, 141 MB on 4.

The search is the one of :func:`jdml.evaluation.knn.knn`, with the primitives of its XLA path
(:mod:`jdml.evaluation.knn.xla`): the references augmented with the score-bias column
(``augmented_references``), the exact two-stage top-k over chunks of a shard
(``chunks_top_k``), the self-exclusion by index (``drop_own_index``), the distances from the
scores (``scores_to_distances``) and the final
(distance, index) order. Ties: the one-device search keeps, among equal scores, the lower
reference index, because it visits the references in index order. Around the ring a device
visits the shards in rotated order (its own first), so the merge of the running top-k with a
shard's top-k first puts the candidates in index order (a sort of 2 (k + 1) integer keys per
query) and then takes the top-k of their scores, whose ties go to the earlier position: the
lower index. Padding: N is padded to D equal shards (each a whole number of chunks) with zero
rows whose bias column is ``-inf``, so they score ``-inf`` and are never selected, and their
global indices (>= N) are distinct from every reference's.

**k-means** (:func:`sharded_kmeans`): :func:`jdml.evaluation.kmeans.lloyd_kmeans` with
:class:`~jdml.evaluation.kmeans.Shards`: each device assigns its own points; the mean, the
per-cluster sums and counts (the centroid update) and the inertia are ``psum``-s over the
devices; the k-means++ draws see the gathered (N,) distances and the same keys as on one device
("random": the same host-drawn indices). The reference (faiss) mode runs on one device.

**Singular values** (:func:`sharded_singular_values`): a TSQR. Each device factors its (N / D,
d) rows as Q_i R_i; the stacked R_i (at most D d x d, gathered on every device) have the
singular values of the whole matrix, which one small SVD returns. The Gram route (``psum`` of
X_i^T X_i, then ``eigh``) squares the condition number: its float32 rounding is about
``eps * s_max^2`` on every eigenvalue, i.e. an error of ``eps * s_max^2 / s`` on a singular
value s, which swamps the small ones that dominate the rho spectrum (the reason
:func:`jdml.evaluation.metrics.singular_values` runs an SVD of the matrix itself). QR and SVD
are backward stable, so both routes compute the singular values of X + E with ``|E| <= c eps
|X|`` (c a modest polynomial in N and d): each value is within about ``c eps s_max`` of the
one-device value. The tests ask for ``1e-5 s_max`` (float32 eps is 1.2e-7).

**Rounding.** The kNN scores are the same dot products as on one device. Where a shard holds
whole chunks of the one-device search (it has at least D chunks: at 60,000 references and
the default ``chunk_size``, up to D = 4) every product has the one-device shape but for its
number of query rows, which the CPU dot kernels do not round by, and the scores, hence the
neighbours and distances, are bit-identical to the chunked one-device search. Otherwise (and
against the one-device selection on the host, which scores whole rows of N references) the
kernels may round a score differently by a unit in the last place: exactly representable
scores (ties, duplicates) are still equal, but two references whose distances differ only by
rounding, or are equal in exact arithmetic and not in float32, can swap. Reductions summed over
devices (the k-means sums, the SVD) differ from the one-device sums in float rounding, so a
point almost halfway between two centroids could change cluster.

On a CPU host, fake devices (``XLA_FLAGS=--xla_force_host_platform_device_count=D``) share
the cores: they show the memory per device and the results, not a speed-up.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.errors import ConfigError
from jdml.evaluation.kmeans import (
    DEFAULT_NUM_ITERS,
    REFERENCE_SEED,
    KMeansResult,
    Shards,
    check_points,
    lloyd_kmeans,
    random_indices,
    reference_kmeans,
)
from jdml.evaluation.kmeans.assignment import block_rows
from jdml.evaluation.knn.blocks import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHUNK_SIZE,
    INDEX_SENTINEL,
    NeighbourBlock,
    check_search,
    chunk_layout,
    query_block,
)
from jdml.evaluation.knn.xla import (
    augmented_references,
    chunks_top_k,
    neighbours_from_scores,
    with_ones,
)
from jdml.geometry import l2_normalize

AXIS = "eval"
# The programs run the one-device primitives (their loops start from constants, which
# shard_map's check of device-varying values would ask to mark as varying), so that check is
# off; the outputs declared replicated (the centroids, the inertia, the singular values) come
# from psum or all_gather and are the same on every device.


def eval_mesh(devices: int = 0) -> Mesh:
    """The 1-D mesh (axis ``"eval"``) of the first ``devices`` devices of ``jax.devices()``.

    Args:
      devices: how many devices; 0 for all (under ``jax.distributed``, those of every host).

    Raises:
      ConfigError: more devices than there are.
    """
    available = jax.devices()
    if devices < 0 or devices > len(available):
        raise ConfigError(
            f"parallel.eval_devices={devices} must be in [0, {len(available)}] (0: all "
            f"{len(available)} devices); change --config.parallel.eval_devices"
        )
    return Mesh(np.asarray(available[: devices or len(available)]), (AXIS,))


def shard_rows(rows: np.ndarray, mesh: Mesh, per_device: int) -> jax.Array:
    """(D * per_device, ...) rows split over the mesh, from the host array of ``rows`` (every
    process passes the same array), zero-padded at the end."""
    total = mesh.size * per_device
    padded = np.zeros((total, *rows.shape[1:]), rows.dtype)
    padded[: len(rows)] = rows
    sharding = NamedSharding(mesh, P(AXIS))
    return jax.make_array_from_callback(padded.shape, sharding, lambda index: padded[index])


def replicate(value: np.ndarray, mesh: Mesh) -> jax.Array:
    """A host array (the same in every process) on every device of the mesh."""
    value = np.asarray(value)
    sharding = NamedSharding(mesh, P())
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def _normalized(rows: jax.Array) -> jax.Array:
    """:func:`jdml.geometry.l2_normalize` of rows split over the devices, op by op as the
    one-device evaluator calls it: each device normalises its own rows, bit-identically to the
    one-device result (inside a jitted program XLA fuses and vectorises the steps otherwise,
    and rounds some rows differently). Zero padding rows stay zero."""
    return l2_normalize(rows)


def _to_host(array: jax.Array) -> np.ndarray:
    """The whole of an output of the mesh on the host (of every process)."""
    if array.is_fully_addressable:
        return np.asarray(array)
    if array.is_fully_replicated:
        return np.asarray(array.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(array, tiled=True))


# ---------------------------------------------------------------------------------------------
# kNN: queries split over the devices, references passed around the ring.


def _merge_in_index_order(
    values: jax.Array,
    indices: jax.Array,
    more_values: jax.Array,
    more_indices: jax.Array,
    wanted: int,
) -> tuple[jax.Array, jax.Array]:
    """The top-``wanted`` of two candidate lists, equal scores to the lower index.

    The candidates are put in index order first, so that ``lax.top_k``, which keeps the
    earlier position among equal values (and orders floats as the one-device search does),
    keeps the lower index whatever order the shards came in.

    Args:
      values, indices: (B, w) scores and global indices of the running top-k.
      more_values, more_indices: (B, w') those of one more shard.
      wanted: how many to keep, <= w + w'.

    Returns:
      (B, wanted) scores, descending, and their indices.
    """
    by_index, scores = jax.lax.sort(
        (
            jnp.concatenate([indices, more_indices], axis=1),
            jnp.concatenate([values, more_values], axis=1),
        ),
        dimension=1,
        num_keys=1,
    )
    best, position = jax.lax.top_k(scores, wanted)
    return best, jnp.take_along_axis(by_index, position, axis=1)


def _knn_layout(
    num_queries: int | None,
    num_references: int,
    devices: int,
    block_size: int,
    chunk_size: int,
) -> dict[str, int]:
    """Rows per device and the blocking of one device's search.

    Each device holds ``per_device`` references, a whole number of chunks (so every padding
    row has a global index >= N). Where the one-device search has at least D chunks, the
    shards are its chunks, ``ceil(M / D)`` per device: every product of a query block and a
    chunk then has the shape it has on one device, and the CPU backend rounds it the same way
    (its dot kernels round alike whatever the number of query rows, but not whatever the
    number of reference columns). With fewer chunks than devices (few references), each device
    holds N / D rounded up, in narrower chunks. The device's queries (the same rows when
    ``num_queries`` is None) are scored ``block`` at a time.
    """
    num_chunks, chunk = chunk_layout(num_references, chunk_size)
    if num_chunks >= devices:
        num_chunks = math.ceil(num_chunks / devices)
    else:
        num_chunks, chunk = chunk_layout(math.ceil(num_references / devices), chunk_size)
    per_device = num_chunks * chunk
    queries_per_device = per_device if num_queries is None else math.ceil(num_queries / devices)
    block = query_block(queries_per_device, chunk, block_size)
    return {
        "num_chunks": num_chunks,
        "chunk": chunk,
        "per_device": per_device,
        "queries_per_device": queries_per_device,
        "block": block,
    }


@functools.cache
def _knn_program(
    mesh: Mesh,
    *,
    k: int,
    exclude_self: bool,
    distance: str,
    separate: bool,
    num_references: int,
    num_chunks: int,
    chunk: int,
    block: int,
) -> Any:
    """The jitted search on ``mesh``: ``(queries[, references]) -> (distances, indices)``,
    every array split over the devices by rows (the queries are the references unless
    ``separate``)."""
    devices = mesh.size
    wanted = k + int(exclude_self)
    per_device = num_chunks * chunk
    ring = [(j, (j + 1) % devices) for j in range(devices)]

    def search(queries: jax.Array, *references: jax.Array) -> tuple[jax.Array, jax.Array]:
        me = jax.lax.axis_index(AXIS)
        (own,) = references or (queries,)
        shard = augmented_references(
            own,
            num_chunks=num_chunks,
            chunk=chunk,
            distance=distance,
            num_valid=num_references - me * per_device,  # rows >= N are padding
        )

        count = queries.shape[0]
        full_blocks, rest = divmod(count, block)

        def shard_top_k(shard: jax.Array, owner: jax.Array, rows: jax.Array) -> tuple:
            """The best ``wanted`` of one shard for a block, with global indices; a shard of
            one chunk narrower than ``wanted`` is completed with ``-inf`` at the sentinel
            index, as a running top-k over several chunks starts (the N >= ``wanted`` real
            references evict them)."""
            values, local = chunks_top_k(with_ones(rows), shard, wanted)
            missing = wanted - values.shape[1]
            if missing:
                values = jnp.pad(values, ((0, 0), (0, missing)), constant_values=-jnp.inf)
                local = jnp.pad(local, ((0, 0), (0, missing)), constant_values=INDEX_SENTINEL)
            # The sentinel stays the sentinel (it would overflow).
            indices = jnp.where(local == INDEX_SENTINEL, local, local + owner * per_device)
            return values, indices

        def merge_block(best: tuple, start: Any, size: int, shard: jax.Array, owner: Any):
            """The running top-k of the queries ``start .. start + size - 1`` merged with
            their best of ``shard``, in place (the queries are sliced, never copied)."""
            rows = jax.lax.dynamic_slice_in_dim(queries, start, size)
            block_best = (jax.lax.dynamic_slice_in_dim(a, start, size) for a in best)
            more = shard_top_k(shard, owner, rows)
            merged = _merge_in_index_order(*block_best, *more, wanted)
            return tuple(
                jax.lax.dynamic_update_slice_in_dim(a, m, start, 0)
                for a, m in zip(best, merged, strict=True)
            )

        def merge_shard(best: tuple, shard: jax.Array, owner: Any) -> tuple:
            """Every query's running top-k merged with its best of ``shard``."""
            best = jax.lax.fori_loop(
                0,
                full_blocks,
                lambda b, best: merge_block(best, b * block, block, shard, owner),
                best,
            )
            if rest:  # the last, shorter block
                best = merge_block(best, full_blocks * block, rest, shard, owner)
            return best

        empty = (
            jnp.full((count, wanted), -jnp.inf, jnp.float32),
            jnp.full((count, wanted), INDEX_SENTINEL, jnp.int32),
        )
        best = merge_shard(empty, shard, me)

        def step(s: int, carry: tuple) -> tuple:
            shard, best = carry
            shard = jax.lax.ppermute(shard, AXIS, ring)
            # Device j passes to j + 1: at step s a device holds the shard of device me - s.
            return shard, merge_shard(best, shard, (me - s) % devices)

        if devices > 1:
            _, best = jax.lax.fori_loop(1, devices, step, (shard, best))
        values, indices = best
        query_ids = me * count + jnp.arange(count, dtype=jnp.int32)
        return neighbours_from_scores(
            queries,
            values,
            indices,
            query_ids,
            k=k,
            exclude_self=exclude_self,
            distance=distance,
        )

    specs = (P(AXIS), P(AXIS)) if separate else (P(AXIS),)
    return jax.jit(
        jax.shard_map(
            search,
            mesh=mesh,
            in_specs=specs,
            out_specs=(P(AXIS), P(AXIS)),
            check_vma=False,  # see the note at AXIS
        )
    )


def knn_program(
    num_queries: int,
    num_references: int | None,
    dim: int,
    k: int,
    *,
    mesh: Mesh,
    exclude_self: bool,
    distance: str = "euclidean",
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[Any, tuple[jax.ShapeDtypeStruct, ...]]:
    """The jitted program of :func:`sharded_knn` and the shapes (with shardings) of its inputs,
    e.g. for ``program.lower(*inputs).compile().memory_analysis()``.

    Args:
      num_queries: Q.
      num_references: N, or None when the queries are the references (one input array).
      dim: d.
      k, mesh, exclude_self, distance, block_size, chunk_size: as in :func:`sharded_knn`.

    Returns:
      (program, input shapes).
    """
    separate = num_references is not None
    num_references = num_references if separate else num_queries
    check_search(
        (num_queries, dim),
        (num_references, dim),
        k,
        exclude_self,
        distance,
        block_size,
        chunk_size,
    )
    layout = _knn_layout(
        num_queries if separate else None,
        num_references,
        mesh.size,
        block_size,
        chunk_size,
    )
    program = _knn_program(
        mesh,
        k=k,
        exclude_self=exclude_self,
        distance=distance,
        separate=separate,
        num_references=num_references,
        num_chunks=layout["num_chunks"],
        chunk=layout["chunk"],
        block=layout["block"],
    )
    sharding = NamedSharding(mesh, P(AXIS))
    rows = [mesh.size * layout["queries_per_device"]]
    if separate:
        rows.append(mesh.size * layout["per_device"])
    inputs = tuple(jax.ShapeDtypeStruct((r, dim), jnp.float32, sharding=sharding) for r in rows)
    return program, inputs


def sharded_knn(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    mesh: Mesh | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`jdml.evaluation.knn.knn` on every device of ``mesh``, references ring-passed.

    Args:
      queries, references, k, exclude_self, distance: as in :func:`~jdml.evaluation.knn.knn`
        (pass the same object twice for leave-one-out: it is placed on the devices once).
      mesh: a 1-D mesh from :func:`eval_mesh`; None for every device.
      block_size: queries per block on a device (more while a block holds few scores, as in
        :func:`~jdml.evaluation.knn.knn`).
      chunk_size: largest number of references a block is scored against at once.

    Returns:
      distances (Q, k) float32, ascending per row, and indices (Q, k) int32 into
      ``references``, equal distances ordered by lower index (numpy arrays on the host).
    """
    mesh = eval_mesh() if mesh is None else mesh
    # Leave-one-out passes the queries as the references: one array is placed, not two.
    separate = references is not queries
    queries = np.asarray(queries, np.float32)
    references = np.asarray(references, np.float32) if separate else queries
    check_search(queries.shape, references.shape, k, exclude_self, distance, block_size, chunk_size)
    program, inputs = knn_program(
        len(queries),
        len(references) if separate else None,
        queries.shape[1],
        k,
        mesh=mesh,
        exclude_self=exclude_self,
        distance=distance,
        block_size=block_size,
        chunk_size=chunk_size,
    )
    arrays = [queries, references][: len(inputs)]
    placed = [
        shard_rows(a, mesh, i.shape[0] // mesh.size) for a, i in zip(arrays, inputs, strict=True)
    ]
    if distance == "cosine":
        placed = [_normalized(a) for a in placed]
    distances, indices = program(*placed)
    count = len(queries)
    return _to_host(distances)[:count], _to_host(indices)[:count]


def sharded_knn_blocks(
    queries: jax.Array | np.ndarray,
    references: jax.Array | np.ndarray,
    k: int,
    *,
    exclude_self: bool,
    distance: str = "euclidean",
    mesh: Mesh | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> Iterator[NeighbourBlock]:
    """:func:`sharded_knn` handed out as :func:`jdml.evaluation.knn.knn_blocks` does: blocks
    of ``block_size`` consecutive queries, in order (the search runs, and the arguments are
    checked, at the call)."""
    distances, indices = sharded_knn(
        queries,
        references,
        k,
        exclude_self=exclude_self,
        distance=distance,
        mesh=mesh,
        block_size=block_size,
        chunk_size=chunk_size,
    )
    firsts = range(0, len(indices), block_size)
    return (
        NeighbourBlock(f, distances[f : f + block_size], indices[f : f + block_size])
        for f in firsts
    )


# ---------------------------------------------------------------------------------------------
# k-means: points split over the devices, the centroid update a psum.


@functools.cache
def _kmeans_program(
    mesh: Mesh,
    *,
    num_points: int,
    num_clusters: int,
    num_iters: int,
    block_size: int,
    init: str,
) -> Any:
    """The jitted sharded k-means on ``mesh``: ``(points, key data, initial) -> KMeansResult``
    with the points and assignments split over the devices, the rest replicated (the key as its
    raw data, which places on the devices of every host as any array)."""
    shards = Shards(AXIS, num_points)

    def run(points: jax.Array, key_data: jax.Array, initial: jax.Array) -> KMeansResult:
        return lloyd_kmeans(
            points,
            jax.random.wrap_key_data(key_data),
            initial,
            num_clusters=num_clusters,
            num_iters=num_iters,
            block_size=block_size,
            init=init,
            shards=shards,
        )

    return jax.jit(
        jax.shard_map(
            run,
            mesh=mesh,
            in_specs=(P(AXIS), P(), P()),
            out_specs=KMeansResult(P(), P(AXIS), P()),
            check_vma=False,  # see the note at AXIS
        )
    )


def sharded_kmeans(
    x: jax.Array | np.ndarray,
    num_clusters: int,
    *,
    mesh: Mesh | None = None,
    num_iters: int = DEFAULT_NUM_ITERS,
    seed: int | None = None,
    block_size: int | None = None,
    init: str = "k-means++",
    normalize: bool = False,
    native: bool = False,
) -> KMeansResult:
    """:func:`jdml.evaluation.kmeans.kmeans` with the points split over the devices of ``mesh``.

    Same arguments, initialisation and iterations as the one-device k-means; the per-cluster
    sums and counts are summed over the devices. ``init="reference"`` (faiss's k-means, whose
    host-side splits follow every iteration) runs :func:`~jdml.evaluation.kmeans.reference_kmeans`
    on one device.

    Args:
      x, num_clusters, num_iters, seed, block_size, init: as in
        :func:`~jdml.evaluation.kmeans.kmeans` (``block_size``: points per assignment block on
        a device).
      mesh: a 1-D mesh from :func:`eval_mesh`; None for every device.
      normalize: cluster the L2-normalised points (each device normalises its own rows).
      native: the native assignment of the one-device reference k-means (a run's
        :class:`jdml.backends.Backends`' ``kmeans``).

    Returns:
      A :class:`~jdml.evaluation.kmeans.KMeansResult` of numpy arrays on the host.
    """
    x = np.asarray(x, np.float32)
    n = check_points(x, num_clusters, init)
    if init == "reference":
        points = np.asarray(l2_normalize(x)) if normalize else x
        result = reference_kmeans(
            points,
            num_clusters,
            num_iters=num_iters,
            seed=REFERENCE_SEED if seed is None else seed,
            block_size=block_size,
            native=native,
        )
        return KMeansResult(*(np.asarray(a) for a in result))
    mesh = eval_mesh() if mesh is None else mesh
    seed = 0 if seed is None else seed
    per_device = math.ceil(n / mesh.size)
    initial = (
        random_indices(n, num_clusters, seed)
        if init == "random"
        else np.zeros((num_clusters,), np.int32)
    )
    program = _kmeans_program(
        mesh,
        num_points=n,
        num_clusters=num_clusters,
        num_iters=num_iters,
        block_size=block_rows(per_device, num_clusters, block_size),
        init=init,
    )
    points = shard_rows(x, mesh, per_device)
    result = program(
        _normalized(points) if normalize else points,
        replicate(jax.random.key_data(jax.random.key(seed)), mesh),
        replicate(initial, mesh),
    )
    return KMeansResult(
        _to_host(result.centroids), _to_host(result.assignments)[:n], _to_host(result.inertia)
    )


# ---------------------------------------------------------------------------------------------
# Singular values: a TSQR.


@functools.cache
def _singular_values_program(mesh: Mesh) -> Any:
    """The jitted TSQR on ``mesh``: (N', d) rows split over the devices -> the singular
    values of the stacked R factors (replicated)."""

    def spectrum(rows: jax.Array) -> jax.Array:
        r = jnp.linalg.qr(rows, mode="r")
        stacked = jax.lax.all_gather(r, AXIS, tiled=True)
        return jnp.linalg.svd(stacked, compute_uv=False)

    return jax.jit(
        jax.shard_map(spectrum, mesh=mesh, in_specs=P(AXIS), out_specs=P(), check_vma=False)
    )


def sharded_singular_values(
    points: jax.Array | np.ndarray, *, mesh: Mesh | None = None, normalize: bool = False
) -> np.ndarray:
    """:func:`jdml.evaluation.metrics.singular_values` from the rows split over ``mesh``.

    Each device's rows (zero rows pad the last ones, which changes no singular value) are
    reduced to their R factor; the SVD of the stacked factors gives the singular values of the
    whole matrix (TSQR). Within about ``1e-5 s_max`` of the one-device values (see the module
    docstring).

    Args:
      points: (N, d) embeddings.
      mesh: a 1-D mesh from :func:`eval_mesh`; None for every device.
      normalize: the singular values of the L2-normalised rows (each device normalises its
        own; zero padding rows stay zero).

    Returns:
      (min(N, d),) float64 singular values, descending.
    """
    mesh = eval_mesh() if mesh is None else mesh
    points = np.asarray(points, np.float32)
    if points.ndim != 2:
        raise ValueError(f"expected (N, D) points, got shape {points.shape}")
    rows = shard_rows(points, mesh, math.ceil(points.shape[0] / mesh.size))
    values = _singular_values_program(mesh)(_normalized(rows) if normalize else rows)
    return np.asarray(_to_host(values)[: min(points.shape)], np.float64)
