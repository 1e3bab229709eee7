"""The program of a run: its members, their state and step, and the run's embeddings.

Every run trains ``L >= 1`` members of its method (``jdml.methods.Method``): a plain run one, a
cohort (``cohort.size > 1``) several, which exchange what ``cohort.exchange`` names
(``jdml.exchanges``; DM2's relation matrices by default). ``Program`` puts three parts together:

* the layout (``jdml.layout``): which members, how their state is stored, the device mesh, its
  data axis and the placement of batches and state;
* the step: a plain run's (``jdml.step``), or a cohort's (``jdml.cohort.step``: stacked or
  heterogeneous members, each one's loss the plain method's), jitted the same way;
* the exchange (``jdml.exchanges.EXCHANGES``): what the members add to each other's losses.

``embedding_names``, ``eval_config``, ``parse_embedding`` and ``embed`` say which embeddings the
program produces and how they are evaluated and combined, for the evaluator and for
``jdml.inference`` alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jdml import step as plain
from jdml.backends import Backends
from jdml.cohort import step as cohort_step
from jdml.cohort.step import StepPlan
from jdml.errors import ConfigError
from jdml.exchanges import EXCHANGES
from jdml.layout import batch_norm_groups, make_layout
from jdml.members import member_configs, member_name, over_members
from jdml.mesh import AXIS, DATA
from jdml.methods.checks import check_stateless_members
from jdml.methods.ema_queue import push
from jdml.methods.method import Method
from jdml.optim import make_optimizer, per_member
from jdml.state import TrainState
from jdml.step import StepFn, jit_step

__all__ = ["ENSEMBLE", "Program", "StepFn", "build_program"]

ENSEMBLE = "ensemble"  # a cohort's concatenation of its members, for ``parse_embedding``


class Program:
    """The members of a run (one, or a cohort), their state, step and embeddings.

    Args:
      config: the full run config (its ``cohort`` section; see ``jdml.config.base_config``).
      method: the method every member runs (member 1's in a heterogeneous cohort).
      steps_per_epoch: for schedules in epochs (the exchange's warm-up; training only).
      size: the number of members (default ``cohort.size``); given, the program is one
        member's alone on one device.
      methods: each member's method, for a heterogeneous cohort (``cohort.members``; see
        ``build_program``): each member then has its own optimiser, and the state fields are
        ``{member<l>: tree}``.
    """

    def __init__(
        self,
        config: ml_collections.ConfigDict,
        method: Method,
        steps_per_epoch: int = 1,
        size: int | None = None,
        methods: tuple[Method, ...] = (),
    ) -> None:
        cohort = config.cohort
        self.config = config
        self.method = method
        self.methods = tuple(methods)
        self.heterogeneous = bool(self.methods)  # each member has its own method
        self.cohort = int(cohort.size if size is None else size) > 1  # phases: validation's
        check_stateless_members(config)
        exchange = EXCHANGES.get(cohort.exchange)(config, steps_per_epoch) if self.cohort else None
        self.exchange = exchange
        self.layout = make_layout(
            config,
            size,
            listed=self.heterogeneous,
            view_diversity=exchange is not None and exchange.view_diversity,
        )
        self.size, self.names = self.layout.size, self.layout.names
        self.loop = "unroll" if self.heterogeneous or not self.cohort else cohort.member_loop
        self.plan = StepPlan(
            layout=self.layout,
            methods=self.methods or (method,),
            exchange=exchange,
            loop=self.loop,
            probabilities=(
                exchange.update_probabilities(self.size)
                if exchange is not None
                else np.ones(self.size, np.float32)
            ),
            model_diversity=exchange is not None and exchange.model_diversity,
        )
        # The evaluated embedding: the method's main head, or member 1's.
        self.head = member_name(0) if self.cohort else method.head

    # -- names ----------------------------------------------------------------------------------

    @functools.cached_property
    def embedding_names(self) -> tuple[str, ...]:
        """Every embedding ``embed`` returns: the method's heads, or per member ``member<l>``
        (its main head) and ``member<l>/<head>`` (its other heads)."""
        methods = self.methods or (self.method,) * self.size
        return tuple(
            self._embedding_name(i, method, head)
            for i, method in enumerate(methods)
            for head in sorted(method.heads, key=lambda h: h != method.head)
        )

    @functools.cached_property
    def eval_config(self) -> ml_collections.ConfigDict:
        """The evaluation section: ``config.eval``, or for a cohort every member alone and the
        ensemble (the concatenation of the members)."""
        if not self.cohort:
            return self.config.eval
        cfg = ml_collections.ConfigDict(self.config.eval.to_dict())
        cfg.heads = tuple(member_name(i) for i in range(self.size))
        cfg.combinations = ((1.0,) * self.size,)
        return cfg

    def parse_embedding(self, spec: str) -> dict[str, float] | None:
        """One embedding of the run by name: None for a name of ``embedding_names``, else the
        ``{name: weight}`` of a weighted concatenation (``concat:<one weight per evaluated
        head>``, or ``ensemble`` for a cohort's members).

        Raises:
          ConfigError: an unknown name, or a concatenation with the wrong number of weights.
        """
        if spec in self.embedding_names:
            return None
        heads = tuple(self.eval_config.heads)
        if spec == ENSEMBLE and self.cohort:
            return dict.fromkeys(heads, 1.0)
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
                    f"{self.head} (choices: {', '.join(self.embedding_names)})"
                )
            raise ConfigError(
                f"embedding {spec!r} needs one weight per evaluated head {list(heads)}, e.g. "
                f"concat:{','.join('1' for _ in heads)}"
            )
        choices = [*self.embedding_names, *([ENSEMBLE] if self.cohort else [])]
        if heads:
            choices.append("concat:<one weight per head of " + ",".join(heads) + ">")
        raise ConfigError(f"unknown embedding {spec!r}; choose one of: {', '.join(choices)}")

    def optimizer(self, steps_per_epoch: int, total_steps: int) -> optax.GradientTransformation:
        """The optimiser of ``config.optim`` over the method's param groups and frozen parts;
        a heterogeneous cohort's is each member's own (``jdml.optim.per_member``)."""

        def of(method: Method) -> optax.GradientTransformation:
            return make_optimizer(
                self.config.optim,
                method.param_groups(),
                steps_per_epoch=steps_per_epoch,
                total_steps=total_steps,
                frozen=method.frozen_params(),
                layer_scale=method.layer_lr_scales(),
            )

        if not self.heterogeneous:
            return of(self.method)
        return per_member({n: of(m) for n, m in zip(self.names, self.methods, strict=True)})

    # -- state and step -------------------------------------------------------------------------

    def init_state(
        self,
        tx: optax.GradientTransformation,
        seed: int,
        sample: np.ndarray,
        sampler_state: dict | None = None,
    ) -> TrainState:
        """The state at step 0 (``jdml.step.init_state``, or the cohort's), placed as the step
        takes it."""
        if not self.cohort:
            state = plain.init_state(self.method, tx, seed, sample, sampler_state)
            return self.layout.place_state(state)
        return cohort_step.init_state(self.plan, tx, seed, sample, sampler_state)

    def make_train_step(
        self, tx: optax.GradientTransformation, state: TrainState, views: Any = None
    ) -> StepFn:
        """The jitted, state-donating step ``(state, batch) -> (state, metrics)``
        (``jdml.step.jit_step``) of a plain run or of the cohort; ``views``: the run's device
        views, made first. ``state`` (an example of the state) is needed on a mesh only."""
        layout = self.layout
        if self.cohort:
            body = cohort_step.stored_step(self.plan, tx, state)
        else:
            body = functools.partial(plain.train_step, self.method, tx)
        if not layout.on_mesh:
            return jit_step(body, views)
        # Fixed output shardings: the returned state is placed exactly as the state it replaces
        # (on a one-device member axis the compiler would otherwise pick an equivalent spec and
        # the second call would compile again).
        shardings = layout.state_shardings(state)
        return jit_step(body, views, shardings, layout.place_batch, layout.replicated)

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """For filling the DaNCE queues: ``keys(ema, batch_stats, images)`` of every member's
        key network on host images (``(B, dim)``, or ``(L, B, dim)`` replicated for a cohort),
        and ``push(queue, keys, labels)`` into every member's queue, placed as the state."""
        method = self.method
        layout = self.layout
        if not layout.on_mesh:
            return jax.jit(lambda e, s, x: method.embed_keys(e, s, x)[head]), push
        if not self.cohort:
            keys_fn = jax.jit(
                lambda e, s, x: method.embed_keys(e, s, x)[head], out_shardings=layout.replicated
            )
            push_fn = jax.jit(push, out_shardings=layout.replicated)
            return (
                lambda e, s, x: keys_fn(e, s, layout.replicate(x)),
                lambda q, k, y: push_fn(q, layout.replicate(k), layout.replicate(y)),
            )
        members = NamedSharding(layout.mesh, P(AXIS))

        def keys(ema: Any, batch_stats: Any, images: jax.Array) -> jax.Array:
            embed = lambda e, s: method.embed_keys(e, s, images)[head]  # noqa: E731
            return over_members(embed, self.loop, ema, batch_stats)

        keys_fn = jax.jit(keys, out_shardings=layout.replicated)
        push_fn = jax.jit(jax.vmap(push, (0, 0, None)), out_shardings=members)

        def embed_keys(ema: Any, batch_stats: Any, images: Any) -> jax.Array:
            return keys_fn(ema, batch_stats, layout.replicate(images))

        def push_keys(queue: Any, new_keys: np.ndarray, labels: np.ndarray) -> Any:
            return push_fn(queue, layout.replicate(new_keys), layout.replicate(labels))

        return embed_keys, push_keys

    # -- embeddings -----------------------------------------------------------------------------

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Eval-mode embeddings ``{name: (B, dim)}`` of every name of ``embedding_names``: each
        group's members embedded as the step runs them (``cohort.member_loop``)."""
        layout, out, index = self.layout, {}, 0
        groups = zip(
            self.plan.methods,
            layout.split(params),
            layout.split(batch_stats),
            strict=True,
        )
        for method, group_params, group_stats in groups:
            embed = lambda p, s, method=method: method.embed(p, s, images)  # noqa: E731
            embedded = over_members(embed, self.loop, group_params, group_stats)
            for i in range(index, index + jax.tree.leaves(group_params)[0].shape[0]):
                for head, emb in embedded.items():
                    out[self._embedding_name(i, method, head)] = emb[i - index]
            index = i + 1
        return out

    def _embedding_name(self, index: int, method: Method, head: str) -> str:
        """A head's name in ``embedding_names``: the head itself for one member, else
        ``member<l>`` for the member's main head and ``member<l>/<head>`` for the others."""
        if not self.cohort:
            return head
        return member_name(index) + ("" if head == method.head else f"/{head}")

    def make_embed_fn(self) -> Callable[[Any, Any, Any], dict[str, jax.Array]]:
        """``embed`` jitted, taking host images (the same in every process). On a mesh the
        images are split over the data axis (zero rows pad them to a multiple of its size;
        eval-mode embeddings are per image), so each device embeds its share, and the outputs
        are replicated: every process gets every member's embeddings."""
        layout = self.layout
        if not layout.on_mesh:
            return jax.jit(self.embed)
        data = layout.mesh.shape[DATA]
        rows = NamedSharding(layout.mesh, P(DATA))

        def embed_rows(params: Any, batch_stats: Any, images: jax.Array, count: int):
            out = self.embed(params, batch_stats, images)
            return jax.tree.map(lambda x: x[..., :count, :], out)

        jitted = jax.jit(embed_rows, static_argnums=3, out_shardings=layout.replicated)

        def embed_fn(params: Any, batch_stats: Any, images: Any) -> dict[str, jax.Array]:
            images = np.asarray(images)
            count = len(images)
            if count % data:
                pad = np.zeros((data - count % data, *images.shape[1:]), images.dtype)
                images = np.concatenate([images, pad])
            placed = jax.make_array_from_callback(images.shape, rows, lambda i: images[i])
            return jitted(params, batch_stats, placed, count)

        return embed_fn


def build_program(
    config: ml_collections.ConfigDict,
    num_classes: int,
    steps_per_epoch: int = 1,
    backends: Backends | None = None,
) -> Program:
    """The program of a run config: its method (one per member of a heterogeneous cohort,
    ``cohort.members``) and members, computing with ``backends`` (None: the environment's,
    read when traced).

    Raises:
      ConfigError: for a config the method or the cohort cannot run.
    """
    groups = batch_norm_groups(config)
    configs = member_configs(config)
    build = functools.partial(Method, num_classes=num_classes, bn_groups=groups, backends=backends)
    methods = tuple(build(c) for c in configs)
    method = methods[0] if methods else build(config)
    return Program(config, method, steps_per_epoch, methods=methods)
