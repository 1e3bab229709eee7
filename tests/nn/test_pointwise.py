"""jdml.nn.pointwise: the 1x1 convolution as a matmul equals XLA's convolution and nn.Conv."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from jdml.nn.pointwise import PointwiseConv, pointwise_conv

NHWC = ("NHWC", "HWIO", "NHWC")


@pytest.mark.parametrize(
    ("shape", "out"), [((3, 5, 4, 6), 7), ((2, 1, 1, 9), 2), ((1, 3, 3, 1), 4)]
)
def test_values_and_gradients_equal_the_convolution(shape, out):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=shape), jnp.float32)
    kernel = jnp.asarray(rng.normal(size=(1, 1, shape[-1], out)), jnp.float32)
    weights = jnp.asarray(rng.normal(size=(*shape[:-1], out)), jnp.float32)

    def conv(x, k):
        return lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=NHWC)

    for fn in (conv, pointwise_conv):
        assert fn(x, kernel).shape == (*shape[:-1], out)
    np.testing.assert_allclose(pointwise_conv(x, kernel), conv(x, kernel), rtol=1e-5, atol=1e-5)
    # An explicit sum over input channels, pixel by pixel.
    explicit = np.einsum("bhwc,co->bhwo", np.asarray(x, np.float64), np.asarray(kernel[0, 0]))
    np.testing.assert_allclose(pointwise_conv(x, kernel), explicit, rtol=1e-5, atol=1e-5)
    grads = [
        jax.grad(lambda x, k, fn=fn: jnp.sum(weights * fn(x, k)), argnums=(0, 1))(x, kernel)
        for fn in (conv, pointwise_conv)
    ]
    for ref, ours in zip(*grads, strict=True):
        np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


def test_module_has_the_parameter_and_init_of_a_bias_free_conv():
    x = jnp.ones((2, 4, 4, 5))
    ours = PointwiseConv(3).init(jax.random.PRNGKey(7), x)
    conv = nn.Conv(3, (1, 1), use_bias=False).init(jax.random.PRNGKey(7), x)
    assert jax.tree.structure(ours) == jax.tree.structure(conv)
    np.testing.assert_array_equal(ours["params"]["kernel"], conv["params"]["kernel"])
    y = PointwiseConv(3).apply(ours, x)
    np.testing.assert_allclose(y, nn.Conv(3, (1, 1), use_bias=False).apply(conv, x), rtol=1e-6)
