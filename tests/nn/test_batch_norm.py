"""jdml.nn.batch_norm.BatchNorm equals flax.linen.BatchNorm: the same variables at init, the same
outputs, running statistics and gradients (input, scale, bias, and through the statistics), in
training and evaluation mode, for maps and for vectors, under vmap, and in bfloat16."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.nn.batch_norm import BatchNorm, batch_norm_train


def both(train: bool, **kwargs) -> tuple[nn.Module, nn.Module]:
    return (
        BatchNorm(use_running_average=not train, momentum=0.9, **kwargs),
        nn.BatchNorm(use_running_average=not train, momentum=0.9, **kwargs),
    )


def loss_and_grads(module: nn.Module, variables, x: jax.Array, cotangent: jax.Array):
    """relu(BN(x)) weighted by ``cotangent``: the loss, gradients and updated statistics."""

    def f(params, x):
        y, updates = module.apply(
            {"params": params, "batch_stats": variables["batch_stats"]}, x, mutable=["batch_stats"]
        )
        return jnp.vdot(jax.nn.relu(y), cotangent), updates

    (loss, updates), grads = jax.value_and_grad(f, argnums=(0, 1), has_aux=True)(
        variables["params"], x
    )
    return loss, grads, updates


@pytest.mark.parametrize("shape", [(16, 6, 5, 12), (40, 7)])
@pytest.mark.parametrize("train", [True, False])
def test_equals_flax_batch_norm(shape: tuple[int, ...], train: bool) -> None:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=shape) * 3 + 1, jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=shape), jnp.float32)
    ours, flax_bn = both(train)
    v_ours = ours.init(jax.random.key(0), x)
    v_flax = flax_bn.init(jax.random.key(0), x)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), v_ours) == jax.tree.map(
        lambda a: (a.shape, a.dtype), v_flax
    )
    for a, b in zip(jax.tree.leaves(v_ours), jax.tree.leaves(v_flax), strict=True):
        np.testing.assert_array_equal(a, b)
    # Non-trivial parameters and statistics.
    variables = jax.tree.map(lambda a: a + jnp.linspace(0.2, 0.9, a.shape[-1]), v_flax)
    got = loss_and_grads(ours, variables, x, cotangent)
    want = loss_and_grads(flax_bn, variables, x, cotangent)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_gradients_through_the_statistics() -> None:
    """A loss on the returned batch mean and variance differentiates like the plain formulas."""
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.normal(size=(8, 3, 3, 4)), jnp.float32)
    scale, bias = jnp.full((4,), 1.5), jnp.full((4,), -0.5)

    def ours(x):
        y, mean, var = batch_norm_train(x, scale, bias, 1e-5)
        return jnp.sum(jnp.sin(y)) + jnp.sum(mean**2) + jnp.sum(jnp.sqrt(var))

    def plain(x):
        mean = jnp.mean(x, (0, 1, 2))
        var = jnp.mean(jnp.square(x - mean), (0, 1, 2))
        y = (x - mean) / jnp.sqrt(var + 1e-5) * scale + bias
        return jnp.sum(jnp.sin(y)) + jnp.sum(mean**2) + jnp.sum(jnp.sqrt(var))

    np.testing.assert_allclose(jax.grad(ours)(x), jax.grad(plain)(x), rtol=1e-4, atol=1e-5)


def test_under_vmap_and_in_bfloat16() -> None:
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(3, 10, 4, 4, 6)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=x.shape[1:]), jnp.float32)
    ours, flax_bn = both(True)
    variables = flax_bn.init(jax.random.key(0), x[0])
    per_block = lambda m: jax.vmap(lambda b: loss_and_grads(m, variables, b, cotangent))  # noqa: E731
    got, want = per_block(ours)(x), per_block(flax_bn)(x)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    ours, flax_bn = both(True, dtype=jnp.bfloat16)
    xb = x[0].astype(jnp.bfloat16)
    y_ours, _ = ours.apply(variables, xb, mutable=["batch_stats"])
    y_flax, _ = flax_bn.apply(variables, xb, mutable=["batch_stats"])
    assert y_ours.dtype == y_flax.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        y_ours.astype(jnp.float32), y_flax.astype(jnp.float32), rtol=2e-2, atol=2e-2
    )
