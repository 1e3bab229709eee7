"""jdml.nn.frozen_bn: frozen BatchNorm as a multiply-add equals nn.BatchNorm in eval mode."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jdml.nn.frozen_bn import FrozenBatchNorm


def test_values_gradients_and_variables_equal_flax_batch_norm():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(2.0, 3.0, size=(4, 5, 5, 6)), jnp.float32)
    ours = FrozenBatchNorm(epsilon=1e-3)
    ref = nn.BatchNorm(use_running_average=True, epsilon=1e-3)
    v_ours, v_ref = ours.init(jax.random.PRNGKey(0), x), ref.init(jax.random.PRNGKey(0), x)
    assert jax.tree.structure(v_ours) == jax.tree.structure(v_ref)
    for a, b in zip(jax.tree.leaves(v_ours), jax.tree.leaves(v_ref), strict=True):
        np.testing.assert_array_equal(a, b)
    # Pretrained-like statistics and affine parameters.
    variables = {
        "params": {
            "scale": jnp.asarray(rng.uniform(0.5, 2, 6)),
            "bias": jnp.asarray(rng.normal(size=6)),
        },
        "batch_stats": {
            "mean": jnp.asarray(rng.normal(2, 1, 6)),
            "var": jnp.asarray(rng.uniform(0.1, 9, 6)),
        },
    }
    variables = jax.tree.map(lambda v: v.astype(jnp.float32), variables)
    weights = jnp.asarray(rng.normal(size=x.shape), jnp.float32)
    # An explicit per-channel formula in float64.
    p, s = variables["params"], variables["batch_stats"]
    explicit = (np.asarray(x, np.float64) - np.asarray(s["mean"])) / np.sqrt(
        np.asarray(s["var"], np.float64) + 1e-3
    ) * np.asarray(p["scale"]) + np.asarray(p["bias"])
    np.testing.assert_allclose(ours.apply(variables, x), explicit, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        ours.apply(variables, x), ref.apply(variables, x), rtol=1e-5, atol=1e-5
    )

    def loss(module, params, x):
        return jnp.sum(weights * module.apply({**variables, "params": params}, x))

    g_ours = jax.grad(lambda p, x: loss(ours, p, x), argnums=(0, 1))(variables["params"], x)
    g_ref = jax.grad(lambda p, x: loss(ref, p, x), argnums=(0, 1))(variables["params"], x)
    for a, b in zip(jax.tree.leaves(g_ours), jax.tree.leaves(g_ref), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    # The statistics never change: nothing is written to batch_stats.
    _, updates = ours.apply(variables, x, mutable=["batch_stats"])
    for a, b in zip(
        jax.tree.leaves(updates), jax.tree.leaves(variables["batch_stats"]), strict=True
    ):
        np.testing.assert_array_equal(a, b)
