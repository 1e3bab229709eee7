"""Where a run chooses, once, between a plain program and a cohort's (``cohort.size > 1``): for
training (:func:`build_program`) and for its embeddings alone (:func:`build_embeddings`, what
inference and export use: no losses, no class counts)."""

from __future__ import annotations

import functools

import ml_collections

from jdml.backends import Backends, resolve_backends
from jdml.cohort.embeddings import cohort_embeddings
from jdml.cohort.program import build_cohort
from jdml.embedder import Embeddings
from jdml.methods.method import Method
from jdml.placement import batch_norm_groups
from jdml.program import Program


def _is_cohort(config: ml_collections.ConfigDict) -> bool:
    return int(config.cohort.size) > 1


def build_program(
    config: ml_collections.ConfigDict,
    num_classes: int,
    steps_per_epoch: int = 1,
    backends: Backends | None = None,
) -> Program:
    """The program of a run config: a plain run's, or a cohort's (``cohort.size > 1``; one
    method per member of a heterogeneous cohort, ``cohort.members``), computing with
    ``backends`` (None: resolved here, once, from ``config.backends`` and the environment).

    Raises:
      ConfigError: for a config the method or the cohort cannot run.
    """
    if backends is None:
        backends = resolve_backends(config.get("backends"))
    build = functools.partial(
        Method, num_classes=num_classes, bn_groups=batch_norm_groups(config), backends=backends
    )
    if _is_cohort(config):
        return build_cohort(config, build, steps_per_epoch)
    return Program(config, build(config))


def build_embeddings(
    config: ml_collections.ConfigDict, backends: Backends | None = None
) -> Embeddings:
    """A run's embeddings alone, from its config (no losses, no class counts): a plain run's
    (``jdml.embedder.Embeddings``) or a cohort's (``jdml.cohort.embeddings``), computing with
    ``backends`` (None: resolved here, once, as :func:`build_program` does)."""
    if backends is None:
        backends = resolve_backends(config.get("backends"))
    if _is_cohort(config):
        return cohort_embeddings(config, backends)
    return Embeddings(config, backends=backends)
