"""The state constructor and the train step of a cohort (``cohort.size > 1``).

The members of a cohort (``jdml.cohort.layout.Layout``) are groups, each stacked on a leading member
axis and run by one method: a stacked DM2 cohort is one group of L, a heterogeneous cohort L
groups of one. The step converts the stored state into groups, runs the plain method's loss over
each member (``jdml.step`` is the plain run's step; its parts are reused here), and stores the
result again:

* each phase (one by default; Sharing Matters' alternating variant has two, each on its own data
  stream) takes the gradient of the members' summed losses, where member l's loss is its
  method's plus ``lambda * value_l`` of the cohort's exchange (``jdml.cohort.exchanges``; DM2: the
  relation matrices), the peers' contributions constants, so that the gradient for member l's
  params is that of its own objective (DM2, Algorithm 1);
* a step whose loss, gradients or params are not finite for any member leaves every member
  unchanged and increments ``nonfinite``; a member skipped by its temporal-diversity draw is left
  unchanged;
* the method states (DaNCE's EMA and queue) and the sampler memory are updated in the step.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from jdml.cohort.exchanges import EXCHANGE_STATE, Exchange, MemberOutputs, Peers
from jdml.cohort.layout import MEMBER_FIELDS, Groups, Layout
from jdml.cohort.members import VIEWS, member_name, over_members
from jdml.mesh import AXIS
from jdml.methods.method import LossAux, Method
from jdml.samplers.memory import update_memory
from jdml.state import TrainState, zeros_state
from jdml.step import all_finite, keep_where, only_groups, phase_key, phases_metrics

#: (L,): whether every value of member l in a tree with a leading member axis is finite.
finite_per_member = functools.partial(all_finite, members=True)

_TEMPORAL_TAG = 0x7D  # folded into a member's step key for its temporal-diversity draw


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """What the step trains: the layout, each group's method, and how the members interact.

    Attributes:
      layout: the members and their placement.
      methods: the method of each group (``layout.group_sizes``).
      exchange: what the members exchange.
      loop: ``cohort.member_loop`` (``jdml.cohort.members.over_members``).
      probabilities: (L,) each member's update probability (the exchange's temporal
        diversity).
      model_diversity: whether member l > 1 draws its embedding heads (a listed member: its
        whole network) from its own key (the exchange's model diversity).
    """

    layout: Layout
    methods: tuple[Method, ...]
    exchange: Exchange
    loop: str
    probabilities: np.ndarray
    model_diversity: bool


def concat(parts: list[jax.Array]) -> jax.Array:
    """The groups' (n_g, ...) arrays as one (L_local, ...) array (one group: itself)."""
    return parts[0] if len(parts) == 1 else jnp.concatenate(parts)


def init_state(
    plan: StepPlan,
    tx: optax.GradientTransformation,
    seed: int,
    sample: np.ndarray,
    sampler_state: dict | None = None,
) -> TrainState:
    """The state at step 0, placed as the step takes it.

    Member 1 is the same for every run (a plain run of the config and seed). Member l > 1
    initialises from member 1's key, or with model diversity from its own: the members of a
    group then take everything but their embedding heads (``head_*``) from the group's first
    member (one backbone start, as a pretrained one would be), a member alone in its group
    (heterogeneous cohorts) its whole network.
    """
    layout = plan.layout
    key = jax.random.PRNGKey(seed)
    images = jnp.asarray(sample)
    init_key, rng0 = jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)
    fields: dict[str, list[Any]] = {f: [] for f in MEMBER_FIELDS if f != "opt_state"}
    index = 0
    for method, size in zip(plan.methods, layout.group_sizes, strict=True):
        first = index
        for i in range(index, index + size):
            own = i > 0 and plan.model_diversity
            if i == first:
                params, stats = method.init(
                    jax.random.fold_in(init_key, i) if own else init_key, images
                )
            else:
                params, stats = fields["params"][first], fields["batch_stats"][first]
                if own:
                    other, _ = method.init(jax.random.fold_in(init_key, i), images)
                    model = {
                        k: other["model"][k] if k.startswith("head_") else v
                        for k, v in params["model"].items()
                    }
                    params = {**params, "model": model}
            fields["params"].append(params)
            fields["batch_stats"].append(stats)
            fields["rng"].append(rng0 if i == 0 else jax.random.fold_in(rng0, i))
            method_state = method.init_method_state(params)
            exchanged = plan.exchange.init_state(params)
            if exchanged is not None:
                method_state = {**method_state, EXCHANGE_STATE: exchanged}
            fields["method_state"].append(method_state)
        index += size
    state = zeros_state(
        sampler_state,
        opt_state=layout.init_optimizer(tx, fields["params"]),
        **{f: layout.store(v) for f, v in fields.items()},
    )
    return layout.place_state(state)


def temporal_draws(
    probabilities: np.ndarray, keys: jax.Array, offset: jax.Array | int
) -> jax.Array:
    """(L_local,) bool: which members apply their update this step (temporal diversity:
    member l with probability ``2^-(l-1)``; all of them without it)."""
    local = keys.shape[0]
    if not np.any(probabilities < 1.0):
        return jnp.ones((local,), bool)
    probs = jnp.asarray(probabilities)[offset + jnp.arange(local)]
    tag = lambda k: jax.random.fold_in(k, _TEMPORAL_TAG)  # noqa: E731
    return jax.vmap(lambda k: jax.random.uniform(tag(k)))(keys) < probs


def cohort_metrics(
    metric: str, totals: jax.Array, losses: jax.Array, exchanged: jax.Array, applied: jax.Array
) -> dict[str, jax.Array]:
    """Per member its loss, exchanged term and whether it updated, and the cohort's means
    (every argument (L,) over the whole cohort)."""
    updated = applied.astype(jnp.float32)
    out = {}
    for i in range(totals.shape[0]):
        out[f"{member_name(i)}/loss"] = losses[i]
        out[f"{member_name(i)}/{metric}"] = exchanged[i]
        out[f"{member_name(i)}/updated"] = updated[i]
    out["loss"] = jnp.mean(totals)
    out[f"{metric}/loss"] = jnp.mean(exchanged)
    out["updated_fraction"] = jnp.mean(updated)
    return out


def _slices(sizes: tuple[int, ...]) -> list[slice | None]:
    """Each group's rows of a (L_local, ...) array; None for a group that is all of them."""
    if len(sizes) == 1:
        return [None]
    starts = np.cumsum((0, *sizes))
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(starts)]


def _take(x: Any, rows: slice | None) -> Any:
    return x if rows is None else jax.tree.map(lambda a: a[rows], x)


class MembersAux(NamedTuple):
    """What the members' loss gives besides its sum (every array (L_local,) over this device's
    members).

    Attributes:
      total: each member's objective: its method's loss plus lambda times the exchanged value.
      loss: each member's method loss.
      exchanged: the exchange's value of each member.
      groups: each group's :class:`jdml.methods.method.LossAux`.
      exchange_state: each group's new exchange state (None without one).
    """

    total: jax.Array
    loss: jax.Array
    exchanged: jax.Array
    groups: tuple[LossAux, ...]
    exchange_state: tuple[Any, ...] | None = None


@dataclasses.dataclass(frozen=True)
class StepContext:
    """What every part of one step reads.

    Attributes:
      plan: what the step trains.
      state: the state the step starts from (its member fields in groups).
      keys: each group's (n_g,) step keys.
      rows: each group's rows of a (L_local, ...) array (:func:`_slices`).
      offset: this device's first member (0 unless the cohort is sharded).
      gather: all-gathers a (L_local, ...) array over the member axis (identity unsharded).
      views: the batch entries each member views on its own (view diversity).
      shared: the other batch entries.
      lam: the exchange's weight at this step.
      peers: what the exchange needs of the other members.
    """

    plan: StepPlan
    state: TrainState
    keys: tuple[jax.Array, ...]
    rows: list[slice | None]
    offset: jax.Array | int
    gather: Callable[[jax.Array], jax.Array]
    views: dict[str, jax.Array]
    shared: dict[str, jax.Array]
    lam: jax.Array
    peers: Peers

    @property
    def local(self) -> int:
        """The members on this device."""
        return sum(r.shape[0] for r in self.state.rng)


def step_context(plan: StepPlan, state: TrainState, batch: dict[str, jax.Array]) -> StepContext:
    """The :class:`StepContext` of one step of ``state`` on ``batch``."""
    layout, exchange = plan.layout, plan.exchange
    sharded = layout.sharded
    gather = (lambda x: jax.lax.all_gather(x, AXIS, tiled=True)) if sharded else (lambda x: x)
    sizes = tuple(r.shape[0] for r in state.rng)
    offset = jax.lax.axis_index(AXIS) * sum(sizes) if sharded else 0
    keys = tuple(jax.vmap(lambda r: jax.random.fold_in(r, state.step))(r) for r in state.rng)
    views = {k: v for k, v in batch.items() if k in VIEWS and layout.view_diversity}
    return StepContext(
        plan=plan,
        state=state,
        keys=keys,
        rows=_slices(sizes),
        offset=offset,
        gather=gather,
        views=views,
        shared={k: v for k, v in batch.items() if k not in views},
        lam=exchange.weight(state.step),
        peers=Peers(gather=gather, offset=offset, size=layout.size),
    )


def members_loss(
    ctx: StepContext,
    params: Groups,
    stats: Groups,
    keys: tuple[jax.Array, ...],
    batch: dict[str, jax.Array],
    phase: tuple[str, ...] | None,
) -> tuple[jax.Array, MembersAux]:
    """The sum of the members' objectives in one phase, and the :class:`MembersAux`."""
    plan, exchange = ctx.plan, ctx.plan.exchange
    group_losses, auxes = [], []
    for g, method in enumerate(plan.methods):

        def member_loss(p_, s_, views_, key, method_state, method=method):
            return method.loss_fn(p_, s_, {**batch, **views_}, key, method_state, phase)

        loss, aux = over_members(
            member_loss,
            plan.loop,
            params[g],
            stats[g],
            _take(ctx.views, ctx.rows[g]),
            keys[g],
            ctx.state.method_state[g],
        )
        group_losses.append(loss)
        auxes.append(aux)
    loss = concat(group_losses)
    value, exchange_state = jnp.zeros_like(loss), None  # inactive: members side by side
    if exchange.active:
        states = tuple(s.get(EXCHANGE_STATE) for s in ctx.state.method_state)
        outputs = MemberOutputs(
            embeddings=tuple(a.embeddings for a in auxes),
            params=params,
            labels=batch["labels"],
            state=None if states[0] is None else states,
        )
        value, exchange_state = exchange.losses(outputs, ctx.peers)
    total = loss + ctx.lam * value
    return jnp.sum(total), MembersAux(total, loss, value, tuple(auxes), exchange_state)


def phase_update(
    ctx: StepContext,
    tx: optax.GradientTransformation,
    index: int,
    phase: tuple[str, ...] | None,
    params: Groups,
    opt_state: Groups,
    stats: Groups,
) -> tuple[Groups, Groups, MembersAux, jax.Array]:
    """One optimiser update of the phase's terms: the new params and optimiser state (the
    groups the phase does not train kept), its :class:`MembersAux`, and (L_local,) whether each
    member's objective, gradients and params are finite."""
    methods = ctx.plan.methods
    batch = methods[0].phase_batch(ctx.shared, index)
    keys = tuple(jax.vmap(lambda k: phase_key(k, index))(k) for k in ctx.keys)
    loss = functools.partial(members_loss, ctx, stats=stats, keys=keys, batch=batch, phase=phase)
    grads, aux = jax.grad(loss, has_aux=True)(params)
    new_params, new_opt_state = ctx.plan.layout.update(tx, grads, opt_state, params)
    kept = [
        only_groups(
            method.phase_groups(phase), new_params[g], params[g], new_opt_state[g], opt_state[g]
        )
        for g, method in enumerate(methods)
    ]
    params, opt_state = tuple(p for p, _ in kept), tuple(o for _, o in kept)
    finite = concat([finite_per_member((g, p)) for g, p in zip(grads, params, strict=True)])
    return params, opt_state, aux, jnp.isfinite(aux.total) & finite


def commit(
    ctx: StepContext,
    params: Groups,
    opt_state: Groups,
    stats: Groups,
    outputs: list[dict[str, Any]],
    apply: jax.Array,
    all_ok: jax.Array,
    first: MembersAux,
) -> TrainState:
    """The state after the step: each member's new fields where ``apply`` holds (its old ones
    elsewhere), the method and exchange states and the sampler memory updated (``first``: the
    first phase's outputs), the step counted."""
    state = ctx.state
    new_fields: dict[str, list[Any]] = {f: [] for f in MEMBER_FIELDS if f != "rng"}
    for g, method in enumerate(ctx.plan.methods):
        mask = _take(apply, ctx.rows[g])
        method_state = jax.vmap(method.update_method_state, (0, 0, 0, None))(
            state.method_state[g], params[g], outputs[g], ctx.shared["labels"]
        )
        if first.exchange_state is not None:
            method_state = {**method_state, EXCHANGE_STATE: first.exchange_state[g]}
        new_fields["params"].append(keep_where(mask, params[g], state.params[g]))
        new_fields["opt_state"].append(keep_where(mask, opt_state[g], state.opt_state[g]))
        new_fields["batch_stats"].append(keep_where(mask, stats[g], state.batch_stats[g]))
        new_fields["method_state"].append(keep_where(mask, method_state, state.method_state[g]))
    return state.replace(
        step=state.step + 1,
        nonfinite=state.nonfinite + (~all_ok).astype(jnp.int32),
        sampler_state=update_memory(
            state.sampler_state,
            ctx.shared.get("indices"),
            ctx.gather(first.groups[0].embeddings)[0],
        ),
        **{f: tuple(v) for f, v in new_fields.items()},
    )


def step_metrics(
    ctx: StepContext, metrics: dict[str, jax.Array], first: MembersAux, apply: jax.Array
) -> dict[str, jax.Array]:
    """The step's metrics: each metric's mean over the members, the phases' losses summed, and
    the cohort's per-member losses and exchanged values (``first``: the first phase's)."""
    exchange, gather = ctx.plan.exchange, ctx.gather
    out = {k: jnp.mean(gather(v)) for k, v in metrics.items()}
    out = phases_metrics(out, len(ctx.plan.methods[0].phases))
    values = (gather(first.total), gather(first.loss), gather(first.exchanged), gather(apply))
    out.update(cohort_metrics(exchange.metric, *values))
    out[f"{exchange.metric}/weight"] = ctx.lam
    return out


def train_step(
    plan: StepPlan,
    tx: optax.GradientTransformation,
    state: TrainState,
    batch: dict[str, jax.Array],
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One step of the members in ``state``, whose member fields are groups (``Layout.split``):
    this device's block of a sharded cohort inside ``shard_map``, or all members."""
    ctx = step_context(plan, state, batch)
    phases = plan.methods[0].phases
    params, opt_state, stats = state.params, state.opt_state, state.batch_stats
    ok, metrics, outputs = jnp.ones((ctx.local,), bool), {}, [{} for _ in plan.methods]
    auxes: list[MembersAux] = []
    for i, phase in enumerate(phases):
        params, opt_state, aux, finite = phase_update(ctx, tx, i, phase, params, opt_state, stats)
        stats, ok = tuple(a.batch_stats for a in aux.groups), ok & finite
        prefix = "" if len(phases) == 1 else f"phase{i}/"
        for k in aux.groups[0].metrics:
            metrics[prefix + k] = concat([a.metrics[k] for a in aux.groups])
        for g, a in enumerate(aux.groups):
            outputs[g].update(a.outputs)
        auxes.append(aux)
    first = auxes[0]
    all_ok = jnp.all(ctx.gather(ok))
    apply = all_ok & temporal_draws(plan.probabilities, concat(list(ctx.keys)), ctx.offset)
    new_state = commit(ctx, params, opt_state, stats, outputs, apply, all_ok, first)
    return new_state, step_metrics(ctx, metrics, first, apply)


def stored_step(plan: StepPlan, tx: optax.GradientTransformation, state: TrainState | None):
    """The cohort's step on its stored state ``(state, batch) -> (state, metrics)``, to be
    jitted (``jdml.step.jit_step``): the state is split into groups and joined again (free
    reshapes); on a mesh, unless the members are listed, each device steps its members
    (``shard_map`` over the member axis; the data axis is left to the compiler, which splits the
    batch and gathers what the losses need). ``state`` (an example of the stored state) is
    needed on a mesh only."""
    layout = plan.layout
    body: Callable = functools.partial(train_step, plan, tx)
    if layout.sharded:
        specs = layout.state_specs(state)
        specs = specs.replace(**{f: (getattr(specs, f),) for f in MEMBER_FIELDS})
        per_member = P(AXIS) if layout.view_diversity else P()
        inner = body

        def body(state: TrainState, batch: dict[str, jax.Array]):
            sharded = jax.shard_map(
                inner,
                mesh=layout.mesh,
                in_specs=(specs, {k: per_member if k in VIEWS else P() for k in batch}),
                out_specs=(specs, P()),
                axis_names=frozenset({AXIS}),  # the data axis stays automatic
                check_vma=False,
            )
            return sharded(state, batch)

    def step(state: TrainState, batch: dict[str, jax.Array]):
        grouped = state.replace(**{f: layout.split(getattr(state, f)) for f in MEMBER_FIELDS})
        new, metrics = body(grouped, batch)
        return new.replace(**{f: layout.join(getattr(new, f)) for f in MEMBER_FIELDS}), metrics

    return step
