"""Leave-one-out evaluation of embeddings (one head or several).

:func:`evaluate_embeddings_with_vectors` validates the requested metric names, computes each
shared requirement once (a single search pass with the largest neighbour count needed, ranking
every query's complete neighbour list only if ``map`` is requested; a single k-means, SVD and
class segment-sum pass only if a metric needs them) and derives every metric from them, the
vector-valued ones and per-query values included; :func:`evaluate_embeddings` gives its scalars.
:func:`evaluate_heads` evaluates several embedding heads and their weighted concatenations.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from jdml.backends import Backends, resolve_backends
from jdml.errors import NonFiniteEmbeddingError
from jdml.evaluation.kmeans import kmeans
from jdml.evaluation.knn import DEFAULT_BLOCK_SIZE, DISTANCES, full_ranking_blocks, knn_blocks
from jdml.evaluation.metrics import (
    Metric,
    Requirements,
    class_distances,
    get_metric,
    singular_values,
)
from jdml.evaluation.sharded import (
    eval_mesh,
    sharded_kmeans,
    sharded_knn_blocks,
    sharded_singular_values,
)
from jdml.evaluation.table import format_table, is_percent  # noqa: F401 (their former home)
from jdml.geometry import l2_normalize


def resolve_metrics(names: Sequence[str]) -> list[Metric]:
    """Resolves metric names up front (duplicates dropped, order kept).

    Args:
      names: metric names, e.g. ``["recall@1", "map@r", "nmi"]``.

    Returns:
      The :class:`Metric` objects.

    Raises:
      UnknownMetricError: (a ``ValueError`` and ``KeyError``) for an unknown name; the message
        lists the known names and the ``recall@<k>`` pattern.
    """
    if isinstance(names, str):
        raise TypeError("metrics must be a sequence of names, not a single string")
    return [get_metric(name) for name in dict.fromkeys(names)]


def check_metric_names(names: Sequence[str]) -> None:
    """Validates metric names without computing anything (e.g. when checking a configuration).

    Args:
      names: metric names.

    Raises:
      UnknownMetricError: (a ``ValueError``) for an unknown name, listing the known names.
    """
    resolve_metrics(names)


def _class_ids(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Class ids 0..C-1, the size of each sample's class (the sample included), and C.

    Args:
      labels: (N,) labels.

    Returns:
      (N,) int32 class ids, (N,) int class sizes and the number of distinct labels.
    """
    _, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    return inverse.astype(np.int32), counts[inverse], len(counts)


def _retrieval_requirements(
    specs: Sequence[Metric],
    queries: jax.Array,
    query_ids: np.ndarray,
    class_sizes: np.ndarray,
    gallery: jax.Array | None,
    gallery_ids: np.ndarray | None,
    *,
    distance: str,
    block_size: int,
    mesh: Mesh | None = None,
    backends: Backends,
) -> dict[str, Any]:
    """The retrieval part of the requirements, one block of queries at a time.

    One search with the largest neighbour count any metric needs (the complete ranking if one
    needs it, see :func:`jdml.evaluation.knn.full_ranking_blocks`); every block of queries is
    reduced at once to the per-query values of the metrics (:attr:`Metric.per_query`), so the
    (Q, k) neighbour lists are never all held. Only a metric without per-query values (none of
    the built-in ones) makes the neighbour classes and precision sums of all queries kept.

    Args:
      specs: the metrics.
      queries: (Q, D) queries (the references too without a gallery).
      query_ids: (Q,) class ids of the queries.
      class_sizes: (Q,) class sizes as in :class:`Requirements`.
      gallery: (M, D) references, or None for leave-one-out.
      gallery_ids: (M,) class ids of the gallery (with ``gallery``).
      distance: "euclidean" or "cosine".
      block_size: queries per search block.
      mesh: the devices of the kNN search (:func:`jdml.evaluation.sharded.sharded_knn`), or
        None for the default device. The complete ranking runs on the default device.
      backends: the kNN selection (a sharded search selects on the devices).

    Returns:
      The keyword arguments ``query_values``, ``neighbour_labels`` and ``precision_sums`` of
      :class:`Requirements`.
    """
    leave_one_out = gallery is None
    reference_ids = query_ids if leave_one_out else gallery_ids
    available = len(reference_ids) - int(leave_one_out)
    wanted = max((m.num_neighbours(class_sizes) for m in specs), default=0)
    num_neighbours = min(wanted, available)
    full_ranking = any(m.needs_full_ranking for m in specs)
    selection = backends.knn
    if full_ranking:
        blocks = full_ranking_blocks(
            queries,
            query_ids,
            num_neighbours,
            references=gallery,
            reference_ids=gallery_ids,
            distance=distance,
            block_size=block_size,
            selection=selection,
        )
    elif num_neighbours > 0:
        search = (
            functools.partial(knn_blocks, selection=selection)
            if mesh is None
            else functools.partial(sharded_knn_blocks, mesh=mesh)
        )
        blocks = search(
            queries,
            queries if leave_one_out else gallery,
            num_neighbours,
            exclude_self=leave_one_out,
            distance=distance,
            block_size=block_size,
        )
    else:
        return {}
    per_query = [m for m in specs if m.per_query is not None]
    keep_all = any(
        m.per_query is None and (m.needs_full_ranking or m.num_neighbours(class_sizes) > 0)
        for m in specs
    )
    values = {m.name: np.empty(len(query_ids), np.float64) for m in per_query}
    all_labels, all_sums = [], []
    for block in blocks:
        rows = slice(block.first, block.first + len(block.indices))
        part = Requirements(
            labels=query_ids[rows],
            class_sizes=class_sizes[rows],
            neighbour_labels=reference_ids[np.asarray(block.indices)],
            precision_sums=getattr(block, "precision_sums", None),
            leave_one_out=leave_one_out,
        )
        for metric in per_query:
            values[metric.name][rows] = metric.per_query(part)
        if keep_all:
            all_labels.append(part.neighbour_labels)
            all_sums.append(part.precision_sums)
    kept = {"query_values": values}
    if keep_all:
        kept["neighbour_labels"] = np.concatenate(all_labels)
        kept["precision_sums"] = np.concatenate(all_sums) if full_ranking else None
    return kept


def _requirements(
    specs: Sequence[Metric],
    embeddings: jax.Array,
    labels: np.ndarray,
    *,
    distance: str,
    seed: int,
    block_size: int,
    kmeans_init: str,
    mesh: Mesh | None = None,
    backends: Backends,
) -> Requirements:
    """Computes each requirement of the metrics once.

    One search over the queries (``knn``, or ``knn_full_ranking`` when ``map`` needs the
    complete ranking, which then also gives the nearest neighbours) with the largest neighbour
    count needed; one k-means, one SVD and one pass of class segment sums, each only if needed.

    Args:
      specs: the metrics to compute.
      embeddings: (N, D) float32 embeddings.
      labels: (N,) labels.
      distance: "euclidean" or "cosine".
      seed: seed of the k-means initialisation (not used by the "reference" k-means, which
        always uses faiss's seed 1234).
      block_size: queries per search block.
      kmeans_init: the k-means, "k-means++", "random" or "reference" (see
        :func:`jdml.evaluation.kmeans.kmeans`).
      mesh: the devices of the kNN search, the k-means and the SVD (``embeddings`` on the
        host; :mod:`jdml.evaluation.sharded`), or None for the default device.
      backends: the kNN selection and the k-means assignment.

    Returns:
      The shared :class:`Requirements`.
    """
    dim = embeddings.shape[1]
    class_ids, class_sizes, num_classes = _class_ids(labels)
    cosine = distance == "cosine"
    # The points the distance compares: k-means, the SVD and the class means work on them (on
    # a mesh, each device normalises its own rows for the k-means and the SVD).
    if mesh is None:
        points = l2_normalize(embeddings) if cosine else embeddings
        cluster = functools.partial(kmeans, native=backends.native_kmeans)
        spectrum_of = singular_values
    else:
        points = None
        cluster = functools.partial(
            sharded_kmeans, mesh=mesh, normalize=cosine, native=backends.native_kmeans
        )
        spectrum_of = functools.partial(sharded_singular_values, mesh=mesh, normalize=cosine)
    retrieval = _retrieval_requirements(
        specs,
        embeddings,
        class_ids,
        class_sizes,
        None,
        None,
        distance=distance,
        block_size=block_size,
        mesh=mesh,
        backends=backends,
    )

    assignments = None
    if any(m.needs_clusters for m in specs):
        # The reference k-means keeps faiss's fixed seed: the clustering of given embeddings
        # does not depend on the run's seed, as in the reference.
        kmeans_seed = None if kmeans_init == "reference" else seed
        result = cluster(
            embeddings if points is None else points,
            num_classes,
            seed=kmeans_seed,
            init=kmeans_init,
        )
        assignments = np.asarray(result.assignments)
    spectrum = None
    if any(m.needs_spectrum for m in specs):
        spectrum = spectrum_of(embeddings if points is None else points)
    distances = None
    if any(m.needs_class_distances for m in specs):
        if points is None:
            points = l2_normalize(embeddings) if cosine else embeddings
        distances = class_distances(points, class_ids)
    return Requirements(
        labels=class_ids,
        class_sizes=class_sizes,
        cluster_assignments=assignments,
        singular_values=spectrum,
        dimension=dim,
        class_distances=distances,
        **retrieval,
    )


def _is_set_level(metric: Metric) -> bool:
    """Whether the metric describes the whole embedded set (clustering, spectrum, class
    distances) rather than the retrieval of queries."""
    return metric.needs_clusters or metric.needs_spectrum or metric.needs_class_distances


def _gallery_requirements(
    specs: Sequence[Metric],
    queries: jax.Array,
    query_labels: np.ndarray,
    gallery: jax.Array,
    gallery_labels: np.ndarray,
    *,
    distance: str,
    block_size: int,
    mesh: Mesh | None = None,
    backends: Backends,
) -> Requirements:
    """The retrieval requirements of queries ranked against a separate gallery.

    Nothing is excluded from a query's neighbours (the query is not in the gallery). The class
    sizes are 1 + R, R the number of gallery items of the query's class, so that the metrics'
    R = class_sizes - 1 holds as in leave-one-out.

    Args:
      specs: the retrieval metrics to compute.
      queries: (Q, D) query embeddings.
      query_labels: (Q,) labels.
      gallery: (M, D) gallery embeddings.
      gallery_labels: (M,) labels, in the queries' label space.
      distance: "euclidean" or "cosine".
      block_size: queries per search block.
      mesh: the devices of the kNN search, or None for the default device.
      backends: the kNN selection.

    Returns:
      :class:`Requirements` with ``leave_one_out=False``.
    """
    classes = np.unique(np.concatenate([query_labels, gallery_labels]))
    query_ids = np.searchsorted(classes, query_labels).astype(np.int32)
    gallery_ids = np.searchsorted(classes, gallery_labels).astype(np.int32)
    class_sizes = np.bincount(gallery_ids, minlength=len(classes))[query_ids] + 1
    retrieval = _retrieval_requirements(
        specs,
        queries,
        query_ids,
        class_sizes,
        gallery,
        gallery_ids,
        distance=distance,
        block_size=block_size,
        mesh=mesh,
        backends=backends,
    )
    return Requirements(
        labels=query_ids,
        class_sizes=class_sizes,
        dimension=queries.shape[1],
        leave_one_out=False,
        **retrieval,
    )


@jax.jit
def _nonfinite_rows(embeddings: jax.Array) -> jax.Array:
    return jnp.sum(~jnp.all(jnp.isfinite(embeddings), axis=-1))


NONFINITE_FIX = (
    "retrieval needs finite embeddings. The model's parameters overflowed in training or were "
    "read from a damaged file, or the input holds NaN/inf: use another checkpoint (--checkpoint "
    "best, latest or a step number) or weights file, or check the input"
)


def check_finite(
    embeddings: jax.Array | np.ndarray, what: str = "embeddings", fix: str = NONFINITE_FIX
) -> None:
    """Raises :class:`NonFiniteEmbeddingError` if rows of (N, D) ``embeddings`` hold NaN or inf,
    naming how many, ``what`` they are and ``fix``: one reduction where the array lives (a
    device array stays on its device; one integer reaches the host)."""
    if isinstance(embeddings, np.ndarray):
        bad = int(np.sum(~np.all(np.isfinite(embeddings), axis=-1)))
    else:
        bad = int(_nonfinite_rows(embeddings))
    if bad:
        found = f"{bad} of {len(embeddings)} {what} are not finite (NaN or inf)"
        raise NonFiniteEmbeddingError(found, fix)


def _check_inputs(
    embeddings: jax.Array | np.ndarray,
    labels: jax.Array | np.ndarray,
    distance: str,
    minimum: int = 2,
    on_host: bool = False,
    what: str = "embeddings",
) -> tuple[jax.Array | np.ndarray, np.ndarray]:
    """Validated (N, D) float32 finite embeddings (on the default device, or ``on_host``) and
    (N,) labels, N >= ``minimum``; ``what`` names the embeddings in a refusal."""
    if distance not in DISTANCES:
        raise ValueError(f"unknown distance {distance!r}; expected one of {DISTANCES}")
    if on_host:
        embeddings = np.asarray(embeddings, np.float32)
    else:
        embeddings = jnp.asarray(embeddings, jnp.float32)
    labels = np.asarray(labels).reshape(-1)
    if embeddings.ndim != 2 or embeddings.shape[0] != labels.shape[0]:
        raise ValueError(
            f"expected (N, D) embeddings and (N,) labels, got {embeddings.shape} and {labels.shape}"
        )
    if embeddings.shape[0] < minimum:
        raise ValueError(f"retrieval evaluation needs at least {minimum} samples")
    check_finite(embeddings, what)
    return embeddings, labels


class EmbeddingEvaluation(NamedTuple):
    """What :func:`evaluate_embeddings_with_vectors` returns."""

    metrics: dict[str, float]
    """{metric name: value} of the scalar-valued metrics, in the requested order."""
    vectors: dict[str, np.ndarray]
    """{metric name: 1-D array} of the vector-valued metrics (e.g. ``rho_spectrum@0``)."""
    per_query: dict[str, np.ndarray]
    """{metric name: (Q,) values} of the metrics asked for per query, one value per query in
    the queries' order (NaN for a query the metric leaves out)."""


def evaluate_embeddings(
    embeddings: jax.Array | np.ndarray,
    labels: jax.Array | np.ndarray,
    metrics: Sequence[str],
    *,
    distance: str = "euclidean",
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kmeans_init: str = "k-means++",
    gallery: jax.Array | np.ndarray | None = None,
    gallery_labels: jax.Array | np.ndarray | None = None,
    devices: int = 1,
    backends: Backends | None = None,
) -> dict[str, float]:
    """The scalar metrics of :func:`evaluate_embeddings_with_vectors` (the same arguments but
    ``per_query``): {metric name: float} in the requested order. Vector-valued metrics
    (``rho_spectrum@0``) are skipped with a warning naming that function, which returns them.

    Raises:
      NonFiniteEmbeddingError: rows of the embeddings or the gallery hold NaN or inf (the
        message counts them).
    """
    specs = resolve_metrics(metrics)
    skipped = [m.name for m in specs if m.vector]
    if skipped:
        warnings.warn(
            f"vector-valued metrics {skipped} are skipped; use "
            "jdml.evaluation.embeddings.evaluate_embeddings_with_vectors to get them",
            stacklevel=2,
        )
    return evaluate_embeddings_with_vectors(
        embeddings,
        labels,
        [m.name for m in specs if not m.vector],
        distance=distance,
        seed=seed,
        block_size=block_size,
        kmeans_init=kmeans_init,
        gallery=gallery,
        gallery_labels=gallery_labels,
        devices=devices,
        backends=backends,
    ).metrics


def evaluate_embeddings_with_vectors(
    embeddings: jax.Array | np.ndarray,
    labels: jax.Array | np.ndarray,
    metrics: Sequence[str],
    *,
    distance: str = "euclidean",
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kmeans_init: str = "k-means++",
    gallery: jax.Array | np.ndarray | None = None,
    gallery_labels: jax.Array | np.ndarray | None = None,
    devices: int = 1,
    per_query: Sequence[str] = (),
    backends: Backends | None = None,
) -> EmbeddingEvaluation:
    """Evaluates embeddings by retrieval, clustering and spectral statistics.

    Every sample is a query against all other samples. Each requirement is computed once
    (see :func:`_requirements`): one exact search with the largest neighbour count any
    requested metric needs (max k of ``recall@k`` / ``map@k``, the largest class size for
    ``map@r`` / ``map@c`` / ``r_precision``), clipped to N - 1, which with ``map`` also
    ranks every query's complete neighbour list blockwise; one k-means (as many clusters as
    distinct labels) for ``nmi`` / ``f1``; one SVD for ``rho_spectrum*``; one pass of class
    segment sums for ``dists@*``. With the cosine distance, k-means, the SVD and the class
    means use the L2-normalised embeddings.

    With a ``gallery`` (the query/gallery protocol of In-Shop) the embeddings are the queries,
    each ranked against every gallery item: the retrieval metrics count a query's gallery
    items of its class as relevant (R of them), and the set-level metrics (``nmi``, ``f1``,
    ``rho_spectrum*``, ``dists@*``) describe the queries and the gallery together.

    With ``devices`` other than 1 (``parallel.eval_devices``) the kNN search, the k-means and
    the SVD run on a mesh of that many devices (:mod:`jdml.evaluation.sharded`: the queries,
    the points and the rows split over the devices, the references passed around a ring), with
    the embeddings kept on the host; the complete ranking of ``map``, the reference k-means and
    the class distances stay on the default device. The metrics are those of one device, up to
    float rounding.

    Args:
      embeddings: (N, D) float embeddings, N >= 2.
      labels: (N,) integer class labels.
      metrics: metric names (see :mod:`jdml.evaluation.metrics`).
      distance: "euclidean" or "cosine".
      seed: seed of the k-means initialisation ("k-means++" and "random" only).
      block_size: queries per search block.
      kmeans_init: "k-means++" (default), "random" (K uniformly drawn samples, then Lloyd;
        much faster with very many classes) or "reference" (faiss's k-means as the
        Revisiting-DML evaluation runs it: its seeded random initialisation, 20 iterations,
        its empty-cluster split, seed 1234 whatever ``seed``).
      gallery: (M, D) gallery embeddings the queries are ranked against, or None for
        leave-one-out retrieval.
      gallery_labels: (M,) labels of the gallery, in the same label space as ``labels``.
      devices: 1 for the default device; 0 for every device (``jax.devices()``, every host's
        under ``jax.distributed``); D for the first D.
      per_query: retrieval metrics of ``metrics`` whose per-query values are returned too.
      backends: the kNN selection and the k-means assignment (a run's
        :class:`jdml.backends.Backends`); None: resolved here, once, from the environment
        (:func:`jdml.backends.resolve_backends`).

    Returns:
      The :class:`EmbeddingEvaluation`: the scalar metrics, the vector-valued ones and the
      per-query values of ``per_query``.

    Raises:
      NonFiniteEmbeddingError: rows of the embeddings or the gallery hold NaN or inf (the
        message counts them).
    """
    specs = resolve_metrics(metrics)
    _check_per_query(specs, per_query)
    mesh = None if devices == 1 else eval_mesh(devices)
    backends = resolve_backends() if backends is None else backends
    on_host = mesh is not None
    embeddings, labels = _check_inputs(
        embeddings, labels, distance, 2 if gallery is None else 1, on_host
    )
    options = {"distance": distance, "block_size": block_size, "mesh": mesh, "backends": backends}
    if gallery is None:
        whole = _requirements(
            specs, embeddings, labels, seed=seed, kmeans_init=kmeans_init, **options
        )
        needs = {m.name: whole for m in specs}
    else:
        if gallery_labels is None:
            raise ValueError("a gallery needs its gallery_labels")
        gallery, gallery_labels = _check_inputs(
            gallery, gallery_labels, distance, 1, on_host, "gallery embeddings"
        )
        if gallery.shape[1] != embeddings.shape[1]:
            raise ValueError(
                f"queries have {embeddings.shape[1]} dimensions but the gallery "
                f"{gallery.shape[1]}: embed both with the same model and head"
            )
        set_level = [m for m in specs if _is_set_level(m)]
        retrieval = [m for m in specs if not _is_set_level(m)]
        ranked = _gallery_requirements(
            retrieval, embeddings, labels, gallery, gallery_labels, **options
        )
        union = _requirements(
            set_level,
            np.concatenate([embeddings, gallery])
            if on_host
            else jnp.concatenate([embeddings, gallery]),
            np.concatenate([labels, gallery_labels]),
            seed=seed,
            kmeans_init=kmeans_init,
            **options,
        )
        needs = {m.name: union if _is_set_level(m) else ranked for m in specs}
    return EmbeddingEvaluation(
        metrics={m.name: float(m.value(needs[m.name])) for m in specs if not m.vector},
        vectors={m.name: np.asarray(m.value(needs[m.name])) for m in specs if m.vector},
        per_query={name: np.asarray(needs[name].query_values[name]) for name in per_query},
    )


def _check_per_query(specs: Sequence[Metric], per_query: Sequence[str]) -> None:
    """Refuses per-query values the evaluation cannot return: a metric not evaluated, or one
    without per-query values."""
    known = {m.name: m for m in specs}
    for name in per_query:
        if name not in known:
            raise ValueError(f"per_query metric {name!r} is not among the metrics {list(known)}")
        if known[name].per_query is None:
            per = [m.name for m in specs if m.per_query is not None]
            raise ValueError(
                f"{name!r} has no per-query values; choose from the retrieval metrics {per}"
            )


def combine_heads(
    embeddings: Mapping[str, jax.Array | np.ndarray], weights: Mapping[str, float]
) -> jax.Array:
    """Weighted concatenation of embedding heads, as evaluated by DiVA (Milbich et al., ECCV
    2020): each head L2-normalised and multiplied by its weight, concatenated, re-normalised.

    Args:
      embeddings: {head: (N, D_head) embeddings}.
      weights: {head: weight}, in concatenation order; every head must be in ``embeddings``.

    Returns:
      (N, sum of the heads' D) float32 unit-norm rows.
    """
    parts = [
        float(weight) * l2_normalize(jnp.asarray(embeddings[head], jnp.float32))
        for head, weight in weights.items()
    ]
    return l2_normalize(jnp.concatenate(parts, axis=1))


def head_embeddings(
    embeddings: Mapping[str, jax.Array | np.ndarray],
    heads: Sequence[str] | None = None,
    combinations: Mapping[str, Mapping[str, float]] | None = None,
) -> Iterator[tuple[str, jax.Array | np.ndarray]]:
    """The rows of a multi-head evaluation: (name, embeddings) of every head alone, then of
    every weighted concatenation (:func:`combine_heads`), one combination made at a time.

    Args:
      embeddings: {head name: (N, D_head) embeddings}, all for the same N samples.
      heads: the heads given alone (default: all of ``embeddings``; combinations may use the
        others).
      combinations: {combination name: {head: weight}}.

    Raises:
      ValueError: at the call, before any row: a combination has a head's name, or names a
        head ``embeddings`` lacks, or none.
    """
    combinations = dict(combinations or {})
    alone = list(embeddings) if heads is None else list(heads)
    for name, weights in combinations.items():
        if name in alone:
            raise ValueError(f"combination {name!r} has the name of a head")
        missing = [head for head in weights if head not in embeddings]
        if missing or not weights:
            raise ValueError(
                f"combination {name!r} needs heads {missing or '(none given)'}; "
                f"available heads: {list(embeddings)}"
            )

    def rows() -> Iterator[tuple[str, jax.Array | np.ndarray]]:
        for head in alone:
            yield head, embeddings[head]
        for name, weights in combinations.items():  # one combination in memory at a time
            yield name, combine_heads(embeddings, weights)

    return rows()


def evaluate_heads(
    embeddings: Mapping[str, jax.Array | np.ndarray],
    labels: jax.Array | np.ndarray,
    metrics: Sequence[str],
    *,
    heads: Sequence[str] | None = None,
    combinations: Mapping[str, Mapping[str, float]] | None = None,
    distance: str = "euclidean",
    seed: int = 0,
    block_size: int = DEFAULT_BLOCK_SIZE,
    kmeans_init: str = "k-means++",
    devices: int = 1,
    backends: Backends | None = None,
) -> dict[str, dict[str, float]]:
    """Multi-head evaluation: every head alone, then every weighted concatenation of heads
    (the rows of :func:`head_embeddings`). The training loop's evaluation
    (``jdml.evaluation.splits.evaluate_splits``) evaluates the same rows, of DiVA's and Sharing
    Matters' heads and of a DM2 cohort's members and ensemble, with their per-query values.

    Args:
      embeddings: {head name: (N, D_head) embeddings}, all for the same N samples.
      labels: (N,) integer class labels.
      metrics: metric names.
      heads, combinations: as in :func:`head_embeddings`, e.g. ``combinations=
        {"disc0.5+others1": {"discriminative": 0.5, "selfsimilarity": 1, "shared": 1,
        "intra": 1}}``.
      distance, seed, block_size, kmeans_init, devices, backends: as in
        :func:`evaluate_embeddings`, used for every row.

    Returns:
      {head or combination name: {metric name: float}}, heads first in their order, then the
      combinations.
    """
    resolve_metrics(metrics)  # every name and combination is checked before any work
    rows = head_embeddings(embeddings, heads, combinations)
    backends = resolve_backends() if backends is None else backends  # once for every row
    return {
        name: evaluate_embeddings(
            emb,
            labels,
            metrics,
            distance=distance,
            seed=seed,
            block_size=block_size,
            kmeans_init=kmeans_init,
            devices=devices,
            backends=backends,
        )
        for name, emb in rows
    }
