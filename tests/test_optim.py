"""Optimiser: coupled Adam weight decay, per-group learning rates, epoch-based schedules."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from jdml.optim import Group, lr_multiplier, make_optimizer


def _cfg(**kw) -> ml_collections.ConfigDict:
    base = dict(name="adam", schedule="multistep", milestones=(2,), gamma=0.5, warmup_epochs=0)
    return ml_collections.ConfigDict({**base, **kw})


def _numpy_coupled_adam(p, grads, lr, wd, b1=0.9, b2=0.999, eps=1e-8):
    """PyTorch's Adam(weight_decay=wd) algorithm: the decay is added to the gradient."""
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        g = g + wd * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        p = p - lr[t - 1] * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
    return p


def test_coupled_adam_groups_and_multistep_match_numpy():
    rng = np.random.default_rng(0)
    params = {"model": jnp.asarray(rng.normal(size=5)), "loss": jnp.asarray(rng.normal(size=3))}
    grads = [
        {k: jnp.asarray(rng.normal(size=v.shape)) for k, v in params.items()} for _ in range(6)
    ]
    groups = {"model": Group(1e-2, 4e-4), "loss": Group(5e-2, 0.0)}
    tx = make_optimizer(_cfg(), groups, steps_per_epoch=2, total_steps=6)
    state, p = tx.init(params), params
    update = jax.jit(tx.update)
    for g in grads:
        u, state = update(g, state, p)
        p = optax.apply_updates(p, u)
    mult = [1.0, 1.0, 1.0, 1.0, 0.5, 0.5]  # milestone at epoch 2 = step 4
    for name, grp in groups.items():
        expected = _numpy_coupled_adam(
            np.asarray(params[name]),
            [np.asarray(g[name]) for g in grads],
            [grp.lr * m for m in mult],
            grp.weight_decay,
        )
        np.testing.assert_allclose(np.asarray(p[name]), expected, rtol=1e-5, atol=1e-6)


def test_schedules():
    cos = lr_multiplier(_cfg(schedule="cosine"), 10, 100)
    assert float(cos(0)) == pytest.approx(1.0) and float(cos(100)) == pytest.approx(0.0)
    warm = lr_multiplier(_cfg(schedule="constant", warmup_epochs=1), 10, 100)
    assert float(warm(0)) == pytest.approx(0.1) and float(warm(50)) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="schedule"):
        lr_multiplier(_cfg(schedule="linear"), 10, 100)
