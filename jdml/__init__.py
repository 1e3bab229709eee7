"""jdml: deep metric learning in JAX/Flax.

``jdml.load(workdir)`` gives a trained model that embeds images and builds and searches indexes
(:mod:`jdml.inference`); training and evaluation are ``train.py`` and ``eval.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jdml.inference import Model


def load(workdir: str, checkpoint: str | int = "best", embedding: str | None = None) -> Model:
    """A trained model from a run directory (see :func:`jdml.inference.load`).

    Example, with ``workdir`` a finished run (``runs/glyphs`` after the README's first
    command): embed images and search them.

    >>> import numpy as np
    >>> import jdml
    >>> model = jdml.load(workdir)  # the best checkpoint's main embedding
    >>> images = np.zeros((3, *model.input_shape), np.uint8)
    >>> embeddings = model.embed(images)
    >>> embeddings.shape[0], str(embeddings.dtype)
    (3, 'float32')
    >>> index = model.index(images, labels=np.array([0, 1, 2]))
    >>> [len(row) for row in index.search(embeddings, k=2)]
    [2, 2, 2]
    >>> jdml.load(workdir + "-missing")
    Traceback (most recent call last):
    ...
    jdml.errors.CheckpointError: ...
    """
    from jdml.inference import load as load_model  # imported on use: ``import jdml`` stays light

    return load_model(workdir, checkpoint, embedding)
