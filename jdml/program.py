"""The program of a run: one state constructor, one train step, and the run's embeddings.

Every run trains ``L >= 1`` members of its method (``jdml.methods.Method``). A plain run is the
program with one member; a DM2 cohort (``cohort.size > 1``, ``jdml.methods.cohort``) has several,
exchanging relation matrices. Both go through the same code:

* the state at step 0 is built member by member (``init_state``); member 1 of every program is
  the same state, and a one-member state is stored without a member axis, so a plain run's
  checkpoint holds the method's own parameter tree;
* the step (``make_train_step``) runs over a leading member axis: gradients of every member's
  loss (plus ``lambda * L_DM2`` against its peers' relation matrices in a cohort), the optimiser
  update per phase, the non-finite guard, the update mask (temporal diversity), the method state
  and the sampler memory. A one-member program adds the axis inside the jitted step and removes it
  again (free reshapes) and runs without a device mesh; a cohort places its members on the
  ``member`` axis of a mesh with ``jax.shard_map``;
* ``embedding_names``, ``eval_config``, ``parse_embedding`` and ``embed`` say which embeddings
  the program produces and how they are evaluated and combined, for the evaluator and for
  ``jdml.inference`` alike.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.distributed import global_array, local_rows
from jdml.errors import ConfigError
from jdml.losses.mutual import mutual_losses, mutual_weight, relation_matrix
from jdml.methods.cohort import (
    AXIS,
    DATA,
    VIEWS,
    cohort_mesh,
    member_configs,
    member_name,
    over_members,
    stack_members,
    update_probabilities,
)
from jdml.methods.ema_queue import push
from jdml.methods.method import Method
from jdml.optim import make_optimizer, per_member
from jdml.samplers.memory import update_memory
from jdml.state import TrainState

StepFn = Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]

ENSEMBLE = "ensemble"  # a cohort's concatenation of its members, for ``parse_embedding``
MEMBER_FIELDS = ("params", "batch_stats", "opt_state", "rng", "method_state")
_TEMPORAL_TAG = 0x7D  # folded into a member's step key for its temporal-diversity draw


def keep_where(mask: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``mask`` else ``old``, leaf by leaf; ``mask`` is (L,) over the leading
    member axis of the leaves, or a scalar for a whole tree."""

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b)

    return jax.tree.map(pick, new, old)


def all_finite(tree: Any) -> jax.Array:
    """Whether every value of every leaf of ``tree`` is finite (True for no leaves)."""
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)] or [True]))


def finite_per_member(tree: Any) -> jax.Array:
    """(L,): whether every value of member l in a tree with a leading member axis is finite."""
    if not jax.tree.leaves(tree):
        return jnp.array(True)
    return jax.vmap(all_finite)(tree)


def only_groups(
    groups: frozenset[str] | None, new_params: Any, params: Any, new_opt: Any, opt: Any
) -> tuple[Any, Any]:
    """Keeps the params and optimiser state of the groups a phase does not train unchanged
    (their gradient is zero, but Adam's momentum and the coupled weight decay would move them)."""
    if groups is None:
        return new_params, new_opt
    params = {k: new_params[k] if k in groups else params[k] for k in params}
    inner = {k: new_opt.inner_states[k] if k in groups else v for k, v in opt.inner_states.items()}
    return params, new_opt._replace(inner_states=inner)


class Program:
    """The members of a run (one, or a DM2 cohort), their state, step and embeddings.

    Two layouts of the members' state:

    * identical members (every cohort without ``cohort.members``): each field of the state
      stacked on a leading member axis, placed on the mesh's ``member`` axis;
    * a heterogeneous cohort (``cohort.members``, DM2's Table 5: other backbones or embedding
      sizes per member): each field a dict ``{member<l>: that member's tree}``, every member
      with its own method (``methods``) and optimiser; the members are traced one after the
      other into the one step, their relation matrices exchanged inside it, and the state is
      replicated over the devices of the data axis (each member's batch split over them).

    Args:
      config: the full run config (its ``cohort`` section; see ``jdml.config.base_config``).
      method: the method every member runs (member 1's in a heterogeneous cohort).
      steps_per_epoch: for the length of lambda's warm-up (training only).
      size: the number of members (default ``cohort.size``).
      methods: each member's method, for a heterogeneous cohort (see ``build_program``).
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
        self.heterogeneous = bool(self.methods)
        self.size = (
            len(self.methods) if self.methods else int(cohort.size if size is None else size)
        )
        self.names = tuple(member_name(i) for i in range(self.size))
        self.cohort = self.size > 1
        if self.cohort and len(method.phases) > 1:
            raise ConfigError(
                "a cohort trains one joint update per step; the method's config sets "
                f"phases={tuple(config.phases)}: use phases=() with cohort.size > 1"
            )
        self.weight = float(cohort.mutual_weight) if self.cohort else 0.0
        self.warmup_steps = round(cohort.warmup_epochs * steps_per_epoch)
        self.relation = cohort.relation
        self.loop = cohort.member_loop if self.cohort else "unroll"
        self.model_diversity = bool(cohort.model_diversity)
        self.view_diversity = bool(cohort.view_diversity) and self.cohort
        self.probabilities = update_probabilities(
            self.size, bool(cohort.temporal_diversity) and self.cohort
        )
        # The evaluated embedding: the method's main head, or member 1's.
        self.head = member_name(0) if self.cohort else method.head
        # A device mesh for a cohort and for data parallelism; one member on one device runs
        # without one.
        self.data_devices = int(config.parallel.data_devices) if size is None else 1
        self.on_mesh = (self.cohort and not self.heterogeneous) or self.data_devices != 1
        if self.heterogeneous and any(t.stateful for m in self.methods for t in m.terms.values()):
            raise ConfigError(
                "cohort.members (a heterogeneous cohort) with a term that keeps a state (DaNCE's "
                "key queue) is not supported; use identical members (cohort.members=()) or drop "
                "the DaNCE term"
            )

    # -- names ----------------------------------------------------------------------------------

    @functools.cached_property
    def embedding_names(self) -> tuple[str, ...]:
        """Every embedding ``embed`` returns: the method's heads, or per member ``member<l>``
        (its main head) and ``member<l>/<head>`` (its other heads)."""
        if not self.cohort:
            return tuple(self.method.heads)
        others = [h for h in self.method.heads if h != self.method.head]
        return tuple(
            member_name(i) + suffix
            for i in range(self.size)
            for suffix in ("", *(f"/{h}" for h in others))
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
            )

        if not self.heterogeneous:
            return of(self.method)
        return per_member({n: of(m) for n, m in zip(self.names, self.methods, strict=True)})

    # -- devices --------------------------------------------------------------------------------

    @functools.cached_property
    def mesh(self) -> Mesh | None:
        """The ``(member, data)`` mesh; None for one member on one device (built when first
        needed: inference embeds without it).

        Raises:
          ConfigError: if the mesh does not fit the devices present, or its data axis does not
            divide the batch.
        """
        if not self.on_mesh:
            return None
        if self.heterogeneous:  # every member on every device of the data axis
            mesh = cohort_mesh(1, 1, self.data_devices)
        else:
            mesh = cohort_mesh(self.size, int(self.config.cohort.devices), self.data_devices)
        batch, data = int(self.config.train.batch_size), mesh.shape[DATA]
        if batch % data:
            raise ConfigError(
                f"the mesh's data axis has {data} devices (parallel.data_devices="
                f"{self.data_devices}), which do not divide train.batch_size={batch}; set "
                "parallel.data_devices to a divisor of the batch size"
            )
        return mesh

    @functools.cached_property
    def replicated(self) -> NamedSharding | None:
        return NamedSharding(self.mesh, P()) if self.on_mesh else None

    @functools.cached_property
    def members(self) -> tuple[int, ...]:
        """The members whose views this process draws: those on its devices under view
        diversity, else none (every member trains on the one batch)."""
        if not self.view_diversity:
            return ()
        if self.heterogeneous:  # every process holds every member
            return tuple(range(self.size))
        block = self.size // self.mesh.devices.shape[0]
        me = jax.process_index()
        return tuple(
            i
            for d, row in enumerate(self.mesh.devices)
            if any(device.process_index == me for device in row)
            for i in range(d * block, (d + 1) * block)
        )

    @functools.cached_property
    def rows(self) -> tuple[int, int] | None:
        """The rows of the global batch this process builds (multi-host input: those of its
        devices on the data axis); None when it builds all of them."""
        if not self.on_mesh or jax.process_count() == 1:
            return None
        sharding = NamedSharding(self.mesh, P(DATA))
        start, stop = local_rows(sharding, int(self.config.train.batch_size))
        return None if (start, stop) == (0, int(self.config.train.batch_size)) else (start, stop)

    def replicate(self, host: Any) -> Any:
        """A host array as the step takes it: replicated on the mesh (unchanged without one)."""
        if not self.on_mesh:
            return host
        host = np.asarray(host)
        return global_array(host, self.replicated, host.shape)

    def place_batch(self, batch: dict[str, Any]) -> dict[str, Any]:
        """The batch as global arrays on the mesh: views on the member axis (each process
        supplies its own members' views) under view diversity, the batch axis on the data axis;
        unchanged without a mesh."""
        if not self.on_mesh:
            return batch
        rows = int(self.config.train.batch_size)  # the global batch
        out = {}
        for key, value in batch.items():
            value = np.asarray(value)
            if key in VIEWS and self.view_diversity:
                member_axis = None if self.heterogeneous else AXIS
                spec, shape = P(member_axis, DATA), (self.size, rows, *value.shape[2:])
            else:
                spec, shape = P(DATA), (rows, *value.shape[1:])
            out[key] = global_array(value, NamedSharding(self.mesh, spec), shape)
        return out

    # -- state ----------------------------------------------------------------------------------

    def init_state(
        self,
        tx: optax.GradientTransformation,
        seed: int,
        sample: np.ndarray,
        sampler_state: dict | None = None,
    ) -> TrainState:
        """The state at step 0. Member 1 is the same for every program; with model diversity,
        member ``l > 1`` takes its embedding heads (``head_*``) from a model initialised with
        its own key and the rest of the model from member 1. One member: no member axis."""
        key = jax.random.PRNGKey(seed)
        images = jnp.asarray(sample)
        if self.heterogeneous:
            return self._init_members(tx, key, images, sampler_state)
        params0, stats0 = self.method.init(jax.random.fold_in(key, 0), images)
        rng0 = jax.random.fold_in(key, 1)
        members = []
        for i in range(self.size):
            params = params0
            if i > 0 and self.model_diversity:
                other, _ = self.method.init(
                    jax.random.fold_in(jax.random.fold_in(key, 0), i), images
                )
                model = {
                    k: other["model"][k] if k.startswith("head_") else v
                    for k, v in params0["model"].items()
                }
                params = {**params0, "model": model}
            rng = rng0 if i == 0 else jax.random.fold_in(rng0, i)
            members.append(
                (params, stats0, tx.init(params), rng, self.method.init_method_state(params))
            )
        fields = (
            members[0]
            if not self.cohort
            else [stack_members([m[j] for m in members]) for j in range(5)]
        )
        state = TrainState(
            step=jnp.zeros((), jnp.int32),
            nonfinite=jnp.zeros((), jnp.int32),
            sampler_state=sampler_state or {},
            **dict(zip(MEMBER_FIELDS, fields, strict=True)),
        )
        return jax.device_put(state, self.state_shardings(state)) if self.on_mesh else state

    def _init_members(
        self,
        tx: optax.GradientTransformation,
        key: jax.Array,
        images: jax.Array,
        sampler_state: dict | None,
    ) -> TrainState:
        """The step-0 state of a heterogeneous cohort: each field ``{member<l>: tree}``. Member
        1 is initialised as a plain run of its config; with model diversity member ``l > 1``
        draws its whole network from its own key (without it, from member 1's key)."""
        fields: dict[str, dict[str, Any]] = {f: {} for f in MEMBER_FIELDS if f != "opt_state"}
        rng0 = jax.random.fold_in(key, 1)
        for i, (name, method) in enumerate(zip(self.names, self.methods, strict=True)):
            init_key = jax.random.fold_in(key, 0)
            if i > 0 and self.model_diversity:
                init_key = jax.random.fold_in(init_key, i)
            params, stats = method.init(init_key, images)
            fields["params"][name] = params
            fields["batch_stats"][name] = stats
            fields["rng"][name] = rng0 if i == 0 else jax.random.fold_in(rng0, i)
            fields["method_state"][name] = method.init_method_state(params)
        state = TrainState(
            step=jnp.zeros((), jnp.int32),
            nonfinite=jnp.zeros((), jnp.int32),
            sampler_state=sampler_state or {},
            opt_state=tx.init(fields["params"]),
            **fields,
        )
        return jax.device_put(state, self.state_shardings(state)) if self.on_mesh else state

    def _state_specs(self, state: TrainState) -> TrainState:
        """PartitionSpecs: member-stacked fields on the ``member`` axis, the rest replicated."""
        member = lambda tree: jax.tree.map(lambda _: P(AXIS), tree)  # noqa: E731
        shared = lambda tree: jax.tree.map(lambda _: P(), tree)  # noqa: E731
        return TrainState(
            step=P(),
            params=member(state.params),
            batch_stats=member(state.batch_stats),
            opt_state=member(state.opt_state),
            rng=P(AXIS),
            nonfinite=P(),
            sampler_state=shared(state.sampler_state),
            method_state=member(state.method_state),
        )

    def state_shardings(self, state: TrainState) -> TrainState:
        """``NamedSharding``s placing each member's state on its device of the mesh (replicated
        over the data axis); one member's state (no member axis) is replicated."""
        if not self.cohort or self.heterogeneous:
            return jax.tree.map(lambda _: self.replicated, state)
        return jax.tree.map(
            lambda spec: NamedSharding(self.mesh, spec),
            self._state_specs(state),
            is_leaf=lambda x: isinstance(x, P),
        )

    def member_state(self, state: TrainState, index: int) -> TrainState:
        """Member ``index``'s slice of the state, as the state of a one-member program."""
        if not self.cohort:
            return state
        if self.heterogeneous:
            name = self.names[index]
            return state.replace(**{f: getattr(state, f)[name] for f in MEMBER_FIELDS})
        take = lambda tree: jax.tree.map(lambda x: x[index], tree)  # noqa: E731
        return state.replace(**{f: take(getattr(state, f)) for f in MEMBER_FIELDS})

    # -- the step -------------------------------------------------------------------------------

    def _step(
        self, tx: optax.GradientTransformation, state: TrainState, batch: dict[str, jax.Array]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One step of the members in ``state`` (leading member axis): this device's block of a
        cohort inside ``shard_map``, or the one member of a plain run.

        Each phase (one by default; Sharing Matters' alternating variant has two, each on its own
        data stream) takes the gradient of the members' summed losses, where member l's loss
        is its method's plus ``lambda * L^l_DM2`` with its peers' relation matrices as constants,
        so that the gradient for member l's params is that of its own objective (DM2,
        Algorithm 1). A step whose loss, gradients or params are not finite for any member
        leaves every member unchanged and increments ``nonfinite``; a member skipped by its
        temporal-diversity draw is left unchanged.
        """
        method = self.method
        on_mesh = self.on_mesh
        gather = (lambda x: jax.lax.all_gather(x, AXIS, tiled=True)) if on_mesh else (lambda x: x)
        local = state.rng.shape[0]
        offset = jax.lax.axis_index(AXIS) * local if on_mesh else 0
        keys = jax.vmap(lambda r: jax.random.fold_in(r, state.step))(state.rng)
        per_member = {k: v for k, v in batch.items() if k in VIEWS and self.view_diversity}
        shared = {k: v for k, v in batch.items() if k not in per_member}
        lam = mutual_weight(state.step, self.weight, self.warmup_steps)
        params, opt_state, stats = state.params, state.opt_state, state.batch_stats
        ok = jnp.ones((local,), bool)
        metrics: dict[str, jax.Array] = {}
        outputs: dict[str, Any] = {}
        embeddings = totals = losses = mutual = None
        for i, phase in enumerate(method.phases):
            phase_batch = method.phase_batch(shared, i)
            phase_keys = keys if i == 0 else jax.vmap(lambda k, i=i: jax.random.fold_in(k, i))(keys)

            def member_loss(p, s, views, key, method_state, b=phase_batch, ph=phase):
                return method.loss_fn(p, s, {**b, **views}, key, method_state, ph)

            def members_loss(p, s=stats, k=phase_keys):
                loss, aux = over_members(
                    member_loss, self.loop, p, s, per_member, k, state.method_state
                )
                if self.weight == 0.0:  # one member, or members side by side: no exchange
                    exchange = jnp.zeros_like(loss)
                else:
                    psi = jax.vmap(relation_matrix)(aux[2])
                    everyone = gather(jax.lax.stop_gradient(psi))
                    exchange = mutual_losses(psi, everyone, offset, self.relation)
                total = loss + lam * exchange
                return jnp.sum(total), (total, loss, exchange, aux)

            grads, (total, loss, exchange, aux) = jax.grad(members_loss, has_aux=True)(params)
            stats, phase_metrics, emb, phase_outputs = aux
            updates, new_opt_state = jax.vmap(tx.update)(grads, opt_state, params)
            new_params = jax.vmap(optax.apply_updates)(params, updates)
            params, opt_state = only_groups(
                method.phase_groups(phase), new_params, params, new_opt_state, opt_state
            )
            ok = ok & jnp.isfinite(total) & finite_per_member(grads) & finite_per_member(params)
            prefix = "" if len(method.phases) == 1 else f"phase{i}/"
            metrics.update({prefix + k: v for k, v in phase_metrics.items()})
            outputs.update(phase_outputs)
            if i == 0:
                embeddings, totals, losses, mutual = emb, total, loss, exchange
        all_ok = jnp.all(gather(ok))
        apply = all_ok & self._temporal_draws(keys, offset)
        method_state = jax.vmap(method.update_method_state, (0, 0, 0, None))(
            state.method_state, params, outputs, batch["labels"]
        )
        new_state = state.replace(
            step=state.step + 1,
            params=keep_where(apply, params, state.params),
            opt_state=keep_where(apply, opt_state, state.opt_state),
            batch_stats=keep_where(apply, stats, state.batch_stats),
            method_state=keep_where(apply, method_state, state.method_state),
            nonfinite=state.nonfinite + (~all_ok).astype(jnp.int32),
            sampler_state=update_memory(
                state.sampler_state, shared.get("indices"), gather(embeddings)[0]
            ),
        )
        out = {k: jnp.mean(gather(v)) for k, v in metrics.items()}
        if len(method.phases) > 1:
            out["loss"] = sum(out[f"phase{i}/loss"] for i in range(len(method.phases)))
        if self.cohort:
            out.update(
                self._cohort_metrics(gather(totals), gather(losses), gather(mutual), gather(apply))
            )
            out["mutual/weight"] = lam
        return new_state, out

    def _members_step(
        self, tx: optax.GradientTransformation, state: TrainState, batch: dict[str, jax.Array]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One step of a heterogeneous cohort (state fields ``{member<l>: tree}``): the same
        objective as ``_step`` (member l's loss plus ``lambda * L^l_DM2`` against its peers'
        relation matrices as constants; the non-finite guard; temporal diversity), each member
        through its own method and optimiser, traced one after the other. The relation
        matrices (B x B whatever each member's embedding size) meet inside the step."""
        names, methods = self.names, self.methods
        keys = {n: jax.random.fold_in(state.rng[n], state.step) for n in names}
        views = {k: v for k, v in batch.items() if k in VIEWS and self.view_diversity}
        shared = {k: v for k, v in batch.items() if k not in views}
        lam = mutual_weight(state.step, self.weight, self.warmup_steps)

        def cohort_loss(params: dict[str, Any]):
            losses, auxes = [], {}
            for i, (n, method) in enumerate(zip(names, methods, strict=True)):
                member_batch = {**shared, **{k: v[i] for k, v in views.items()}}
                loss, auxes[n] = method.loss_fn(
                    params[n],
                    state.batch_stats[n],
                    member_batch,
                    keys[n],
                    state.method_state[n],
                    method.phases[0],
                )
                losses.append(loss)
            loss = jnp.stack(losses)
            if self.weight == 0.0:
                exchange = jnp.zeros_like(loss)
            else:
                psi = jnp.stack([relation_matrix(auxes[n][2]) for n in names])
                exchange = mutual_losses(psi, jax.lax.stop_gradient(psi), 0, self.relation)
            total = loss + lam * exchange
            return jnp.sum(total), (total, loss, exchange, auxes)

        grads, (total, loss, exchange, auxes) = jax.grad(cohort_loss, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ok = jnp.stack(
            [
                jnp.isfinite(total[i]) & all_finite(grads[n]) & all_finite(params[n])
                for i, n in enumerate(names)
            ]
        )
        all_ok = jnp.all(ok)
        apply = all_ok & self._temporal_draws(jnp.stack([keys[n] for n in names]), 0)
        new: dict[str, dict[str, Any]] = {f: {} for f in MEMBER_FIELDS if f != "rng"}
        for i, (n, method) in enumerate(zip(names, methods, strict=True)):
            stats, _, _, outputs = auxes[n]
            method_state = method.update_method_state(
                state.method_state[n], params[n], outputs, batch["labels"]
            )
            new["params"][n] = keep_where(apply[i], params[n], state.params[n])
            new["opt_state"][n] = keep_where(apply[i], opt_state[n], state.opt_state[n])
            new["batch_stats"][n] = keep_where(apply[i], stats, state.batch_stats[n])
            new["method_state"][n] = keep_where(apply[i], method_state, state.method_state[n])
        first = auxes[names[0]]
        new_state = state.replace(
            step=state.step + 1,
            nonfinite=state.nonfinite + (~all_ok).astype(jnp.int32),
            sampler_state=update_memory(state.sampler_state, shared.get("indices"), first[2]),
            **new,
        )
        out = {k: jnp.mean(jnp.stack([auxes[n][1][k] for n in names])) for k in first[1]}
        out.update(self._cohort_metrics(total, loss, exchange, apply))
        out["mutual/weight"] = lam
        return new_state, out

    def _temporal_draws(self, keys: jax.Array, offset: jax.Array | int) -> jax.Array:
        """(L_local,) bool: which members apply their update this step (temporal diversity:
        member l with probability ``2^-(l-1)``; all of them without it)."""
        local = keys.shape[0]
        if not np.any(self.probabilities < 1.0):
            return jnp.ones((local,), bool)
        probs = jnp.asarray(self.probabilities)[offset + jnp.arange(local)]
        tag = lambda k: jax.random.fold_in(k, _TEMPORAL_TAG)  # noqa: E731
        return jax.vmap(lambda k: jax.random.uniform(tag(k)))(keys) < probs

    def _cohort_metrics(
        self, totals: jax.Array, losses: jax.Array, mutual: jax.Array, applied: jax.Array
    ) -> dict[str, jax.Array]:
        """Per member its loss, DM2 term and whether it updated, and the cohort's means (every
        argument (L,) over the whole cohort)."""
        updated = applied.astype(jnp.float32)
        out = {}
        for i in range(self.size):
            out[f"{member_name(i)}/loss"] = losses[i]
            out[f"{member_name(i)}/mutual"] = mutual[i]
            out[f"{member_name(i)}/updated"] = updated[i]
        out["loss"] = jnp.mean(totals)
        out["mutual/loss"] = jnp.mean(mutual)
        out["updated_fraction"] = jnp.mean(updated)
        return out

    def make_train_step(self, tx: optax.GradientTransformation, state: TrainState) -> StepFn:
        """The jitted, state-donating step ``(state, batch) -> (state, metrics)``.

        One member's state has no member axis: it is added and removed inside the step. On a
        mesh, host batches are placed first (``place_batch``) and each device steps its members
        (``shard_map`` over the member axis; the data axis is left to the compiler, which splits
        the batch and gathers what the losses need).
        """

        def stacked(step: Callable) -> Callable:
            if self.cohort:
                return step

            def one(state: TrainState, batch: dict[str, jax.Array]):
                add = lambda x: x[None]  # noqa: E731
                drop = lambda x: x[0]  # noqa: E731
                new, metrics = step(
                    state.replace(
                        **{f: jax.tree.map(add, getattr(state, f)) for f in MEMBER_FIELDS}
                    ),
                    batch,
                )
                return new.replace(
                    **{f: jax.tree.map(drop, getattr(new, f)) for f in MEMBER_FIELDS}
                ), metrics

            return one

        if self.heterogeneous:
            step = functools.partial(self._members_step, tx)
            if not self.on_mesh:
                return jax.jit(step, donate_argnums=0)
            shardings = self.state_shardings(state)
            jitted = jax.jit(step, donate_argnums=0, out_shardings=(shardings, self.replicated))
            return _PlacedStep(jitted, self.place_batch, shardings)
        if not self.on_mesh:
            return jax.jit(stacked(lambda s, b: self._step(tx, s, b)), donate_argnums=0)

        specs = self._state_specs(state)  # the stacked state has the same structure
        per_member = P(AXIS) if self.view_diversity else P()

        def batch_specs(batch: dict[str, jax.Array]) -> dict[str, P]:
            return {k: per_member if k in VIEWS else P() for k in batch}

        def step(state: TrainState, batch: dict[str, jax.Array]):
            sharded = jax.shard_map(
                lambda s, b: self._step(tx, s, b),
                mesh=self.mesh,
                in_specs=(specs, batch_specs(batch)),
                out_specs=(specs, P()),
                axis_names=frozenset({AXIS}),  # the data axis stays automatic
                check_vma=False,
            )
            return sharded(state, batch)

        shardings = self.state_shardings(state)
        # Fixed output shardings: the returned state is placed exactly as the state it replaces
        # (on a one-device member axis the compiler would otherwise pick an equivalent spec and
        # the second call would compile again).
        jitted = jax.jit(
            stacked(step), donate_argnums=0, out_shardings=(shardings, self.replicated)
        )
        return _PlacedStep(jitted, self.place_batch, shardings)

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """For filling the DaNCE queues: ``keys(ema, batch_stats, images)`` of every member's
        key network on host images (``(B, dim)``, or ``(L, B, dim)`` replicated for a cohort),
        and ``push(queue, keys, labels)`` into every member's queue, placed as the state."""
        method = self.method
        if not self.on_mesh:
            return jax.jit(lambda e, s, x: method.embed_keys(e, s, x)[head]), push
        if not self.cohort:
            keys_fn = jax.jit(
                lambda e, s, x: method.embed_keys(e, s, x)[head], out_shardings=self.replicated
            )
            push_fn = jax.jit(push, out_shardings=self.replicated)
            return (
                lambda e, s, x: keys_fn(e, s, self.replicate(x)),
                lambda q, k, y: push_fn(q, self.replicate(k), self.replicate(y)),
            )
        members = NamedSharding(self.mesh, P(AXIS))

        def keys(ema: Any, batch_stats: Any, images: jax.Array) -> jax.Array:
            embed = lambda e, s: method.embed_keys(e, s, images)[head]  # noqa: E731
            return over_members(embed, self.loop, ema, batch_stats)

        keys_fn = jax.jit(keys, out_shardings=self.replicated)
        push_fn = jax.jit(jax.vmap(push, (0, 0, None)), out_shardings=members)

        def embed_keys(ema: Any, batch_stats: Any, images: Any) -> jax.Array:
            return keys_fn(ema, batch_stats, self.replicate(images))

        def push_keys(queue: Any, new_keys: np.ndarray, labels: np.ndarray) -> Any:
            return push_fn(queue, self.replicate(new_keys), self.replicate(labels))

        return embed_keys, push_keys

    # -- embeddings -----------------------------------------------------------------------------

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Eval-mode embeddings ``{name: (B, dim)}`` of every name of ``embedding_names``."""
        if not self.cohort:
            return self.method.embed(params, batch_stats, images)
        if self.heterogeneous:
            out = {}
            for i, (name, method) in enumerate(zip(self.names, self.methods, strict=True)):
                for head, emb in method.embed(params[name], batch_stats[name], images).items():
                    suffix = "" if head == method.head else f"/{head}"
                    out[member_name(i) + suffix] = emb
            return out
        embed = lambda p, s: self.method.embed(p, s, images)  # noqa: E731
        out = over_members(embed, self.loop, params, batch_stats)
        named = {}
        for i in range(self.size):
            for head, emb in out.items():
                suffix = "" if head == self.method.head else f"/{head}"
                named[member_name(i) + suffix] = emb[i]
        return named

    def make_embed_fn(self) -> Callable[[Any, Any, Any], dict[str, jax.Array]]:
        """``embed`` jitted, taking host images (the same in every process). On a mesh the
        images are split over the data axis (zero rows pad them to a multiple of its size;
        eval-mode embeddings are per image), so each device embeds its share, and the outputs
        are replicated: every process gets every member's embeddings."""
        if not self.on_mesh:
            return jax.jit(self.embed)
        data = self.mesh.shape[DATA]
        rows = NamedSharding(self.mesh, P(DATA))

        def embed_rows(params: Any, batch_stats: Any, images: jax.Array, count: int):
            out = self.embed(params, batch_stats, images)
            return jax.tree.map(lambda x: x[..., :count, :], out)

        jitted = jax.jit(embed_rows, static_argnums=3, out_shardings=self.replicated)

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
    config: ml_collections.ConfigDict, num_classes: int, steps_per_epoch: int = 1
) -> Program:
    """The program of a run config: its method (one per member of a heterogeneous cohort,
    ``cohort.members``) and members.

    Raises:
      ConfigError: for a config the method or the cohort cannot run.
    """
    configs = member_configs(config)
    methods = tuple(Method(c, num_classes=num_classes) for c in configs)
    method = methods[0] if methods else Method(config, num_classes=num_classes)
    return Program(config, method, steps_per_epoch, methods=methods)


def make_train_step(method: Method, tx: optax.GradientTransformation) -> StepFn:
    """The jitted, state-donating step of a one-member program of ``method`` (whatever its
    config's ``cohort.size``): the step of a plain run, e.g. on one member's slice of a cohort."""
    return Program(method.config, method, size=1).make_train_step(tx, None)


class _PlacedStep:
    """A jitted step taking host batches: places them on the mesh, then calls the step.

    The first call also places the state as the step returns it (``Run.prepare`` may have
    replaced parts of it), so that the step compiles once.
    """

    def __init__(self, jitted: Any, place: Callable[[dict], dict], shardings: Any) -> None:
        self.jitted, self.place, self.shardings = jitted, place, shardings
        self.placed = False

    def __call__(self, state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        if not self.placed:
            state, self.placed = jax.device_put(state, self.shardings), True
        return self.jitted(state, self.place(batch))

    def _cache_size(self) -> int:
        return self.jitted._cache_size()
