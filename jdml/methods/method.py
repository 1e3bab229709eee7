"""The one method class: named embedding heads on one backbone, weighted loss terms on them and
an optional decorrelation between heads.

* Revisiting-DML (Roth et al., ICML 2020): one head (``model.head``) and its loss (``loss``,
  ``miner``): the main term.
* DiVA (Milbich, Roth et al., ECCV 2020): the main term on the ``discriminative`` head, plus
  ``aux`` terms (class-shared and intra-class margin losses, DaNCE with EMA keys and a queue) and
  ``decorrelation`` between each auxiliary head and the discriminative one.
* Sharing Matters (Milbich et al., TPAMI): the main term on the class head, plus a metric term
  with cross-class triplets on a ``shared`` head and their decorrelation.

The trainer only sees ``init``, ``init_method_state``, ``loss_fn``, ``update_method_state``,
``param_groups`` (with ``frozen_params`` and ``backbone_layers``, what ``jdml.optim`` needs)
and ``embed``; there is no method-specific code in the training loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from jdml.backends import Backends
from jdml.embedder import Embedder
from jdml.losses.decorrelation import Decorrelation
from jdml.methods.checks import check_phases
from jdml.methods.terms import TERMS, Metrics, MetricTerm, Term, TermInputs
from jdml.models import build_model
from jdml.models.embedding import backbone_layers, frozen_backbone_modules
from jdml.models.pretrained.backbones import load_backbone
from jdml.optim import Group
from jdml.platform import platform


def run_once(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``jax.jit`` for a program that runs once per process (initialisation). On the CPU
    backend it compiles at LLVM's level 1, not 2: threefry's unrolled rounds behind every random
    initialiser took 8 s at level 2 against 2 s, for bitwise the same params (tests/methods/
    test_init.py); accelerators, and a caller's own jit around it, compile as they always do."""
    plain = jax.jit(fn)
    if platform() != "cpu":
        return plain
    cheap = jax.jit(fn, compiler_options={"xla_backend_optimization_level": 1})

    def call(*args: Any) -> Any:
        traced = any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))
        return (plain if traced else cheap)(*args)

    return call


class LossAux(NamedTuple):
    """What a method's loss gives besides its value (:meth:`Method.loss_fn`).

    Attributes:
      batch_stats: the new batch statistics.
      metrics: the terms' metrics and ``loss``.
      embeddings: the main head's embeddings of the batch (train mode).
      outputs: term name -> what its ``update_method_state`` needs (the DaNCE keys).
    """

    batch_stats: Any
    metrics: Metrics
    embeddings: jax.Array
    outputs: dict[str, Any]


class Method:
    """Wires model, terms and decorrelation for the train step and the evaluator.

    Args:
      config: the full run config.
      num_classes: number of training classes (sizes per-class loss parameters).
      bn_groups: row blocks of a batch normalised each with its own BatchNorm statistics (the
        devices of the data axis under per-device BatchNorm; ``jdml.placement.batch_norm_groups``).
      backends: the convolutions the model runs (:class:`jdml.backends.Backends`); None:
        resolved once, by its :class:`jdml.embedder.Embedder`, from the config.

    Params tree: ``{"model", "loss" (main term), "aux_<term>" (metric terms' own loss params),
    "decorrelation" (the psi MLPs)}``, each an optimiser group with its own learning rate.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        num_classes: int,
        bn_groups: int = 1,
        backends: Backends | None = None,
    ) -> None:
        self.config = config
        self.head = config.model.head
        self.main = MetricTerm(
            head=self.head,
            weight=1.0,
            loss=config.loss,
            miner=config.miner,
            num_classes=num_classes,
        )
        #: The eval-mode network (``embed``), also what inference and export build alone.
        self.embedder = Embedder(config, backends)
        self.heads = self.embedder.heads
        self.terms: dict[str, Term] = {
            name: TERMS.get(t.kind).build(
                t,
                num_classes=num_classes,
                batch_size=config.train.batch_size,
                dim=self.heads[t.head],
            )
            for name, t in config.aux.items()
        }
        decorrelation = config.decorrelation
        self.decorrelation = (
            Decorrelation(
                pairs=tuple(tuple(p) for p in decorrelation.pairs),
                weights=tuple(float(w) for w in decorrelation.weights),
                hidden=decorrelation.hidden,
                renormalize=decorrelation.renormalize,
                detach_target=decorrelation.detach_target,
            )
            if decorrelation.pairs
            else None
        )
        self.views = max([1, *(t.views for t in self.terms.values())])
        self.phases = self._phases(config)
        self.pretrained = (
            load_backbone(config.model.backbone, config.model.pretrained)
            if config.model.pretrained
            else None
        )
        self.train_model = build_model(
            config.model, train=True, heads=self.heads, native_conv=self.embedder.native_conv
        )
        self.bn_groups = bn_groups

    def _phases(self, config: ml_collections.ConfigDict) -> tuple[tuple[str, ...] | None, ...]:
        """The optimiser updates of one step, each a set of terms (``None``: all of them)."""
        if not config.phases:
            return (None,)
        check_phases(config)
        return tuple(tuple(p) for p in config.phases)

    def phase_groups(self, phase: tuple[str, ...] | None) -> frozenset[str] | None:
        """The params groups a phase trains (the model, and the params of its terms)."""
        if phase is None:
            return None
        groups = {"model"}
        for name in phase:
            groups.add({"main": "loss", "decorrelation": "decorrelation"}.get(name, f"aux_{name}"))
        return frozenset(groups)

    @property
    def streams(self) -> int:
        """Data streams per step: the phases after the first read their own random batch."""
        return len(self.phases)

    def phase_batch(self, batch: dict[str, jax.Array], phase: int) -> dict[str, jax.Array]:
        """The batch a phase trains on: the main stream, or stream ``phase`` (``*_<phase>``)."""
        if phase == 0:
            return batch
        return {k: batch[f"{k}_{phase}"] for k in ("images", "labels")}

    # -- construction ---------------------------------------------------------------------------

    def preprocess(self, images: jax.Array) -> jax.Array:
        """Maps [0, 1] images to the network's input range (``Embedder.preprocess``)."""
        return self.embedder.preprocess(images)

    def init(self, key: jax.Array, images: jax.Array) -> tuple[Any, Any]:
        """Returns ``(params, batch_stats)`` for a sample batch of images.

        Two compiled programs (the network's initialisers, then the heads' outputs and the
        terms' params), not one dispatch per initialiser: on any backend an eager init compiles
        every op of it on its own (~20 s for a tiny network on a CPU core). A pretrained
        backbone is put in between, on the host.
        """
        k_model = jax.random.split(key)[0]  # as the single-head method always drew it
        variables = run_once(self.train_model.init)(k_model, self.preprocess(images))
        if self.pretrained is not None:  # the backbone from the weight file, the heads random
            variables = self.pretrained(variables)
        params = run_once(self._init_terms)(key, variables, images)
        return params, variables.get("batch_stats", {})

    def _init_terms(self, key: jax.Array, variables: Any, images: jax.Array) -> dict[str, Any]:
        """The params tree around the network's ``variables``: the main loss's, each term's and
        the decorrelation MLPs' own params, initialised on the heads' outputs."""
        k_loss = jax.random.split(key)[1]
        k_aux, k_dec = jax.random.fold_in(key, 2), jax.random.fold_in(key, 3)
        out = self.embedder(variables["params"], variables.get("batch_stats", {}), images)
        labels = jnp.zeros((images.shape[0],), jnp.int32)
        params = {
            "model": variables["params"],
            "loss": self.init_loss(k_loss, out[self.head], labels),
        }
        for i, (name, term) in enumerate(self.terms.items()):
            term_params = term.init_params(jax.random.fold_in(k_aux, i), out, labels)
            if term_params is not None:
                params[f"aux_{name}"] = term_params
        if self.decorrelation is not None:
            params["decorrelation"] = self.decorrelation.init(k_dec, out)["params"]
        return params

    def init_loss(self, key: jax.Array, embeddings: jax.Array, labels: jax.Array) -> Any:
        """The main loss's own learnable parameters (``{}`` for a loss without any)."""
        return self.main.init(key, embeddings, labels)

    def init_method_state(self, params: Any) -> dict[str, Any]:
        """State the step carries besides params: each term's own (per DaNCE term its EMA
        params and key queue)."""
        states = {name: term.init_state(params["model"]) for name, term in self.terms.items()}
        return {name: state for name, state in states.items() if state is not None}

    def param_groups(self) -> dict[str, Group]:
        """How each params subtree learns, as the method declares it (``jdml.optim.Group``:
        the network at ``optim.lr`` and ``optim.weight_decay``, the loss parameters and the
        decorrelation MLPs at their own rates)."""
        groups = {"model": Group(), "loss": self.main.param_group()}
        for name, term in self.terms.items():
            group = term.param_group()
            if group is not None:
                groups[f"aux_{name}"] = group
        if self.decorrelation is not None:
            decorrelation = self.config.decorrelation
            groups["decorrelation"] = Group(decorrelation.lr, decorrelation.weight_decay)
        return groups

    def frozen_params(self) -> Callable[[tuple[str, ...]], bool] | None:
        """``model.frozen_stages``: params path -> whether the optimiser leaves it fixed."""
        names = frozen_backbone_modules(self.config.model)
        if not names:
            return None
        return lambda path: path[:2] == ("model", "backbone") and len(path) > 2 and path[2] in names

    def backbone_layers(self) -> tuple[tuple[str, ...], ...] | None:
        """The backbone's parameter names by depth, for ``optim.layer_decay`` (None: it
        declares none)."""
        return backbone_layers(self.config.model)

    # -- the step -------------------------------------------------------------------------------

    def head_loss(
        self, loss_params: Any, embeddings: jax.Array, labels: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, Metrics]:
        """The main term alone: mines tuples on the detached embeddings and applies the loss."""
        return self.main(loss_params, embeddings, labels, key)

    def loss_fn(
        self,
        params: Any,
        batch_stats: Any,
        batch: dict[str, jax.Array],
        key: jax.Array,
        method_state: dict[str, Any] | None = None,
        phase: tuple[str, ...] | None = None,
    ) -> tuple[jax.Array, LossAux]:
        """Total loss of one batch (of the terms in ``phase``: "main", "decorrelation" and
        auxiliary term names; ``None`` = all).

        Returns:
          ``(loss, LossAux)``: the new batch statistics; the metrics (the main term's
          unprefixed, each auxiliary term's as ``<term>/<name>``, the decorrelation's, and
          ``loss`` = total); the embeddings of the main head (train mode), which feed the
          samplers' memory and the cohort's exchange; the outputs ``update_method_state`` needs
          (the DaNCE keys).
        """
        out, updates = self._apply_train(params["model"], batch_stats, batch["images"])
        labels = batch["labels"]
        active = lambda name: phase is None or name in phase  # noqa: E731
        total, metrics = jnp.zeros((), jnp.float32), {}
        if active("main"):
            total, metrics = self.main(params["loss"], out[self.head], labels, key)
        outputs: dict[str, Any] = {}
        for i, (name, term) in enumerate(self.terms.items()):
            if not active(name):
                continue
            inputs = TermInputs(
                out=out,
                labels=labels,
                key=jax.random.fold_in(key, i + 1),
                batch=batch,
                batch_stats=batch_stats,
                state=(method_state or {}).get(name),
                network=lambda p, images: self._network(p, batch_stats, images),
            )
            value, term_metrics, output = term.apply(params.get(f"aux_{name}"), inputs)
            if output is not None:
                outputs[name] = output
            total = total + term.weight * value
            metrics.update({f"{name}/{k}": v for k, v in term_metrics.items()})
        if self.decorrelation is not None and active("decorrelation"):
            value, dec_metrics = self.decorrelation.apply({"params": params["decorrelation"]}, out)
            total = total + value
            metrics.update(dec_metrics)
        metrics["loss"] = total
        new_stats = updates.get("batch_stats", batch_stats)
        return total, LossAux(new_stats, metrics, out[self.head], outputs)

    def _network(
        self, model_params: Any, batch_stats: Any, images: jax.Array
    ) -> dict[str, jax.Array]:
        """Every head's embeddings under other model params (e.g. a term's EMA copy), in train
        mode (batch statistics of ``images``), the running statistics not updated."""
        return self._apply_train(model_params, batch_stats, images)[0]

    def _apply_train(
        self, model_params: Any, batch_stats: Any, images: jax.Array
    ) -> tuple[dict[str, jax.Array], dict[str, Any]]:
        """The train-mode model on ``images``: every head's embeddings and the updated
        variables. With per-device BatchNorm (``bn_groups`` G > 1) the batch's G row blocks
        (one per device of the data axis) are normalised each with its own statistics, and the
        running statistics move towards their mean over the blocks."""
        variables = {"params": model_params, "batch_stats": batch_stats}
        apply = lambda x: self.train_model.apply(  # noqa: E731
            variables, self.preprocess(x), mutable=["batch_stats"]
        )
        groups = self.bn_groups
        if groups == 1:
            return apply(images)
        blocks = images.reshape(groups, images.shape[0] // groups, *images.shape[1:])
        out, updates = jax.vmap(apply)(blocks)
        out = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)
        return out, jax.tree.map(lambda x: jnp.mean(x, axis=0), updates)

    def update_method_state(
        self, state: dict[str, Any], params: Any, outputs: dict[str, Any], labels: jax.Array
    ) -> dict[str, Any]:
        """After the optimiser update: each term's state from its output of the step (DaNCE:
        the EMA of the key params, then the keys enter the queue)."""
        new = dict(state)
        for name, output in outputs.items():
            new[name] = self.terms[name].update_state(state[name], params["model"], output, labels)
        return new

    # -- evaluation -----------------------------------------------------------------------------

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Eval-mode embeddings of every head, ``{head: (B, dim)}``."""
        return self.embedder(params["model"], batch_stats, images)

    def embed_keys(
        self, ema_params: Any, batch_stats: Any, images: jax.Array
    ) -> dict[str, jax.Array]:
        """Eval-mode embeddings of every head under the EMA (key) parameters."""
        return self.embedder(ema_params, batch_stats, images)
