"""DM2 cohorts: L members of any method trained together, exchanging relation matrices.

Park, Kim, You, Cho, "Diversified Mutual Learning for Deep Metric Learning" (DM2):

* every member is a full model of the base method (the Revisiting baseline, DiVA, ...); their
  params, optimiser states, batch statistics and method states (EMA keys, queues) are stacked on a
  leading member axis and trained by one jitted step (the members of a device traced one after
  the other into it, ``cohort.member_loop="unroll"``, or vectorised, ``"vmap"``);
* member ``l`` minimises its own loss plus ``lambda * L^l_DM2`` (``jdml.losses.mutual``), with the
  peers' relation matrices as constants, so the gradient of the summed cohort loss with respect
  to member ``l``'s params is exactly the gradient of its own objective (Algorithm 1);
* model diversity: each member's embedding layers get their own random initialisation (the
  backbone starts from the same weights, as a pretrained one would);
* temporal diversity: member ``l`` (1-based) applies its update with probability ``2^-(l-1)``; a
  skipped member keeps params, optimiser state, batch statistics and method state unchanged;
* view diversity: each member sees its own augmentation of the same images.

The member axis is the ``member`` axis of a device mesh: ``jax.shard_map`` gives each device its
block of members; the relation matrices (B x B per member) are all-gathered. On one device the
same code runs with the whole cohort in one block. A second mesh axis ``data`` (left to the
compiler's automatic partitioning) splits each member's batch over ``cohort.data_devices``
devices: data parallelism within a member, with the same results as on one device.

Member 1 starts as the plain run of the same config and seed (same init, same batches and
augmentations, same randomness); with lambda = 0 and no temporal diversity every member equals
an independent run from its own initialisation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jdml.distributed import global_array
from jdml.errors import ConfigError
from jdml.losses.mutual import mutual_losses, mutual_weight, relation_matrix
from jdml.methods.ema_queue import push
from jdml.methods.method import Method
from jdml.samplers.memory import update_memory
from jdml.state import TrainState

AXIS = "member"
DATA = "data"  # splits each member's batch (automatic partitioning)
VIEWS = ("images", "images_b")  # batch entries with a member axis under view diversity
_TEMPORAL_TAG = 0x7D  # folded into a member's step key for its temporal-diversity draw

StepFn = Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]


def member_name(index: int) -> str:
    """The evaluation name of member ``index`` (0-based) : ``member1``, ``member2``, ..."""
    return f"member{index + 1}"


def update_probabilities(size: int, temporal: bool) -> np.ndarray:
    """Per-member update probability: ``2^-(l-1)`` for l = 1..L with temporal diversity, else 1."""
    if not temporal:
        return np.ones(size, np.float32)
    return np.power(2.0, -np.arange(size)).astype(np.float32)


def cohort_mesh(size: int, devices: int, data_devices: int = 1) -> Mesh:
    """A ``(member, data)`` mesh: ``devices`` devices on the member axis (0: as many as divide
    ``size``), each member's batch split over ``data_devices`` devices.

    Raises:
      ConfigError: if ``devices`` does not divide the cohort size, or the mesh needs more devices
        than there are.
    """
    available = jax.devices()
    data_devices = max(1, data_devices)
    if devices <= 0:
        fits = len(available) // data_devices
        devices = max(d for d in range(1, max(1, min(size, fits)) + 1) if size % d == 0)
    if devices * data_devices > len(available) or size % devices:
        raise ConfigError(
            f"cohort.devices={devices} must divide cohort.size={size}, and cohort.devices x "
            f"cohort.data_devices={data_devices} be at most the {len(available)} device(s) "
            "present; use cohort.devices=0 to choose automatically"
        )
    grid = np.asarray(available[: devices * data_devices]).reshape(devices, data_devices)
    return Mesh(grid, (AXIS, DATA))


def _stack(trees: list[Any]) -> Any:
    return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def _select(mask: jax.Array, new: Any, old: Any) -> Any:
    """Per member: ``new`` where ``mask`` (shape (L,)) else ``old``, for stacked trees."""

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


def over_members(fn: Callable[..., Any], loop: str, *args: Any) -> Any:
    """Applies ``fn`` to each member's slice of ``args`` (leading member axis), stacking outputs.

    ``"unroll"`` traces the members of a device one after the other into the step (compile time
    grows with their number; each runs ordinary convolutions). ``"vmap"`` vectorises them, which
    turns convolutions into grouped ones: worth trying on accelerators, but on XLA's CPU backend
    measured 2.6x slower than two separate networks already for two members (and a
    ``lax.map`` loop is worse still: convolution gradients inside a loop body ran 27x slower).
    """
    if loop == "vmap":
        return jax.vmap(fn)(*args)
    count = jax.tree.leaves(args)[0].shape[0]
    return _stack([fn(*jax.tree.map(lambda x, i=i: x[i], args)) for i in range(count)])


def _finite(tree: Any) -> jax.Array:
    """(L,) whether every leaf of a stacked tree is finite, per member."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.array(True)
    per_leaf = [jnp.all(jnp.isfinite(x.reshape(x.shape[0], -1)), axis=1) for x in leaves]
    return jnp.all(jnp.stack(per_leaf), axis=0)


class Cohort:
    """A DM2 cohort of ``config.cohort.size`` members of the configured method.

    Args:
      config: the full run config (its ``cohort`` section: size, mutual_weight, warmup_epochs,
        relation, model_diversity, temporal_diversity, view_diversity, devices, data_devices,
        member_loop; see ``jdml.config.base_config``).
      method: the base method every member runs.
      steps_per_epoch: for the length of lambda's warm-up.
    """

    def __init__(self, config: ml_collections.ConfigDict, method: Method, steps_per_epoch: int):
        c = config.cohort
        if len(method.phases) > 1:
            raise ConfigError(
                "a cohort trains one joint update per step; the method's config sets "
                f"phases={tuple(config.phases)}: use phases=() with cohort.size > 1"
            )
        self.base = method
        self.size = int(c.size)
        self.weight = float(c.mutual_weight)
        self.warmup_steps = round(c.warmup_epochs * steps_per_epoch)
        self.relation = c.relation
        self.loop = c.member_loop
        self.model_diversity = bool(c.model_diversity)
        self.view_diversity = bool(c.view_diversity)
        self.probabilities = update_probabilities(self.size, bool(c.temporal_diversity))
        self.mesh = cohort_mesh(self.size, int(c.devices), int(c.data_devices))
        self.replicated = NamedSharding(self.mesh, P())
        self.head = member_name(0)
        self.heads = tuple(member_name(i) for i in range(self.size))
        # Under view diversity the data pipeline draws one set of views per member (each
        # process for the members on its devices).
        self.members = self.local_members() if self.view_diversity else ()

    def local_members(self) -> tuple[int, ...]:
        """The members on this process's devices (all of them in a single-process run)."""
        block = self.size // self.mesh.devices.shape[0]
        me = jax.process_index()
        return tuple(
            i
            for d, row in enumerate(self.mesh.devices)
            if any(device.process_index == me for device in row)
            for i in range(d * block, (d + 1) * block)
        )

    # -- state ----------------------------------------------------------------------------------

    def init_state(
        self,
        tx: optax.GradientTransformation,
        seed: int,
        sample: np.ndarray,
        sampler_state: dict | None = None,
    ) -> TrainState:
        """The cohort at step 0; member 1 is exactly ``jdml.step.init_state`` of the plain run.

        With model diversity, member ``l > 1`` takes its embedding heads (``head_*``) from a
        model initialised with its own key and the rest of the model from member 1.
        """
        key = jax.random.PRNGKey(seed)
        images = jnp.asarray(sample)
        params0, stats0 = self.base.init(jax.random.fold_in(key, 0), images)
        rng0 = jax.random.fold_in(key, 1)
        members = []
        for i in range(self.size):
            params = params0
            if i > 0 and self.model_diversity:
                other, _ = self.base.init(jax.random.fold_in(jax.random.fold_in(key, 0), i), images)
                model = {
                    k: other["model"][k] if k.startswith("head_") else v
                    for k, v in params0["model"].items()
                }
                params = {**params0, "model": model}
            rng = rng0 if i == 0 else jax.random.fold_in(rng0, i)
            members.append(
                (params, stats0, tx.init(params), rng, self.base.init_method_state(params))
            )
        params, stats, opt_state, rng, method_state = (
            _stack([m[j] for m in members]) for j in range(5)
        )
        state = TrainState(
            step=jnp.zeros((), jnp.int32),
            params=params,
            batch_stats=stats,
            opt_state=opt_state,
            rng=rng,
            nonfinite=jnp.zeros((), jnp.int32),
            sampler_state=sampler_state or {},
            method_state=method_state,
        )
        return jax.device_put(state, self.state_shardings(state))

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
        """``NamedSharding``s placing each member's state on its device of the mesh."""
        return jax.tree.map(
            lambda spec: NamedSharding(self.mesh, spec),
            self._state_specs(state),
            is_leaf=lambda x: isinstance(x, P),
        )

    def member_state(self, state: TrainState, index: int) -> TrainState:
        """Member ``index``'s slice of a cohort state, as the state of a plain run."""
        take = lambda tree: jax.tree.map(lambda x: x[index], tree)  # noqa: E731
        return state.replace(
            params=take(state.params),
            batch_stats=take(state.batch_stats),
            opt_state=take(state.opt_state),
            rng=state.rng[index],
            method_state=take(state.method_state),
        )

    # -- the step -------------------------------------------------------------------------------

    def _member_batch(self, batch: dict[str, jax.Array]) -> tuple[dict, dict]:
        """Splits a batch into per-member arrays (views, leading member axis) and shared ones."""
        per_member = {k: v for k, v in batch.items() if k in VIEWS and self.view_diversity}
        shared = {k: v for k, v in batch.items() if k not in per_member}
        return per_member, shared

    def _local_step(
        self, tx: optax.GradientTransformation, state: TrainState, batch: dict[str, jax.Array]
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        """One step of this device's block of members (inside ``shard_map``)."""
        base = self.base
        local = state.rng.shape[0]
        offset = jax.lax.axis_index(AXIS) * local
        gather = lambda x: jax.lax.all_gather(x, AXIS, tiled=True)  # noqa: E731
        keys = jax.vmap(lambda r: jax.random.fold_in(r, state.step))(state.rng)
        per_member, shared = self._member_batch(batch)
        lam = mutual_weight(state.step, self.weight, self.warmup_steps)

        def member_loss(params, stats, views, key, method_state):
            return base.loss_fn(params, stats, {**shared, **views}, key, method_state, None)

        def cohort_loss(params):
            losses, aux = over_members(
                member_loss,
                self.loop,
                params,
                state.batch_stats,
                per_member,
                keys,
                state.method_state,
            )
            embeddings = aux[2]
            if self.weight == 0.0:  # members trained side by side: nothing to exchange
                mutual = jnp.zeros_like(losses)
            else:
                psi = jax.vmap(relation_matrix)(embeddings)
                everyone = gather(jax.lax.stop_gradient(psi))
                mutual = mutual_losses(psi, everyone, offset, self.relation)
            totals = losses + lam * mutual
            return jnp.sum(totals), (totals, losses, mutual, aux)

        grads, (totals, losses, mutual, aux) = jax.grad(cohort_loss, has_aux=True)(state.params)
        new_stats, metrics, embeddings, outputs = aux
        updates, opt_state = jax.vmap(tx.update)(grads, state.opt_state, state.params)
        params = jax.vmap(optax.apply_updates)(state.params, updates)
        ok = jnp.isfinite(totals) & _finite(grads) & _finite(params)
        all_ok = jnp.all(gather(ok))
        probs = jnp.asarray(self.probabilities)[offset + jnp.arange(local)]
        draws = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, _TEMPORAL_TAG)))(keys)
        apply = all_ok & (draws < probs)
        method_state = jax.vmap(base.update_method_state, (0, 0, 0, None))(
            state.method_state, params, outputs, shared["labels"]
        )
        sampler_state = state.sampler_state
        if "memory" in sampler_state:
            sampler_state = update_memory(
                sampler_state, shared.get("indices"), gather(embeddings)[0]
            )
        new_state = state.replace(
            step=state.step + 1,
            params=_select(apply, params, state.params),
            opt_state=_select(apply, opt_state, state.opt_state),
            batch_stats=_select(apply, new_stats, state.batch_stats),
            method_state=_select(apply, method_state, state.method_state),
            nonfinite=state.nonfinite + (~all_ok).astype(jnp.int32),
            sampler_state=sampler_state,
        )
        out = {k: jnp.mean(gather(v)) for k, v in metrics.items()}
        everyone_losses, everyone_mutual = gather(losses), gather(mutual)
        updated = gather(apply).astype(jnp.float32)
        for i in range(self.size):
            out[f"{member_name(i)}/loss"] = everyone_losses[i]
            out[f"{member_name(i)}/mutual"] = everyone_mutual[i]
            out[f"{member_name(i)}/updated"] = updated[i]
        out["loss"] = jnp.mean(gather(totals))
        out["mutual/loss"] = jnp.mean(everyone_mutual)
        out["mutual/weight"] = lam
        out["updated_fraction"] = jnp.mean(updated)
        return new_state, out

    def replicate(self, host: Any) -> jax.Array:
        """A host array as a global array replicated on every device of the mesh."""
        host = np.asarray(host)
        return global_array(host, self.replicated, host.shape)

    def place_batch(self, batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """The batch as global arrays: views on the member axis (each process supplies its own
        members' views) under view diversity, the batch axis on the data axis."""
        out = {}
        for key, value in batch.items():
            value = np.asarray(value)
            if key in VIEWS and self.view_diversity:
                spec, shape = P(AXIS, DATA), (self.size, *value.shape[1:])
            else:
                spec, shape = P(DATA), value.shape
            sharding = NamedSharding(self.mesh, spec)
            out[key] = global_array(value, sharding, shape)
        return out

    def make_train_step(self, tx: optax.GradientTransformation, state: TrainState) -> StepFn:
        """The jitted, state-donating cohort step ``(state, batch) -> (state, metrics)``; host
        batches are placed on the mesh first (``place_batch``)."""
        specs = self._state_specs(state)
        per_member = P(AXIS) if self.view_diversity else P()

        def batch_specs(batch: dict[str, jax.Array]) -> dict[str, P]:
            return {k: per_member if k in VIEWS else P() for k in batch}

        def step(state: TrainState, batch: dict[str, jax.Array]):
            sharded = jax.shard_map(
                lambda s, b: self._local_step(tx, s, b),
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
        jitted = jax.jit(step, donate_argnums=0, out_shardings=(shardings, self.replicated))
        return _PlacedStep(jitted, self.place_batch, shardings)

    def key_functions(self, head: str) -> tuple[Callable, Callable]:
        """For filling the DaNCE queues: ``(keys(ema, batch_stats, images) -> (L, B, dim)``
        of every member's key network on host images, replicated; ``push(queue, keys, labels)``
        into every member's queue, placed as the state)."""
        members = NamedSharding(self.mesh, P(AXIS))

        def keys(ema: Any, batch_stats: Any, images: jax.Array) -> jax.Array:
            embed = lambda e, s: self.base.embed_keys(e, s, images)[head]  # noqa: E731
            return over_members(embed, self.loop, ema, batch_stats)

        keys_fn = jax.jit(keys, out_shardings=self.replicated)
        push_fn = jax.jit(jax.vmap(push, (0, 0, None)), out_shardings=members)

        def embed_keys(ema: Any, batch_stats: Any, images: Any) -> jax.Array:
            return keys_fn(ema, batch_stats, self.replicate(images))

        def push_keys(queue: Any, new_keys: np.ndarray, labels: np.ndarray) -> Any:
            return push_fn(queue, self.replicate(new_keys), self.replicate(labels))

        return embed_keys, push_keys

    # -- evaluation -----------------------------------------------------------------------------

    def make_embed_fn(self) -> Callable[[Any, Any, Any], dict[str, jax.Array]]:
        """``embed`` jitted with replicated outputs (every process gets every member's
        embeddings), taking host images."""
        jitted = jax.jit(self.embed, out_shardings=self.replicated)

        def embed_fn(params: Any, batch_stats: Any, images: Any) -> dict[str, jax.Array]:
            return jitted(params, batch_stats, self.replicate(images))

        return embed_fn

    def embed(self, params: Any, batch_stats: Any, images: jax.Array) -> dict[str, jax.Array]:
        """Eval-mode embeddings of every member: ``member<l>`` (its main head) and
        ``member<l>/<head>`` (its other heads), each (B, dim)."""
        embed = lambda p, s: self.base.embed(p, s, images)  # noqa: E731
        out = over_members(embed, self.loop, params, batch_stats)
        named = {}
        for i in range(self.size):
            for head, emb in out.items():
                suffix = "" if head == self.base.head else f"/{head}"
                named[member_name(i) + suffix] = emb[i]
        return named


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
