"""What a trained network is used for: its embeddings, without losses or class counts.

* :class:`Embedder`: one network's eval-mode embeddings of every head (``model.*``,
  ``data.normalization``); the method's training network is its train-mode twin.
* :class:`Embeddings`: a plain run's embeddings by name: its heads, how the evaluator reads
  them (``eval``) and how a user names one (a head, or ``concat:<weights>``). A cohort's
  (``jdml.cohort.embeddings``) names its members.

Inference and export (``jdml.inference``) build these from a run's config alone; training
builds them inside its program (``jdml.program``).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jdml.backends import Backends, resolve_backends
from jdml.errors import ConfigError
from jdml.models import INPUT_NORMALIZATIONS, build_model


def input_normalization(
    config: ml_collections.ConfigDict,
) -> tuple[float | np.ndarray, float | np.ndarray]:
    """The mean and standard deviation ``preprocess`` applies: ``data.mean`` / ``data.std``, or
    the backbone's own per-channel constants with ``data.normalization=backbone`` (the
    ``INPUT_NORMALIZATIONS`` entry of ``data.normalization``)."""
    constants = INPUT_NORMALIZATIONS.get(config.data.normalization)(config)
    if constants is None:
        raise ConfigError(
            f"data.normalization=backbone, but backbone {config.model.backbone!r} has no "
            "pretrained input constants; use data.normalization=mean_std"
        )
    return constants


def check_head_dims(config: ml_collections.ConfigDict) -> dict[str, int]:
    """Every head has one dimension: an auxiliary term's ``dim`` (0: ``model.embed_dim``) equals
    that of every other term on its head.

    Args:
      config: the full run config (its ``model`` and ``aux`` sections).

    Returns:
      head name -> dimension, the main head first.

    Raises:
      ConfigError: naming the term whose dimension differs.
    """
    heads = {config.model.head: int(config.model.embed_dim)}
    for name, t in config.aux.items():
        dim = int(t.dim or config.model.embed_dim)
        if heads.setdefault(t.head, dim) != dim:
            raise ConfigError(
                f"aux.{name}.dim={dim} differs from another term's dimension for head "
                f"{t.head!r} ({heads[t.head]}); give them one dimension"
            )
    return heads


class Embedder:
    """One network's eval-mode embeddings of every head.

    Args:
      config: the run config (its ``model`` and ``data`` sections).
      backends: the convolutions the network runs (:class:`jdml.backends.Backends`); None:
        resolved here, once, from the config's ``backends`` section and the environment.

    Attributes:
      head: the main head (``model.head``).
      heads: every head's dimension.
      model: the eval-mode Flax module.
    """

    def __init__(self, config: ml_collections.ConfigDict, backends: Backends | None = None):
        self.head = config.model.head
        self.heads = check_head_dims(config)
        if backends is None:
            backends = resolve_backends(config.get("backends"))
        self.native_conv = backends.native_conv
        self.model = build_model(
            config.model, train=False, heads=self.heads, native_conv=self.native_conv
        )
        self.mean, self.std = input_normalization(config)

    def preprocess(self, images: jax.Array) -> jax.Array:
        """Maps [0, 1] images to the network's input range (per channel where the mean and
        standard deviation are per channel)."""
        return (images.astype(jnp.float32) - self.mean) / self.std

    def __call__(
        self, model_params: Any, batch_stats: Any, images: jax.Array
    ) -> dict[str, jax.Array]:
        """Eval-mode embeddings of every head, ``{head: (B, dim)}``, under ``model_params``
        (the params tree's ``model`` entry, or its EMA copy)."""
        variables = {"params": model_params, "batch_stats": batch_stats}
        return self.model.apply(variables, self.preprocess(images))


ENSEMBLE = "ensemble"  # a cohort's concatenation of its members, for ``parse``


class Embeddings:
    """A plain run's embeddings by name: every head of its network.

    Args:
      config: the run config.
      embedder: the network (default: built from ``config`` with ``backends``).
      backends: as :class:`Embedder`'s.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        embedder: Embedder | None = None,
        backends: Backends | None = None,
    ) -> None:
        self.config = config
        self.embedder = embedder or Embedder(config, backends)
        #: The evaluated embedding.
        self.head = self.embedder.head

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """Every embedding ``embed`` returns: the heads, the main one first."""
        return tuple(sorted(self.embedder.heads, key=lambda h: h != self.head))

    @property
    def eval_config(self) -> ml_collections.ConfigDict:
        """The evaluation section (``eval``)."""
        return self.config.eval

    @property
    def ensemble(self) -> tuple[str, ...]:
        """The evaluated heads whose concatenation is ``ensemble`` (a plain run has none)."""
        return ()

    def network_params(self, params: Any) -> Any:
        """The part of a run's params tree that ``embed`` reads (the network's)."""
        return {"model": params["model"]}

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Eval-mode embeddings ``{name: (B, dim)}`` of every name of ``names``."""
        return self.embedder(params["model"], batch_stats, images)

    def parse(self, spec: str) -> dict[str, float] | None:
        """One embedding by name: None for a name of ``names``, else the ``{name: weight}`` of a
        weighted concatenation (``concat:<one weight per evaluated head>``, or ``ensemble`` for
        a cohort's members).

        Raises:
          ConfigError: an unknown name, or a concatenation with the wrong number of weights.
        """
        if spec in self.names:
            return None
        heads = tuple(self.eval_config.heads)
        if spec == ENSEMBLE and self.ensemble:
            return dict.fromkeys(self.ensemble, 1.0)
        if spec.startswith("concat:"):
            try:
                weights = [float(w) for w in spec.removeprefix("concat:").split(",")]
            except ValueError:
                weights = []
            if heads and len(weights) == len(heads):
                return dict(zip(heads, weights, strict=True))
            if not heads:  # eval.heads is empty: nothing to concatenate
                raise ConfigError(
                    f"embedding {spec!r}: this run evaluates one head (eval.heads is empty), so "
                    f"there is nothing to concatenate; use --embedding "
                    f"{self.head} (choices: {', '.join(self.names)})"
                )
            raise ConfigError(
                f"embedding {spec!r} needs one weight per evaluated head {list(heads)}, e.g. "
                f"concat:{','.join('1' for _ in heads)}"
            )
        choices = [*self.names, *([ENSEMBLE] if self.ensemble else [])]
        if heads:
            choices.append("concat:<one weight per head of " + ",".join(heads) + ">")
        raise ConfigError(f"unknown embedding {spec!r}; choose one of: {', '.join(choices)}")
