"""Embeds dataset splits with a model state and evaluates them with the retrieval metrics."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
from tqdm import tqdm

from jdml.backends import Backends, resolve_backends
from jdml.data.arrays import ImageSet, QueryGallery
from jdml.data.pipeline import eval_batches
from jdml.evaluation import per_query as pq
from jdml.evaluation.embeddings import (
    EmbeddingEvaluation,
    check_finite,
    evaluate_embeddings_with_vectors,
    head_embeddings,
)

EmbedFn = Callable[[Any, Any, jax.Array], dict[str, jax.Array]]


def embed_split(
    embed_fn: EmbedFn,
    params: Any,
    batch_stats: Any,
    data: ImageSet,
    batch_size: int,
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """Embeds every image of ``data`` with a jitted ``embed_fn``; returns ``{head: (N, dim)}``.

    Batches have a fixed shape (the last one padded), so ``embed_fn`` compiles once; the images
    are read batch by batch, so a large photo split never sits in memory whole.
    """
    parts: dict[str, list[np.ndarray]] = {}
    batches = eval_batches(data, batch_size)
    total = math.ceil(len(data) / batch_size)
    for images, valid in tqdm(batches, total=total, unit="batch", disable=not progress):
        out = embed_fn(params, batch_stats, images)
        for head, emb in out.items():
            parts.setdefault(head, []).append(np.asarray(emb)[:valid])
    return {head: np.concatenate(chunks) for head, chunks in parts.items()}


def evaluate_split(
    embeddings: np.ndarray | jax.Array, data: ImageSet, metrics: Sequence[str], **options: Any
) -> EmbeddingEvaluation:
    """``evaluate_embeddings_with_vectors`` of one split's embeddings: leave-one-out, or, for a
    :class:`QueryGallery` split, its queries (the first ``num_queries`` rows) ranked against
    its gallery (the rest)."""
    labels = np.asarray(data.labels)
    if not isinstance(data, QueryGallery):
        return evaluate_embeddings_with_vectors(embeddings, labels, list(metrics), **options)
    n = data.num_queries
    return evaluate_embeddings_with_vectors(
        embeddings[:n],
        labels[:n],
        list(metrics),
        gallery=embeddings[n:],
        gallery_labels=labels[n:],
        **options,
    )


SPECTRUM = "rho_spectrum@0"  # the normalised singular-value spectrum, kept for plots


class Evaluation(NamedTuple):
    """The evaluation of a model state on dataset splits (:func:`evaluate_splits`)."""

    metrics: dict[str, dict[str, float]]
    """{split: {metric: value}} of the evaluated head."""
    vectors: dict[str, dict[str, np.ndarray]]
    """{split: {vector metric or per-query key: 1-D array}}: the vector-valued metrics (e.g.
    :data:`SPECTRUM`) of the evaluated head, and the per-query values of every evaluated head
    and combination with the queries' classes (keys of :mod:`jdml.evaluation.per_query`)."""
    heads: dict[str, dict[str, dict[str, float]]]
    """{split: {other head or combination: {metric: value}}}: the heads of ``eval.heads`` other
    than the evaluated one, and the weighted concatenations of ``eval.combinations``."""


def split_metrics(
    cfg: ml_collections.ConfigDict, splits: Sequence[str], full: Sequence[str]
) -> dict[str, list[str]]:
    """The metrics computed on each split at an evaluation.

    The splits in ``full`` get ``eval.metrics``. The training split additionally gets
    ``eval.train_metrics`` (the Revisiting paper measures the spectral decay rho on the
    training embeddings) and the normalised singular-value spectrum, which the report plots.

    Args:
      cfg: the ``eval`` config section.
      splits: the split names to evaluate.
      full: the splits that get every metric of ``eval.metrics``.
    """
    out = {}
    for name in splits:
        names = list(cfg.metrics) if name in full else []
        if name == "train" and cfg.train_metrics:
            names += [*cfg.train_metrics, SPECTRUM]
        out[name] = list(dict.fromkeys(names))
    return out


def _options(
    cfg: ml_collections.ConfigDict,
    seed: int,
    devices: int = 1,
    backends: Backends | None = None,
) -> dict[str, Any]:
    """The evaluator's options from the ``eval`` config section: the distance, the k-means
    (``eval.kmeans``) and the seed of its initialisation (unused by the reference k-means),
    the devices it runs on and the run's backends.

    Args:
      cfg: the ``eval`` config section.
      seed: the run's seed.
      devices: ``parallel.eval_devices`` (1: the default device, 0: every device).
      backends: the run's kNN selection and k-means assignment (None: resolved here, once,
        from the environment, :func:`jdml.backends.resolve_backends`).

    Returns:
      Keyword arguments of :func:`jdml.evaluation.embeddings.evaluate_embeddings`.
    """
    return {
        "distance": cfg.distance,
        "seed": seed,
        "kmeans_init": cfg.kmeans,
        "devices": int(devices),
        "backends": resolve_backends() if backends is None else backends,
    }


def combination_name(weights: Sequence[float]) -> str:
    """The record name of a weighted concatenation, e.g. ``concat:0.75,1.25,1.25,1.25``."""
    return "concat:" + ",".join(f"{float(w):g}" for w in weights)


def evaluate_splits(
    embed_fn: EmbedFn,
    params: Any,
    batch_stats: Any,
    splits: Mapping[str, ImageSet],
    metrics: Mapping[str, Sequence[str]],
    cfg: ml_collections.ConfigDict,
    *,
    head: str,
    seed: int = 0,
    full: Sequence[str] = (),
    devices: int = 1,
    on_embeddings: Callable[[str, ImageSet, np.ndarray], None] | None = None,
    backends: Backends | None = None,
) -> Evaluation:
    """Evaluates the embeddings of ``head`` on each split with that split's metrics.

    On the splits in ``full``, the heads of ``eval.heads`` other than ``head`` are evaluated
    alone and ``eval.combinations`` as weighted concatenations (DiVA's evaluation), with
    ``eval.metrics``; every head is embedded once per split. ``devices``
    (``parallel.eval_devices``): the devices of the evaluation, see
    :func:`jdml.evaluation.embeddings.evaluate_embeddings`. ``on_embeddings(split, data,
    embeddings)`` sees ``head``'s embeddings of each split in ``full`` (e.g. to draw them).
    ``backends``: the kNN selection and the k-means assignment (the run's; None: resolved
    once, from the environment).

    On the splits in ``full``, the per-query values of the metrics in ``eval.per_query`` of
    every evaluated head and combination, and the queries' classes, are among the split's
    vectors (keys of :mod:`jdml.evaluation.per_query`).

    Returns:
      The :class:`Evaluation`: the metrics of ``head``, the vectors and the other heads'
      metrics, per split.

    Raises:
      NonFiniteEmbeddingError: an evaluated head's embeddings of a split hold NaN or inf (the
        message names the head and the split and counts the rows).
    """
    scalars, vectors, extra = {}, {}, {}
    kept = tuple(cfg.get("per_query", ()))
    options = _options(cfg, seed, devices, backends)
    for name, data in splits.items():
        embeddings = embed_split(embed_fn, params, batch_stats, data, cfg.batch_size)
        evaluated = [head, *(cfg.heads if name in full else ())]
        for h in dict.fromkeys(evaluated):
            check_finite(embeddings[h], f"{h!r} embeddings of split {name!r}")
        queries = kept if name in full else ()
        main = evaluate_split(embeddings[head], data, metrics[name], per_query=queries, **options)
        scalars[name], vectors[name] = main.metrics, dict(main.vectors)
        if queries:
            _add_queries(vectors[name], head, main.per_query, data)
        if name in full and on_embeddings is not None:
            on_embeddings(name, data, np.asarray(embeddings[head]))
        if name not in full or not cfg.heads:
            continue
        rows = head_embeddings(
            embeddings,
            heads=[h for h in cfg.heads if h != head],
            combinations={
                combination_name(w): dict(zip(cfg.heads, w, strict=True)) for w in cfg.combinations
            },
        )
        extra[name] = {}
        for embedding, emb in rows:
            row = evaluate_split(emb, data, cfg.metrics, per_query=queries, **options)
            extra[name][embedding] = row.metrics
            for metric in queries:
                vectors[name][pq.vector_key(embedding, metric)] = row.per_query[metric]
    return Evaluation(metrics=scalars, vectors=vectors, heads=extra)


def _add_queries(
    vectors: dict[str, np.ndarray],
    head: str,
    per_query: Mapping[str, np.ndarray],
    data: ImageSet,
) -> None:
    """Adds the main head's per-query values under their :mod:`jdml.evaluation.per_query` keys,
    and the queries' classes (a gallery split's queries: its first rows)."""
    labels = np.asarray(data.labels)
    if isinstance(data, QueryGallery):
        labels = labels[: data.num_queries]
    vectors[pq.classes_key()] = labels.astype(np.int64)
    for metric, values in per_query.items():
        vectors[pq.vector_key(head, metric)] = values


def evaluate_raw_pixels(
    splits: Mapping[str, ImageSet],
    cfg: ml_collections.ConfigDict,
    *,
    seed: int = 0,
    devices: int = 1,
) -> dict[str, dict[str, float]]:
    """The raw-pixel baseline: the same metrics on flattened pixel vectors scaled to [0, 1]
    (on ``devices`` devices, as :func:`evaluate_splits`)."""
    out = {}
    for name, data in splits.items():
        x = data.eval_images(np.arange(len(data))).reshape(len(data), -1)
        out[name] = evaluate_split(x, data, cfg.metrics, **_options(cfg, seed, devices)).metrics
    return out
