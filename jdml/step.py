"""The train step of a plain run: one network, one method, one optimiser.

The shape of Flax's ImageNet step: the gradient of the method's loss
(``jdml.methods.Method.loss_fn``: the terms the config names, e.g. Revisiting's margin loss with
its miner) over the params, the optimiser's update, then the method's own state (DiVA's DaNCE
EMA and queue) and the sampler's embedding memory, and the step's metrics. A step whose loss,
gradients or new params are not finite leaves the state as it was and counts itself in
``nonfinite``.

Sharing Matters' alternating variant trains in phases (``Method.phases``): one update per phase,
each on its own data stream, the params a phase does not train kept. A cohort of members
(``jdml.cohort``) wraps these parts; nothing here knows of it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jdml.data.device_pixels import make_views
from jdml.methods.method import Method
from jdml.samplers.memory import update_memory
from jdml.state import TrainState, zeros_state

StepFn = Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]


def init_state(
    method: Method,
    tx: optax.GradientTransformation,
    seed: int,
    sample: np.ndarray,
    sampler_state: dict | None = None,
) -> TrainState:
    """The state at step 0: the method's params initialised from ``seed`` on ``sample`` images."""
    key = jax.random.PRNGKey(seed)
    params, batch_stats = method.init(jax.random.fold_in(key, 0), jnp.asarray(sample))
    return zeros_state(
        sampler_state,
        params=params,
        batch_stats=batch_stats,
        opt_state=tx.init(params),
        rng=jax.random.fold_in(key, 1),
        method_state=method.init_method_state(params),
    )


def keep_where(mask: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``mask`` else ``old``, leaf by leaf; ``mask`` is a scalar, or (L,) over a
    leading axis of the leaves (a cohort's members)."""

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (a.ndim - mask.ndim)), a, b)

    return jax.tree.map(pick, new, old)


def all_finite(tree: Any, members: bool = False) -> jax.Array:
    """Whether every inexact value of ``tree`` is finite (``members``: (L,), per slice of the
    leaves' leading axis).

    One flag per leaf, counted by one integer sum. Joined by ``jnp.all`` instead, the flags are
    split by XLA's simplifier into a chain of scalar ands, which fusion copies into every
    consumer of the result (each leaf's :func:`keep_where`): a program quadratic in the number of
    leaves. A two-stage test network's cohort step compiled in 9.8 s on the CPU that way, 7.3 s
    counted, 4.7 s without the check; ``tests/test_step.py`` holds the growth to linear.
    """
    leaves = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    if not leaves:
        return jnp.array(True)
    rows = leaves[0].shape[0] if members else 1
    flags = jnp.stack([jnp.all(jnp.isfinite(x.reshape(rows, -1)), axis=1) for x in leaves], 1)
    ok = jnp.sum(flags, axis=1, dtype=jnp.int32) == len(leaves)
    return ok if members else ok[0]


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


def phase_key(key: jax.Array, index: int) -> jax.Array:
    """Phase ``index``'s key of the step's ``key`` (phase 0: the key itself)."""
    return jax.random.fold_in(key, index) if index else key


def phases_metrics(metrics: dict[str, jax.Array], phases: int) -> dict[str, jax.Array]:
    """The step's metrics: with several phases, ``loss`` is the sum of theirs."""
    if phases > 1:
        metrics = {**metrics, "loss": sum(metrics[f"phase{i}/loss"] for i in range(phases))}
    return metrics


def train_step(
    method: Method, tx: optax.GradientTransformation, state: TrainState, batch: dict[str, Any]
) -> tuple[TrainState, dict[str, jax.Array]]:
    """One optimiser update per phase of ``method`` on ``batch``, then its state and the
    sampler's memory; ``(new state, metrics)``."""
    key = jax.random.fold_in(state.rng, state.step)
    params, opt_state, stats = state.params, state.opt_state, state.batch_stats
    ok, metrics, outputs, embeddings = jnp.array(True), {}, {}, None
    for i, phase in enumerate(method.phases):
        grad_fn = jax.value_and_grad(method.loss_fn, has_aux=True)
        (loss, aux), grads = grad_fn(params, stats, method.phase_batch(batch, i),
                                     phase_key(key, i), state.method_state, phase)  # fmt: skip
        updates, new_opt = tx.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)
        groups = method.phase_groups(phase)
        params, opt_state = only_groups(groups, new_params, params, new_opt, opt_state)
        ok = ok & jnp.isfinite(loss) & all_finite((grads, params))
        stats, embeddings = aux.batch_stats, aux.embeddings if i == 0 else embeddings
        prefix = "" if len(method.phases) == 1 else f"phase{i}/"
        metrics.update({prefix + k: v for k, v in aux.metrics.items()})
        outputs.update(aux.outputs)
    method_state = method.update_method_state(state.method_state, params, outputs, batch["labels"])
    new = state.replace(
        step=state.step + 1,
        params=keep_where(ok, params, state.params),
        opt_state=keep_where(ok, opt_state, state.opt_state),
        batch_stats=keep_where(ok, stats, state.batch_stats),
        method_state=keep_where(ok, method_state, state.method_state),
        nonfinite=state.nonfinite + (~ok).astype(jnp.int32),
        sampler_state=update_memory(state.sampler_state, batch.get("indices"), embeddings),
    )
    return new, phases_metrics(metrics, len(method.phases))


def make_train_step(method: Method, tx: optax.GradientTransformation) -> StepFn:
    """The jitted, state-donating step of a plain run of ``method`` on one device (whatever its
    config's ``cohort.size``: e.g. one member's slice of a cohort)."""
    return jit_step(functools.partial(train_step, method, tx))


#: The batch entry of the device views' resident photos and tables (added by the step itself).
PHOTO_SET = "photo_set"


def jit_step(
    body: StepFn,
    views: Any = None,
    shardings: Any = None,
    place: Callable[[dict], dict] | None = None,
    replicated: Any = None,
) -> StepFn:
    """``body`` jitted, donating the state: ``(state, batch) -> (state, metrics)``.

    With ``views`` (``jdml.data.device_pixels.DeviceViews``, data) the batches hold view
    parameters, and the step makes the views first (``make_views`` of its ``spec``), inside the
    same jitted program; the resident photos
    are passed to every call as an argument (placed on the devices, or split over the mesh,
    when the views were built: nothing is copied). On a mesh (``shardings``: the state's), host
    batches are placed by ``place`` first and the state is returned placed as it came
    (``replicated``: the metrics'), so that the step compiles once.
    """

    def step(state: TrainState, batch: dict[str, jax.Array]):
        if views is not None:
            batch = make_views(views.spec, {k: v for k, v in batch.items() if k != PHOTO_SET},
                               batch[PHOTO_SET])  # fmt: skip
        return body(state, batch)

    extra = {} if views is None else {PHOTO_SET: views.resident}
    if shardings is None:
        jitted = jax.jit(step, donate_argnums=0)
        return PlacedStep(jitted, None, None, extra) if extra else jitted
    jitted = jax.jit(step, donate_argnums=0, out_shardings=(shardings, replicated))
    return PlacedStep(jitted, place, shardings, extra)


def _placed(leaf: Any, sharding: Any) -> Any:
    """``leaf`` placed by ``sharding``; a shape (``jax.ShapeDtypeStruct``) given it."""
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding)
    return jax.device_put(leaf, sharding)


class PlacedStep:
    """A jitted step taking host batches: places them on the mesh (``place``; None: as they
    are), adds the ``extra`` entries already on the devices, then calls the step.

    The first call also places the state as the step returns it (``Run.prepare`` may have
    replaced parts of it), so that the step compiles once.
    """

    def __init__(
        self,
        jitted: Any,
        place: Callable[[dict], dict] | None,
        shardings: Any,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.jitted, self.place, self.shardings = jitted, place, shardings
        self.extra = extra or {}
        self.placed = shardings is None

    def __call__(self, state: TrainState, batch: dict) -> tuple[TrainState, dict[str, jax.Array]]:
        if not self.placed:
            state, self.placed = jax.device_put(state, self.shardings), True
        placed = batch if self.place is None else self.place(batch)
        return self.jitted(state, {**placed, **self.extra})

    def arguments(self, state: TrainState, batch: dict) -> tuple[TrainState, dict]:
        """What :attr:`jitted` takes for ``state`` (arrays, or their shapes) and the host
        ``batch``, placed (for ``jax.export``, :mod:`jdml.lowering`)."""
        placed = batch if self.place is None else self.place(batch)
        if self.shardings is not None:
            state = jax.tree.map(_placed, state, self.shardings)
        return state, {**placed, **self.extra}

    def _cache_size(self) -> int:
        return self.jitted._cache_size()
