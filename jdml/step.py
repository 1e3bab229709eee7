"""The train state at step 0 and the one jitted, state-donating train step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jdml.methods import Method
from jdml.samplers.memory import update_memory
from jdml.state import TrainState

StepFn = Callable[[TrainState, dict[str, jax.Array]], tuple[TrainState, dict[str, jax.Array]]]


def init_state(
    method: Method,
    tx: optax.GradientTransformation,
    seed: int,
    sample: np.ndarray,
    sampler_state: dict | None = None,
) -> TrainState:
    """The state at step 0 for a method, an optimiser and a sample image batch."""
    key = jax.random.PRNGKey(seed)
    params, batch_stats = method.init(jax.random.fold_in(key, 0), jnp.asarray(sample))
    method_state = method.init_method_state(params)
    return TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        batch_stats=batch_stats,
        opt_state=tx.init(params),
        rng=jax.random.fold_in(key, 1),
        nonfinite=jnp.zeros((), jnp.int32),
        sampler_state=sampler_state or {},
        method_state=method_state,
    )


def _all_finite(tree: Any) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def make_train_step(method: Method, tx: optax.GradientTransformation) -> StepFn:
    """Returns the jitted train step ``(state, batch) -> (state, metrics)``; state is donated.

    A step whose loss or gradients are not finite leaves params, optimiser state and batch
    statistics unchanged and increments ``state.nonfinite``; the loop stops with a clear error at
    the next log point, so no checkpoint ever holds a state damaged by a NaN.
    """

    def step(state: TrainState, batch: dict[str, jax.Array]):
        key = jax.random.fold_in(state.rng, state.step)
        grad_fn = jax.value_and_grad(method.loss_fn, has_aux=True)
        (loss, (batch_stats, metrics, embeddings, outputs)), grads = grad_fn(
            state.params, state.batch_stats, batch, key, state.method_state
        )
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        ok = jnp.isfinite(loss) & _all_finite(grads) & _all_finite(params)
        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(ok, a, b), new, old)  # noqa: E731
        new_state = state.replace(
            step=state.step + 1,
            params=keep(params, state.params),
            opt_state=keep(opt_state, state.opt_state),
            batch_stats=keep(batch_stats, state.batch_stats),
            nonfinite=state.nonfinite + (~ok).astype(jnp.int32),
            method_state=keep(
                method.update_method_state(state.method_state, params, outputs, batch["labels"]),
                state.method_state,
            ),
            sampler_state=update_memory(state.sampler_state, batch.get("indices"), embeddings),
        )
        return new_state, metrics

    return jax.jit(step, donate_argnums=0)
