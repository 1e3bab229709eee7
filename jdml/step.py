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


def _only_groups(
    groups: frozenset[str] | None, new_params: Any, params: Any, new_opt: Any, opt: Any
) -> tuple[Any, Any]:
    """Keeps the params and optimiser state of the groups a phase does not train unchanged
    (their gradient is zero, but Adam's momentum and the coupled weight decay would move them)."""
    if groups is None:
        return new_params, new_opt
    params = {k: new_params[k] if k in groups else params[k] for k in params}
    inner = {k: new_opt.inner_states[k] if k in groups else v for k, v in opt.inner_states.items()}
    return params, new_opt._replace(inner_states=inner)


def make_train_step(method: Method, tx: optax.GradientTransformation) -> StepFn:
    """Returns the jitted train step ``(state, batch) -> (state, metrics)``; state is donated.

    A step whose loss or gradients are not finite leaves params, optimiser state and batch
    statistics unchanged and increments ``state.nonfinite``; the loop stops with a clear error at
    the next log point, so no checkpoint ever holds a state damaged by a NaN.
    """

    def step(state: TrainState, batch: dict[str, jax.Array]):
        key = jax.random.fold_in(state.rng, state.step)
        grad_fn = jax.value_and_grad(method.loss_fn, has_aux=True)
        params, opt_state, batch_stats = state.params, state.opt_state, state.batch_stats
        ok = jnp.array(True)
        metrics, outputs, embeddings = {}, {}, None
        # One phase (every term) by default; Sharing Matters' alternating variant has two, each
        # an optimiser update on its own data stream (``Method.phases``).
        for i, phase in enumerate(method.phases):
            phase_batch = method.phase_batch(batch, i)
            (loss, (batch_stats, phase_metrics, emb, phase_outputs)), grads = grad_fn(
                params,
                batch_stats,
                phase_batch,
                key if i == 0 else jax.random.fold_in(key, i),
                state.method_state,
                phase,
            )
            updates, new_opt_state = tx.update(grads, opt_state, params)
            new_params = optax.apply_updates(params, updates)
            params, opt_state = _only_groups(
                method.phase_groups(phase), new_params, params, new_opt_state, opt_state
            )
            ok = ok & jnp.isfinite(loss) & _all_finite(grads) & _all_finite(params)
            prefix = "" if len(method.phases) == 1 else f"phase{i}/"
            metrics.update({prefix + k: v for k, v in phase_metrics.items()})
            outputs.update(phase_outputs)
            embeddings = emb if embeddings is None else embeddings
        if len(method.phases) > 1:
            metrics["loss"] = sum(metrics[f"phase{i}/loss"] for i in range(len(method.phases)))
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
