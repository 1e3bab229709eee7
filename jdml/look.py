"""``jdml look RUN``: pictures of what a trained model learned, and a run's HTML report.

For a split of the run (default test, unseen classes) it embeds every image with a checkpoint
and draws a retrieval grid (sampled queries and their nearest neighbours, correct ones framed
green), an embedding map (a 2-D projection of the embeddings of some classes, coloured by
class; one panel per head for multi-head runs, as in the Sharing Matters paper's Fig. 2/7
comparison), and the run's training curves and spectrum; ``report.html`` gathers them with the
config and the results.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import numpy as np
from PIL import Image

from jdml.data.loading import load_splits
from jdml.data.notices import stamp
from jdml.errors import ConfigError
from jdml.inference import Model, load
from jdml.visualize import embedding_map, embedding_maps, html_report, split_retrieval_grid

log = logging.getLogger("jdml")


@dataclasses.dataclass(frozen=True)
class LookOptions:
    """What ``look`` draws.

    Attributes:
      split: the run's split to look at (train, val or test).
      queries: queries in the retrieval grid.
      neighbours: neighbours per query in the grid.
      classes: classes in the embedding map (chosen at random; 0 = all).
      max_points: most points projected per map.
      method: the 2-D projection: auto (UMAP if installed, else t-SNE, PCA for many points),
        umap, tsne or pca.
      seed: seed of the choice of queries and classes and of the projection.
    """

    split: str = "test"
    queries: int = 6
    neighbours: int = 6
    classes: int = 20
    max_points: int = 3000
    method: str = "auto"
    seed: int = 0


def draw_retrieval_grid(
    model: Model, data: Any, embeddings: np.ndarray, path: str, options: LookOptions
) -> str:
    """The retrieval grid of ``options.queries`` random items of ``data`` (a split) among the
    other items; for a query/gallery split, random queries among the gallery."""
    title = f"{os.path.basename(model.workdir)}: {options.split} queries, {model.embedding}"
    path = split_retrieval_grid(
        data,
        embeddings,
        path,
        distance=str(model.config.eval.distance),
        queries=options.queries,
        neighbours=options.neighbours,
        seed=options.seed,
        title=title,
    )
    if model.config.data.name == "emoji":  # third-party artwork: its credits under it
        with Image.open(path) as image:
            stamped = stamp(image)
        stamped.save(path)
    return path


def _class_sample(labels: np.ndarray, options: LookOptions) -> np.ndarray:
    """Indices of the items of ``options.classes`` random classes (all with 0)."""
    classes = np.unique(labels)
    if 0 < options.classes < len(classes):
        rng = np.random.default_rng(options.seed)
        classes = np.sort(rng.choice(classes, options.classes, replace=False))
    return np.flatnonzero(np.isin(labels, classes))


def draw_embedding_map(
    model: Model, data: Any, embeddings: dict[str, np.ndarray], path: str, options: LookOptions
) -> str:
    """The embedding map of some classes of ``data``: one panel per head of a multi-head run
    (its evaluated heads), else the model's embedding alone."""
    chosen = _class_sample(np.asarray(data.labels), options)
    labels = np.asarray(data.labels)[chosen]
    names = list(data.class_names)
    heads = [h for h in model.config.eval.heads if h in embeddings]
    title = f"{os.path.basename(model.workdir)}: {options.split}, {len(np.unique(labels))} classes"
    common = {"method": options.method, "seed": options.seed, "max_points": options.max_points}
    if len(heads) > 1:
        panels = {h: embeddings[h][chosen] for h in heads}
        return embedding_maps(panels, labels, path, title=title, class_names=names, **common)
    single = model.select(embeddings)[chosen]
    return embedding_map(single, labels, path, title=title, class_names=names, **common)


def look(
    workdir: str,
    *,
    checkpoint: str | int = "best",
    embedding: str | None = None,
    out: str | None = None,
    options: LookOptions = LookOptions(),
) -> dict[str, str]:
    """Draws the retrieval grid, the embedding map, the training curves and the spectrum of a
    run, and writes its ``report.html``.

    Args:
      workdir: a training run directory.
      checkpoint: "best", "latest" or a step number.
      embedding: the embedding to look at (see :func:`jdml.inference.load`).
      out: the output folder (default ``<workdir>/look``).
      options: what to draw.

    Returns:
      ``{"retrieval_grid": path, "embedding_map": path, "report": path}``.
    """
    model = load(workdir, checkpoint, embedding)
    splits = load_splits(model.config.data)
    if options.split not in splits:
        raise ConfigError(
            f"split {options.split!r} does not exist for this run; choose one of {sorted(splits)}"
        )
    data = splits[options.split]
    out = out or os.path.join(workdir, "look")
    os.makedirs(out, exist_ok=True)
    log.info("embedding %d %s images with step %d", len(data), options.split, model.step)
    embeddings = model.embed_set(data, int(model.config.eval.batch_size), progress=True)
    grid = draw_retrieval_grid(
        model,
        data,
        model.select(embeddings),
        os.path.join(out, "retrieval_grid.png"),
        options,
    )
    emap = draw_embedding_map(
        model, data, embeddings, os.path.join(out, "embedding_map.png"), options
    )
    report = html_report(
        workdir, out=os.path.join(out, "report.html"), images=[grid, emap], figures_dir=out
    )
    return {"retrieval_grid": grid, "embedding_map": emap, "report": report}
