"""jdml: deep metric learning in JAX/Flax.

``jdml.load(workdir)`` gives a trained model that embeds images and builds and searches indexes
(:mod:`jdml.inference`); training and evaluation are ``train.py`` and ``eval.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jdml.inference import Model


def load(workdir: str, checkpoint: str | int = "best", embedding: str | None = None) -> Model:
    """A trained model from a run directory (see :func:`jdml.inference.load`)."""
    from jdml.inference import load as load_model  # imported on use: ``import jdml`` stays light

    return load_model(workdir, checkpoint, embedding)
