"""The train step's finiteness mask (jdml/step.py): values on explicit trees, and a compiled
program that grows linearly with the number of leaves it guards."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jdml.cohort.step import finite_per_member
from jdml.step import keep_where


def test_finite_per_member_on_explicit_trees():
    ok = {"w": jnp.ones((2, 3)), "b": jnp.zeros((2,))}
    np.testing.assert_array_equal(finite_per_member(ok), [True, True])
    for bad in (np.nan, np.inf, -np.inf):
        tree = {"w": jnp.ones((2, 3)).at[1, 2].set(bad), "b": jnp.zeros((2,))}
        np.testing.assert_array_equal(finite_per_member(tree), [True, False])
    # every dtype is checked (a bfloat16 overflow), integer leaves are always finite
    mixed = {
        "h": jnp.ones((3, 2), jnp.bfloat16).at[0, 0].set(jnp.inf),
        "count": jnp.full((3,), 7, jnp.int32),
        "e": jnp.zeros((3, 0)),  # an empty leaf
    }
    np.testing.assert_array_equal(finite_per_member(mixed), [False, True, True])
    assert bool(finite_per_member({"count": jnp.zeros((2,), jnp.int32)}))
    assert bool(finite_per_member({}))


def _compiled_size(leaves: int) -> int:
    """Characters of the optimised program that updates ``leaves`` leaves and keeps the old
    values where any new value or gradient is not finite (the step's pattern)."""
    tree = [jnp.ones((1, 3, 3, 4)) if i % 2 else jnp.ones((1, 4)) for i in range(leaves)]

    def update(params, x):
        grads = jax.grad(lambda p: sum(jnp.sum(jnp.sin(a * x)) for a in p))(params)
        new = [p - 0.1 * g for p, g in zip(params, grads, strict=True)]
        return keep_where(finite_per_member((grads, new)), new, params)

    return len(jax.jit(update).lower(tree, 1.0).compile().as_text())


def test_the_mask_is_not_copied_into_every_guarded_leaf():
    # Quadratic growth (the mask recomputed inside every leaf's select) gives a ratio near 4.
    small, large = _compiled_size(40), _compiled_size(80)
    assert large < 2.6 * small, (small, large)
