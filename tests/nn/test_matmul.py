"""jdml.nn.matmul: oneDNN's products equal XLA's, values and both gradients, for matrices and
stacks with every transpose, and a vision transformer with them (``native_conv``, a run's
``backends.conv=onednn`` on CPU) equals the one with XLA's dots, in float32 and bfloat16."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jdml.models.vit import Architecture, VisionTransformer, attention
from jdml.nn.matmul import native_dot_general, product
from jdml.throughput import model_flops
from tests.helpers import skip_off_cpu

pytestmark = pytest.mark.cpu  # the CPU backend's native kernels


def _value_and_grads(fn, *operands, weights):
    """The weighted sum of ``fn``'s output and its gradients by every operand."""
    loss = lambda *xs: jnp.sum(fn(*xs).astype(jnp.float32) * weights)  # noqa: E731
    return jax.value_and_grad(loss, argnums=tuple(range(len(operands))))(*operands)


def _assert_close(got, want, rtol: float, atol: float) -> None:
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=rtol, atol=atol
        )


@pytest.mark.parametrize(
    ("shape_a", "shape_b", "trans_a", "trans_b"),
    [
        ((5, 7), (7, 3), False, False),
        ((7, 5), (7, 3), True, False),
        ((5, 7), (3, 7), False, True),
        ((1, 1), (1, 1), False, False),
        ((4, 5, 7), (4, 7, 3), False, False),
        ((4, 5, 7), (4, 3, 7), False, True),
        ((4, 7, 5), (4, 7, 3), True, False),
        ((3, 17, 8), (3, 17, 8), False, True),  # an odd token count, as a ViT's 197
    ],
)
def test_products_and_their_gradients_equal_xla(shape_a, shape_b, trans_a, trans_b):
    skip_off_cpu("oneDNN's sgemm")
    rng = np.random.default_rng(0)
    a = jnp.asarray(rng.normal(size=shape_a), jnp.float32)
    b = jnp.asarray(rng.normal(size=shape_b), jnp.float32)

    def xla(a, b):
        a = jnp.swapaxes(a, -1, -2) if trans_a else a
        b = jnp.swapaxes(b, -1, -2) if trans_b else b
        return jnp.matmul(a, b, precision="highest")

    weights = jnp.asarray(rng.normal(size=xla(a, b).shape), jnp.float32)
    got = jax.jit(lambda a, b: _value_and_grads(
        lambda a, b: product(a, b, trans_a, trans_b), a, b, weights=weights))(a, b)  # fmt: skip
    _assert_close(got, _value_and_grads(xla, a, b, weights=weights), 1e-5, 1e-5)


def test_an_empty_sum_gives_zeros():
    skip_off_cpu("oneDNN's sgemm")
    a, b = jnp.ones((2, 3, 0)), jnp.ones((2, 0, 4))
    np.testing.assert_array_equal(np.asarray(product(a, b)), np.zeros((2, 3, 4), np.float32))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_a_dense_layer_with_the_native_product_equals_nn_dense(dtype):
    skip_off_cpu("oneDNN's sgemm")
    x = jnp.asarray(np.random.default_rng(1).normal(size=(2, 5, 6)), jnp.float32)
    plain = nn.Dense(4, dtype=dtype)
    native = nn.Dense(4, dtype=dtype, dot_general=native_dot_general)
    params = plain.init(jax.random.key(0), x)
    assert jax.tree.structure(native.init(jax.random.key(0), x)) == jax.tree.structure(params)
    weights = jnp.ones((2, 5, 4))
    got = _value_and_grads(lambda p, x: native.apply(p, x), params, x, weights=weights)
    want = _value_and_grads(lambda p, x: plain.apply(p, x), params, x, weights=weights)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2  # bfloat16 outputs: one rounding apart
    _assert_close(got, want, tol, tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_attention_with_native_products_equals_xlas(dtype):
    skip_off_cpu("oneDNN's sgemm")
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 3, 17, 8)), dtype) for _ in range(3))
    weights = jnp.asarray(rng.normal(size=(2, 17, 3, 8)), jnp.float32)
    got = _value_and_grads(lambda *a: attention(*a, "xla", native=True), q, k, v, weights=weights)
    want = _value_and_grads(lambda *a: attention(*a, "xla"), q, k, v, weights=weights)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    _assert_close(got, want, tol, tol)


@pytest.mark.parametrize("dtype", [jnp.float32, pytest.param(jnp.bfloat16, marks=pytest.mark.slow)])
def test_a_vit_with_native_products_equals_the_xla_one(dtype):
    """A one-block ViT (class token, layer scale, 5 tokens): features and every parameter's
    gradient."""
    skip_off_cpu("oneDNN's sgemm")
    arch = Architecture(patch=4, dim=16, depth=1, heads=2, layer_scale=0.1)
    xla = VisionTransformer(arch, dtype=dtype)
    native = VisionTransformer(arch, dtype=dtype, native_conv=True)
    images = jnp.asarray(np.random.default_rng(3).normal(size=(3, 8, 8, 3)), jnp.float32)
    params = xla.init(jax.random.key(0), images)
    weights = jnp.asarray(np.random.default_rng(4).normal(size=(3, 16)), jnp.float32)

    def run(model):
        return jax.jit(lambda p: _value_and_grads(model.apply, p, images, weights=weights))(params)

    tol = 1e-4 if dtype == jnp.float32 else 5e-2
    _assert_close(run(native), run(xla), tol, tol)
    if dtype == jnp.float32:  # the model FLOPs count the native products as XLA's dots
        counts = [
            model_flops(lambda p, m=m: _value_and_grads(m.apply, p, images, weights=weights), p)
            for m, p in ((native, params), (xla, params))
        ]
        assert counts[0] == counts[1] and not counts[0].note
    text = jax.jit(native.apply).lower(params, images).as_text()
    assert "jdml_dnnl_matmul" in text and "jdml_dnnl_batched_matmul" in text
